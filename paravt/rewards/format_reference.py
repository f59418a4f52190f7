"""The reference release's R_fmt: the rules of its format reward, re-implemented linear-time.

The ParaVT reference release (`paravt/rl/rewards/format.py` and `utils.py` there) scores a
completion with string rules, not with credits and weights. `reference_indicators` reads those
rules off one text; `reference_total` adds them up. With the PARA-GRPO recipe (answer-suffix
mode on, anchor weight 0.5):

    think   = the first closed `<think>...</think>` block (or, none closed, the first `<think>`
              read up to the next `<tool_`, `<answer>`, `<|im_end|>` or the end) holds
              >= min_think_chars characters after strip                     -> +0.2
    answer  = some `<answer>...</answer>` pair has a non-blank body       -> +0.3 (`<answer>`
              occurs) +0.2 (`</answer>` occurs); both always occur when the body exists
    anchor  = anchor_weight * (+0.4 if `</think>` occurs and think
                               +0.3 if also answer and `</answer>` occurs
                               -0.3 if `<think>` occurs and `</think>` never does)
    tool    = +0.3 if think, a parseable call exists (a `<tool_call>` body that is a JSON object
              with "name", or a `<tool_code>` body with a non-comment line holding "("; a block
              may run unclosed to the end of the text) and the first `<think>` comes before the
              first `<tool_call>` / `<tool_code>`
    balance = +0.1 if the score so far is > 0 and each of `<think>`, `<tool_call>`,
              `<tool_code>`, `<answer>` occurs as often as its closing tag (substring counts)
    total   = min(score, 1.0)   (clipped from above only: -0.15 is reachable)

Answer-suffix mode off (the reference's vanilla-GRPO recipe) pays think 0.3, `<answer>` 0.2 and
`</answer>` 0.1 instead. Tag positions are found with `str.find`, never with a backtracking
regex, so a megabyte of hostile tags costs linear time (the reference's `<think>(.*?)</think>`
search is quadratic on many unclosed `<think>`). One deliberate difference: a `<tool_call>` body
nested too deep for `json` counts as unparseable here (the reference raises RecursionError).
"""

from __future__ import annotations

import json

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
CODE_TAG = "<tool_code>"  # the prior's tool tag: an RL turn that opens it has reverted
# The tag pairs whose counts must match for the balance bonus (the reference's _BALANCED_TAGS).
BALANCED_PAIRS: tuple[tuple[str, str], ...] = (
    (THINK_OPEN, THINK_CLOSE),
    ("<tool_call>", "</tool_call>"),
    (CODE_TAG, "</tool_code>"),
    (ANSWER_OPEN, ANSWER_CLOSE),
)
# Where an unclosed think block stops being read.
_OPEN_THINK_STOPS = ("<tool_", ANSWER_OPEN, "<|im_end|>")
IM_END = "<|im_end|>"
# (think, `<answer>`, `</answer>`) credits with answer-suffix mode on / off.
SUFFIX_CREDITS = (0.2, 0.3, 0.2)
DEFAULT_CREDITS = (0.3, 0.2, 0.1)
TOOL_BONUS = 0.3
BALANCE_BONUS = 0.1


def reverted_turn(text: str) -> bool:
    """True when the turn opens a `<tool_code>` block: the prior's dialect, not `<tool_call>`."""
    return CODE_TAG in text


def think_body(text: str) -> str | None:
    """The think block the reference reads: first closed one, else the first open one."""
    start = text.find(THINK_OPEN)
    if start < 0:
        return None
    body_start = start + len(THINK_OPEN)
    close = text.find(THINK_CLOSE, body_start)
    if close >= 0:
        return text[body_start:close]
    stops = [p for p in (text.find(s, body_start) for s in _OPEN_THINK_STOPS) if p >= 0]
    return text[body_start : min(stops, default=len(text))]


def has_substantive_think(text: str, min_chars: int = 10) -> bool:
    body = think_body(text)
    return body is not None and len(body.strip()) >= min_chars


def _bodies(text: str, open_tag: str, close_tag: str, *, to_end: bool) -> list[str]:
    """Bodies of successive non-overlapping `open...close` pairs; with `to_end` an unclosed
    last block runs to the end of the text (else it is dropped)."""
    out: list[str] = []
    pos = 0
    while (start := text.find(open_tag, pos)) >= 0:
        body_start = start + len(open_tag)
        close = text.find(close_tag, body_start)
        if close < 0:
            if to_end:
                out.append(text[body_start:])
            break
        out.append(text[body_start:close])
        pos = close + len(close_tag)
    return out


def has_nonempty_answer(text: str) -> bool:
    return any(body.strip() for body in _bodies(text, ANSWER_OPEN, ANSWER_CLOSE, to_end=False))


def _json_call(body: str) -> bool:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "name" in data


def _code_call(body: str) -> bool:
    for line in body.splitlines():
        line = line.strip()
        if line and "(" in line and not line.startswith("#"):
            return True
    return False


def has_parseable_tool_call(text: str) -> bool:
    """A `<tool_call>` JSON object with "name", or a `<tool_code>` line that calls something."""
    for open_tag, close_tag, check in (
        ("<tool_call>", "</tool_call>", _json_call),
        ("<tool_code>", "</tool_code>", _code_call),
    ):
        for body in _bodies(text, open_tag, close_tag, to_end=True):
            body = body.strip()
            if body and not body.startswith(IM_END) and check(body):
                return True
    return False


def think_before_tool(text: str) -> bool:
    """The first `<think>` precedes the first `<tool_call>` / `<tool_code>` (one must exist)."""
    think = text.find(THINK_OPEN)
    tools = [p for p in (text.find("<tool_call>"), text.find("<tool_code>")) if p >= 0]
    return think >= 0 and bool(tools) and think < min(tools)


def tags_balanced(text: str) -> bool:
    return all(text.count(o) == text.count(c) for o, c in BALANCED_PAIRS)


def reference_indicators(text: str, min_think_chars: int = 10) -> dict[str, float]:
    """The 0/1 facts the reference formula adds up (names shared with `FormatTerms`).

    think, answer: the two credits; order: the think -> tool bonus holds; balance: every pair's
    counts match (paid only when the score before it is > 0); closed_think, flow,
    unclosed_think: the three anchor indicators.
    """
    think = has_substantive_think(text, min_think_chars)
    answer = has_nonempty_answer(text)
    closed = THINK_CLOSE in text
    return {
        "think": float(think),
        "answer": float(answer),
        "order": float(think and has_parseable_tool_call(text) and think_before_tool(text)),
        "balance": float(tags_balanced(text)),
        "closed_think": float(closed and think),
        "flow": float(closed and think and answer and ANSWER_CLOSE in text),
        "unclosed_think": float(THINK_OPEN in text and not closed),
    }


def reference_total(
    ind: dict[str, float], text: str, anchor: float, *, answer_suffix: bool = True
) -> tuple[float, float]:
    """(score without the anchor term, R_fmt) from `reference_indicators` and the weighted
    anchor term (anchor_weight x anchor bonus; 0 turns anchoring off as the reference does)."""
    think_credit, open_credit, close_credit = SUFFIX_CREDITS if answer_suffix else DEFAULT_CREDITS
    score = think_credit * ind["think"]
    if ind["answer"]:
        score += open_credit * (ANSWER_OPEN in text) + close_credit * (ANSWER_CLOSE in text)
    score += anchor + TOOL_BONUS * ind["order"]
    if score > 0 and ind["balance"]:
        score += BALANCE_BONUS
    return score - anchor, min(score, 1.0)
