"""The pure core imports no framework: DESIGN.md's two-layer split, enforced."""

from __future__ import annotations

import subprocess
import sys

import pytest

CORE = [
    "paravt.types",
    "paravt.video.sampling",
    "paravt.agent.parsing",
    "paravt.agent.prompts",
    "paravt.agent.scripts",
    "paravt.agent.tools",
    "paravt.rewards.compose",
    "paravt.rewards.structural",
    "paravt.rewards.judge",
    "paravt.rl.advantages",
    "paravt.rl.losses",
    "paravt.rl.kl",
    "paravt.rl.logprobs",
    "paravt.rl.budget",
    "paravt.rl.metrics",
    "paravt.rl.objective",
    "paravt.data.schemas",
    "paravt.data.sft_schema",
    "paravt.rl.microbatch",
    "paravt.progress",
    "paravt.parallel.distributed",
    "paravt.rollout.records",
    "paravt.rollout.engine",
    "paravt.eval.scoring",
    "paravt.eval.benchmarks",
]
FORBIDDEN = ("lightning", "hydra", "vllm", "decord", "pytorch_lightning")


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_framework(module):
    code = (
        f"import sys, {module}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
