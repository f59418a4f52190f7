"""A video that opens but fails to decode mid-step: its prompt is skipped, counted and named.

The bad file is a real mp4 whose middle bytes are zeroed: decord opens it and decodes frame 0
(so it passes the load-time `video_check="open"`), and fails on the frames a rollout reads.
Training goes on past it; `data.fail_fast=true` stops with one line instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from paravt.data.datasets import BadRowError, load_samples
from paravt.run.build import build_run
from paravt.run.summary import summary
from paravt.video.writer import write_video
from tests.modules.test_grpo_training import Batches

ROOT = Path(__file__).resolve().parents[2]
SCALE = [
    "model=tiny_qwen3",
    "data=needle",
    "trainer=cpu",
    "trainer.max_steps=3",
    "data.batch_size=1",
    "data.shuffle=false",
    "rollout.group_size=2",
    "rollout.frame_budget=4",
    "rollout.agent.max_rounds=1",
    "rollout.agent.max_new_tokens=8",
    "rollout.agent.max_total_tokens=4096",
    "callbacks.frame_budget_gating.frame_budgets=[4]",
    "callbacks.benchmark_validation=null",
    "callbacks.rollout_logger.every_n_steps=1",
    "export_hf=false",
]


def corrupt_mid_file(path: Path) -> Path:
    """A 10 s noise mp4 with 20 kB zeroed at 60% of the file: frame 0 decodes, later ones fail."""
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (64, 64, 3), dtype=np.uint8) for _ in range(40)]
    write_video(path, frames, fps=4.0)
    data = bytearray(path.read_bytes())
    at = int(len(data) * 0.6)
    data[at : at + 20_000] = bytes(20_000)
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="module")
def rows_with_a_bad_video(tmp_path_factory, needle_dir) -> Path:
    """[bad, good]: the first needle row twice, once with its video swapped for a corrupt one."""
    folder = tmp_path_factory.mktemp("midstep")
    good = json.loads((needle_dir / "train.jsonl").read_text().splitlines()[0])
    good["videos"][0]["video"] = str((needle_dir / good["videos"][0]["video"]).resolve())
    bad = json.loads(json.dumps(good))
    bad["id"] = "bad_prompt"
    bad["videos"][0]["video"] = str(corrupt_mid_file(folder / "corrupt.mp4"))
    path = folder / "train.jsonl"
    path.write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    return path


def _cfg(tmp_path, tiny_dir, train_path, *extra):
    overrides = [
        *SCALE,
        f"run_dir={tmp_path}",
        f"model.path={tiny_dir}",
        "model.build_tiny=null",
        f"data.train_path={train_path}",
        "data.eval_path=null",
        "data.generate=null",
        *extra,
    ]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_the_corrupt_file_passes_the_load_check(rows_with_a_bad_video):
    samples, report = load_samples(rows_with_a_bad_video, video_check="open")
    assert [s.id for s in samples] == ["bad_prompt", samples[1].id] and report.video_errors == 0


@pytest.mark.slow
def test_a_video_failing_mid_step_is_skipped_counted_and_named(
    tmp_path, tiny_qwen3_dir, rows_with_a_bad_video, caplog
):
    cfg = _cfg(tmp_path, tiny_qwen3_dir, rows_with_a_bad_video)
    run = build_run(cfg)
    seen = Batches()
    run.trainer.callbacks.append(seen)
    with caplog.at_level(logging.WARNING):
        run.trainer.fit(run.module, datamodule=run.datamodule)
    dm = run.datamodule
    # Steps 0 and 2 draw the bad prompt (batch size 1): empty steps, training goes on.
    assert run.trainer.global_step == 3
    good_id = next(i for _, ids in seen.prompts for i in ids)
    assert good_id != "bad_prompt" and seen.prompts == [(0, ()), (1, (good_id,)), (2, ())]
    corrupt = str(rows_with_a_bad_video.parent / "corrupt.mp4")
    assert list(dm.bad_videos) == [corrupt] and dm.skipped_prompts == 2
    # One warning naming the file, at the first failure; the second time it is not retried.
    warnings = [r.getMessage() for r in caplog.records if "failed to decode" in r.getMessage()]
    assert len(warnings) == 1 and corrupt in warnings[0] and "bad_prompt" in warnings[0]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("rollout/skipped_prompts")] == [1.0, 0.0, 1.0]
    assert [e.value for e in acc.Scalars("data/skipped_prompts")] == [1.0, 1.0, 2.0]
    assert acc.Scalars("data/undecodable_videos")[-1].value == 1.0
    text = summary(cfg, run)
    assert "skipped: 1 video(s) undecodable during training, 2 prompt draw(s) left out" in text
    assert corrupt in text
    # The count survives a resume: it is part of the DataModule's checkpointed state.
    assert dm.state_dict()["skipped_prompts"] == 2


@pytest.mark.slow
def test_fail_fast_stops_at_the_bad_video_naming_it(
    tmp_path, tiny_qwen3_dir, rows_with_a_bad_video
):
    cfg = _cfg(tmp_path, tiny_qwen3_dir, rows_with_a_bad_video, "data.fail_fast=true")
    run = build_run(cfg)
    with pytest.raises(BadRowError, match=r"corrupt\.mp4.*fail_fast"):
        run.trainer.fit(run.module, datamodule=run.datamodule)


def test_a_mixed_batch_keeps_the_good_prompts_group_major(tiny_qwen3_dir, rows_with_a_bad_video):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.agent.loop import VIDEO_ERROR, AgentConfig
    from paravt.modules.rollout_datamodule import RolloutConfig, RolloutDataModule

    class Policy:  # the RolloutPolicy Protocol, without Lightning
        policy = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)
        processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
        policy_version, model_path = 0, str(tiny_qwen3_dir)

    agent = AgentConfig(max_rounds=1, max_new_tokens=4, max_total_tokens=4096)
    rollout = RolloutConfig(group_size=2, frame_budget=4, agent=agent)
    dm = RolloutDataModule(
        str(rows_with_a_bad_video), batch_size=2, max_steps=1, shuffle=False, rollout=rollout
    )
    dm.setup("fit")
    bad, good = dm.train_samples
    batch = dm.generate_rollouts(next(iter(dm.train_dataloader())), Policy())
    assert batch.samples == (good,) and len(batch.trajectories) == 2
    assert [t.sample_id for t in batch.trajectories] == [good.id, good.id]
    assert [sid for sid, _ in batch.skipped] == [bad.id] and "corrupt.mp4" in batch.skipped[0][1]
    assert batch.counts["data/skipped_prompts"] == 1.0
    # Held-out evaluation keeps one trajectory per sample: the bad one is empty, scored wrong.
    trajs = dm.evaluate(Policy(), [bad, good])
    assert [t.finish_reason == VIDEO_ERROR for t in trajs] == [True, False]
    assert trajs[0].token_ids == () and list(dm.eval_video_errors) == [bad.video]


def test_load_time_skips_are_counted_and_summarised(tmp_path, rows_with_a_bad_video):
    from paravt.modules.rollout_datamodule import RolloutDataModule
    from paravt.run.summary import _skip_lines

    rows = rows_with_a_bad_video.read_text().splitlines()
    good = json.loads(rows[1])
    missing = json.loads(json.dumps(good)) | {"id": "no_video"}
    missing["videos"] = [{"video": str(tmp_path / "gone.mp4")}]
    broken = {"id": "no_prompt", "videos": good["videos"]}  # a row without its prompt field
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (good, missing, broken)) + "\n")
    dm = RolloutDataModule(str(path), batch_size=1, max_steps=1)
    dm.setup("fit")
    assert [s.id for s in dm.train_samples] == [good["id"]]
    counts = dm.skip_counts()
    assert (counts["data/bad_rows"], counts["data/bad_videos_at_load"]) == (1.0, 1.0)
    head, *reasons = _skip_lines(dm)
    assert head == "skipped: 1 bad row(s) at load, 1 unusable video(s) at load"
    assert any("gone.mp4" in r for r in reasons) and any("no_prompt" in r for r in reasons)
