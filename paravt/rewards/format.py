"""The string-level format reward R_fmt with its anchor bonus, and the degenerate-text guard.

docs/method.md section 3. `format_reward` reads the WHOLE trajectory's own text (every turn, the
forced `<think>\\n` prefix included) and returns every term in a frozen `FormatTerms`:

    credits of the "credits" and "mean" formulas (0/1-valued, except balance):
             think   - some think block holds >= min_think_chars non-blank characters
                       (an unclosed block counts up to the next tag: the spec credits a
                       substantive think, and the anchor's closed_think a closed one);
             answer  - the last closed `<answer>...</answer>` is non-empty;
             order   - a closed think ends before the first action: the first `<tool_call>`, or
                       the first `<answer>` when no tool is called (no action: 0);
             balance - share of the tag pairs present (think, tool_call, answer) whose tags pair
                       up in order, none nested in itself or left open; no tags at all: 0.
    anchor = + closed_think_bonus      (0.4) if some think is closed and substantive
             + flow_bonus              (0.3) if a closed think precedes a credited answer
             - unclosed_think_penalty  (0.3) if some `<think>` is opened and never closed

Three formulas (`formula=`, registry `FORMULAS`, config `reward.format_formula`):

    "reference" (default): the reference release's own rules (`format_reference.py`: think 0.2,
        answer 0.3 + 0.2, anchor_weight x anchor, +0.3 think -> parseable tool call, +0.1
        balanced tags, clipped at 1 from above only, so an unclosed think alone scores -0.15).
        Here `order` means "a substantive think precedes a parseable tool call" and `balance`
        "every tag pair (`<tool_code>` included) occurs as often opened as closed"; the credit
        weights are not used. `answer_suffix=False` gives the reference's vanilla-GRPO credits.
    "credits" (paravt's second formula): base = sum of weight * credit, fixed credit weights
        0.25 each; total = clip(base + anchor_weight * anchor, 0, 1).
    "mean" (paravt's first formula): base = the weighted MEAN of the credits (weights
        relative), total = base + anchor_weight * anchor, unclipped ([-0.15, 1.35]).

Reference scores (tests/rewards/test_format_reference.py): no think, answer 0.6; forced
`<think>` left open before the answer 0.5 - 0.15 = 0.35 (think too short) or 0.55; an
answer outside the tags 0.2 + 0.2 + 0.1 = 0.5; a closed short think then the answer 0.5 + 0.1;
a full think -> answer 1.0 (1.15 before the clip). f_tau is the mean R_fmt of the training
rollouts (paper: 0.13 -> 0.64).

This module deliberately does not touch tokens or log-probabilities: the token-level anchor of
section 4(i) lives in `structural.py`. The "credits" and "mean" formulas judge a `<tool_call>`
block by its tags only; the reference formula checks, as the reference does, that some call
body parses (validity for running tools stays the agent parser's job and feeds R_tool).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from paravt.rewards.format_reference import reference_indicators, reference_total

_TAG_RE = re.compile(r"<(/?)(think|tool_call|answer)>")
PAIRED_TAGS: tuple[str, ...] = ("think", "tool_call", "answer")


@dataclass(frozen=True)
class FormatTerms:
    """Every term of R_fmt (credits and indicators are 0.0 or 1.0, except balance)."""

    think: float
    answer: float
    order: float
    balance: float
    base: float
    closed_think: float
    flow: float
    unclosed_think: float
    anchor: float
    total: float

    def as_dict(self, prefix: str = "format/") -> dict[str, float]:
        return {f"{prefix}{name}": value for name, value in asdict(self).items()}


@dataclass(frozen=True)
class _Tag:
    name: str
    closing: bool
    start: int
    end: int


@dataclass(frozen=True)
class _Block:
    """One opened block: its content span and whether its closing tag followed."""

    open_start: int
    content_start: int
    content_end: int
    close_end: int | None

    @property
    def closed(self) -> bool:
        return self.close_end is not None


def _scan(text: str) -> list[_Tag]:
    return [_Tag(m.group(2), m.group(1) == "/", m.start(), m.end()) for m in _TAG_RE.finditer(text)]


def _blocks(tags: list[_Tag], name: str, text_len: int) -> tuple[list[_Block], bool]:
    """The blocks of one tag pair, and whether that pair is balanced."""
    blocks: list[_Block] = []
    opened: _Tag | None = None
    balanced = True

    starts = [t.start for t in tags]

    def unclosed(tag: _Tag) -> _Block:
        # An unclosed block's content runs to the next tag of any kind (or the end of the text).
        following = bisect.bisect_left(starts, tag.end)
        nxt = starts[following] if following < len(starts) else text_len
        return _Block(tag.start, tag.end, nxt, None)

    for tag in (t for t in tags if t.name == name):
        if not tag.closing:
            if opened is not None:
                blocks.append(unclosed(opened))
                balanced = False
            opened = tag
        elif opened is None:
            balanced = False
        else:
            blocks.append(_Block(opened.start, opened.end, tag.start, tag.end))
            opened = None
    if opened is not None:
        blocks.append(unclosed(opened))
        balanced = False
    return blocks, balanced


def _check_weights(**weights: float) -> None:
    for name, value in weights.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"format_reward {name} must be a finite number >= 0, got {value}")


def _indicators(text: str, min_think_chars: int) -> dict[str, float]:
    """The four base credits and the three anchor indicators of one text."""
    tags = _scan(text)
    parsed = {name: _blocks(tags, name, len(text)) for name in PAIRED_TAGS}
    thinks, calls, answers = (parsed[name][0] for name in PAIRED_TAGS)

    def substantive(block: _Block) -> bool:
        return len(text[block.content_start : block.content_end].strip()) >= min_think_chars

    closed_ends = [b.close_end for b in thinks if b.close_end is not None]
    closed_answers = [b for b in answers if b.closed]
    final = closed_answers[-1] if closed_answers else None
    answer = final is not None and bool(text[final.content_start : final.content_end].strip())
    first_action = (calls or answers)[0].open_start if (calls or answers) else None
    present = [name for name in PAIRED_TAGS if any(t.name == name for t in tags)]
    return {
        "think": float(any(substantive(b) for b in thinks)),
        "answer": float(answer),
        "order": float(first_action is not None and any(e <= first_action for e in closed_ends)),
        "balance": sum(parsed[n][1] for n in present) / len(present) if present else 0.0,
        "closed_think": float(any(b.closed and substantive(b) for b in thinks)),
        "flow": float(answer and any(e <= final.open_start for e in closed_ends)),
        "unclosed_think": float(any(not b.closed for b in thinks)),
    }


def _credits_total(
    credits: Mapping[str, float], weights: Mapping[str, float], anchor: float, **_: object
) -> tuple[float, float]:
    """paravt's second formula: fixed-weight sum of the credits plus the anchor, clip to [0, 1]."""
    base = sum(w * credits[name] for name, w in weights.items())
    return base, min(1.0, max(0.0, base + anchor))


