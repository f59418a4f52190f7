"""compute_reward: the composition, the degenerate guard and the weights."""

import dataclasses
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt.rewards.compose import RewardWeights, compute_reward
from paravt.types import RewardBreakdown

GOOD = "<think>\nThe red square is at 12 s.</think>\n<answer>B</answer>"
TOOL = (
    "<think>\nI need a closer look.</think>\n"
    '<tool_call>{"name": "crop_video", "arguments": {}}</tool_call>\n'
    "<think>\nThe crop shows red.</think>\n<answer>B</answer>"
)


def test_correct_tool_using_trajectory() -> None:
    r = compute_reward(TOOL, "B", "mcq", num_valid_calls=1, num_tool_responses=1)
    assert isinstance(r, RewardBreakdown)
    # R_acc 1; R_fmt = clip(1 + 0.5 * 0.7) = 1; R_tool = 0.3 + 0.5 = 0.8; R = 1 + 1 + 0.8
    assert (r.accuracy, r.format, r.tool) == pytest.approx((1.0, 1.0, 0.8))
    assert r.total == pytest.approx(2.8)
    assert not r.degenerate
    assert r.components["total"] == pytest.approx(2.8)
    assert r.components["format/anchor"] == pytest.approx(0.7)
    assert r.components["degenerate"] == 0.0


def test_wrong_tool_free_trajectory() -> None:
    r = compute_reward(GOOD, "C", "mcq")
    # R_acc 0; R_fmt 1 (clipped from 1.35); R_tool 0 -> 1
    assert r.total == pytest.approx(1.0)
    legacy = compute_reward(GOOD, "C", "mcq", weights=RewardWeights(format_formula="mean"))
    assert legacy.total == pytest.approx(1.35)
    with pytest.raises(ValueError, match="format_formula must be one of reference, credits, mean"):
        RewardWeights(format_formula="clipped")


def test_weights_scale_each_term() -> None:
    weights = RewardWeights(format_weight=2.0, tool_weight=0.5, anchor_weight=0.0)
    r = compute_reward(TOOL, "B", "mcq", num_valid_calls=1, num_tool_responses=1, weights=weights)
    # R_fmt = 1 + 0 * 0.7 = 1; R = 1 + 2 * 1 + 0.5 * 0.8 = 3.4
    assert r.total == pytest.approx(3.4)
    weights = RewardWeights(correct_bonus=0.0, response_reward=0.25)
    r = compute_reward(TOOL, "B", "mcq", num_valid_calls=1, num_tool_responses=1, weights=weights)
    assert r.tool == pytest.approx(0.25)


def test_weights_are_plain_frozen_values() -> None:
    weights = RewardWeights()
    assert all(
        isinstance(getattr(weights, f.name), (int, float, str, type(None)))
        for f in dataclasses.fields(weights)
    )
    assert RewardWeights(rewarded_tools=["zoom"]).rewarded_tools == ("zoom",)  # a tuple
    with pytest.raises(dataclasses.FrozenInstanceError):
        weights.format_weight = 2.0  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"RewardWeights\.tool_weight must be a finite number"):
        RewardWeights(tool_weight=math.inf)


def test_degenerate_scores_zero() -> None:
    r = compute_reward(
        "<|im_start|>assistant\n<|im_start|>assistant",
        "B",
        "mcq",
        num_valid_calls=2,
        num_tool_responses=2,
    )
    assert r.degenerate and r.total == 0.0 and (r.accuracy, r.format, r.tool) == (0, 0, 0)
    assert r.components["degenerate"] == 1.0
    # Same component keys as a healthy reward, so logs line up.
    healthy = compute_reward(GOOD, "B", "mcq")
    assert set(r.components) == set(healthy.components)


def test_forced_prefix_is_part_of_the_text() -> None:
    # With the forced "<think>\n" prefix the anchor bonus is paid; a decode that dropped it
    # (docs/method.md pitfall 2) would leave a stray </think> and lose it.
    own_text = "<think>\nThe red square is at 12 s.</think><answer>B</answer>"
    dropped = own_text.removeprefix("<think>\n")
    assert compute_reward(own_text, "B", "mcq").format == pytest.approx(1.0)
    # dropped (reference formula): no <think> -> no think credit, no anchor; answer 0.3 + 0.2;
    # one </think> against no <think> -> no balance bonus: 0.5
    assert compute_reward(dropped, "B", "mcq").format == pytest.approx(0.5)


