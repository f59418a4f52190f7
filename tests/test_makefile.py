"""The Makefile's test recipes under PyTorch's other CPU kernels (`ATEN_CPU_CAPABILITY`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _vllm_recipe(capability: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "test-vllm"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (line,) = [line for line in out.splitlines() if "-m 'vllm and not gpu'" in line]
    return line


def _inductor_cache(line: str) -> str | None:
    found = re.search(r"TORCHINDUCTOR_CACHE_DIR=(\S+)", line)
    return found and found.group(1)


def test_each_cpu_capability_gets_an_inductor_cache_of_its_own():
    # vLLM's sampler is compiled by Inductor, whose on-disk cache does not tell capabilities
    # apart: kernels cached natively failed to build under ATEN_CPU_CAPABILITY=default.
    assert _inductor_cache(_vllm_recipe(None)) is None  # natively: torch's own default cache
    default, avx2 = _inductor_cache(_vllm_recipe("default")), _inductor_cache(_vllm_recipe("avx2"))
    assert default and avx2 and default != avx2
    assert "default" in default and "avx2" in avx2
