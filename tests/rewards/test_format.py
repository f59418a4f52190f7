"""format_reward terms of paravt's "credits" and "mean" formulas, and the degenerate guard.

The default, the reference release's formula, is tested in test_format_reference.py.
"""

import math
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt.rewards.format import FormatTerms, format_reward, is_degenerate

# paravt's second formula (the default before the reference release's rules).
credits = partial(format_reward, formula="credits")

GOOD = "<think>\nThe red square is at 12 s.</think>\n<answer>B</answer>"
TOOL = (
    "<think>\nI need a closer look.</think>\n"
    '<tool_call>{"name": "crop_video", "arguments": {}}</tool_call>\n'
    '<tool_call>{"name": "crop_video", "arguments": {}}</tool_call>\n'
    "<think>\nThe second crop shows red.</think>\n<answer>B</answer>"
)


def test_perfect_single_turn() -> None:
    terms = credits(GOOD)
    assert (terms.think, terms.answer, terms.order, terms.balance) == (1.0, 1.0, 1.0, 1.0)
    assert terms.base == 1.0
    assert (terms.closed_think, terms.flow, terms.unclosed_think) == (1.0, 1.0, 0.0)
    # anchor = 0.4 + 0.3 = 0.7; total = clip(1 + 0.5 * 0.7 = 1.35) = 1.0
    assert terms.anchor == pytest.approx(0.7)
    assert terms.total == 1.0
    assert credits(GOOD, formula="mean").total == pytest.approx(1.35)


THOUGHT = "I compare the overview frames and the crop."
CREDITS_SCORES = {
    # The "credits" formula's R_fmt of typical completions. Hand computation with
    # credit weights 0.25, anchor weight 0.5, clip to [0, 1]:
    "no think": ("<answer>B</answer>", 0.5),  # answer + balance = 0.5
    # the forced prefix left open, then the answer: answer 0.25 + balance 0.5 * 0.25
    # - 0.5 * 0.3 = 0.225
    "unclosed think": ("<think>\n<answer>B</answer>", 0.225),
    # think + balance 0.5, + 0.5 * 0.4 closed substantive think = 0.7
    "answer outside tags": (f"<think>\n{THOUGHT}</think>\nThe answer is B.", 0.7),
    # answer + order + balance 0.75, + 0.5 * 0.3 flow = 0.9
    "too-short think": ("<think>\nok</think>\n<answer>B</answer>", 0.9),
    # think + order + balance 0.75, + 0.5 * 0.4 = 0.95
    "only tool calls": (
        f'<think>\n{THOUGHT}</think>\n<tool_call>{{"name": "crop_video"}}</tool_call>',
        0.95,
    ),
    "full": (GOOD, 1.0),  # 1 + 0.5 * 0.7 = 1.35, clipped
}


@pytest.mark.parametrize("case", sorted(CREDITS_SCORES))
def test_credits_formula_scores(case: str) -> None:
    text, expected = CREDITS_SCORES[case]
    assert credits(text).total == pytest.approx(expected)


def test_perfect_multi_turn_with_parallel_calls() -> None:
    assert credits(TOOL).total == 1.0


def test_tool_call_before_any_think_loses_order() -> None:
    text = '<tool_call>{"name": "crop_video"}</tool_call>\n<think>\nNow it is clear.</think>'
    terms = credits(text + "<answer>B</answer>")
    assert terms.order == 0.0
    # think 1, answer 1, order 0, balance 1 -> base 3/4; anchor 0.4 + 0.3 (think precedes answer)
    assert terms.base == pytest.approx(0.75)
    assert terms.total == 1.0  # clip(0.75 + 0.5 * 0.7 = 1.1)


def test_unclosed_think_penalty() -> None:
    terms = credits("<think>\nI keep thinking forever <answer>B</answer>")
    # think content runs to the next tag: "I keep thinking forever" >= 10 chars -> think 1;
    # answer 1; order 0 (no closed think before the answer); balance: think unbalanced,
    # answer balanced -> 1/2. base = 0.25 * (1 + 1 + 0 + 0.5) = 0.625
    assert (terms.think, terms.answer, terms.order, terms.balance) == (1.0, 1.0, 0.0, 0.5)
    assert terms.base == pytest.approx(0.625)
    # anchor = -0.3 (no closed think, no flow); total = 0.625 - 0.15 = 0.475
    assert (terms.closed_think, terms.flow, terms.unclosed_think) == (0.0, 0.0, 1.0)
    assert terms.total == pytest.approx(0.475)
    # The penalty alone would go below 0: clipped, R_fmt stays in [0, 1].
    assert credits("<think>\nhm").total == 0.0
    assert credits("<think>\nhm", formula="mean").total == pytest.approx(-0.15)


def test_short_think_is_not_substantive() -> None:
    terms = credits("<think>\nok</think><answer>B</answer>")
    # "ok" < 10 chars: think 0, closed_think 0; flow still 1 (closed think precedes answer)
    # base = 0.25 * (0 + 1 + 1 + 1) = 0.75; anchor 0.3; total = 0.75 + 0.15 = 0.9
    assert (terms.think, terms.closed_think, terms.flow) == (0.0, 0.0, 1.0)
    assert terms.total == pytest.approx(0.9)
    # exactly 10 characters counts (the boundary is >=)
    assert credits("<think>0123456789</think>").think == 1.0
    assert credits("<think>012345678</think>").think == 0.0


