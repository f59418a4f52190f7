"""MLVU (dev, multiple-choice): the official per-task JSON files or the flat HF rows, and M-Avg.

Two layouts are read:
- the official dev release: one JSON list per task, `1_plotQA.json`, `2_needle.json`,
  `3_ego.json`, `4_count.json`, `5_order.json`, `6_anomaly_reco.json`, `7_topic_reasoning.json`
  (pass the folder holding them, or one of them), rows {video, duration, question, candidates,
  answer (the option TEXT), question_type ("plotQA", "findNeedle", ...)}; videos under
  `{video_root}/{N}_{task}/{video}`. The task label is the file's (`needle` for
  `2_needle.json`), so both layouts report the same `task_type` labels. The generation tasks'
  files (`8_sub_scene.json`, `9_summary.json`) are skipped.
- the flat HF `sy1998/MLVU_dev` rows: video_name, duration, question, candidates, answer (a
  letter), task_type, question_id; videos `{video_root}/{video_name}`, then
  `{video_root}/{task_type}/{video_name}`, then `{video_root}/{N}_{task_type}/{video_name}`.
`answer` is read as a letter when it is one of the options' letters, else as an option's text
(compared stripped and case-folded). Inline "(A) ..." options in the question are cut (the stem
is kept) and the candidates lettered once. A row without question_id gets f"{task}-{row}".
The report adds "m_avg", the mean of the per-task accuracies (lmms-eval's headline).

This module deliberately does not read MLVU's generation (open-ended) tasks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from paravt.eval import lmms_scoring, scoring
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


MCQ_TASKS = ("plotQA", "needle", "ego", "count", "order", "anomaly_reco", "topic_reasoning")
_TASK_FILE = re.compile(r"^(\d{1,3})_([A-Za-z_]{1,40})\.json$")


def _item(
    row: dict[str, Any], index: int, path: str, root: str, folder: str | None = None
) -> EvalItem:
    """One row of either layout; `folder` ("2_needle") is set for the official per-task files."""

    def field(name: str, kind: str = "str") -> Any:
        return get_field(row, name, kind, path, index)

    raw = field("candidates", "list")
    if not raw or not all(isinstance(c, str) and c.strip() for c in raw):
        raise AnnotationError(path, index, "candidates", f"expected option texts, got {raw!r}")
    options = tuple(c.strip() for c in raw)
    if folder is not None:
        task, name = folder.split("_", 1)[1], field("video")
        places = [os.path.join(root, folder, name), os.path.join(root, name)]
    else:
        task, name = field("task_type"), field("video_name")
        places = [os.path.join(root, name), os.path.join(root, task, name)]
        places += [os.path.join(root, f"{n}_{task}", name) for n in range(1, 10)]
    video, missing = resolve_video(places)
    has_id = row.get("question_id") is not None
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


def task_files(annotations: str) -> list[tuple[str, str]]:
    """[(path, "N_task")] of the official multiple-choice task files in `annotations`."""
    if os.path.isdir(annotations):
        names = sorted(os.listdir(annotations))
        paths = [os.path.join(annotations, n) for n in names]
    else:
        paths = [annotations]
    found = []
    for path in paths:
        match = _TASK_FILE.match(os.path.basename(path))
        if match and match.group(2) in MCQ_TASKS:
            found.append((path, f"{match.group(1)}_{match.group(2)}"))
    if os.path.isdir(annotations) and not found:
        raise FileNotFoundError(
            f"{annotations}: no MLVU task file (1_plotQA.json ... 7_topic_reasoning.json); "
            "pass the dev release's json folder, one task file, or the flat parquet"
        )
    return found


def load_mlvu(annotations: str, video_root: str, limit: int | None = None) -> list[EvalItem]:
    files = task_files(annotations)
    if not files:  # the flat layout
        rows = take(read_rows(annotations), limit)
        make = partial(_item, path=annotations, root=video_root)
        return build_items(enumerate(rows), make, annotations, "MLVU (flat rows)")
    items: list[EvalItem] = []
    for path, folder in files:
        left = None if limit is None else limit - len(items)
        if left is not None and left <= 0:
            break
        make = partial(_item, path=path, root=video_root, folder=folder)
        rows = take(read_rows(path), left)
        items += build_items(enumerate(rows), make, path, "MLVU (official task json)")
    return items


def m_avg(metrics: Mapping[str, float]) -> dict[str, float]:
    """{"m_avg": mean of the "accuracy/task_type=..." entries} (MLVU's headline number)."""
    return {"m_avg": scoring.macro_average(metrics, "accuracy/task_type=")}


def lmms_m_avg(items: Sequence[EvalItem], correct: Sequence[float]) -> dict[str, float]:
    """lmms-eval's MLVU figure: the mean over its 7 dev task types (`lmms_scoring.mlvu_m_avg`)."""
    types = [item.groups["task_type"][0] for item in items]
    return {LMMS + "m_avg": lmms_scoring.mlvu_m_avg(types, correct)}


def mlvu() -> MultipleChoiceBenchmark:
    return MultipleChoiceBenchmark(
        name="mlvu", loader=load_mlvu, headline=m_avg, lmms_summary=lmms_m_avg
    )
