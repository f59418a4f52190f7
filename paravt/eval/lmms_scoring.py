"""lmms-eval's scoring rules, reimplemented: per-item results and aggregations as lmms-eval 0.7.3
computes them for the benchmarks it ships (Video-MME, LongVideoBench, LVBench, MLVU, MMVU,
Charades-STA), so that a paravt evaluation can print the figure published tables quote.

Written from the behaviour of lmms-eval 0.7.3's task code (`lmms_eval/tasks/<task>/utils.py`,
`_task_utils/mcq_extract.py`, `api/reasoning.py`); tests/eval/test_lmms_eval_agreement.py checks
every rule against those functions on a few hundred varied answers. lmms-eval is never imported.

The pipeline lmms-eval applies to a generated answer:
1. `strip_reasoning`: the CLI's default `--reasoning_tags` (`<think>`, `<analysis>`) blocks are
   cut out; with a closing tag but no opening one, only the text after the last closing tag stays;
2. the task's rule on what is left:
   - `mcq_letter` (Video-MME, LVBench, MLVU: choices A-D whatever the item's count): candidate
     letters in several formats ("(B)", "B.", "B:", "B)", "B ", after an answer phrase, the
     first or last character), the most trusted format wins, then the later position; capitals
     only; with no candidate, the last capital choice letter anywhere (inside words too);
   - `longvideobench_letter`: answer prefixes removed, then the first capital A-E anywhere;
     nothing found is a random guess among the item's letters (seeded here by the item);
   - `mmvu_correct`: correct when the gold letter stands alone anywhere (any case), when the gold
     option's text appears, or when the gold letter appears anywhere (inside words too) and one
     word (> 2 characters) of the gold option's text does;
   - `charades_interval`: "to" becomes "-", sentences with a time keyword are searched for a
     clock range, a number range, clock times, the first number of each sentence, "5s - 7s";
     anything but exactly one interval scores IoU 0.
3. the task's aggregation (`*_summary`): plain accuracy (Video-MME, LVBench, LongVideoBench),
   MLVU's mean over its fixed task types (an absent type counts 0), MMVU's accuracy over the items
   whose subject is one of its 27 (the others leave the denominator), Charades-STA's mIoU and
   R@0.3/0.5/0.7 over distinct (video, caption, gold) keys, the last answer of a key kept.

Pure functions on strings and numbers; fractions in [0, 1] (lmms-eval prints percentages).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Iterable, Mapping, Sequence

LMMS_EVAL_VERSION = "0.7.3"

REASONING_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<analysis>", "</analysis>"),
)


def strip_reasoning(text: str, tags: Sequence[tuple[str, str]] = REASONING_TAGS) -> str:
    """`text` without its reasoning blocks (lmms-eval's default `--reasoning_tags`), stripped."""
    for opening, closing in tags:
        while opening in text and closing in text:
            start = text.find(opening)
            end = text.find(closing, start)
            if end == -1:  # a closing tag only before the opening one
                break
            text = text[:start] + text[end + len(closing) :]
        if closing in text and opening not in text:  # the template prefilled the opening tag
            text = text.rsplit(closing, 1)[-1]
    return text.strip()


# ------------------------------------------------------------------ the shared MCQ rule

MCQ_CHOICES = "ABCD"  # what Video-MME, LVBench and MLVU pass, whatever an item's option count

_ANSWER_PHRASES = (
    "the answer is",
    "answer is",
    "the correct answer is",
    "correct answer is",
    "the best answer is",
    "best answer is",
    "the correct option is",
    "correct option is",
    "the best option is",
    "best option is",
    "the choice is",
    "choice is",
    "the correct choice is",
    "correct choice is",
    "i choose",
    "i select",
    "i pick",
    "my answer is",
    "my choice is",
    "옵션",
    "정답은",
    "답은",
    "답:",
    "答案是",
    "答案为",
    "选",
    "答えは",
)
# The literal letter formats in the order their candidates are gathered, with their rank.
_LETTER_FORMATS = (("({})", 6), ("{}.", 5), ("{}:", 4), ("{})", 3), ("{} ", 2))
_RANK_START, _RANK_END, _RANK_PHRASE, _RANK_ANYWHERE = 10, 9, 7, 0
_EDGE_PUNCTUATION = ",.!?;:'\""  # stripped from both ends one character kind at a time


def _trimmed(response: str) -> str:
    text = response.strip()
    for char in _EDGE_PUNCTUATION:
        text = text.strip(char)
    return text


def _phrase_candidates(padded: str, choices: str) -> list[tuple[int, int, str]]:
    lowered = padded.lower()  # searched lower-cased, the letter then in the original text
    found = []
    for phrase in _ANSWER_PHRASES:
        at = lowered.find(phrase)
        if at == -1:
            continue
        for letter in choices:
            position = padded.find(letter, at + len(phrase))
            if position != -1:
                found.append((_RANK_PHRASE, position, letter))
    return found


def _edge_candidates(padded: str, choices: str) -> list[tuple[int, int, str]]:
    core = padded.strip()
    found = []
    for letter in choices:  # a leading letter, not the first letter of a word
        if core.startswith(letter) and (len(core) == 1 or not core[1].isalpha()):
            found.append((_RANK_START, 0, letter))
    for letter in choices:  # a trailing letter, not the last letter of a word
        if core.endswith(letter) and (len(core) == 1 or not core[-2].isalpha()):
            found.append((_RANK_END, len(padded) - 1, letter))
    return found


def mcq_letter(response: str, choices: str = MCQ_CHOICES) -> str:
    """The letter lmms-eval's shared extractor reads from a (reasoning-stripped) answer, or ""."""
    if not response.strip():
        return ""
    padded = f" {_trimmed(response)} "
    found: list[tuple[int, int, str]] = []  # (rank, position, letter) in gathering order
    for template, rank in _LETTER_FORMATS:
        for letter in choices:
            mark = template.format(letter)
            if mark in padded:
                found.append((rank, padded.rfind(mark), letter))
    found += _phrase_candidates(padded, choices)
    found += _edge_candidates(padded, choices)
    if not found:
        found = [(_RANK_ANYWHERE, padded.rfind(c), c) for c in choices if c in padded]
    if not found:
        return ""
    # max() keeps the first of equal keys, as lmms-eval's stable descending sort does
    return max(found, key=lambda c: (c[0], c[1]))[2]


def mcq_correct(response: str, gold: str, choices: str = MCQ_CHOICES) -> bool:
    """Video-MME / LVBench / MLVU: the extracted letter equals the gold letter."""
    return mcq_letter(strip_reasoning(response), choices) == gold.strip().upper()


# ------------------------------------------------------------------ LongVideoBench

_LVB_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option is",
    "The correct option is",
    "Best answer:",
    "Best option:",
)
_LVB_LETTER = re.compile("[ABCDE]")


