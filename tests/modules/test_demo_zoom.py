"""experiment=demo_zoom end to end at a tiny scale: its data carry the badge only a zoom reads,
its teacher runs crop_video and zoom on the real mp4 files (decord), R_tool and the tool metrics
count each tool, and a cold start plus one RL step print the per-tool shares. Whether RL learns
to combine the tools is the full run's question (docs/results.md), not this test's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paravt.agent.scripts import teacher_calls
from paravt.run.build import build_run, maybe_cold_start
from paravt.run.coldstart import teacher_trajectories
from paravt.run.summary import summary
from paravt.video.detail import BADGES
from tests.modules.test_grpo_training import compose_cfg

TINY = [
    "trainer=cpu",
    "trainer.max_steps=1",
    "trainer.enable_progress_bar=false",
    "data.batch_size=1",
    "data.generate.num_train=4",
    "data.generate.num_eval=2",
    "rollout.group_size=2",
    "cold_start.steps=2",
    "cold_start.oracle_steps=1",
    "cold_start.batch_size=2",
    "cold_start.eval_limit=2",
    "cold_start.report_limit=2",
    "callbacks.benchmark_validation.limit=1",
    "callbacks.benchmark_validation.at_start=false",
    "name=demo_zoom_test",
]


@pytest.fixture(scope="module")
def zoom_run(tiny_qwen3_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo_zoom")
    data = tmp / "needle_zoom"
    paths = [f"data.generate.out_dir={data}", f"data.train_path={data / 'train.jsonl'}"]
    paths += [f"data.eval_path={data / 'eval.jsonl'}", f"run_dir={tmp / 'run'}"]
    model = [f"model.path={tiny_qwen3_dir}", "model.build_tiny=null"]
    cfg = compose_cfg(["experiment=demo_zoom", *TINY, *paths, *model])
    run = build_run(cfg)
    run.datamodule.prepare_data()  # generates the badge videos into tmp
    run.datamodule.setup("fit")
    run.datamodule.connect(run.module)
    return cfg, run


def _stripes(frames) -> tuple[float, float]:
    """Mean |difference| of neighbouring rows and of neighbouring columns of the frames' top-left
    quarter (grey levels): horizontal stripes vary down the rows, vertical ones along them."""
    corner = frames.pixels[:, : frames.pixels.shape[1] // 2, : frames.pixels.shape[2] // 2]
    corner = corner.astype(float).mean(axis=-1)
    rows = np.abs(np.diff(corner, axis=1)).mean()
    cols = np.abs(np.diff(corner, axis=2)).mean()
    return float(rows), float(cols)


def test_each_tool_runs_on_the_mp4s_and_only_the_zoom_shows_the_badge(zoom_run):
    cfg, run = zoom_run
    samples = run.datamodule.train_samples
    assert {s.extra["badge"] for s in samples} <= set(BADGES)
    agent = run.datamodule.agent
    assert list(agent.executor.tools) == ["crop_video", "zoom"]
    from hydra.utils import instantiate

    both = replace(instantiate(cfg.cold_start), teacher_mix={}, strategy="both")
    trajs = teacher_trajectories(agent, samples, both)
    for traj, sample in zip(trajs, samples, strict=True):
        results = traj.turns[0].results
        # two 16 s crops at 0.5 fps (8 frames of 64x64 px), then the zoom (2 frames, 64x64)
        assert [r.name for r in results] == ["crop_video", "crop_video", "zoom"]
        assert all(r.ok for r in results)
        assert [r.frames.pixels.shape[:3] for r in results] == [(8, 64, 64)] * 2 + [(2, 64, 64)]
        rows, cols = _stripes(results[2].frames)
        # The zoom shows 2 px stripes: across them neighbours differ by ~100 grey levels, along
        # them by a few; which way round is the sample's badge.
        across, along = (rows, cols) if sample.extra["badge"] == "horizontal" else (cols, rows)
        assert across > 4 * along and across > 20
        # The crops at 64x64 see no stripes: at most a few grey levels either way.
        crop_rows, crop_cols = _stripes(results[0].frames)
        assert max(crop_rows, crop_cols) < 0.5 * across
        reward = run.module.score(traj, sample)
        # both tools' calls earn R_tool (reward.rewarded_tools=null: every tool of the toolbox)
        assert reward.tool >= 0.4  # 0.1 for a call + 0.3 for a response, before any bonus
    # The oracle (the cold start's first steps) shows all the answer needs: a crop around the
    # square's true window, then the zoom on the badge's corner (clean labels for both).
    oracle = teacher_calls(samples[0], "oracle")
    assert len(oracle) == 2 and '"crop_video"' in oracle[0] and '"zoom"' in oracle[1]
    from paravt.rl.tool_metrics import tool_metrics

    metrics = tool_metrics(trajs)
    assert metrics["kappa/crop_video"] == 2.0 and metrics["kappa/zoom"] == 1.0


def test_zoom_alone_earns_r_tool_and_a_cold_start_and_rl_step_report_tool_shares(zoom_run):
    cfg, run = zoom_run
    from hydra.utils import instantiate

    zoom = replace(instantiate(cfg.cold_start), teacher_mix={}, strategy="zoom")
    sample = run.datamodule.train_samples[0]
    (traj,) = teacher_trajectories(run.datamodule.agent, [sample], zoom)
    assert [r.name for r in traj.turns[0].results] == ["zoom"]
    assert run.module.score(traj, sample).tool >= 0.4
    run = maybe_cold_start(cfg, run)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    text = summary(cfg, run, fit_seconds=1.0, total_seconds=2.0)
    head = "held-out share of samples calling each tool (all: every tool; greedy):"
    assert head in text
    table = text.split(head)[1].splitlines()
    assert "before: crop_video" in table[1] and "after: crop_video" in table[1]
    assert [line.split()[0] for line in table[2:5]] == ["K=2", "K=4", "all"]
