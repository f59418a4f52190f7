"""Tests of paravt.rl.metrics (named test_rl_metrics so it cannot clash with other test_metrics)."""

from __future__ import annotations

import math

import pytest
import torch

from paravt.rl.metrics import f_tau, kappa


def test_f_tau_and_kappa_hand_computed() -> None:
    # (0.2 + 0.4 + 0.9) / 3 = 0.5; (0 + 2 + 1 + 1) / 4 = 1.0
    assert f_tau([0.2, 0.4, 0.9]) == pytest.approx(0.5)
    assert kappa([0, 2, 1, 1]) == 1.0
    assert f_tau(torch.tensor([[1.0, 0.0], [0.0, 0.0]])) == 0.25  # any shape, flattened
    assert kappa(torch.tensor([3])) == 3.0


def test_empty_inputs_are_zero_not_nan() -> None:
    for value in (f_tau([]), kappa([]), f_tau(torch.tensor([])), kappa(torch.zeros(0, 8))):
        assert value == 0.0 and not math.isnan(value)


def test_format_compliance_is_r_fmt_in_unit_interval():
    from paravt.rewards.compose import RewardWeights, compute_reward
    from paravt.rl.metrics import format_compliance
    from paravt.types import RewardBreakdown

    good = "<think>\nThe red square is at 12 s.</think>\n<answer>B</answer>"
    # f_tau averages R_fmt itself, anchor included, clipped at 1 (0.7 + 0.35 + 0.1 -> 1).
    assert format_compliance(compute_reward(good, "B", "mcq")) == 1.0
    legacy = compute_reward(good, "B", "mcq", weights=RewardWeights(format_formula="mean"))
    assert legacy.format > 1.0 and format_compliance(legacy) == 1.0
    # an answer outside the tags: think 0.2 + 0.5 * 0.4 closed think + balance 0.1 = 0.5
    outside = compute_reward("<think>\nI compare the frames.</think> B", "B", "mcq")
    assert format_compliance(outside) == pytest.approx(0.5)
    # an unclosed think alone: -0.5 * 0.3, kept (the reference clips from above only)
    unclosed = compute_reward("<think>\nI compare the frames and", "B", "mcq")
    assert format_compliance(unclosed) == pytest.approx(0.2 - 0.15)
    assert format_compliance(RewardBreakdown(total=-0.15, format=-0.15)) == -0.15
    assert format_compliance(RewardBreakdown(total=0.4, format=0.4)) == 0.4


def test_drift_metrics_count_the_prior_tag_and_dropped_closers():
    from paravt.rl.metrics import drift_metrics, dropped_closers

    good = '<think>\nlook</think><tool_call>{"name": "crop_video"}</tool_call>'
    reverted = "<think>\nlook</think><tool_code>crop_video(1, 5)"  # prior tag, unclosed
    lost = "<think>\nI think the answer<answer>B"  # think and answer left open
    assert [dropped_closers(t) for t in (good, reverted, lost)] == [0, 1, 2]
    # </tool_code> without an opener is not the prior's tag and drops nothing
    assert dropped_closers("</tool_code>") == 0
    m = drift_metrics([good, reverted, lost, good + "<answer>B</answer>"])
    assert m["drift/tag_reversion"] == pytest.approx(1 / 4)
    assert m["drift/dropped_closers"] == pytest.approx(3 / 4)
    assert m["drift/dropped_any"] == pytest.approx(2 / 4)
    assert m["drift/no_answer"] == pytest.approx(3 / 4)
    assert set(drift_metrics([]).values()) == {0.0}


DIRECT = "<think>\nThe red square is at 12 s.</think>\n<answer>B</answer>"
TOOL = (
    '<think>\nThe frames are too sparse.</think>\n<tool_call>{"name": "crop_video", '
    '"arguments": {"start_time": 0, "end_time": 16}}</tool_call>'
    "The crops show it.</think>\n<answer>B</answer>"
)


