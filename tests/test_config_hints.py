"""A misspelt override or an unknown experiment: exit 1, Hydra's message naming it, and a hint
with the closest existing name. Subprocesses of train.py / evaluate.py, as a
user runs them; each fails while composing, before anything is built (about a second each)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from paravt.config_hints import typo_hints

ROOT = Path(__file__).resolve().parents[1]


def run(train_py, script: str, tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    run_dir = f"hydra.run.dir={tmp_path / 'run'}"
    return train_py(run_dir, *overrides, script=script, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize(
    ("override", "named", "fix"),
    [
        ("trainer.max_stepz=3", "trainer.max_stepz", "did you mean 'trainer.max_steps'?"),
        ("trainr.devices=2", "trainr", "did you mean 'trainer.devices'?"),
        ("experiment=dem", "experiment/dem", "did you mean experiment=demo?"),
        ("experiment=nope", "experiment/nope", "available: demo, demo_lora,"),
    ],
)
def test_train_py_names_the_bad_key_or_experiment_and_the_fix(
    train_py, tmp_path, override, named, fix
):
    result = run(train_py, "train.py", tmp_path, override)
    assert result.returncode == 1, result.stderr
    assert named in result.stderr and fix in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("hint: ")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_typo_after_an_experiment_is_checked_against_that_experiment(train_py, tmp_path):
    result = run(
        train_py,
        "train.py",
        tmp_path,
        "experiment=paragrpo",
        "ablation=grpo",
        "algorithm.clip_hihg=0.3",
    )
    assert result.returncode == 1
    assert "did you mean 'algorithm.clip_high'?" in result.stderr, result.stderr


def test_evaluate_py_gets_the_same_hints(train_py, tmp_path):
    result = run(train_py, "evaluate.py", tmp_path, "benchmark=videome")
    assert result.returncode == 1
    assert "benchmark=videomme" in result.stderr.splitlines()[-1], result.stderr


def test_no_hint_for_correct_or_deliberate_overrides():
    conf = ROOT / "conf"
    ok = ["trainer.max_steps=3", "+trainer.new_key=1", "~callbacks.progress", "seed=1,2"]
    ok += ["run_dir=/tmp/x", "data.max_steps=3"]  # interpolated values: never resolved here
    assert typo_hints(conf, "train", ok) == []
    assert typo_hints(conf, "train", ["mode=parallel,sequential"]) == []


def test_an_added_key_a_target_does_not_take_gets_the_closest_argument(train_py, tmp_path):
    # `+key=` passes Hydra; the constructor refuses it (paravt.errors: one line, exit 2).
    result = run(train_py, "train.py", tmp_path, "+algorithm.clip_hgh=0.3")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()[-1:]
    assert "clip_hgh" in line and "did you mean 'clip_high'?" in line
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("experiment", "old", "new"),
    [
        ("demo", "cold_start.budgets", "cold_start.frame_budgets"),
        ("demo", "cold_start.report_budgets", "cold_start.report_frame_budgets"),
        ("demo_prior_paragrpo", "prior.budgets", "prior.frame_budgets"),
    ],
)
def test_a_former_frame_budget_key_is_named_with_its_new_name(experiment, old, new):
    hints = typo_hints(ROOT / "conf", "train", [f"experiment={experiment}", f"{old}=[2]"])
    assert len(hints) == 1 and f"the config has no key '{old}'; did you mean '{new}'?" in hints[0]


def test_a_list_of_group_options_is_checked_option_by_option():
    conf = ROOT / "conf"
    assert typo_hints(conf, "train", ["logger=[tensorboard,wandb,mlflow,csv]"]) == []
    (hint,) = typo_hints(conf, "train", ["logger=[tensorboard,wandbb]"])
    assert hint.startswith("hint: no config logger=wandbb in conf/logger/") and "wandb" in hint


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rl.mismatch.mode=mis", "algorithm.engine_is_correction"),
        ("rl.mismatch.level=sequence", "algorithm.engine_is_level"),
        ("rl.mask_truncated=true", "algorithm.mask_truncated"),
        ("monitor.min_kappa=0.5", "callbacks.tool_alarm.min_kappa"),
    ],
)
def test_another_frameworks_name_for_a_key_gets_paravts(override, key):
    conf = ROOT / "conf"
    (hint,) = typo_hints(conf, "train", [override])
    assert f"did you mean '{key}'?" in hint
    assert typo_hints(conf, "train", [f"{key}={override.split('=')[1]}"]) == []


@pytest.mark.parametrize(
    ("config", "override", "key"),
    [
        ("train", "rollout.default_budget=4", "rollout.frame_budget"),
        ("train", "callbacks.frame_budget=null", "callbacks.frame_budget_gating"),
        (
            "train",
            "callbacks.frame_budget.budgets=[2,4]",
            "callbacks.frame_budget_gating.frame_budgets",
        ),
        ("train", "callbacks.frame_budget.seed=3", "callbacks.frame_budget_gating.seed"),
        ("eval", "protocol.num_frames=4", "protocol.frame_budget"),
    ],
)
def test_a_renamed_key_gets_its_new_name(config, override, key):
    conf = ROOT / "conf"
    (hint,) = typo_hints(conf, config, [override])
    assert f"did you mean '{key}'?" in hint
    assert typo_hints(conf, config, [f"{key}={override.split('=')[1]}"]) == []
