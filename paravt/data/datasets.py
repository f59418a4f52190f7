"""Load RL prompt files (.parquet, .jsonl, .json) into `Sample`s, and order them per epoch.

`load_samples` never crashes on a bad row and never drops one silently: every skipped row is in
`LoadReport.skipped` with its id and the reason, and a one-line warning is logged. Whole-file
problems (unknown extension, unreadable file, a bad JSON line) raise `DataFileError` naming the
file (and line). Row conversion rules live in `paravt.data.schemas`; this module only reads files,
checks each row's video (`video_check`: exists, opens and decodes its first frame, or also
decodes its last frame, so a truncated or corrupt mp4 is skipped at load instead of stopping a
training step). `fail_fast=True` raises on the first bad row.
It deliberately does not build prompts, sample frames or batch tensors.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paravt.data.schemas import DataRowError, check_layout, row_to_sample
from paravt.errors import UserError
from paravt.types import Sample

log = logging.getLogger(__name__)
# How many skip reasons the warning line quotes; the report holds all of them.
_REASONS_IN_WARNING = 3


class DataFileError(UserError, ValueError):
    """A data file that cannot be read at all (the message names the file and the fix)."""


class BadRowError(UserError, ValueError):
    """A bad row or video under `fail_fast=True` (the message names the row, file and fix)."""


# How hard each row's video is checked at load: none, the file exists, it opens and its first
# frame decodes, or its last frame decodes too (catches truncated files whose header is intact).
VIDEO_CHECKS = ("none", "exists", "open", "decode")


@dataclass(frozen=True)
class LoadReport:
    """What load_samples did with one file: rows seen, kept, and each skipped row's reason."""

    path: str
    total: int
    kept: int
    skipped: tuple[tuple[str, str], ...]  # (row id, reason)
    video_errors: int = 0  # how many of `skipped` had a missing or undecodable video


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    # Imported here: JSONL-only machines (tests/gpu/run.sh's wheel folder) need no pyarrow.
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as error:
        raise DataFileError(f"{path}: cannot read as parquet ({error})") from error


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFileError(
                f"{path}:{lineno}: invalid JSON ({error.msg} at column {error.colno}); "
                "each line must hold one JSON object"
            ) from error
        if not isinstance(row, dict):
            raise DataFileError(
                f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}"
            )
        rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise DataFileError(
            f"{path}:{error.lineno}: invalid JSON ({error.msg} at column {error.colno})"
        ) from error
    if not isinstance(rows, list):
        got = type(rows).__name__
    elif odd := [type(row).__name__ for row in rows if not isinstance(row, dict)]:
        got = f"a list holding {odd[0]}"
    else:
        return rows
    raise DataFileError(
        f"{path}: expected a JSON list of row objects, got {got}; "
        "use .jsonl for one object per line"
    )


def read_text(path: Path) -> str:
    """The file as UTF-8 text; `DataFileError` naming it when it cannot be read so."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: cannot read as UTF-8 text ({error})") from error


_READERS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    ".parquet": _read_parquet,
    ".jsonl": _read_jsonl,
    ".json": _read_json,
}


def load_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read every row of a .parquet, .jsonl or .json (a list of rows) file as plain dicts."""
    file = Path(path)
    reader = _READERS.get(file.suffix.lower())
    if reader is None:
        raise DataFileError(
            f"{file}: unknown data file extension {file.suffix!r}; "
            f"expected one of {', '.join(_READERS)}"
        )
    if not file.is_file():
        raise DataFileError(f"{file}: no such file; check the data path")
    return reader(file)


def load_samples(
    path: str | os.PathLike[str],
    *,
    layout: str = "auto",
    check_videos: bool = True,
    limit: int | None = None,
    video_check: str = "exists",
    fail_fast: bool = False,
) -> tuple[list[Sample], LoadReport]:
    """Convert a file's rows to Samples, skipping (and reporting) malformed ones.

    Relative video paths are resolved against the file's directory. With `limit`, reading stops
    once `limit` samples are kept, so `total` counts only the rows examined. A row whose id
    repeats an earlier kept row is skipped: ids key the frame budget and resumption.
    `check_videos=False` is `video_check="none"`; `fail_fast` raises `BadRowError` instead.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    if video_check not in VIDEO_CHECKS:
        raise UserError(f"video_check must be one of {VIDEO_CHECKS}, got {video_check!r}")
    check_layout(layout)
    check = video_check if check_videos else "none"
    rows = load_rows(path)
    base_dir = Path(path).parent
    samples: list[Sample] = []
    skipped: list[tuple[str, str]] = []
    seen: set[str] = set()
    total = video_errors = 0
    for index, row in enumerate(rows):
        if limit is not None and len(samples) >= limit:
            break
        total += 1
        try:
            sample = row_to_sample(row, base_dir=base_dir, row_index=index, layout=layout)
        except DataRowError as error:
            problem, row_id, is_video = str(error), error.row_id, False
        else:
            row_id, problem = sample.id, _duplicate(sample, seen)
            is_video = problem is None and (problem := video_problem(sample, check)) is not None
        if problem:
            if fail_fast:
                raise BadRowError(f"{path}: {problem} (fail_fast is on; fix or drop the row)")
            skipped.append((row_id, problem))
            video_errors += is_video
            continue
        seen.add(sample.id)
        samples.append(sample)
    report = LoadReport(str(path), total, len(samples), tuple(skipped), video_errors)
    _log_report(report)
    return samples, report


def _duplicate(sample: Sample, seen: set[str]) -> str | None:
    if sample.id in seen:
        return f"row {sample.id!r}: field 'id': duplicate id; give every row a unique id"
    return None


def video_problem(sample: Sample, check: str) -> str | None:
    """Why the sample's video cannot be used under `check` (see VIDEO_CHECKS), or None."""
    if check == "none":
        return None
    where = f"row {sample.id!r}: field 'videos[0].video'"
    if not os.path.isfile(sample.video):
        return (
            f"{where}: video file not found: {sample.video}; "
            "fix the path (relative paths are resolved against the data file's folder)"
        )
    if check == "exists":
        return None
    from paravt.video.reader import VideoError, VideoReader

    reader = VideoReader(cache_size=1)
    try:
        info = reader.info(sample.video)
        if info.num_frames < 2:
            return f"{where}: {sample.video} has {info.num_frames} frame; a video needs >= 2"
        if check == "decode":
            reader.read(sample.video, [info.num_frames - 1], max_pixels=64 * 64)
    except VideoError as error:
        return f"{where}: {error}"
    except Exception as error:  # a decoder failure deep in the last frame of a truncated file
        return f"{where}: {sample.video}: cannot decode its last frame ({error}); re-encode it"
    return None


def _log_report(report: LoadReport) -> None:
    if report.skipped:
        first = " | ".join(reason for _, reason in report.skipped[:_REASONS_IN_WARNING])
        log.warning(
            "%s: skipped %d of %d rows (kept %d), %d with a bad video; first reasons: %s",
            report.path,
            len(report.skipped),
            report.total,
            report.kept,
            report.video_errors,
            first,
        )
    else:
        log.info("%s: loaded %d samples", report.path, report.kept)


def epoch_order(num: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """Indices 0..num-1 in epoch `epoch`'s order: a permutation from a torch.Generator seeded
    with seed + epoch, so a resumed run replays the same sequence of prompts."""
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if not shuffle:
        return list(range(num))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num, generator=generator).tolist()
