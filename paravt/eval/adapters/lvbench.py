"""LVBench: the HF `lmms-lab/LVBench` rows (or the official nested meta file) to `EvalItem`s.

Flat rows: key (YouTube id), type, uid, video_path, question (options INLINE as
"...?\\n(A) x\\n(B) y"), answer (a letter), question_type (a list: multi-label), time_reference.
The official meta file nests {key, type, qa: [{uid, question, answer, question_type,
time_reference}], video_info}; both are read. The options are parsed out of the question and
lettered once by `mcq_prompt`. Videos: `{video_root}/{video_path}` when the row has one, then
`{video_root}/{key}.mp4`, then `{video_root}/{key}_clean.mp4`. The official download
script (yt-dlp by YouTube id) names files `{key}.mp4`; its post-processing step writes
`{key}_clean.mp4` (video without the audio/subtitle streams), which some copies keep instead.

This module deliberately does not use time_reference (it is not an input of the protocol).
"""

from __future__ import annotations

import os
import re
from functools import partial
from typing import Any

from paravt.eval.adapters.base import (
    AnnotationError,
    EvalItem,
    MultipleChoiceBenchmark,
    build_items,
    check_gold,
    get_field,
    mcq_prompt,
    read_rows,
    resolve_video,
    take,
)
from paravt.eval.scoring import LETTERS
from paravt.types import Sample

_INLINE_OPTION = re.compile(r"(?:^|\n)\s*\(([A-Z])\)\s*")


def split_inline_options(question: str, path: str, index: int) -> tuple[str, tuple[str, ...]]:
    """ "Q?\\n(A) x\\n(B) y" -> ("Q?", ("x", "y")); the letters must run A, B, ... in order."""
    marks = list(_INLINE_OPTION.finditer(question))
    letters = "".join(m.group(1) for m in marks)
    if len(marks) < 2 or letters != LETTERS[: len(marks)]:
        reason = f"expected inline options '(A) ...' '(B) ...' in order, found {list(letters)}"
        raise AnnotationError(path, index, "question", reason)
    ends = [m.start() for m in marks[1:]] + [len(question)]
    options = tuple(question[m.end() : end].strip() for m, end in zip(marks, ends, strict=True))
    if not all(options):
        raise AnnotationError(path, index, "question", "an inline option is empty")
    return question[: marks[0].start()].strip(), options


def flatten(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Expand nested meta records ({key, qa: [...]}) into flat rows; flat rows pass unchanged."""
    flat: list[dict[str, Any]] = []
    for row in rows:
        if isinstance(row.get("qa"), list):
            shared = {"key": row.get("key"), "type": row.get("type")}
            flat += [{**shared, **qa} for qa in row["qa"]]
        else:
            flat.append(row)
    return flat


def _item(row: dict[str, Any], index: int, path: str, root: str) -> EvalItem:
    key = get_field(row, "key", "str", path, index)
    stem, options = split_inline_options(
        get_field(row, "question", "str", path, index), path, index
    )
    labels = get_field(row, "question_type", "list", path, index)
    if not labels or not all(isinstance(x, str) and x.strip() for x in labels):
        raise AnnotationError(path, index, "question_type", f"expected labels, got {labels!r}")
    candidates = [os.path.join(root, f"{key}{suffix}.mp4") for suffix in ("", "_clean")]
    if isinstance(row.get("video_path"), str) and row["video_path"].strip():
        candidates.insert(0, os.path.join(root, row["video_path"]))
    video, missing = resolve_video(candidates)
    sample = Sample(
        id=str(get_field(row, "uid", "id", path, index)),
        video=video,
        question=mcq_prompt(stem, options),
        answer=check_gold(
            get_field(row, "answer", "str", path, index), options, path, index, "answer"
        ),
        question_type="mcq",
        options=options,
        data_source="lvbench",
        extra={"key": key, "time_reference": row.get("time_reference")},
    )
    groups = {"question_type": tuple(label.strip() for label in labels)}
    return EvalItem(sample=sample, groups=groups, video_missing=missing)


def load_lvbench(annotations: str, video_root: str, limit: int | None = None) -> list[EvalItem]:
    rows = take(flatten(read_rows(annotations)), limit)
    make = partial(_item, path=annotations, root=video_root)
    return build_items(enumerate(rows), make, annotations, "LVBench")


def lvbench() -> MultipleChoiceBenchmark:
    return MultipleChoiceBenchmark(name="lvbench", loader=load_lvbench)
