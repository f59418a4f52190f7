"""A sweep's jobs share one identical cold start (`paravt.run.coldstart_cache`).

`train.py -m` with two jobs that differ only in a reward weight, as a user runs a sweep: the first
job runs the cold start and saves it under the sweep folder, the second loads it (same weights,
same report) instead of tracing the teacher and training again; a job whose cold start differs
computes its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "cold_start.steps=2",
    "cold_start.oracle_steps=1",
    "cold_start.batch_size=2",
    "cold_start.eval_limit=2",
    "cold_start.eval_every=1",
    "cold_start.report_limit=2",
    "trainer.max_steps=1",
    "rollout.agent.max_rounds=1",
    "rollout.agent.max_new_tokens=8",
    "callbacks.benchmark_validation=null",
    "export_hf=false",
]


def _sweep(tmp_path: Path, overrides: list[str], *sweep: str) -> str:
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        *overrides,
        *SMALL,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *sweep,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _key(tmp_path, *overrides: str) -> str:
    from hydra import compose, initialize_config_dir

    from paravt.run.coldstart_cache import cache_key

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return cache_key(compose("train", overrides=[f"run_dir={tmp_path}", *overrides]))


def test_the_key_follows_what_the_cold_start_reads_and_nothing_else(tmp_path):
    base = _key(tmp_path)
    assert _key(tmp_path, "reward.format_weight=0.5") == base  # RL only: shared
    assert _key(tmp_path, "optimizer.lr=1e-5", "trainer.max_steps=3") == base
    assert _key(tmp_path, "cold_start.lr=1e-3") != base
    assert _key(tmp_path, "rollout.crop.max_frames=6") != base
    assert _key(tmp_path, "seed=1") != base


@pytest.mark.slow
def test_the_second_job_of_a_sweep_loads_the_first_jobs_cold_start(tmp_path, tiny_run_overrides):
    out = _sweep(tmp_path, tiny_run_overrides, "reward.format_weight=0.5,1.0")
    cache = sorted((tmp_path / "sweep" / ".cold_start_cache").glob("*.pt"))
    assert len(cache) == 1, out[-3000:]
    assert out.count("cold start saved for the sweep's other jobs") == 1, out[-3000:]
    assert out.count("loaded from an earlier job of this sweep") == 1, out[-3000:]
    summaries = out.split("== paravt run")[1:]

    def cold_lines(summary: str) -> list[str]:
        return [
            line
            for line in summary.splitlines()
            if line.startswith("cold start") and "loaded from" not in line
        ]

    first, second = (cold_lines(s) for s in summaries)
    assert any("SFT loss" in line for line in first), first
    assert first == second  # the same cold start (loss, teacher, answer tokens), reported twice
