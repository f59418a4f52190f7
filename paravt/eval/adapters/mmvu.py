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
number apart from it. Both parts load through `load_part` (the row filter, id, video, discipline
and subject), each adding its own question and answer fields.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
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


def disciplines_of(mapping: Mapping[str, str] | None) -> dict[str, str]:
    """A user's subject -> discipline mapping with its subjects normalised (None: `DISCIPLINES`)."""
    if mapping is None:
        return dict(DISCIPLINES)
    if not isinstance(mapping, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
    ):
        raise ValueError(
            "benchmark.options.disciplines must map subject folders to disciplines, e.g. "
            f"{{Mechanics: Science}}, got {mapping!r}"
        )
    return {normalise_subject(k): v for k, v in mapping.items()}


# A part's own Sample fields of a row: (get(name, kind), annotations path, row index) -> the
# question, answer, question_type, options ... and `extra` beyond the subject.
PartFields = Callable[[Callable[..., Any], str, int], dict[str, Any]]


def load_part(
    annotations: str,
    video_root: str,
    limit: int | None,
    disciplines: Mapping[str, str],
    question_type: str,
    fields: PartFields,
) -> list[EvalItem]:
    """The `EvalItem`s of the rows of MMVU's `data/validation.json` whose question_type is
    `question_type` (the multiple-choice and the open-ended parts): id, video, data source,
    subject and the discipline/subject groups are read here, the rest by `fields`. A row without
    a question_type is kept so that it is reported as a bad row, and row numbers in errors stay
    those of the file, not of the filtered list."""
    rows = read_rows(annotations)
    kept = [
        (i, r)
        for i, r in enumerate(rows)
        if not isinstance(r.get("question_type"), str) or r["question_type"] == question_type
    ]

    def item(row: dict[str, Any], index: int) -> EvalItem:
        def get(name: str, kind: str = "str") -> Any:
            return get_field(row, name, kind, annotations, index)

        get("question_type")
        subject_dir, file_name = video_location(get("video"), annotations, index)
        video, missing = resolve_video([os.path.join(video_root, "videos", subject_dir, file_name)])
        sample_id = str(get("id", "id"))
        own = fields(get, annotations, index)
        extra = {"subject": subject_dir, **own.pop("extra", {})}
        sample = Sample(id=sample_id, video=video, data_source="mmvu", extra=extra, **own)
        discipline = disciplines.get(normalise_subject(subject_dir), OTHER_DISCIPLINE)
        groups = {"discipline": (discipline,), "subject": (subject_dir,)}
        return EvalItem(sample=sample, groups=groups, video_missing=missing)

    return build_items(take(kept, limit), item, annotations, "MMVU (data/validation.json)")


def _mcq_fields(get: Callable[..., Any], path: str, index: int) -> dict[str, Any]:
    options = _options(get("choices", "dict"), path, index)
    return {
        "question": mcq_prompt(get("question"), options),
        "answer": check_gold(get("answer"), options, path, index, "answer"),
        "question_type": "mcq",
        "options": options,
    }


def load_mmvu(
    annotations: str,
    video_root: str,
    limit: int | None = None,
    disciplines: Mapping[str, str] = DISCIPLINES,
) -> list[EvalItem]:
    return load_part(annotations, video_root, limit, disciplines, KEPT_QUESTION_TYPE, _mcq_fields)


def mmvu(disciplines: Mapping[str, str] | None = None) -> MultipleChoiceBenchmark:
    return MultipleChoiceBenchmark(
        name="mmvu",
        loader=partial(load_mmvu, disciplines=disciplines_of(disciplines)),
        lmms_rule="mmvu",
        lmms_summary=lmms_accuracy,
    )


def lmms_accuracy(items: Sequence[EvalItem], correct: Sequence[float]) -> dict[str, float]:
    """lmms-eval's MMVU figure: the accuracy over items of its 27 subject folders."""
    subjects = [item.sample.extra.get("subject", "") for item in items]
    return {LMMS + "accuracy": lmms_scoring.mmvu_accuracy(subjects, correct)}
