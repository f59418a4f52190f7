"""Video-MME (without and with subtitles): the official test parquet to `EvalItem`s.

Rows: video_id, duration (short|medium|long), domain, sub_category, url, videoID, question_id,
task_type, question, options (ALREADY lettered, "A. Apples."), answer (a letter). Videos are
`{video_root}/{videoID}.mp4` (.MP4 and .mkv also tried). The letters are stripped from the options
and put back once by `mcq_prompt`, so an option never reads "A. A. Apples.".

With subtitles (`videomme_sub`): `{subtitle_root}/{videoID}.srt`. We use ALL subtitle text (the
reference driver's choice), not only the blocks covering sampled frames (lmms-eval's): the frames
sampled depend on the runner's frame budget, and the adapter must not. `<font>` and other tags
are stripped and HTML entities (`&amp;`, `&#39;`) unescaped; a prefix longer than
`SUBTITLE_WARN_CHARS` is warned about (it may not fit the context). A video without a subtitle
file gets no prefix (about 468 questions in the release).

Report: accuracy overall and by duration, domain, sub_category and task_type. Unparseable
answers: paravt counts them wrong; the official Video-MME script leaves them out of the
denominator (`benchmark.unparseable=exclude` reproduces it).

This module deliberately does not decode video or score (see `base` and `paravt.eval.scoring`).
"""

from __future__ import annotations

import html
import logging
import os
import re
from functools import partial
from typing import Any

from paravt.eval.benchmarks.base import (
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

VIDEO_EXTENSIONS = (".mp4", ".MP4", ".mkv")
SUBTITLE_PREFIX = "This video's subtitles are listed below:\n{text}\n\n"
log = logging.getLogger(__name__)
GROUP_FIELDS = ("duration", "domain", "sub_category", "task_type")
# ~4 characters per token: a prefix over ~16k tokens leaves little room in a 32k context.
SUBTITLE_WARN_CHARS = 64_000
_LETTERED = re.compile(r"^\s*\(?([A-Z])\s*[.):]\s*(.*?)\s*$", re.S)
_SRT_TIMING = re.compile(r"^\s*\d{1,2}:\d{2}:\d{2}[,.]\d{1,3}\s*-->")
_TAG = re.compile(r"<[^>]*>")


def strip_letters(options: list[Any], path: str, index: int) -> tuple[str, ...]:
    """["A. x", "B. y"] -> ("x", "y"); the letters must run A, B, C, ... in order."""
    texts = []
    for position, option in enumerate(options):
        found = _LETTERED.match(option) if isinstance(option, str) else None
        if found is None or found.group(1) != LETTERS[position]:
            expected = f"'{LETTERS[position]}. ...'"
            raise AnnotationError(path, index, "options", f"option {option!r}: expected {expected}")
        texts.append(found.group(2))
    return tuple(texts)


def parse_srt(text: str) -> list[str]:
    """The text lines of an SRT file in order: each block's index and timing lines dropped (a
    subtitle that is itself a number is kept), tags such as `<font color=...>` stripped."""
    lines = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n").lstrip("\ufeff")):
        block_lines = [line.strip() for line in block.split("\n") if line.strip()]
        if block_lines and block_lines[0].isdigit():
            block_lines = block_lines[1:]
        if block_lines and _SRT_TIMING.match(block_lines[0]):
            block_lines = block_lines[1:]
        text_lines = (html.unescape(_TAG.sub("", line)).strip() for line in block_lines)
        lines += [c for c in text_lines if c]
    return lines


def subtitle_prefix(subtitle_root: str | None, video_id: str) -> str:
    """The with-subtitles prompt prefix for one video; "" without a root or a subtitle file."""
    if subtitle_root is None:
        return ""
    path = os.path.join(subtitle_root, f"{video_id}.srt")
    if not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = parse_srt(handle.read())
    prefix = SUBTITLE_PREFIX.format(text="\n".join(lines)) if lines else ""
    if len(prefix) > SUBTITLE_WARN_CHARS:
        log.warning(
            "%s: all-subtitles prefix is ~%d tokens (%d chars), it may not fit the context "
            "(protocol agent.max_total_tokens); the official alternative keeps only subtitles at "
            "sampled frames (lmms-eval), not implemented here yet",
            path,
            len(prefix) // 4,
            len(prefix),
        )
    return prefix


def _item(row: dict[str, Any], index: int, path: str, root: str, subs: str | None) -> EvalItem:
    def field(name: str, kind: str = "str") -> Any:
        return get_field(row, name, kind, path, index)

    video_id = field("videoID")
    options = strip_letters(list(field("options", "list")), path, index)
    video, missing = resolve_video([os.path.join(root, video_id + e) for e in VIDEO_EXTENSIONS])
    prefix = subtitle_prefix(subs, video_id)
    sample = Sample(
        id=field("question_id"),
        video=video,
        question=mcq_prompt(field("question"), options, prefix),
        answer=check_gold(field("answer"), options, path, index, "answer"),
        question_type="mcq",
        options=options,
        data_source="videomme_sub" if subs is not None else "videomme",
        extra={"videoID": video_id, "has_subtitles": bool(prefix)},
    )
    groups = {key: (field(key),) for key in GROUP_FIELDS}
    return EvalItem(sample=sample, groups=groups, video_missing=missing)


def load_videomme(
    annotations: str, video_root: str, limit: int | None = None, subtitle_root: str | None = None
) -> list[EvalItem]:
    rows = take(read_rows(annotations), limit)
    make = partial(_item, path=annotations, root=video_root, subs=subtitle_root)
    return build_items(enumerate(rows), make, annotations, "Video-MME")


def videomme() -> MultipleChoiceBenchmark:
    return MultipleChoiceBenchmark(name="videomme", loader=load_videomme)


def videomme_sub(subtitle_root: str | None = None) -> MultipleChoiceBenchmark:
    if not subtitle_root:
        raise ValueError(
            "videomme_sub needs subtitle_root=<folder holding {videoID}.srt files>; "
            "use 'videomme' for the no-subtitle variant"
        )
    if not os.path.isdir(subtitle_root):
        raise FileNotFoundError(f"videomme_sub: subtitle_root {subtitle_root!r} is not a folder")
    loader = partial(load_videomme, subtitle_root=subtitle_root)
    return MultipleChoiceBenchmark(name="videomme_sub", loader=loader)