def _mean_total(
    credits: Mapping[str, float], weights: Mapping[str, float], anchor: float, **_: object
) -> tuple[float, float]:
    """paravt's first formula: weighted mean of the credits plus the anchor term, unclipped."""
    weight_sum = sum(weights.values())
    base = sum(w * credits[name] for name, w in weights.items()) / weight_sum if weight_sum else 0.0
    return base, base + anchor


def _reference_total(
    credits: Mapping[str, float], weights: Mapping[str, float], anchor: float, **kw: object
) -> tuple[float, float]:
    """The reference release's rules (format_reference.py); credit weights do not apply."""
    return reference_total(
        dict(credits), str(kw["text"]), anchor, answer_suffix=bool(kw["answer_suffix"])
    )


@dataclass(frozen=True)
class Formula:
    """One R_fmt formula: how it reads a text, and how it adds the reading up."""

    indicators: Callable[[str, int], dict[str, float]]
    total: Callable[..., tuple[float, float]]


FORMULAS: dict[str, Formula] = {
    "reference": Formula(reference_indicators, _reference_total),
    "credits": Formula(_indicators, _credits_total),
    "mean": Formula(_indicators, _mean_total),
}


def format_reward(
    text: str,
    *,
    think_weight: float = 0.25,
    answer_weight: float = 0.25,
    order_weight: float = 0.25,
    balance_weight: float = 0.25,
    anchor_weight: float = 0.5,
    closed_think_bonus: float = 0.4,
    flow_bonus: float = 0.3,
    unclosed_think_penalty: float = 0.3,
    min_think_chars: int = 10,
    formula: str = "reference",
    answer_suffix: bool = True,
) -> FormatTerms:
    """R_fmt of a whole trajectory's text, every term included (see the module docstring)."""
    if formula not in FORMULAS:
        raise ValueError(
            f"unknown format formula {formula!r}; choose one of: {', '.join(FORMULAS)} "
            "(reward.format_formula)"
        )
    weights = {
        "think": think_weight,
        "answer": answer_weight,
        "order": order_weight,
        "balance": balance_weight,
    }
    _check_weights(
        **{f"{name}_weight": w for name, w in weights.items()},
        anchor_weight=anchor_weight,
        closed_think_bonus=closed_think_bonus,
        flow_bonus=flow_bonus,
        unclosed_think_penalty=unclosed_think_penalty,
    )
    chosen = FORMULAS[formula]
    ind = chosen.indicators(text, min_think_chars)
    anchor = (
        closed_think_bonus * ind["closed_think"]
        + flow_bonus * ind["flow"]
        - unclosed_think_penalty * ind["unclosed_think"]
    )
    base, total = chosen.total(
        ind, weights, anchor_weight * anchor, text=text, answer_suffix=answer_suffix
    )
    return FormatTerms(**ind, base=base, anchor=anchor, total=total)