def test_the_ruler_reads_every_arm_the_same_where_r_fmt_does_not():
    from paravt.rewards.compose import RewardWeights, compute_reward
    from paravt.rl.metrics import format_compliance, ruler_format

    arms = {
        "para_grpo": RewardWeights(),  # anchor weight 0.5, answer-suffix credits
        "gating_only": RewardWeights(anchor_weight=0.0),
        "vanilla": RewardWeights(anchor_weight=0.0, answer_suffix=False),
    }
    own = {
        arm: format_compliance(compute_reward(DIRECT, "B", "mcq", weights=w))
        for arm, w in arms.items()
    }
    # the arms' own R_fmt of one direct answer: 0.2 + 0.5 + 0.1 + 0.5 * 0.7 -> 1 (clipped),
    # 0.2 + 0.5 + 0.1 = 0.8, and the vanilla credits 0.3 + 0.3 + 0.1 = 0.7
    assert own == pytest.approx({"para_grpo": 1.0, "gating_only": 0.8, "vanilla": 0.7})
    # the ruler: 0.8 whatever the arm trains with
    assert ruler_format(DIRECT) == pytest.approx(0.8)
    # a tool rollout adds the think -> call bonus: 0.2 + 0.5 + 0.3 = 1.0 (+ 0.1 balance, clipped;
    # its two </think> leave the tags unbalanced, which the clip hides)
    assert ruler_format(TOOL) == pytest.approx(1.0)
    # an unclosed think alone: think 0.2, no anchor penalty on the ruler, tags unbalanced
    assert ruler_format("<think>\nI compare the frames and") == pytest.approx(0.2)
    # an answer outside the tags: think 0.2 + balance 0.1; a degenerate text: 0
    assert ruler_format("<think>\nI compare the frames.</think> B") == pytest.approx(0.3)
    assert ruler_format("<think>\n<|im_start|>user\nuser\nuser") == 0.0


def test_rollout_metrics_log_the_ruler_the_anchor_term_and_reversions():
    from paravt.rewards.compose import RewardWeights, compute_reward
    from paravt.rl.objective import rollout_metrics
    from paravt.types import ParsedCall, ToolCall, Trajectory, Turn

    call = ParsedCall(0, "<tool_call>...", call=ToolCall("crop_video", {}))
    code = ParsedCall(0, "<tool_code>...", error="<tool_code> is not a tool call here")

    def traj(*turns: Turn) -> Trajectory:
        return Trajectory("s", 0, (1,), (1,), (0.0,), (), 0, turns=turns, num_calls=1)

    unclosed = "<think>\nI compare the frames and"
    trajs = [
        traj(Turn("<think>\nlook closer now</think><tool_code>crop_video(1, 2)", calls=(code,)),
             Turn(DIRECT[len("<think>\n") :])),
        traj(Turn("<think>\nlook closer now</think><tool_call>{}</tool_call>", calls=(call,))),
        traj(Turn(DIRECT)),
        traj(Turn(unclosed)),
    ]  # fmt: skip
    rewards = [
        compute_reward(
            t.response_text,
            "B",
            "mcq",
            weights=RewardWeights(anchor_weight=0.0),
            num_valid_calls=0,  # R_tool plays no part in the figures checked here
            num_tool_responses=0,
        )
        for t in trajs
    ]
    m = rollout_metrics(trajs, rewards)
    # two tool turns, one in <tool_code>
    assert m["tag_reversion"] == 0.5 and m["rollout/reversions"] == 0.25
    # on the ruler: think 0.2 + answer 0.5 + think -> call 0.3 (the open <tool_code> body runs
    # to the end and holds a call; tags unbalanced) = 1.0; think 0.2 + balance 0.1 (a call
    # without "name" is not parseable) = 0.3; the direct answer 0.8; the unclosed think 0.2
    ruler = (1.0, 0.3, 0.8, 0.2)
    # anchor bonus before its weight: 0.4 + 0.3, 0.4, 0.4 + 0.3, -0.3 (paid by no arm here)
    assert m["f_tau_anchor"] == pytest.approx((0.7 + 0.4 + 0.7 - 0.3) / 4)
    assert m["f_tau_ruler"] == pytest.approx(sum(ruler) / 4)
