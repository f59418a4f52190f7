"""The default R_fmt: the reference release's rules (paravt/rewards/format_reference.py).

Every expected value is computed by hand from the rules in the module docstring (PARA-GRPO
recipe: answer-suffix credits think 0.2, `<answer>` 0.3, `</answer>` 0.2; anchor weight 0.5).
"""

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt.rewards.format import format_reward
from paravt.rewards.format_reference import (
    has_parseable_tool_call,
    has_substantive_think,
    think_before_tool,
    think_body,
)

LONG = "Crop 30-40 s and compare."  # >= 10 characters after strip
CALL = '<tool_call>{"name": "crop_video", "arguments": {"start": 3}}</tool_call>'


def r(text: str, **kw) -> float:
    return format_reward(text, **kw).total


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # no think, an answer: 0.3 + 0.2, balanced -> + 0.1
        ("<answer>C</answer>", 0.6),
        # the forced prefix left open, short: answer 0.5, anchor -0.15, think unbalanced
        ("<think>\n<answer>C</answer>", 0.35),
        # open think read up to <answer>: 0.2 + 0.5 - 0.15
        (f"<think>\n{LONG}<answer>C</answer>", 0.55),
        # answer outside the tags: think 0.2 + anchor 0.5 * 0.4 + balance 0.1
        (f"<think>{LONG}</think> C", 0.5),
        # short closed think: no think credit, no anchor (needs think); answer + balance
        ("<think>ok</think><answer>C</answer>", 0.6),
        # only a tool call: 0.2 + 0.2 + tool 0.3 + 0.1
        (f"<think>{LONG}</think>{CALL}", 0.8),
        # full flow: 0.2 + 0.5 + 0.35 + 0.1 = 1.15 -> 1.0
        (f"<think>{LONG}</think><answer>C</answer>", 1.0),
        # an unclosed think alone: 0.2 - 0.15 = 0.05, no balance
        (f"<think>{LONG}", 0.05),
        # an unclosed short think alone: -0.15, negative kept (clip from above only)
        ("<think>\nhm", -0.15),
        ("", 0.0),
        ("plain words", 0.0),
    ],
)
def test_hand_computed_scores(text: str, expected: float) -> None:
    assert r(text) == pytest.approx(expected)


def test_think_boundary_ten_characters_after_strip() -> None:
    assert has_substantive_think("<think>  0123456789 \n</think>")
    assert not has_substantive_think("<think>  012345678 \n</think>")
    # the first closed block is read, from the FIRST <think> to the next </think>
    assert think_body("<think>ab</think><think>0123456789abc</think>") == "ab"
    assert not has_substantive_think("<think>ab</think><think>0123456789abc</think>")
    # a stray </think> before the first <think> closes nothing: the open block is read
    assert think_body(f"</think><think>{LONG}") == LONG


@pytest.mark.parametrize("stop", ["<tool_call>", "<tool_code>", "<tool_response>", "<answer>"])
def test_unclosed_think_stops_at_next_tool_answer_or_im_end(stop: str) -> None:
    assert think_body(f"<think>short{stop}{LONG}") == "short"
    assert think_body(f"<think>short<|im_end|>{LONG}") == "short"
    assert think_body(f"<think>{LONG}") == LONG  # or the end of the text


def test_answer_credit_needs_a_non_blank_pair() -> None:
    assert r("<answer> \n </answer>") == 0.0  # blank: no credit, score 0 -> no balance
    assert r("<answer>C") == 0.0  # unclosed: no pair
    # a later pair with a body pays, and both tags are counted once
    assert r("<answer> </answer><answer>C</answer>") == pytest.approx(0.6)
    # answer-suffix off (the reference's vanilla recipe): 0.2 + 0.1, + balance 0.1
    assert r("<answer>C</answer>", answer_suffix=False) == pytest.approx(0.4)
    assert r(f"<think>{LONG}</think>", answer_suffix=False) == pytest.approx(0.3 + 0.2 + 0.1)


def test_anchor_terms_and_weight() -> None:
    full = f"<think>{LONG}</think><answer>C</answer>"
    terms = format_reward(full)
    assert (terms.closed_think, terms.flow, terms.unclosed_think) == (1.0, 1.0, 0.0)
    assert terms.anchor == pytest.approx(0.7)
    # anchor weight 0: 0.2 + 0.5 + 0.1
    assert r(full, anchor_weight=0.0) == pytest.approx(0.8)
    # anchor weight 1 on the unclosed penalty: -0.3
    assert r("<think>hm", anchor_weight=1.0) == pytest.approx(-0.3)
    # flow needs </think> and the think credit, not an order: answer first still pays it
    assert r(f"<answer>C</answer><think>{LONG}</think>") == pytest.approx(1.0)


