"""Per-tool R_tool (`RewardWeights.rewarded_tools`) and per-tool metrics (kappa, errors,
timeouts, latency, frames), on hand-built rollouts whose counts are worked out below."""

from __future__ import annotations

import numpy as np
import pytest

from paravt.rewards.compose import RewardWeights, trajectory_reward
from paravt.rl.objective import rollout_metrics
from paravt.rl.tool_metrics import tool_metrics
from paravt.types import Frames, ParsedCall, Sample, ToolCall, ToolResult, Trajectory, Turn

ANSWER = "<think>\nlook closer at it</think>\n<answer>A</answer>"


def frames(k: int) -> Frames:
    return Frames(np.zeros((k, 32, 32, 3), np.uint8), tuple(range(k)), tuple(range(k)), 1.0, 9.0)


def rollout(*pairs: tuple[str, ToolResult]) -> Trajectory:
    calls = tuple(
        ParsedCall(i, "<tool_call>", call=ToolCall(n, {})) for i, (n, _) in enumerate(pairs)
    )
    results = tuple(r for _, r in pairs)
    turn = Turn("<think>\nlook closer at it</think><tool_call>", calls=calls, results=results)
    return Trajectory(
        "s", 0, (1,), (1,), (0.0,), (), 0,
        turns=(turn, Turn(ANSWER)),
        num_calls=len(calls),
        num_valid_calls=len(calls),
        num_tool_responses=sum(r.ok for r in results),
    )  # fmt: skip


ZOOM_OK = ToolResult(0, "zoom", frames=frames(2), window=(0, 2), latency_s=0.4)
CROP_BAD = ToolResult(1, "crop_video", error="invalid window", latency_s=0.1)
CROP_LATE = ToolResult(0, "crop_video", error="crop_video timed out", timed_out=True, latency_s=30)
CROP_OK = ToolResult(1, "crop_video", frames=frames(4), window=(0, 4), latency_s=0.2)
SAMPLE = Sample("s", "v.mp4", "Q?", "A", "mcq", options=("x", "y"))


def test_r_tool_counts_the_rewarded_tools_only():
    traj = rollout(("zoom", ZOOM_OK), ("crop_video", CROP_BAD))
    # every tool (default): a valid call and a response, correct: 0.3 + 0.5
    assert trajectory_reward(traj, SAMPLE).tool == pytest.approx(0.8)
    # crop_video only: its one call failed, no crop response: 0.1 + 0.5
    only_crop = RewardWeights(rewarded_tools=["crop_video"])
    assert trajectory_reward(traj, SAMPLE, only_crop).tool == pytest.approx(0.6)
    # a tool never called earns nothing, the bonus included
    assert trajectory_reward(traj, SAMPLE, RewardWeights(rewarded_tools=["ocr"])).tool == 0.0
    with pytest.raises(ValueError, match="rewarded_tools must be tool names"):
        RewardWeights(rewarded_tools=[""])


def test_per_tool_kappa_errors_timeouts_latency_and_frames():
    trajs = [
        rollout(("zoom", ZOOM_OK), ("crop_video", CROP_BAD)),
        rollout(("crop_video", CROP_LATE), ("crop_video", CROP_OK)),
    ]
    m = tool_metrics(trajs)
    # crop_video: 3 calls over 2 rollouts; 2 of 3 failed, 1 of 3 timed out; latency
    # (0.1 + 30 + 0.2) / 3 = 10.1; one good result of 4 frames
    assert m["kappa/crop_video"] == 1.5 and m["kappa/zoom"] == 0.5
    assert m["tool/crop_video/errors"] == pytest.approx(2 / 3)
    assert m["tool/crop_video/timeouts"] == pytest.approx(1 / 3)
    assert m["tool/crop_video/latency_s"] == pytest.approx(10.1)
    assert m["tool/crop_video/frames"] == 4.0 and m["tool/zoom/frames"] == 2.0
    assert m["tool/zoom/errors"] == 0.0
    assert m["tools/mixed"] == 0.5  # the first rollout called two tools, the second one
    assert "tools/mixed" not in tool_metrics(trajs[1:])  # crop_video alone: nothing to mix
    rewards = [trajectory_reward(t, SAMPLE) for t in trajs]
    overall = rollout_metrics(trajs, rewards)
    assert overall["kappa"] == 2.0 == overall["kappa/crop_video"] + overall["kappa/zoom"]


def test_the_rollout_inspector_shows_text_results_timeouts_and_a_line_per_tool():
    from paravt.run.inspect import format_counters, format_result

    text = ToolResult(2, "duration", text="20.0 s", latency_s=0.01)
    assert format_result(text) == "[2] duration: 20.0 s"
    assert format_result(CROP_LATE) == "[0] error (timed out): crop_video timed out"
    counters = format_counters(rollout(("zoom", ZOOM_OK), ("crop_video", CROP_BAD)))
    # one call each; crop_video's failed; latencies 0.1 s and 0.4 s
    assert counters.endswith(
        "\n  crop_video: 1 calls, errors 100%, 0.10 s each\n  zoom: 1 calls, errors 0%, 0.40 s each"
    )
