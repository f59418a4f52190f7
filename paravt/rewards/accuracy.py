"""Answer extraction and the accuracy reward R_acc (docs/method.md section 3).

Pure string functions: extract the answer from a trajectory's own text, then score it against the
ground truth by question type (`mcq` option letter, `tvg` temporal IoU, `oe` open-ended scorer).
Every function is total on arbitrary strings: no exception, no NaN.

This module deliberately does not call any network judge itself (see `judge.py`) and does not
know about tokens, tensors or trajectories.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache

DEFAULT_LETTERS = "ABCDEFGHIJ"

Judge = Callable[[str, str], float]
"""An open-ended judge: (prediction, gold) -> score in [0, 1]."""

# ------------------------------------------------------------------ answer extraction

# An unclosed tool block runs to the end of the text: nothing after it is an answer.
_TOOL_BLOCK_RE = re.compile(r"<(tool_call|tool_code)>.*?(?:</\1>|\Z)", re.S)
_TAG_RE = re.compile(r"</?(?:think|answer|tool_call|tool_code|tool_response)>")


def _strip_tools_and_tags(text: str) -> str:
    return _TAG_RE.sub(" ", _TOOL_BLOCK_RE.sub(" ", text))


def extract_answer(text: str) -> str:
    """The answer the model gave in `text` (a whole trajectory), stripped.

    1. the content of the LAST closed `<answer>...</answer>` (a multi-turn trajectory's final
       answer is its last one, e.g. after the forced-answer message);
    2. else the text after the last `</think>` with tool blocks and stray tags removed (this also
       reads an `<answer>` cut off before its closing tag); empty when nothing follows it;
    3. else (no `</think>`) the last non-empty line, tool blocks and tags removed.
    """
    # rfind, not a regex: a lazy `<answer>(.*?)</answer>` is quadratic on many unclosed tags.
    close = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, close) if close != -1 else -1
    if start != -1:
        return text[start + len("<answer>") : close].split("</answer>", 1)[0].strip()
    if "</think>" in text:
        # Nothing after the reasoning means no answer; the think itself is never read as one.
        return _strip_tools_and_tags(text.rsplit("</think>", 1)[1]).strip()
    lines = [line.strip() for line in _strip_tools_and_tags(text).splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else ""


# ------------------------------------------------------------------ normalisation

_ARTICLES_RE = re.compile(r"\b(?:a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation (ASCII and Unicode) and the articles a/an/the, squash spaces."""
    lowered = text.lower()
    # Punctuation becomes a space so "12.5" -> "12 5" and "red/blue" -> "red blue" stay apart.
    chars = [
        " " if ch in _PUNCT or unicodedata.category(ch).startswith("P") else ch for ch in lowered
    ]
    return " ".join(_ARTICLES_RE.sub(" ", "".join(chars)).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised texts are equal and non-empty, else 0.0."""
    pred = normalize_text(prediction)
    return float(bool(pred) and pred == normalize_text(gold))


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD-style token F1 of the normalised texts; 0.0 when either side is empty."""
    pred_tokens = normalize_text(prediction).split()
    gold_tokens = normalize_text(gold).split()
    if not pred_tokens or not gold_tokens:
        return 0.0
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


# ------------------------------------------------------------------ multiple choice

# After a letter: end of text, punctuation, a newline, or a connective ("B because ...").
# Requiring this is what keeps "The answer is A person ..." from reading as option A.
_LETTER_END = r"(?=\s*\Z|\s*[.,:;!?)\]*\n\"'-]|\s+(?:because|since|as|which|for|given)\b)"
_OPTION_PREFIX_RE = re.compile(r"^\s*[(\[]?[A-Za-z]\s*[.):\]]\s+")
_WHITESPACE_RUN_RE = re.compile(r"\s+")


def _squash_one(run: re.Match[str]) -> str:
    return "\n" if "\n" in run.group() else " "


def squash_whitespace(text: str) -> str:
    """Every whitespace run as ONE character: a newline if the run holds one, else a space.

    Linear time, and it keeps the meaning of every pattern here (`\\s*`, `\\s+`, `\\b`, a
    newline after a letter). It is what keeps the letter and interval patterns linear: a run of
    whitespace between optional groups (`answer\\s*(is)?\\s*(option)?\\s*B`) makes a
    backtracking regex engine try every split of the run, cubic in its length, and after this
    every run is one character long.
    """
    return _WHITESPACE_RUN_RE.sub(_squash_one, text)


@lru_cache(maxsize=64)
def _letter_patterns(letters: str) -> tuple[re.Pattern[str], ...]:
    """Patterns for one letter set, in priority order (compiled once per set)."""
    upper = re.escape(letters.upper())
    both = re.escape(letters.upper() + letters.lower())
    return (
        # The whole answer is a letter: "B", "B.", "(b)", "**B**".
        re.compile(rf"^\W*([{both}])\W*\Z"),
        # Leads with a letter and an option delimiter: "B. red", "(B) red", "B: red".
        re.compile(rf"^\s*[(\[*]*\s*([{upper}])\s*(?:[.):\]]|\*\*)"),
        # An explicit phrase: "The answer is B", "Answer: (B)", "option B", "I choose B".
        re.compile(
            r"(?i:answer|option|choice|choose|pick|select)\s*"
            r"(?i:is|:|=|would\s+be|should\s+be)?\s*(?i:option\s+|choice\s+)?"
            rf"[(\[*]*\s*([{both}]){_LETTER_END}"
        ),
        # "B is correct", "B is the answer".
        re.compile(
            rf"(?<![A-Za-z0-9])([{upper}])\s*[.):]?\s+(?i:is|seems)\s+(?i:the\s+)?"
            r"(?i:correct|right|best|answer)"
        ),
    )


@lru_cache(maxsize=64)
def _standalone_pattern(letters: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9])([{re.escape(letters.upper())}])(?![A-Za-z0-9]|'[a-z])")


# "A" and "I" are the only one-letter English words; before a lower-case word they are the
# article / pronoun ("A person ...", "I think ..."), unless the word joins letters ("A or B").
_WORD_USE_RE = re.compile(r"\s+(?!(?:and|or|nor|vs|versus)\b)[a-z]")


def _is_word_use(text: str, match: re.Match[str]) -> bool:
    """True when a capital letter is the article "A" / pronoun "I", not an option."""
    return match.group(1) in "AI" and _WORD_USE_RE.match(text, match.end()) is not None


def _letter_by_option_text(text: str, letters: str, options: Sequence[str]) -> str | None:
    """The letter of the one option whose normalised text the answer equals or contains."""
    answer = normalize_text(text)
    if not answer:
        return None
    normed = [
        normalize_text(_OPTION_PREFIX_RE.sub("", squash_whitespace(opt)))
        for opt in options[: len(letters)]
    ]
    for letter, opt in zip(letters, normed, strict=False):
        if opt and opt == answer:
            return letter
    hits = [(opt, letter) for letter, opt in zip(letters, normed, strict=False)]
    hits = [(opt, letter) for opt, letter in hits if opt and f" {opt} " in f" {answer} "]
    # "dark red" contains "red": keep only hits not contained in a longer hit.
    maximal = [h for h in hits if not any(h[0] != o and f" {h[0]} " in f" {o} " for o, _ in hits)]
    return maximal[0][1] if len({letter for _, letter in maximal}) == 1 else None


def extract_option_letter(
    text: str, letters: str = DEFAULT_LETTERS, options: Sequence[str] = ()
) -> str | None:
    """The option letter (upper-case, one of `letters`) that `text` chooses, or None.

    Tried in order: the whole text is a letter; a leading letter with a delimiter ("B. red");
    the last explicit phrase ("the answer is B"); "B is correct"; the option text itself when
    `options` are given ("the red one" -> the letter of "red"); finally a single distinct
    stand-alone capital letter, ignoring "A ..."/"I ..." used as words ("A person", "I think").
    """
    letters = "".join(ch for ch in letters.upper() if ch.isalpha() and ch.isascii())
    if not letters or not text.strip():
        return None
    text = squash_whitespace(text)
    bare, leading, phrase, is_correct = _letter_patterns(letters)
    for pattern in (bare, leading):
        found = pattern.search(text)
        if found:
            return found.group(1).upper()
    for pattern in (phrase, is_correct):
        found_all = list(pattern.finditer(text))
        if found_all:
            return found_all[-1].group(1).upper()
    if options:
        by_text = _letter_by_option_text(text, letters, options)
        if by_text is not None:
            return by_text
    seen = {
        m.group(1) for m in _standalone_pattern(letters).finditer(text) if not _is_word_use(text, m)
    }
    return seen.pop() if len(seen) == 1 else None


def _letters_for(options: Sequence[str]) -> str:
    return DEFAULT_LETTERS[: len(options)] if options else DEFAULT_LETTERS


def mcq_accuracy(answer_text: str, gold_letter: str, options: Sequence[str] = ()) -> float:
    """1.0 when the answer picks the gold option (gold given as "B", "(B)" or the option text)."""
    letters = _letters_for(options)
    gold = extract_option_letter(gold_letter, letters, options)
    if gold is None:
        return 0.0
    return float(extract_option_letter(answer_text, letters, options) == gold)


# ------------------------------------------------------------------ temporal grounding

_NUM = r"(?:\d+:)?\d+:\d{2}(?:\.\d+)?|\d+(?:\.\d+)?"
_UNIT = r"(?:\s*(?:seconds?|secs?|s)\b\.?)?"
_SEP = r"\s*(?:-{1,2}|–|—|~|\bto\b|\band\b|\buntil\b|\btill\b|\bthrough\b)\s*"
_INTERVAL_RE = re.compile(
    rf"[\[(]\s*({_NUM}){_UNIT}\s*[,;]\s*({_NUM}){_UNIT}\s*[\])]"
    rf"|(?<![\w.:])({_NUM}){_UNIT}{_SEP}({_NUM})(?![\d:]|\.\d)"
)


def clock_seconds(token: str) -> float:
    """'12.5' -> 12.5, '01:30' -> 90, '1:02:03' -> 3723."""
    total = 0.0
    for part in token.split(":"):
        total = total * 60 + float(part)
    return total


def parse_interval(text: str) -> tuple[float, float] | None:
    """The first time interval in `text`, in seconds, as (start, end) with start <= end.

    Reads "[12.5, 20]", "(12.5, 20)", "12.5 - 20 seconds", "12.5s–20s", "from 12.5 to 20",
    "between 12 and 20", "00:12-00:20" (MM:SS) and "0:01:05 - 0:01:10" (HH:MM:SS). A reversed
    interval is swapped; a non-finite number (a 400-digit string) yields None.
    """
    found = _INTERVAL_RE.search(squash_whitespace(text))
    if found is None:
        return None
    groups = [g for g in found.groups() if g is not None]
    start, end = clock_seconds(groups[0]), clock_seconds(groups[1])
    if not (math.isfinite(start) and math.isfinite(end)):
        return None
    return (min(start, end), max(start, end))


def temporal_iou(pred: tuple[float, float], gold: tuple[float, float]) -> float:
    """Intersection over union of two [start, end] intervals; 0.0 for degenerate or non-finite."""
    values = (*pred, *gold)
    if len(values) != 4 or not all(math.isfinite(v) for v in values):
        return 0.0
    p0, p1 = sorted(pred)
    g0, g1 = sorted(gold)
    inter = max(0.0, min(p1, g1) - max(p0, g0))
    union = (p1 - p0) + (g1 - g0) - inter
    return inter / union if union > 0 else 0.0


def tvg_accuracy(answer_text: str, gold: str | tuple[float, float]) -> float:
    """Temporal IoU of the first interval in the answer against the gold interval."""
    gold_interval = parse_interval(gold) if isinstance(gold, str) else gold
    pred = parse_interval(answer_text)
    if pred is None or gold_interval is None:
        return 0.0
    return temporal_iou(pred, gold_interval)


# ------------------------------------------------------------------ the reward

OPEN_ENDED_SCORERS: dict[str, Judge] = {"f1": token_f1, "exact": exact_match}
"""Open-ended scorers by name; "judge" (an LLM judge passed in) is resolved by `accuracy_reward`."""


def _open_ended_scorer(name: str, judge: Judge | None) -> Judge:
    if name == "judge":
        if judge is None:
            raise ValueError(
                "open_ended='judge' needs a judge callable: pass judge=LLMJudge(...) "
                "(paravt.rewards.judge) or choose open_ended='f1' / 'exact'"
            )
        return judge
    if name not in OPEN_ENDED_SCORERS:
        known = ", ".join([*OPEN_ENDED_SCORERS, "judge"])
        raise ValueError(f"unknown open_ended scorer {name!r}; choose one of: {known}")
    return OPEN_ENDED_SCORERS[name]


def _finite_unit(value: float) -> float:
    value = float(value)
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0


def _score_mcq(answer: str, gold: str, options: Sequence[str], _open: Judge) -> float:
    return mcq_accuracy(answer, gold, options)


def _score_tvg(answer: str, gold: str, _options: Sequence[str], _open: Judge) -> float:
    return tvg_accuracy(answer, gold)


def _score_oe(answer: str, gold: str, _options: Sequence[str], open_scorer: Judge) -> float:
    return open_scorer(answer, gold)


_BY_TYPE: dict[str, Callable[[str, str, Sequence[str], Judge], float]] = {
    "mcq": _score_mcq,
    "tvg": _score_tvg,
    "oe": _score_oe,
}


def accuracy_reward(
    answer_text: str,
    gold: str,
    question_type: str,
    options: Sequence[str] = (),
    open_ended: str = "f1",
    judge: Judge | None = None,
) -> float:
    """R_acc in [0, 1] for an already extracted answer (see `extract_answer`), never a whole
    trajectory: its reasoning would score as part of the answer (a text holding `</answer>` is
    refused; `compute_reward` extracts and scores a whole text).

    A normalised exact match scores 1 first; otherwise `mcq` compares option letters, `tvg`
    takes the temporal IoU of the first interval, `oe` uses the `open_ended` scorer ("f1",
    "exact", or "judge" with `judge` given). An empty answer scores 0, whatever the gold.
    """
    if "</answer>" in answer_text:  # extract_answer never leaves one: a whole trajectory
        raise ValueError(
            "accuracy_reward scores an extracted answer, got a text holding </answer>; pass "
            "extract_answer(text), or score the whole trajectory with compute_reward(text, ...)"
        )
    kind = question_type.strip().lower()
    if kind not in _BY_TYPE:
        raise ValueError(
            f"unknown question_type {question_type!r}; expected one of: {', '.join(_BY_TYPE)}"
        )
    # Resolved before any early return so a misconfigured scorer fails on the first sample.
    open_scorer = _open_ended_scorer(open_ended, judge) if kind == "oe" else token_f1
    if not answer_text.strip():
        return 0.0
    if exact_match(answer_text, gold):
        return 1.0
    return _finite_unit(_BY_TYPE[kind](answer_text, gold, options, open_scorer))
