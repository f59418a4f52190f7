"""`python train.py` killed with SIGKILL mid-run, then `ckpt_path=last`: the run goes on from
the last complete checkpoint and its summary says from which step.

Both runs are real processes of train.py on the test run's tiny model and needle data, forked
from one interpreter that imported torch and Lightning once (tests/forkserver.py).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch

from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]


def _command(run_dir: Path, overrides: list[str], *extra: str) -> list[str]:
    return [
        str(ROOT / "train.py"),
        f"hydra.run.dir={run_dir}",
        "cold_start=null",
        "export_hf=false",
        *overrides,
        "rollout.agent.max_new_tokens=8",
        "rollout.agent.max_rounds=1",
        "callbacks.benchmark_validation.limit=1",
        "callbacks.benchmark_validation.every_n_steps=2",
        *extra,
    ]


def _checkpoint_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def _wait_for_step(path: Path, proc: forkserver.Child, step: int, timeout: float = 300) -> None:
    start = time.monotonic()
    while not (path.exists() and _checkpoint_step(path) >= step):
        if proc.poll() is not None or time.monotonic() - start > timeout:
            proc.kill()
            out = proc.communicate()[0]
            pytest.fail(f"no checkpoint of step {step} at {path}:\n{out[-3000:]}")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_sigkilled_train_py_resumes_and_says_from_which_step(tmp_path, tiny_run_overrides):
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    argv = _command(run_dir, tiny_run_overrides, "trainer.max_steps=200")
    proc = forkserver.start(
        forkserver.script_code(argv[0]), argv, tmp_path / "killed.log", forkserver.RUN_ENV, tmp_path
    )
    _wait_for_step(last, proc, 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    step = _checkpoint_step(last)  # the last complete checkpoint: 2 or a later one
    args = _command(run_dir, tiny_run_overrides, f"trainer.max_steps={step + 1}", "ckpt_path=last")
    resumed = forkserver.run(args, tmp_path / "logs", tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout
    assert f"({step + 1} RL steps)" in out, out
    assert f"resumed from {last} at step {step}" in out, out
    assert _checkpoint_step(last) == step + 1