def longvideobench_letter(response: str, num_options: int, key: str = "") -> tuple[str, bool]:
    """(letter, guessed): the first capital A-E once the answer prefixes are removed; with none,
    a letter among the item's `num_options` drawn at random, seeded by `key` and the answer (the
    task guesses with Python's global generator; only the expectation can agree)."""
    text = strip_reasoning(response).strip()
    for prefix in _LVB_PREFIXES:
        text = text.replace(prefix, "")
    found = _LVB_LETTER.search(text)
    if found is not None:
        return found.group(0), False
    letters = "ABCDEFGHIJ"[:num_options]
    return random.Random(f"lmms-lvb|{key}|{response}").choice(letters), True


# ------------------------------------------------------------------ MMVU (multiple choice)


def _words(text: str) -> list[str]:
    return [
        w.strip(string.punctuation) for w in text.split() if len(w.strip(string.punctuation)) > 2
    ]


def mmvu_correct(response: str, gold: str, choices: Mapping[str, str]) -> bool:
    """lmms-eval's MMVU multiple-choice rule (the judge is never asked for these)."""
    answer = strip_reasoning(response).strip()
    gold = gold.strip()
    if re.search(rf"\b{re.escape(gold)}\b", answer, re.IGNORECASE):
        return True
    if gold not in choices:
        return False
    gold_text, lowered = choices[gold].strip().lower(), answer.lower()
    if gold_text in lowered:
        return True
    letter_anywhere = gold.upper() in answer.upper()
    return letter_anywhere and any(word in lowered for word in _words(gold_text))


# The subject folders MMVU's lmms-eval aggregation counts (its `TASK_MAP` keys); an item of any
# other folder leaves the denominator.
MMVU_SUBJECTS = frozenset(
    (
        "Biology Chemistry Modern_Physics Astronomy Geography Materials_Science Neurobiology "
        "Electromagnetism Thermodynamics Mechanics Civil_Engineering Electrical_Engineering "
        "Mechanical_Engineering Biomedical_Engineering Electronics_and_Communication "
        "Computer_Science Clinical_Medicine Basic_Medicine Preventive_Medicine Pharmacy Dentistry "
        "Art Literature History Law Economics Management"
    ).split()
)

# ------------------------------------------------------------------ Charades-STA

