"""Benchmark scoring: answer extraction, per-item scores and their aggregation.

Pure functions on strings and numbers. Scores are fractions in [0, 1] (not percentages).

The letter rule (one rule for every multiple-choice benchmark; `extract_choice`):
1. the answer segment of the whole response (`paravt.rewards.accuracy.extract_answer`): the LAST
   closed `<answer>...</answer>` (the forced-answer round comes last, so a later answer overrides
   an earlier one), else the text after the last `</think>`, else the last non-empty line;
2. the option letter in that segment (`extract_option_letter`), restricted to the sample's own
   letters (A..D for four options): a bare letter, "B. text", "the answer is B", "B is correct",
   the option text itself, else one distinct stand-alone capital, never "A"/"I" used as a word;
3. only when the response has neither a closed `<answer>` nor a `</think>` (a plain model that
   writes "The answer is B.\nBecause ..."), step 2 again on the whole text minus tool blocks.
A letter outside the sample's letters, or none, is wrong. The think block is never read.

Intervals (`extract_interval`) follow the same segment rule with `parse_interval`; the IoU is
intersection / (max end - min start), zero for disjoint or degenerate intervals.

This module deliberately does not read files or know about benchmarks' schemas.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

from paravt.rewards.accuracy import extract_answer, extract_option_letter, parse_interval

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


def _has_answer_structure(response: str) -> bool:
    return "</think>" in response or ("<answer>" in response and "</answer>" in response)


def extract_choice(response: str, options: Sequence[str]) -> str | None:
    """The option letter `response` chooses among the sample's options, or None (module rule)."""
    letters = option_letters(len(options))
    letter = extract_option_letter(extract_answer(response), letters, options)
    if letter is None and not _has_answer_structure(response):
        letter = extract_option_letter(_without_tools(response).strip(), letters, options)
    return letter


def score_choice(response: str, gold: str, options: Sequence[str]) -> dict[str, float]:
    """{"correct": 1.0} when the response's letter is the gold letter, else {"correct": 0.0}."""
    return {"correct": float(extract_choice(response, options) == gold.strip().upper())}


def extract_interval(response: str) -> tuple[float, float] | None:
    """The predicted (start, end) in seconds: the answer segment first, then the whole text."""
    found = parse_interval(extract_answer(response))
    if found is None and not _has_answer_structure(response):
        found = parse_interval(_without_tools(response))
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


def grouped_means(
    groups: Sequence[Mapping[str, Sequence[str]]],  # one label mapping per item
    values: Sequence[float],  # one score per item
    name: str,
) -> dict[str, float]:
    """Means per group label, keyed f"{name}/{key}={label}", sorted; multi-label items count in
    every label they carry."""
    if len(groups) != len(values):
        raise ValueError(f"{len(groups)} group mappings for {len(values)} scores")
    buckets: dict[str, list[float]] = {}
    for labels, value in zip(groups, values, strict=True):
        for key, names in labels.items():
            for label in names:
                buckets.setdefault(f"{name}/{key}={label}", []).append(value)
    return {k: mean(v) for k, v in sorted(buckets.items())}


def macro_average(per_label: Mapping[str, float], prefix: str) -> float:
    """The mean of the entries whose key starts with `prefix` (MLVU's M-Avg over task types)."""
    return mean(v for k, v in per_label.items() if k.startswith(prefix))
