"""Finding 4: vLLM's `external_launcher` under a 2-rank gloo launch (CPU backend, vllm venv).

The arguments paravt gives each rank's engine on a multi-rank GPU launch are accepted by
vLLM 0.32: each rank becomes its own data-parallel replica (its RANK) of a W-replica engine and
generates on its own. (GPU placement on `cuda:LOCAL_RANK` waits for a GPU; docs/multi-gpu.md.)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]
HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_two_ranks_build_external_launcher_engines(tiny_qwen3_dir, tmp_path):
    port, procs = _port(), []
    for rank in (0, 1):
        env = os.environ | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
        }
        log = open(tmp_path / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        cmd = [sys.executable, str(HERE / "external_launcher_worker.py"), str(tiny_qwen3_dir)]
        procs.append(
            (subprocess.Popen([*cmd, str(tmp_path)], env=env, stdout=log, stderr=log), log)
        )
    for proc, log in procs:
        proc.wait(timeout=1100)
        log.close()
    tails = "".join((tmp_path / f"rank{r}.log").read_text()[-1500:] for r in (0, 1))
    assert [p.returncode for p, _ in procs] == [0, 0], tails
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["dp_rank"] for r in ranks] == [0, 1]
    assert {r["dp_size"] for r in ranks} == {2} and {r["backend"] for r in ranks} == {
        "external_launcher"
    }
    assert ranks[0]["tokens"] == ranks[1]["tokens"] and len(ranks[0]["tokens"]) == 4