def test_open_ended_and_tvg_paths() -> None:
    r = compute_reward(
        "<think>\nThe colour is clear.</think><answer>a red car parked</answer>",
        "the red car",
        "oe",
    )
    assert r.accuracy == pytest.approx(0.8)  # token F1, see test_accuracy
    r = compute_reward(
        "<think>\nIt starts near ten.</think><answer>[0, 10]</answer>", "[5, 15]", "tvg"
    )
    assert r.accuracy == pytest.approx(1 / 3)
    r = compute_reward(GOOD, "x", "oe", open_ended="judge", judge=lambda p, g: 0.5)
    assert r.accuracy == 0.5


def test_pathological_texts_stay_linear() -> None:
    # 20k unclosed tags: a quadratic scan (a lazy regex per tag) took ~16 s here.
    texts = ["<answer>B" * 20000, "<tool_call>" * 20000 + "x", "<think>x" * 20000, "1:" * 50000]
    started = time.monotonic()
    for text in texts:
        for kind in ("mcq", "tvg", "oe"):
            counts = {"num_valid_calls": 0, "num_tool_responses": 0}
            assert math.isfinite(compute_reward(text, "B", kind, **counts).total)
    assert time.monotonic() - started < 8.0  # linear: ~2 s on a busy 2-core machine


_TAGGY = st.lists(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
            "<tool_call>",
            "</tool_call>",
            "thinking hard",
            "B",
            "[1, 2]",
            "\n",
            "<|im_start|>",
            "user",
            "nan",
            "inf",
        ]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(
    text=st.one_of(st.text(max_size=300), _TAGGY),
    gold=st.text(max_size=20),
    kind=st.sampled_from(["mcq", "tvg", "oe"]),
    calls=st.integers(-2, 6),
    responses=st.integers(-2, 6),
)
def test_never_raises_never_nan(
    text: str, gold: str, kind: str, calls: int, responses: int
) -> None:
    r = compute_reward(
        text,
        gold,
        kind,
        options=("red", "blue"),
        num_valid_calls=calls,
        num_tool_responses=responses,
    )
    assert math.isfinite(r.total)
    assert all(math.isfinite(v) for v in r.components.values())
    # Bounds with the default weights: R_acc in [0, 1], R_fmt in [-0.15, 1] (the reference
    # clips from above only), R_tool in [0, 0.8]
    assert -0.15 - 1e-9 <= r.format <= 1.0
    assert -0.15 - 1e-9 <= r.total <= 2.8 + 1e-9


def test_parsed_calls_and_tool_results_give_r_tool() -> None:
    from paravt.types import Frames, ParsedCall, ToolCall, ToolResult

    call = ParsedCall(0, "{...}", call=ToolCall("crop_video", {"start": 1.0, "end": 2.0}))
    frames = Frames(None, (0,), (1.0,), 1.0, 10.0)
    done = ToolResult(0, "crop_video", frames=frames, window=(1.0, 2.0))
    r = compute_reward(TOOL, "B", "mcq", calls=[call], tool_results=[done])
    assert r.tool == pytest.approx(0.8)  # R_tool = 0.3 + 0.5 (a response, a correct answer)
    failed = ToolResult(0, "crop_video", error="window outside the video")
    # A failed call still earns the correctness bonus (the reference's rule): 0.1 + 0.5; with a
    # wrong answer only the call's 0.1.
    assert compute_reward(
        TOOL, "B", "mcq", calls=[call], tool_results=[failed]
    ).tool == pytest.approx(0.6)
    assert compute_reward(
        TOOL, "A", "mcq", calls=[call], tool_results=[failed]
    ).tool == pytest.approx(0.1)
    # Neither calls nor counts for a text that calls a tool: refused, not R_tool = 0.
    with pytest.raises(ValueError, match="pass calls="):
        compute_reward(TOOL, "B", "mcq")
    with pytest.raises(ValueError, match="not both"):
        compute_reward(TOOL, "B", "mcq", calls=[call], num_valid_calls=1)
    assert compute_reward(GOOD, "B", "mcq").tool == 0.0  # no call in the text: 0 is right
    # The calls without what they returned: R_tool would be 0.1 + 0.5 = 0.6 instead of 0.8.
    with pytest.raises(ValueError, match="1 valid calls but nothing says what they returned"):
        compute_reward(TOOL, "B", "mcq", calls=[call])
    with pytest.raises(ValueError, match="pass tool_results="):
        compute_reward(TOOL, "B", "mcq", num_valid_calls=1)
    with pytest.raises(ValueError, match="1 tool responses but no calls"):
        compute_reward(TOOL, "B", "mcq", tool_results=[done])
    # No valid call (a malformed one): nothing can have come back, so R_tool 0 needs no results.
    bad = ParsedCall(0, "{", error="not JSON")
    assert compute_reward(TOOL, "B", "mcq", calls=[bad]).tool == 0.0


