"""MLVU (dev, multiple-choice): the HF `sy1998/MLVU_dev` rows to `EvalItem`s, and M-Avg.

Rows: video_name, duration, question (options may be INLINE as "(A) ..."; the stem before them is
kept), candidates (the option texts), answer, task_type, question_id. `answer` is read as a
letter when it is one of the options' letters, else as an option's text (compared stripped and
case-folded): BENCHMARKS.md infers the letter form, and the reference driver matched texts.
Videos: `{video_root}/{video_name}`, then `{video_root}/{task_type}/{video_name}` (inferred: the
dev release groups videos in per-task folders). A row without question_id gets
f"{task_type}-{row index}". The report adds "m_avg", the mean of the per-task accuracies.

This module deliberately does not read MLVU's generation (open-ended) tasks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from paravt.eval import scoring
from paravt.eval.benchmarks.base import (
    AnnotationError,
    EvalItem,
    MultipleChoiceBenchmark,
    get_field,
    mcq_prompt,
    read_rows,
    resolve_video,
    take,
)
from paravt.types import Sample

_FIRST_INLINE_OPTION = re.compile(r"(?:^|\n)\s*\(A\)")


def question_stem(question: str) -> str:
    """The question without its inline "(A) ..." options (unchanged when it has none)."""
    found = _FIRST_INLINE_OPTION.search(question)
    return (question[: found.start()] if found else question).strip()


def gold_letter(answer: str, options: tuple[str, ...], path: str, index: int) -> str:
    """The gold letter from a letter ("B", "(B)") or from an option's text."""
    letters = scoring.option_letters(len(options))
    bare = answer.strip().strip("()").strip().upper()
    if len(bare) == 1 and bare in letters:
        return bare
    folded = [option.strip().casefold() for option in options]
    if answer.strip().casefold() in folded:
        return letters[folded.index(answer.strip().casefold())]
    reason = f"{answer!r} is neither one of {list(letters)} nor an option text {list(options)}"
    raise AnnotationError(path, index, "answer", reason)


def _item(row: dict[str, Any], index: int, path: str, root: str) -> EvalItem:
    def field(name: str, kind: str = "str") -> Any:
        return get_field(row, name, kind, path, index)

    raw = field("candidates", "list")
    if not raw or not all(isinstance(c, str) and c.strip() for c in raw):
        raise AnnotationError(path, index, "candidates", f"expected option texts, got {raw!r}")
    options = tuple(c.strip() for c in raw)
    task, name = field("task_type"), field("video_name")
    has_id = row.get("question_id") is not None
    video, missing = resolve_video([os.path.join(root, name), os.path.join(root, task, name)])
    sample = Sample(
        id=str(field("question_id", "id")) if has_id else f"{task}-{index}",
        video=video,
        question=mcq_prompt(question_stem(field("question")), options),
        answer=gold_letter(str(field("answer", "id")), options, path, index),
        question_type="mcq",
        options=options,
        data_source="mlvu",
        extra={"video_name": name, "duration": row.get("duration")},
    )
    return EvalItem(sample=sample, groups={"task_type": (task,)}, video_missing=missing)


def load_mlvu(annotations: str, video_root: str, limit: int | None = None) -> list[EvalItem]:
    rows = take(read_rows(annotations), limit)
    return [_item(r, i, annotations, video_root) for i, r in enumerate(rows)]


def m_avg(metrics: Mapping[str, float]) -> dict[str, float]:
    """{"m_avg": mean of the "accuracy/task_type=..." entries} (MLVU's headline number)."""
    return {"m_avg": scoring.macro_average(metrics, "accuracy/task_type=")}


def mlvu() -> MultipleChoiceBenchmark:
    return MultipleChoiceBenchmark(name="mlvu", loader=load_mlvu, headline=m_avg)
