"""Benchmark scoring: answer extraction, per-item scores and their aggregation.

Pure functions on strings and numbers. Scores are fractions in [0, 1] (not percentages).

The letter rule (one rule for every multiple-choice benchmark; `extract_choice`):
1. the answer segment of the whole response (`paravt.rewards.accuracy.extract_answer`): the LAST
   closed `<answer>...</answer>` (the forced-answer round comes last, so a later answer overrides
   an earlier one), else the text after the last `</think>`, else the last non-empty line;
2. the option letter in that segment (`extract_option_letter`), restricted to the sample's own
   letters (A..D for four options): a bare letter, "B. text", "the answer is B", "B is correct",
   the option text itself, else one distinct stand-alone capital, never "A"/"I" used as a word;
3. when there is no closed `<answer>` (a plain model that writes "The answer is B.\nC is
   wrong." or "Answer: B\nReason: D shows nothing"), the untagged body (the text after the last
   `</think>`, else the whole text minus tool blocks) is read BEFORE step 2's last-line segment,
   in this order: an explicit phrase anywhere ("answer is X", "answer: X", "answer - (X)"; the
   first one naming one of the sample's letters), then the first non-empty line, then the
   segment of step 1, then the whole body (lmms-eval and the official Video-MME rule agree on
   the phrase and the leading letter).
A letter outside the sample's letters, or none, is wrong. The think block is never read.

How an unparseable answer counts differs between official scorers; `UNPARSEABLE_POLICIES`
names them: "wrong" (paravt's default: kept in the denominator, scored 0), "exclude" (the
official Video-MME script leaves it out of the denominator), "random" (LongVideoBench's lmms-eval
task assigns a random letter, seeded by the item id so reruns agree). See `choice_score`.

Intervals (`extract_interval`) follow the same segment rule; labelled answers ("Start time: 24.0
seconds\nEnd time: 30.0 seconds", "start: 0:24, end: 0:30") are read first, then
`parse_interval` ("a - b", "[a, b]", "m:ss - m:ss"); the IoU is
intersection / (max end - min start), zero for disjoint or degenerate intervals.

This module deliberately does not read files or know about benchmarks' schemas.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence

from paravt.rewards.accuracy import (
    clock_seconds,
    extract_answer,
    extract_option_letter,
    parse_interval,
)

LETTERS = "ABCDEFGHIJ"
RECALL_THRESHOLDS: tuple[float, ...] = (0.3, 0.5, 0.7)

_TOOL_BLOCK_RE = re.compile(r"<(tool_call|tool_code|tool_response)>.*?(?:</\1>|\Z)", re.S)
_TAG_RE = re.compile(r"</?(?:think|answer|tool_call|tool_code|tool_response)>")


def option_letters(num_options: int) -> str:
    """The letters of a question with `num_options` options: 4 -> "ABCD"."""
    if not 1 <= num_options <= len(LETTERS):
        raise ValueError(f"a question needs 1..{len(LETTERS)} options, got {num_options}")
    return LETTERS[:num_options]


def _without_tools(text: str) -> str:
    return _TAG_RE.sub(" ", _TOOL_BLOCK_RE.sub(" ", text))


def _has_closed_answer(response: str) -> bool:
    return "<answer>" in response and "</answer>" in response


# "answer is B", "Answer: (B)", "the correct answer is option B", "final answer - B". Every
# quantifier is bounded and the pieces are separated by literals: linear-time on any input.
_PHRASE_RE = re.compile(
    r"(?i:answer)[ \t]{0,4}(?i:is|:|-|=)[ \t]{0,4}(?i:option[ \t]{1,4})?"
    r"[(\[]?([A-J])(?![A-Za-z0-9])"
)


# "Answer: A person ..." uses "A" as a word, not as an option.
_WORD_AFTER_RE = re.compile(r"[ \t]{1,4}(?!(?:and|or|nor|vs|versus)\b)[a-z]")


def _phrase_letter(text: str, letters: str) -> str | None:
    for found in _PHRASE_RE.finditer(text):
        letter = found.group(1)
        as_word = letter in "AI" and _WORD_AFTER_RE.match(text, found.end()) is not None
        if letter in letters and not as_word:
            return letter
    return None


def _untagged_body(response: str) -> str:
    _head, sep, tail = response.rpartition("</think>")
    return _without_tools(tail if sep else response).strip()


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def extract_choice(response: str, options: Sequence[str]) -> str | None:
    """The option letter `response` chooses among the sample's options, or None (module rule)."""
    letters = option_letters(len(options))
    segment = extract_answer(response)
    if _has_closed_answer(response):
        return extract_option_letter(segment, letters, options)
    body = _untagged_body(response)
    phrased = _phrase_letter(body, letters)
    if phrased is not None:
        return phrased
    for text in (_first_line(body), segment, body):
        letter = extract_option_letter(text, letters, options)
        if letter is not None:
            return letter
    return None