@pytest.mark.parametrize("credit", ["think", "answer", "order", "balance"])
def test_credit_weights_under_the_reference_formula_are_refused(credit) -> None:
    # The reference formula has its own rules: RewardWeights(think=0, answer=0, order=0,
    # balance=0) still gave R_fmt 1.0 for GOOD there, without a word.
    with pytest.raises(ValueError, match=rf"RewardWeights: {credit} set.*ignores them"):
        RewardWeights(**{credit: 0.0})
    # Under the credits formula they weigh: all four 0 leave the anchor, clip(0 + 0.5 * 0.7) = 0.35
    zero = dict.fromkeys(("think", "answer", "order", "balance"), 0.0)
    weights = RewardWeights(**zero, format_formula="credits")
    assert compute_reward(GOOD, "B", "mcq", weights=weights).format == pytest.approx(0.35)


def test_a_whole_text_as_the_answer_is_refused() -> None:
    from paravt.rewards.accuracy import accuracy_reward, extract_answer

    text = "<think>\nThe man wears a red coat.</think>\n<answer>a red coat</answer>"
    assert accuracy_reward(extract_answer(text), "a red coat", "oe") == 1.0
    with pytest.raises(ValueError, match=r"pass extract_answer\(text\)"):
        accuracy_reward(text, "a red coat", "oe")
    assert compute_reward(text, "a red coat", "oe").accuracy == 1.0  # extracts it itself


def test_an_agent_programs_posted_reward_is_trained_on_as_asked() -> None:
    """reward.agent_reward: paravt's R, the agent program's posted reward, or their sum."""
    from paravt.rewards.compose import trajectory_reward
    from paravt.types import Sample, Trajectory, Turn

    sample = Sample("s", "v.mp4", "Which?", "B")
    posted = Trajectory("s", 1, (), (), (), (), 0, turns=(Turn(GOOD),), agent_reward=0.25)
    silent = dataclasses.replace(posted, agent_reward=None)
    # GOOD: R_acc 1, R_fmt 1 (the reference formula, clipped), R_tool 0: R = 2.
    assert trajectory_reward(posted, sample).total == pytest.approx(2.0)
    agent = trajectory_reward(posted, sample, RewardWeights(agent_reward="agent"))
    assert agent.total == 0.25 and agent.accuracy == 1.0  # paravt's terms still logged
    assert agent.components["agent"] == 0.25 and agent.components["total"] == 0.25
    both = trajectory_reward(posted, sample, RewardWeights(agent_reward="sum"))
    assert both.total == pytest.approx(2.25)  # 2 + 0.25
    assert trajectory_reward(silent, sample).total == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"rollout s#1 posted no reward.*agent_reward=paravt"):
        trajectory_reward(silent, sample, RewardWeights(agent_reward="agent"))
    with pytest.raises(ValueError, match="paravt, agent, sum"):
        RewardWeights(agent_reward="mine")


def test_the_anchor_reads_well_formed_rollouts_or_all_of_them():
    from paravt.rewards.compose import anchored
    from paravt.rl.algorithm import AlgorithmConfig

    closed = "<think>Look at the frames closely.</think>\n<answer>B</answer>"
    rewards = [
        compute_reward(closed, "B", "mcq"),
        # an unclosed think; no <answer> block
        compute_reward("<think>Look at the frames closely.\n<answer>B</answer>", "B", "mcq"),
        compute_reward("<think>Look at the frames closely.</think>\nB", "B", "mcq"),
    ]
    assert anchored(rewards) == [True, False, False]  # balanced tags and a closed answer
    assert anchored(rewards, "all") == [True, True, True]  # the paper's formula
    with pytest.raises(
        ValueError, match=r"anchor_rollouts must be one of \('well_formed', 'all'\)"
    ):
        anchored(rewards, "parseable")
    with pytest.raises(ValueError, match="anchor_rollouts must be one of"):
        AlgorithmConfig(anchor_rollouts="parseable")
