"""LongVideoBench (validation): the parquet or the `lvb_val.json` annotations to `EvalItem`s.

Parquet rows hold option0..option4 ("N/A" when absent); the json variant holds `candidates` (a
list). Both hold id, video_path, correct_choice (int, 0-based), question, duration_group and
question_category. Videos are `{video_root}/videos/{video_path}`. "N/A" options are dropped; the
gold letter is chr(65 + the gold's index among the options kept), which equals
chr(65 + correct_choice) in the release (N/A only trails), and a gold that points at "N/A" raises.

This module deliberately does not read the subtitles (the ParaVT protocol evaluates without them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from typing import Any

from paravt.eval import lmms_scoring
from paravt.eval.adapters.base import (
    LMMS,
    AnnotationError,
    EvalItem,
    MultipleChoiceBenchmark,
    build_items,
    get_field,
    mcq_prompt,
    read_rows,
    resolve_video,
    take,
)
from paravt.eval.scoring import LETTERS
from paravt.types import Sample

ABSENT_OPTION = "N/A"
NUM_OPTION_FIELDS = 5


def _raw_options(row: dict[str, Any], path: str, index: int) -> tuple[list[Any], str]:
    """The option values in file order and the field they came from (json or parquet layout)."""
    if "candidates" in row:
        return list(get_field(row, "candidates", "list", path, index)), "candidates"
    fields = [f"option{k}" for k in range(NUM_OPTION_FIELDS) if f"option{k}" in row]
    if not fields:
        raise AnnotationError(path, index, "option0", "no option0..option4 and no candidates")
    return [row[name] for name in fields], "option0..option4"


def _options_and_gold(row: dict[str, Any], path: str, index: int) -> tuple[tuple[str, ...], str]:
    raw, source = _raw_options(row, path, index)
    correct = get_field(row, "correct_choice", "int", path, index)
    if not 0 <= correct < len(raw):
        raise AnnotationError(path, index, "correct_choice", f"{correct} is not in 0..{len(raw)}")
    kept = [
        k for k, v in enumerate(raw) if v is not None and str(v).strip() not in ("", ABSENT_OPTION)
    ]
    if correct not in kept:
        raise AnnotationError(path, index, "correct_choice", f"points at {raw[correct]!r}")
    if any(not isinstance(raw[k], str) for k in kept) or not kept:
        raise AnnotationError(path, index, source, f"expected option strings, got {raw!r}")
    return tuple(raw[k].strip() for k in kept), LETTERS[kept.index(correct)]


def _item(row: dict[str, Any], index: int, path: str, root: str) -> EvalItem:
    def field(name: str, kind: str = "str") -> Any:
        return get_field(row, name, kind, path, index)

    options, gold = _options_and_gold(row, path, index)
    video, missing = resolve_video([os.path.join(root, "videos", field("video_path"))])
    duration_group = get_field(row, "duration_group", "float", path, index)
    sample = Sample(
        id=str(field("id", "id")),
        video=video,
        question=mcq_prompt(field("question"), options),
        answer=gold,
        question_type="mcq",
        options=options,
        data_source="longvideobench",
        extra={"video_id": row.get("video_id"), "duration": row.get("duration")},
    )
    groups = {
        # 600.0 (a float in some exports) and 600 are the same group.
        "duration_group": (f"{duration_group:g}",),
        "question_category": (field("question_category"),),
    }
    return EvalItem(sample=sample, groups=groups, video_missing=missing)


def load_longvideobench(
    annotations: str, video_root: str, limit: int | None = None
) -> list[EvalItem]:
    rows = take(read_rows(annotations), limit)
    make = partial(_item, path=annotations, root=video_root)
    return build_items(enumerate(rows), make, annotations, "LongVideoBench")


def lmms_accuracy(items: Sequence[EvalItem], correct: Sequence[float]) -> dict[str, float]:
    """lmms-eval's LongVideoBench figure: the accuracy rounded to 5 decimals."""
    return {LMMS + "accuracy": lmms_scoring.longvideobench_accuracy(correct)}


def longvideobench() -> MultipleChoiceBenchmark:
    return MultipleChoiceBenchmark(
        name="longvideobench",
        loader=load_longvideobench,
        lmms_rule="longvideobench",
        lmms_summary=lmms_accuracy,
    )