def test_tool_code_bodies() -> None:
    assert has_parseable_tool_call("<tool_code>\ncrop_video(3, 9)\n</tool_code>")
    assert not has_parseable_tool_call("<tool_code>\n# crop_video(3, 9)\n</tool_code>")
    assert not has_parseable_tool_call("<tool_code>crop_video 3 9</tool_code>")
    assert not has_parseable_tool_call("<tool_code>   </tool_code>")
    assert not has_parseable_tool_call("<tool_code><|im_end|>f(x)</tool_code>")
    # unclosed to the end of the text
    assert has_parseable_tool_call("<tool_code>\n# first\nzoom(1)")
    # prior-dialect call: think 0.2 + anchor 0.2 + tool 0.3 + balance 0.1
    assert r(f"<think>{LONG}</think><tool_code>crop(3, 9)</tool_code>") == pytest.approx(0.8)


def test_tool_call_bodies() -> None:
    assert has_parseable_tool_call(CALL)
    assert not has_parseable_tool_call('<tool_call>{"name": "crop_video"')  # not JSON
    assert has_parseable_tool_call('<tool_call>{"name": "x"}\n')  # unclosed, to the end
    assert not has_parseable_tool_call('<tool_call>{"tool": "x"}</tool_call>')
    assert not has_parseable_tool_call('<tool_call>["name"]</tool_call>')
    assert not has_parseable_tool_call("<tool_call>" + "[" * 100_000 + "</tool_call>")
    # a later closed call still counts after a broken one
    assert has_parseable_tool_call("<tool_call>oops</tool_call>" + CALL)


def test_think_must_precede_the_first_tool_tag() -> None:
    assert think_before_tool(f"<think>x</think>{CALL}")
    assert not think_before_tool(f"{CALL}<think>x</think>")
    # the first of EITHER tool tag counts, parseable or not
    assert not think_before_tool(f"<tool_code>oops</tool_code><think>x</think>{CALL}")
    assert not think_before_tool("<think>x</think>")  # no tool at all
    after = f"{CALL}<think>{LONG}</think>"
    # no tool bonus: think 0.2 + anchor 0.2 + balance 0.1
    assert r(after) == pytest.approx(0.5)


def test_balance_counts_every_pair_including_tool_code() -> None:
    good = f"<think>{LONG}</think><answer>C</answer>"
    assert format_reward(good).balance == 1.0
    # an unclosed <tool_code> breaks balance: 0.2 + 0.5 + 0.35 + tool 0.3 -> 1.35 -> 1.0 anyway
    assert format_reward(good + "<tool_code>f(1)").balance == 0.0
    # without the think, a dropped closing tag costs the 0.1: 0.5 vs 0.6
    assert r("<answer>C</answer><tool_call>{}") == pytest.approx(0.5)
    # counts only, not order: a closer before its opener still balances
    assert r("</tool_call><tool_call><answer>C</answer>") == pytest.approx(0.6)
    # score 0 before the bonus: no bonus even though balanced
    assert r("<think>hi</think>") == 0.0


def test_clip_from_above_only() -> None:
    text = f"<think>{LONG}</think>{CALL}<answer>C</answer>"
    terms = format_reward(text)
    # 0.2 + 0.5 + 0.35 + 0.3 + 0.1 = 1.45 before the clip
    assert terms.base + 0.5 * terms.anchor == pytest.approx(1.45)
    assert terms.total == 1.0


def test_linear_time_on_hostile_tags() -> None:
    for text in ("<think>" * 200_000, "<tool_call>" * 200_000, "<answer>" * 200_000 + "x"):
        start = time.perf_counter()
        value = r(text)
        assert math.isfinite(value)
        assert time.perf_counter() - start < 5.0


_PIECES = [
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    "<tool_code>",
    "</tool_code>",
    "<|im_end|>",
    '{"name": "crop"}',
    "f(1)",
    "# c(",
    "x" * 11,
    "C",
    "\n",
    " ",
]


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))
def test_bounds_and_decomposition(text: str) -> None:
    terms = format_reward(text)
    assert -0.15 - 1e-9 <= terms.total <= 1.0
    assert terms.total == pytest.approx(min(1.0, terms.base + 0.5 * terms.anchor))
    assert terms.answer in (0.0, 1.0) and terms.balance in (0.0, 1.0)
