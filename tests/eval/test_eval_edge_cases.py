"""evaluate.py on edge cases: a one-frame video goes through the whole protocol, and an out_dir
of another run is refused before any model is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from paravt.eval.results import METRICS, PREDICTIONS, check_run_identity
from paravt.video.writer import write_video

ROOT = Path(__file__).resolve().parents[2]
FAST = ["device=cpu", "protocol.frame_budget=4", "rollout.agent.max_new_tokens=4", "mode=parallel"]


def _cfg(overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("eval", overrides=overrides)


@pytest.fixture
def one_frame_split(tmp_path, needle_dir) -> Path:
    """The needle eval split's first row twice: as is, and with a one-frame mp4 as its video."""
    first = json.loads((needle_dir / "eval.jsonl").read_text().splitlines()[0])
    first["videos"][0]["video"] = str((needle_dir / first["videos"][0]["video"]).resolve())
    still = json.loads(json.dumps(first))
    still["id"] = "one_frame"
    frame = np.full((64, 64, 3), 200, np.uint8)
    still["videos"][0]["video"] = str(write_video(tmp_path / "still.mp4", [frame], fps=1.0))
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(still) + "\n")
    return path


def test_a_one_frame_video_is_evaluated_like_any_other(tmp_path, tiny_qwen3_dir, one_frame_split):
    from evaluate import evaluate

    out = tmp_path / "out"
    overrides = [f"model.path={tiny_qwen3_dir}", f"benchmark.annotations={one_frame_split}"]
    metrics = evaluate(_cfg([*overrides, f"out_dir={out}", *FAST]))
    assert metrics["num_samples"] == 2 and metrics["video_errors"] == 0
    records = {r["id"]: r for r in map(json.loads, (out / PREDICTIONS).read_text().splitlines())}
    still = records["one_frame"]
    # The model saw the single frame (repeated to the overview budget) and answered something.
    assert still["error"] is None and not still["video_missing"]
    assert still["finish_reason"] in {"stop", "length"}
    assert json.loads((out / METRICS).read_text())["metrics"]["num_samples"] == 2


def test_another_runs_out_dir_is_refused_before_the_model_is_loaded(
    tmp_path, tiny_qwen3_dir, one_frame_split
):
    from evaluate import evaluate

    # A model folder with a config but no weights: loading it would fail with another error.
    unloadable = tmp_path / "no_weights"
    unloadable.mkdir()
    shutil.copy(tiny_qwen3_dir / "config.json", unloadable / "config.json")
    out = tmp_path / "out"
    check_run_identity(str(out.mkdir() or out), {"model": "/models/another", "benchmark": "needle"})
    overrides = [f"model.path={unloadable}", f"benchmark.annotations={one_frame_split}"]
    with pytest.raises(ValueError, match=r"another run \(.*model: '/models/another' then"):
        evaluate(_cfg([*overrides, f"out_dir={out}", *FAST]))
    assert sorted(p.name for p in out.iterdir()) == ["run_config.json"]  # nothing else written
