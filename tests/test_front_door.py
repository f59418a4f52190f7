"""The front door: a user's mistake prints one line, exits 2 and creates nothing.

train.py runs as a subprocess in an empty folder, exactly as a user would start it; every check
here fails before a model or data set is built, so each run takes about a second.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from paravt.errors import InputPathError, may_build_tiny, may_generate_data, user_message
from paravt.models.loading import PolicySpec, load_policy

ROOT = Path(__file__).resolve().parents[1]


def train(
    train_py, cwd: Path, *overrides: str, full_error: bool = False
) -> subprocess.CompletedProcess:
    env = {"HYDRA_FULL_ERROR": "1"} if full_error else None
    return train_py(f"hydra.run.dir={cwd / 'run'}", *overrides, cwd=cwd, timeout=300, env=env)


def created(cwd: Path) -> list[str]:
    """Everything under cwd except the Hydra run folder (its config copy and log)."""
    return sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*") if "run" not in p.parts)


def test_a_missing_data_path_fails_naming_it_and_creates_nothing(train_py, tmp_path):
    bad = tmp_path / "data" / "nonexistent.parquet"
    (tmp_path / "data").mkdir()
    result = train(train_py, tmp_path, f"data.train_path={bad}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "data.generate.out_dir" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert created(tmp_path) == ["data"]  # no videos, no jsonl, no tiny model, no artifacts/
    assert not list(tmp_path.rglob("*.mp4"))


def test_a_missing_model_path_fails_naming_it_and_builds_no_model(train_py, tmp_path):
    bad = tmp_path / "models" / "nope"
    result = train(train_py, tmp_path, f"model.path={bad}")
    assert result.returncode == 2, result.stderr
    assert str(bad) in result.stderr and "model.tiny_dir" in result.stderr
    assert not bad.exists() and created(tmp_path) == []


def test_a_misspelt_key_under_a_target_is_one_line(train_py, tmp_path):
    result = train(train_py, tmp_path, "+model.pathh=x")
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "pathh" in line and "--cfg job" in line
    assert "Traceback" not in result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1  # nothing else


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("rollout.group_size=0", "rollout.group_size must be an integer >= 1, got 0"),
        ("rollout.max_staleness=-1", "rollout.max_staleness must be an integer >= 0"),
        ("rollout.temperature=0", "rollout.temperature must be a finite number > 0"),
        ("optimizer.lr=-1", "optimizer: Invalid learning rate: -1"),
        ("+optimizer.betas=[2,0.9]", "optimizer: Invalid beta parameter"),
        ("cold_start.lr=0", "cold_start.lr must be a finite number > 0"),
        ("cold_start.steps=1.5", "cold_start.steps must be an integer >= 0, got 1.5"),
        ("model.dtype=foo", "model.dtype='foo': choose one of float32"),
        ("model.tiny.hidden_size=0", "model.tiny.hidden_size must be an integer >= 1, got 0"),
        ("model.tiny.num_heads=3", "model.tiny.hidden_size=64 over num_heads=3"),
        ("+model.tiny.hiden=3", "unexpected keyword argument 'hiden'; valid keys"),
        ("rollout.engine.dtype=foo", "rollout.engine.dtype='foo': choose one of auto"),
        ("ckpt_path=/nonexistent/x.ckpt", "ckpt_path '/nonexistent/x.ckpt' does not exist"),
    ],
)
def test_an_unusable_value_fails_at_once_naming_it(train_py, tmp_path, override, named):
    """Before, these failed minutes in (after the data, the tiny model and the cold start were
    built: the optimizer's lr, a group of 0, a resume checkpoint that is not there), as a
    traceback when the model was built (a dtype, a tiny size) or never (a negative staleness was
    accepted)."""
    result = train(train_py, tmp_path, override)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr.strip().splitlines()[-1] and "Traceback" not in result.stderr
    assert created(tmp_path) == []  # nothing was built


def test_hydra_full_error_still_shows_the_traceback(train_py, tmp_path):
    result = train(train_py, tmp_path, f"data.train_path={tmp_path / 'x.jsonl'}", full_error=True)
    assert result.returncode == 2  # the same exit code as without it
    assert "Traceback" in result.stderr and "InputPathError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: data.train_path")


def test_hydra_config_errors_name_the_key_and_the_experiment(train_py, tmp_path):
    typo = train(train_py, tmp_path, "trainer.max_stepz=3")
    assert typo.returncode != 0 and "max_stepz" in typo.stderr and "Traceback" not in typo.stderr
    unknown = train(train_py, tmp_path, "experiment=nope")
    assert unknown.returncode != 0 and "experiment/nope" in unknown.stderr
    assert "demo" in unknown.stderr  # the available experiments are listed


def test_generation_and_tiny_building_happen_only_in_their_own_folder(tmp_path):
    own = tmp_path / "artifacts" / "needle"
    assert may_generate_data(str(own / "train.jsonl"), str(own))
    assert not may_generate_data("/nonexistent.parquet", str(own))
    assert may_generate_data(str(tmp_path / "x" / "train.jsonl"), None)  # explicit caller
    assert may_build_tiny("artifacts/tiny", "qwen3_vl", "artifacts/tiny/")
    assert not may_build_tiny("/nonexistent", "qwen3_vl", "artifacts/tiny")
    assert not may_build_tiny("artifacts/tiny", None, None)


def test_load_policy_refuses_to_build_a_tiny_model_at_a_user_path(tmp_path):
    spec = PolicySpec(path=str(tmp_path / "typo"), build_tiny="qwen3_vl", tiny_dir="artifacts/x")
    with pytest.raises(InputPathError, match="typo"):
        load_policy(spec)
    assert list(tmp_path.iterdir()) == []


def test_bugs_are_not_dressed_up_as_user_errors():
    assert user_message(KeyError("x")) is None
    message = "data.train_path 'x' does not exist"
    assert user_message(InputPathError(message)) == message


@pytest.mark.parametrize(
    ("value", "kw", "ok"),
    [
        (1, {"least": 1, "integer": True}, True),
        (True, {"least": 0, "integer": True}, False),  # a bool is not a count
        (2.0, {"least": 1, "integer": True}, False),
        (float("nan"), {"above": 0}, False),
        (float("inf"), {"least": 0}, False),
        ("3", {"least": 0}, False),
        (0, {"above": 0}, False),
        (None, {"least": 1, "optional": True}, True),
        (None, {"least": 1}, False),
    ],
)
def test_check_number_refuses_what_no_run_can_use(value, kw, ok):
    from paravt.errors import check_number

    if ok:
        check_number("x.y", value, **kw)
    else:
        with pytest.raises(ValueError, match=r"^x\.y must be "):
            check_number("x.y", value, **kw)


def test_the_prior_stage_checks_its_numbers():
    from paravt.run.prior import PriorConfig

    with pytest.raises(ValueError, match=r"prior\.batch_size must be an integer >= 1"):
        PriorConfig(batch_size=0)
