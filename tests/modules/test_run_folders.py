"""A run never writes into another run's folder, and `ckpt_path=last` continues the intended one.

The folder rules (`paravt.run.run_dirs`) on real folders, then `train.py` as a user starts it (in an
empty working folder, no `hydra.run.dir`): a second run gets `runs/NAME-2`, a resume continues it
with one `last.ckpt`, reaches the weights of an uninterrupted run, and prints no "dataloader is
not resumable" warning (that warning is false here; train.py says what is true). Each run is a
process of its own, forked from one that imported torch and Lightning once (tests/forkserver.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paravt.run.run_dirs import choose_run_dir, run_folders
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]


def _result(folder: Path) -> None:
    (folder / "checkpoints").mkdir(parents=True)


def test_a_taken_name_gets_the_next_number_and_last_resumes_the_newest(tmp_path):
    runs = tmp_path / "runs"
    assert choose_run_dir(runs, "demo", None) == runs / "demo"
    (runs / "demo" / ".hydra").mkdir(parents=True)  # stopped by a pre-flight error: reusable
    assert choose_run_dir(runs, "demo", None) == runs / "demo"
    _result(runs / "demo")
    assert choose_run_dir(runs, "demo", None) == runs / "demo-2"
    _result(runs / "demo-2")
    (runs / "demo-20x").mkdir()  # not a run of this name
    (runs / "demo_sft").mkdir()
    assert run_folders(runs, "demo") == [runs / "demo", runs / "demo-2"]
    assert choose_run_dir(runs, "demo", None) == runs / "demo-3"
    assert choose_run_dir(runs, "demo", "last") == runs / "demo-2"
    assert choose_run_dir(runs, "demo-2", "last") == runs / "demo-2"  # an older one by name
    (runs / "demo-3").mkdir()  # a numbered folder without results is not resumed
    assert choose_run_dir(runs, "demo", "last") == runs / "demo-2"
    assert choose_run_dir(runs, "demo", None) == runs / "demo-3"
    assert choose_run_dir(runs, "fresh", "last") == runs / "fresh"


def _train(cwd: Path, overrides: list[str], *extra: str) -> str:
    cmd = [
        str(ROOT / "train.py"),
        "name=tiny",
        "cold_start=null",
        *overrides,
        "rollout.agent.max_new_tokens=8",
        "rollout.agent.max_rounds=1",
        "callbacks.benchmark_validation=null",
        *extra,
    ]
    proc = forkserver.run(cmd, cwd.parent / f"{cwd.name}_logs", cwd)  # a fork of its own
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _policy(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("policy.")}


@pytest.mark.slow
def test_a_second_run_gets_its_own_folder_and_a_resume_continues_it_exactly(
    tmp_path, tiny_run_overrides
):
    runs = tmp_path / "runs"
    whole = _train(tmp_path, tiny_run_overrides, "trainer.max_steps=2")
    assert (runs / "tiny" / "hf" / "config.json").exists(), whole
    exported = (runs / "tiny" / "hf" / "config.json").stat().st_mtime_ns
    second = _train(tmp_path, tiny_run_overrides, "trainer.max_steps=1")
    assert "runs/tiny holds an earlier run; this run writes to runs/tiny-2" in second
    assert (runs / "tiny" / "hf" / "config.json").stat().st_mtime_ns == exported  # untouched
    resumed = _train(tmp_path, tiny_run_overrides, "trainer.max_steps=2", "ckpt_path=last")
    assert "resuming in runs/tiny-2" in resumed and "not resumable" not in resumed, resumed
    assert "(2 RL steps)" in resumed
    assert sorted(p.name for p in (runs / "tiny-2" / "checkpoints").iterdir()) == ["last.ckpt"]
    assert sorted(p.name for p in runs.iterdir()) == ["tiny", "tiny-2"]
    a = _policy(runs / "tiny" / "checkpoints" / "last.ckpt")
    b = _policy(runs / "tiny-2" / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