# ------------------------------------------------------------------ degenerate completions

_CHAT_TOKEN_RE = re.compile(r"<\|[^|<>\s]{1,40}\|>")
_STRUCT_TAG_RE = re.compile(r"</?(?:think|answer|tool_call|tool_code|tool_response)>")
_ROLES = frozenset({"system", "user", "assistant", "tool"})
# End-of-turn tokens end every healthy turn when the text is decoded with special tokens kept.
_END_TOKENS = frozenset({"<|im_end|>", "<|endoftext|>", "<|eot_id|>"})


def is_degenerate(text: str, *, short_chars: int = 32) -> bool:
    """True for a completion that must score 0 whatever else it holds.

    Degenerate: nothing but whitespace, chat-special tokens (`<|im_start|>`, `<|video_pad|>`...),
    role words on their own lines ("user\\nuser\\n...") and bare structural tags (the forced
    `<think>\\n` prefix alone); or a short completion (< short_chars characters of content) that
    echoes a chat token (end-of-turn tokens such as `<|im_end|>` excepted) or a role line; or
    one whose non-empty lines are mostly role lines (at least 3 of them).
    """
    markers = sum(tok not in _END_TOKENS for tok in _CHAT_TOKEN_RE.findall(text))
    lines = [line.strip() for line in _CHAT_TOKEN_RE.sub("\n", text).splitlines()]
    lines = [line for line in lines if line]
    role_lines = sum(line.lower() in _ROLES for line in lines)
    content_lines = [line for line in lines if line.lower() not in _ROLES]
    content = "".join(_STRUCT_TAG_RE.sub("", "".join(content_lines)).split())
    if not content:
        return True
    if markers + role_lines > 0 and len(content) < short_chars:
        return True
    return role_lines >= 3 and 2 * role_lines >= len(lines)