_PROMPT_EXAMPLE = "a specific example is : 20.8 - 30.0 seconds"
_TIME_KEYWORDS = (
    "starts",
    "ends",
    "happens in",
    "start time",
    "end time",
    "start",
    "end",
    "happen",
)
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2})?"
_CLOCK_RANGE = re.compile(rf"\b({_CLOCK})\s*[–-]\s*({_CLOCK})\b")
_NUMBER_RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"\b(\d+(?:\.\d+)?)\b")
_CLOCK_TIME = re.compile(rf"\b({_CLOCK})\b")
_SECONDS_RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*s?\s*[–-]\s*(\d+(?:\.\d+)?)\s*s?")


def _clock(text: str) -> float:
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def _pairs(times: list[float]) -> list[tuple[float, float]]:
    return [(times[i], times[i + 1]) for i in range(0, len(times) - 1, 2)]


def _first_ranges(sentences: list[str], pattern: re.Pattern, convert) -> list[tuple[float, float]]:
    """Every range of the first sentence that has one."""
    for sentence in sentences:
        found = pattern.findall(sentence)
        if found:
            return [(convert(a), convert(b)) for a, b in found]
    return []


def charades_intervals(response: str) -> list[tuple[float, float]]:
    """The intervals lmms-eval's Charades-STA parser reads (at most one, start <= end)."""
    text = strip_reasoning(response).lower().replace(_PROMPT_EXAMPLE, "").replace("to", "-")
    sentences = re.split(r"[!?\n]", text)
    timed = [s for s in sentences if any(k in s for k in _TIME_KEYWORDS)] or sentences
    found = _first_ranges(timed, _CLOCK_RANGE, _clock) or _first_ranges(timed, _NUMBER_RANGE, float)
    if not found:
        found = _pairs([_clock(t) for s in timed for t in _CLOCK_TIME.findall(s)])
    if not found:
        found = _pairs([float(m[0]) for m in (_NUMBER.findall(s) for s in timed) if m])
    if not found:
        found = _first_ranges(timed, _SECONDS_RANGE, float)
    return [(min(a, b), max(a, b)) for a, b in found[:1]]


def charades_iou(response: str, gold: tuple[float, float]) -> float:
    """IoU of the parsed interval with `gold`; 0 unless exactly one interval was read."""
    found = charades_intervals(response)
    if len(found) != 1:
        return 0.0
    (p0, p1), (g0, g1) = found[0], (float(gold[0]), float(gold[1]))
    span = max(p1, g1) - min(p0, g0)
    return 0.0 if span <= 0 else max(min(p1, g1) - max(p0, g0), 0) / span


# ------------------------------------------------------------------ aggregations


def accuracy(correct: Iterable[float]) -> float:
    values = list(correct)
    return sum(values) / len(values) if values else 0.0


def longvideobench_accuracy(correct: Iterable[float]) -> float:
    """LongVideoBench's figure: the accuracy rounded to 5 decimals."""
    return round(accuracy(correct), 5)


MLVU_DEV_TYPES = ("anomaly_reco", "count", "ego", "needle", "order", "plotQA", "topic_reasoning")


def mlvu_m_avg(task_types: Sequence[str], correct: Sequence[float]) -> float:
    """The mean of the per-type accuracies over MLVU's 7 dev types (a type with no item counts
    0); items of other types (lmms-eval stops on them) are left out."""
    total = dict.fromkeys(MLVU_DEV_TYPES, 0.0)
    count = dict.fromkeys(MLVU_DEV_TYPES, 0)
    for task, value in zip(task_types, correct, strict=True):
        if task in total:
            total[task] += value
            count[task] += 1
    return sum(total[t] / count[t] if count[t] else 0.0 for t in MLVU_DEV_TYPES) / len(total)


def mmvu_accuracy(subjects: Sequence[str], correct: Sequence[float]) -> float:
    """Accuracy over the items whose subject folder is one of `MMVU_SUBJECTS`."""
    return accuracy(v for s, v in zip(subjects, correct, strict=True) if s in MMVU_SUBJECTS)


def charades_summary(keys: Sequence[Iterable], ious: Sequence[float]) -> dict[str, float]:
    """{"miou", "r@0.3", "r@0.5", "r@0.7"} over distinct keys (video, caption, gold), the last
    item of a key kept (lmms-eval merges per-item dicts keyed by them)."""
    by_key = {tuple(k): v for k, v in zip(keys, ious, strict=True)}
    values = list(by_key.values())
    out = {"miou": accuracy(values)}
    out.update({f"r@{t}": accuracy(float(v >= t) for v in values) for t in (0.3, 0.5, 0.7)})
    return out
