"""MMVU (validation, open-ended part): `benchmark=mmvu_oe`, the rows `mmvu` leaves out.

The paper's MMVU number is the multiple-choice part (`paravt.eval.adapters.mmvu`), unchanged.
This adapter reads the same `data/validation.json` and keeps the rows whose question_type is
"open-ended" (375 of 1,000): a free-text gold answer, no choices; videos, disciplines and
subjects as in `mmvu`. It is scored as MMVU's lmms-eval task (`mmvu_val`) scores that part:
1. rules first (`rule_correct`, the same checks as lmms-eval's rule-based pass, written here):
   after lower-casing, superscript digits as ^n and collapsed spaces, the answer equals the
   gold, contains it, or is contained in it (a non-empty answer: an empty one never is); or
   the first numbers of both differ by < 0.01; or a gold of 2 to 5 words has all its words
   longer than 2 characters among the answer's; or both hold the same O(...) expression;
2. an answer the rules call wrong goes to the LLM judge when one is configured
   (`paravt.eval.judging`): correct only on a CORRECT verdict (PARTIAL counts 0, as
   lmms-eval's judge prompt scores a partly right answer); when the judge fails the rules'
   answer stands (0), as lmms-eval falls back to its rule-based result.
Without a judge the rules alone score, and the results say the answers were not judged. The
answer read is the agent's answer segment (`extract_answer`: the last `<answer>`), asked for
with the generic forced-answer message (no option letters here).

This module deliberately does not call the judge itself.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from paravt.agent.prompts import FORCED_ANSWER
from paravt.eval.adapters.base import EvalItem, check_unique_ids, summarize
from paravt.eval.adapters.mmvu import DISCIPLINES, disciplines_of, load_part
from paravt.rewards.accuracy import extract_answer

KEPT_QUESTION_TYPE = "open-ended"
OPEN_INSTRUCTION = "Answer with the final answer only, as a short phrase or number."
_SUPERSCRIPTS = str.maketrans({"²": "^2", "³": "^3", "¹": "^1", "⁰": "^0", "⁴": "^4"})
_SUPERSCRIPTS.update(str.maketrans({"⁵": "^5", "⁶": "^6", "⁷": "^7", "⁸": "^8", "⁹": "^9"}))
_NUMBER = re.compile(r"\d+\.?\d*")
_BIG_O = re.compile(r"\bo\s*\([^)]+\)")


def _normalise(text: str) -> str:
    return " ".join(text.strip().lower().translate(_SUPERSCRIPTS).split())


def _words(text: str) -> list[str]:
    return [w.strip(string.punctuation) for w in text.split() if w.strip(string.punctuation)]


def _same_number(answer: str, gold: str) -> bool:
    a, g = _NUMBER.findall(answer), _NUMBER.findall(gold)
    return bool(a and g) and abs(float(a[0]) - float(g[0])) < 0.01


def _same_words(answer: str, gold: str) -> bool:
    gold_words = _words(gold)
    if not 2 <= len(gold_words) <= 5:
        return False
    answer_words = set(_words(answer))
    return all(w in answer_words for w in gold_words if len(w) > 2)


def _same_big_o(answer: str, gold: str) -> bool:
    a, g = _BIG_O.search(answer), _BIG_O.search(gold)
    return a is not None and g is not None and a.group(0) == g.group(0)


def rule_correct(answer: str, gold: str) -> bool:
    """MMVU's rule-based check of an open-ended answer (module docstring, step 1)."""
    a, g = _normalise(answer), _normalise(gold)
    if not a:
        return False
    if a == g or g in a or a in g:
        return True
    return _same_number(a, g) or _same_words(a, g) or _same_big_o(a, g)


def _open_fields(get: Callable[..., Any], path: str, index: int) -> dict[str, Any]:
    question = get("question").strip()
    return {
        "question": f"Question: {question}\n{OPEN_INSTRUCTION}",
        "answer": str(get("answer")).strip(),
        "question_type": "oe",
        "extra": {"question": question},
    }


def load_mmvu_open(
    annotations: str,
    video_root: str,
    limit: int | None = None,
    disciplines: Mapping[str, str] = DISCIPLINES,
) -> list[EvalItem]:
    return load_part(annotations, video_root, limit, disciplines, KEPT_QUESTION_TYPE, _open_fields)


@dataclass(frozen=True)
class MMVUOpenEnded:
    """MMVU's open-ended questions: rules, then the judge for what they call wrong."""

    name: str = "mmvu_oe"
    forced_answer: str = FORCED_ANSWER
    forced_answer_max_tokens: int | None = 128  # a short phrase or number
    open_ended_rule: str = "MMVU's rules"
    disciplines: Mapping[str, str] = field(default_factory=lambda: dict(DISCIPLINES))

    def load(self, annotations: str, video_root: str, limit: int | None = None) -> list[EvalItem]:
        items = load_mmvu_open(annotations, video_root, limit, self.disciplines)
        return check_unique_ids(items, annotations)

    def score(self, item: EvalItem, response: str) -> dict[str, float]:
        if item.video_missing:
            return {"correct": 0.0}
        return {"correct": float(rule_correct(extract_answer(response), item.sample.answer))}

    def judge_query(self, item: EvalItem, response: str) -> tuple[str, str, str] | None:
        answer = extract_answer(response)
        if not answer.strip() or rule_correct(answer, item.sample.answer):
            return None
        return answer, item.sample.answer, item.sample.extra["question"]

    def from_verdict(self, item: EvalItem, verdict: float) -> dict[str, float]:
        return {"correct": float(verdict == 1.0)}

    def report(
        self, items: Sequence[EvalItem], scores: Sequence[Mapping[str, float]]
    ) -> dict[str, float]:
        return summarize(items, scores, {"correct": "accuracy"})


def mmvu_oe(disciplines: Mapping[str, str] | None = None) -> MMVUOpenEnded:
    return MMVUOpenEnded(disciplines=disciplines_of(disciplines))