UNPARSEABLE_POLICIES = ("wrong", "exclude", "random")


def choice_score(
    response: str, gold: str, options: Sequence[str], unparseable: str = "wrong", key: str = ""
) -> dict[str, float]:
    """{"correct": 0/1, "parsed": 0/1} under an unparseable-answer policy (module docstring);
    "exclude" marks the item with "excluded": 1.0 so reports can drop it from the denominator."""
    if unparseable not in UNPARSEABLE_POLICIES:
        raise ValueError(f"unparseable={unparseable!r}: choose one of {UNPARSEABLE_POLICIES}")
    letter = extract_choice(response, options)
    parsed = letter is not None
    if not parsed and unparseable == "random":
        letter = random.Random(f"{key}|{response}").choice(option_letters(len(options)))
    score = {"correct": float(letter == gold.strip().upper()), "parsed": float(parsed)}
    if not parsed and unparseable == "exclude":
        score["excluded"] = 1.0
    return score


def score_choice(response: str, gold: str, options: Sequence[str]) -> dict[str, float]:
    """{"correct": 1.0} when the response's letter is the gold letter, else {"correct": 0.0}."""
    return {"correct": float(extract_choice(response, options) == gold.strip().upper())}


_CLOCK = r"\d{1,2}:\d{2}(?::\d{2})?(?:\.\d{1,3})?"
_LABELLED_RE = re.compile(
    rf"(?i:\b(start|end)(?:ing|s)?(?:[ _-]?(?:time|timestamp|point))?)[ \t]{{0,4}}"
    rf"(?i:is|at|=|:|-)?[ \t]{{0,4}}(?i:about[ \t]{{1,4}})?({_CLOCK}|\d{{1,7}}(?:\.\d{{1,6}})?)"
)


def parse_labelled_interval(text: str) -> tuple[float, float] | None:
    """(start, end) from "Start time: 24.0 s ... End time: 30.0 s" (the first of each label);
    None unless both labels carry a number. A reversed pair is swapped."""
    found: dict[str, float] = {}
    for match in _LABELLED_RE.finditer(text):
        found.setdefault(match.group(1).lower(), clock_seconds(match.group(2)))
    if "start" not in found or "end" not in found:
        return None
    return (min(found["start"], found["end"]), max(found["start"], found["end"]))


def _interval_in(text: str) -> tuple[float, float] | None:
    labelled = parse_labelled_interval(text)
    return labelled if labelled is not None else parse_interval(text)


def extract_interval(response: str) -> tuple[float, float] | None:
    """The predicted (start, end) in seconds: the answer segment first, then the whole text."""
    found = _interval_in(extract_answer(response))
    if found is None and not _has_closed_answer(response):
        found = _interval_in(_untagged_body(response))
    return found


def interval_iou(pred: tuple[float, float], gold: tuple[float, float]) -> float:
    """intersection / (max end - min start); 0.0 when disjoint, degenerate or non-finite."""
    if not all(math.isfinite(v) for v in (*pred, *gold)):
        return 0.0
    p0, p1 = sorted(pred)
    g0, g1 = sorted(gold)
    inter = min(p1, g1) - max(p0, g0)
    span = max(p1, g1) - min(p0, g0)
    return inter / span if inter > 0 and span > 0 else 0.0


def grounding_scores(iou: float) -> dict[str, float]:
    """{"iou": iou, "r@0.3": iou >= 0.3, "r@0.5": ..., "r@0.7": ...} as floats."""
    return {"iou": iou, **{f"r@{t}": float(iou >= t) for t in RECALL_THRESHOLDS}}


def score_grounding(response: str, gold: tuple[float, float]) -> dict[str, float]:
    """Grounding scores of a response; an unparseable answer scores IoU 0 (kept in the mean)."""
    pred = extract_interval(response)
    return grounding_scores(0.0 if pred is None else interval_iou(pred, gold))


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean; 0.0 for no values (an empty benchmark reports zeros, not NaN)."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def macro_average(per_label: Mapping[str, float], prefix: str) -> float:
    """The mean of the entries whose key starts with `prefix` (MLVU's M-Avg over task types)."""
    return mean(v for k, v in per_label.items() if k.startswith(prefix))
