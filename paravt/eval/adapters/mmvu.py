"""MMVU (validation, multiple-choice part): `data/validation.json` to `EvalItem`s.

Rows: id, video (a URL ending `/videos/{Subject_Dir}/{n}.mp4`), question_type, metadata
{subject, ...}, question, choices (a dict letter -> text), answer (a letter). Only rows whose
question_type is "multiple-choice" are kept (the reference driver forgot this filter); `limit`
counts kept rows. Videos: `{video_root}/videos/{Subject_Dir}/{n}.mp4`. The discipline comes from
the video's subject folder through `DISCIPLINES`, the published mapping (lmms-eval's `TASK_MAP`;
27 folders; Mechanics, Materials_Science, Electromagnetism, Modern_Physics, Thermodynamics and
Neurobiology are Science). A folder not in it is reported as discipline "other", and the
folder name stays visible under "subject". Pass `disciplines=` to `mmvu()` for another mapping.

The open-ended part (rules, then an LLM judge) is `benchmark=mmvu_oe`
(`paravt.eval.adapters.mmvu_open`); this module deliberately keeps the paper's multiple-choice
number apart from it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from paravt.eval import lmms_scoring
from paravt.eval.adapters.base import (
    LMMS,
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

KEPT_QUESTION_TYPE = "multiple-choice"
_VIDEO_URL = re.compile(r"/videos/([^/]+)/([^/?#]+\.mp4)(?:[?#].*)?$")


def normalise_subject(folder: str) -> str:
    return " ".join(folder.replace("_", " ").replace("-", " ").lower().split())


# The subject folders of the release by discipline: the published mapping (lmms-eval's MMVU
# `TASK_MAP`, facts checked against its task code), e.g. Mechanics, Materials_Science,
# Electromagnetism and Neurobiology are Science.
_BY_DISCIPLINE = {
    "Science": (
        "Astronomy",
        "Biology",
        "Chemistry",
        "Electromagnetism",
        "Geography",
        "Materials_Science",
        "Mechanics",
        "Modern_Physics",
        "Neurobiology",
        "Thermodynamics",
    ),
    "Engineering": (
        "Biomedical_Engineering",
        "Civil_Engineering",
        "Computer_Science",
        "Electrical_Engineering",
        "Electronics_and_Communication",
        "Mechanical_Engineering",
    ),
    "Healthcare": (
        "Basic_Medicine",
        "Clinical_Medicine",
        "Dentistry",
        "Pharmacy",
        "Preventive_Medicine",
    ),
    "Humanities & Social Science": (
        "Art",
        "Economics",
        "History",
        "Law",
        "Literature",
        "Management",
    ),
}
DISCIPLINES: dict[str, str] = {
    normalise_subject(s): d for d, subjects in _BY_DISCIPLINE.items() for s in subjects
}
"""Normalised subject (lower case, "_" and "-" as spaces) -> discipline."""
OTHER_DISCIPLINE = "other"


def video_location(url: str, path: str, index: int) -> tuple[str, str]:
    """(Subject_Dir, file name) from ".../videos/{Subject_Dir}/{n}.mp4"."""
    found = _VIDEO_URL.search(url)
    if found is None:
        reason = f"{url!r} does not end in '/videos/<Subject_Dir>/<n>.mp4'"
        raise AnnotationError(path, index, "video", reason)
    return found.group(1), found.group(2)


def _options(choices: dict[str, Any], path: str, index: int) -> tuple[str, ...]:
    """The non-empty choice texts in letter order; the letters must run A, B, ... without gaps."""
    kept = {k.strip().upper(): v for k, v in choices.items() if isinstance(v, str) and v.strip()}
    letters = "".join(sorted(kept))
    if not letters or letters != LETTERS[: len(letters)]:
        raise AnnotationError(path, index, "choices", f"expected letters A, B, ...: {choices!r}")
    return tuple(kept[letter].strip() for letter in letters)


@dataclass(frozen=True)
class MMVUVideo:
    """Where a row's video is and how it is grouped (shared by the MCQ and open-ended loaders)."""

    path: str  # absolute when found
    missing: bool
    subject: str  # the Subject_Dir of its URL
    groups: dict[str, tuple[str, ...]]  # discipline and subject


def locate_video(
    url: str, path: str, index: int, root: str, disciplines: Mapping[str, str]
) -> MMVUVideo:
    """The row's video under `root`/videos/{Subject_Dir}/ and its discipline/subject groups."""
    subject_dir, file_name = video_location(url, path, index)
    video, missing = resolve_video([os.path.join(root, "videos", subject_dir, file_name)])
    discipline = disciplines.get(normalise_subject(subject_dir), OTHER_DISCIPLINE)
    groups = {"discipline": (discipline,), "subject": (subject_dir,)}
    return MMVUVideo(video, missing, subject_dir, groups)


def _item(
    row: dict[str, Any], index: int, path: str, root: str, disciplines: Mapping[str, str]
) -> EvalItem:
    def field(name: str, kind: str = "str") -> Any:
        return get_field(row, name, kind, path, index)

    where = locate_video(field("video"), path, index, root, disciplines)
    options = _options(field("choices", "dict"), path, index)
    sample = Sample(
        id=str(field("id", "id")),
        video=where.path,
        question=mcq_prompt(field("question"), options),
        answer=check_gold(field("answer"), options, path, index, "answer"),
        question_type="mcq",
        options=options,
        data_source="mmvu",
        extra={"subject": where.subject},
    )
    return EvalItem(sample=sample, groups=where.groups, video_missing=where.missing)


def load_rows_of_type(
    annotations: str,
    question_type: str,
    limit: int | None,
    item: Callable[[dict[str, Any], int], EvalItem],
) -> list[EvalItem]:
    """`item(row, index)` of each row of MMVU's `data/validation.json` whose question_type is
    `question_type`; a row without one is kept so that it is reported as a bad row, and row
    numbers in errors stay those of the file, not of the filtered list."""
    rows = read_rows(annotations)
    kept = [
        (i, r)
        for i, r in enumerate(rows)
        if not isinstance(r.get("question_type"), str) or r["question_type"] == question_type
    ]

    def make(row: dict[str, Any], index: int) -> EvalItem:
        get_field(row, "question_type", "str", annotations, index)
        return item(row, index)

    return build_items(take(kept, limit), make, annotations, "MMVU (data/validation.json)")


def load_mmvu(
    annotations: str,
    video_root: str,
    limit: int | None = None,
    disciplines: Mapping[str, str] = DISCIPLINES,
) -> list[EvalItem]:
    def item(row: dict[str, Any], index: int) -> EvalItem:
        return _item(row, index, annotations, video_root, disciplines)

    return load_rows_of_type(annotations, KEPT_QUESTION_TYPE, limit, item)


def mmvu(disciplines: Mapping[str, str] | None = None) -> MultipleChoiceBenchmark:
    mapping = (
        DISCIPLINES
        if disciplines is None
        else {normalise_subject(k): v for k, v in disciplines.items()}
    )
    return MultipleChoiceBenchmark(
        name="mmvu",
        loader=partial(load_mmvu, disciplines=mapping),
        lmms_rule="mmvu",
        lmms_summary=lmms_accuracy,
    )


def lmms_accuracy(items: Sequence[EvalItem], correct: Sequence[float]) -> dict[str, float]:
    """lmms-eval's MMVU figure: the accuracy over items of its 27 subject folders."""
    subjects = [item.sample.extra.get("subject", "") for item in items]
    return {LMMS + "accuracy": lmms_scoring.mmvu_accuracy(subjects, correct)}