def test_empty_answer_gets_no_answer_credit_nor_flow() -> None:
    terms = credits("<think>\nlong enough thought</think><answer>  </answer>")
    assert (terms.answer, terms.flow) == (0.0, 0.0)


def test_drifted_tool_code_and_missing_closers() -> None:
    text = "<think>\nLet me crop the video.</think>\n<tool_code>crop_video(1, 2)</tool_code>"
    terms = credits(text)
    # <tool_code> is not a tool call and there is no answer: no action -> order 0;
    # think 1, answer 0, balance 1 (only think present, balanced) -> base 0.25 * 2 = 0.5
    assert (terms.think, terms.answer, terms.order, terms.balance) == (1.0, 0.0, 0.0, 1.0)
    assert terms.total == pytest.approx(0.5 + 0.5 * 0.4)
    unclosed_call = credits("<think>\nLet me crop it.</think><tool_call>{")
    # think balanced, tool_call unbalanced -> balance 1/2; order 1 (closed think first)
    assert (unclosed_call.balance, unclosed_call.order) == (0.5, 1.0)


def test_balance_details() -> None:
    # A stray closer and a nested opener both unbalance their pair.
    assert credits("</think><answer>B</answer>").balance == pytest.approx(0.5)
    assert credits("<answer><answer>B</answer>").balance == 0.0
    # No tags at all: no balance credit (tag-free text is not well formatted).
    assert credits("just text").balance == 0.0
    assert credits("").total == 0.0


def test_weights_are_parameters() -> None:
    terms = credits(
        "<think>\nok</think><answer>B</answer>",
        think_weight=0.5,
        answer_weight=0.25,
        order_weight=0.0,
        balance_weight=0.25,
        anchor_weight=1.0,
        flow_bonus=0.25,
    )
    # base = 0.5*0 + 0.25*1 + 0*1 + 0.25*1 = 0.5; anchor = 0.25 (flow only); total = 0.75
    assert terms.base == pytest.approx(0.5)
    assert terms.total == pytest.approx(0.75)
    # The "mean" formula normalises the weights: (0.25 + 0.25) / 1.0 = 0.5, + 0.25 unclipped.
    legacy = credits(
        "<think>\nok</think><answer>B</answer>",
        think_weight=2.0,
        answer_weight=1.0,
        order_weight=0.0,
        balance_weight=1.0,
        anchor_weight=1.0,
        flow_bonus=0.5,
        formula="mean",
    )
    # base = (2*0 + 1*1 + 0*1 + 1*1) / 4 = 0.5; anchor = 0.5 (flow only); total = 0.5 + 1*0.5
    assert (legacy.base, legacy.total) == pytest.approx((0.5, 1.0))
    with pytest.raises(ValueError, match="unknown format formula 'sum'"):
        credits(GOOD, formula="sum")
    zero = credits(GOOD, think_weight=0, answer_weight=0, order_weight=0, balance_weight=0)
    assert zero.base == 0.0
    with pytest.raises(ValueError, match="order_weight must be a finite number >= 0"):
        credits(GOOD, order_weight=-1.0)
    with pytest.raises(ValueError, match="anchor_weight"):
        credits(GOOD, anchor_weight=math.nan)


def test_as_dict_has_every_term() -> None:
    d = credits(GOOD).as_dict()
    assert d["format/total"] == 1.0
    assert len(d) == len(FormatTerms.__dataclass_fields__) == 10


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n ",
        "<think>\n",  # the forced prefix alone
        "<|im_start|>assistant",
        "<|im_start|>assistant\n<|im_start|>assistant\n",
        "user\nuser\nuser\nuser\n",
        "assistant\nB",  # a short echo of a role line
        "<|video_pad|><|video_pad|><|video_pad|>",
        "user\nuser\nuser\nassistant\nsome words here",  # mostly role lines
    ],
)
def test_degenerate(text: str) -> None:
    assert is_degenerate(text)


@pytest.mark.parametrize(
    "text",
    [
        "B",
        GOOD,
        TOOL,
        GOOD + "<|im_end|>",  # end-of-turn tokens are healthy
        "<think>\nThe user asked about colour; the user wants the red one.</think>",
        "Here the assistant would answer: the red square appears at twelve seconds.\nuser",
    ],
)
def test_not_degenerate(text: str) -> None:
    assert not is_degenerate(text)


_TAGGY = st.lists(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
            "<tool_call>",
            "</tool_call>",
            "x" * 12,
            "B",
            "\n",
            "<|im_start|>",
            "user",
            "<tool_code>",
            " ",
        ]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=300), _TAGGY))
def test_format_reward_is_total_and_bounded(text: str) -> None:
    terms = credits(text)
    values = list(terms.as_dict().values())
    assert all(math.isfinite(v) for v in values)
    assert 0.0 <= terms.base <= 1.0
    assert 0.0 <= terms.total <= 1.0  # R_fmt in [0, 1], as in the paper
    legacy = credits(text, formula="mean")
    # the legacy total lies in [-0.5 * 0.3, 1 + 0.5 * 0.7]
    assert -0.15 - 1e-9 <= legacy.total <= 1.35 + 1e-9
    assert isinstance(is_degenerate(text), bool)
    reference = format_reward(text)  # clipped at 1 from above only
    assert -0.15 - 1e-9 <= reference.total <= 1.0
    assert reference.total == min(1.0, reference.base + reference.anchor * 0.5) or (
        abs(reference.total - min(1.0, reference.base + 0.5 * reference.anchor)) < 1e-9
    )
