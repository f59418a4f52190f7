"""Video-MME (without and with subtitles): the official test parquet to `EvalItem`s.

Rows: video_id, duration (short|medium|long), domain, sub_category, url, videoID, question_id,
task_type, question, options (ALREADY lettered, "A. Apples."), answer (a letter). Videos are
`{video_root}/{videoID}.mp4` (.MP4 and .mkv also tried). The letters are stripped from the options
and put back once by `mcq_prompt`, so an option never reads "A. A. Apples.".

With subtitles (`videomme_sub`): `{subtitle_root}/{videoID}.srt`. Two rules, option `subtitles`:
- `all` (default, the reference driver's): every subtitle line, in the question text.
- `sampled_frames` (lmms-eval's, the official protocol's alternative when all subtitles do not
  fit the context): only the blocks whose time span holds one of the overview frames the model
  is shown. The frames depend on the run's frame budget, which the adapter does not know, so it
  stores the timed blocks in `Sample.extra[FRAME_SUBTITLES]` and the prompt builder
  (`paravt.agent.prompts.user_text`) picks the blocks at the frames actually sampled.
`<font>` and other tags are stripped and HTML entities (`&amp;`, `&#39;`) unescaped; an
all-subtitles prefix longer than `SUBTITLE_WARN_CHARS` is warned about (it may not fit the
context). A video without a subtitle file gets no prefix (about 468 questions in the release).

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

from paravt.agent.prompts import FRAME_SUBTITLES, SUBTITLE_PREFIX
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

VIDEO_EXTENSIONS = (".mp4", ".MP4", ".mkv")
log = logging.getLogger(__name__)
GROUP_FIELDS = ("duration", "domain", "sub_category", "task_type")
# ~4 characters per token: a prefix over ~16k tokens leaves little room in a 32k context.
SUBTITLE_WARN_CHARS = 64_000
_LETTERED = re.compile(r"^\s*\(?([A-Z])\s*[.):]\s*(.*?)\s*$", re.S)
_SRT_TIMING = re.compile(r"^\s*\d{1,2}:\d{2}:\d{2}[,.]\d{1,3}\s*-->")
_SRT_SPAN = re.compile(
    r"^(\d{1,2}):(\d{2}):(\d{2})[,.](\d{1,3})\s*-->\s*(\d{1,2}):(\d{2}):(\d{2})[,.](\d{1,3})"
)
SUBTITLE_RULES = ("all", "sampled_frames")
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


def parse_srt_blocks(text: str) -> list[tuple[float, float, str]]:
    """The timed blocks `(start s, end s, text)` of an SRT file in order; blocks without a timing
    line or without text are dropped, tags stripped and HTML entities unescaped."""
    blocks = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n").lstrip("\ufeff")):
        lines = [line.strip() for line in block.split("\n") if line.strip()]
        at = next((i for i, line in enumerate(lines[:2]) if _SRT_SPAN.match(line)), None)
        if at is None:
            continue
        times = [int(g) for g in _SRT_SPAN.match(lines[at]).groups()]
        words = (html.unescape(_TAG.sub("", line)).strip() for line in lines[at + 1 :])
        body = "\n".join(w for w in words if w)
        if body:
            blocks.append((_seconds(*times[:4]), _seconds(*times[4:]), body))
    return blocks


def _seconds(hours: int, minutes: int, seconds: int, millis: int) -> float:
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


def _read_srt(subtitle_root: str | None, video_id: str) -> str | None:
    path = os.path.join(subtitle_root or "", f"{video_id}.srt")
    if subtitle_root is None or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def subtitle_prefix(subtitle_root: str | None, video_id: str) -> str:
    """The with-subtitles prompt prefix for one video; "" without a root or a subtitle file."""
    text = _read_srt(subtitle_root, video_id)
    lines = parse_srt(text) if text is not None else []
    prefix = SUBTITLE_PREFIX.format(text="\n".join(lines)) if lines else ""
    if len(prefix) > SUBTITLE_WARN_CHARS:
        log.warning(
            "%s.srt: all-subtitles prefix is ~%d tokens (%d chars), it may not fit the context "
            "(protocol agent.max_total_tokens); the official alternative keeps only subtitles at "
            "sampled frames: benchmark.options.subtitles=sampled_frames",
            os.path.join(subtitle_root or "", video_id),
            len(prefix) // 4,
            len(prefix),
        )
    return prefix


def _item(
    row: dict[str, Any], index: int, path: str, root: str, subs: str | None, rule: str = "all"
) -> EvalItem:
    def field(name: str, kind: str = "str") -> Any:
        return get_field(row, name, kind, path, index)

    video_id = field("videoID")
    options = strip_letters(list(field("options", "list")), path, index)
    video, missing = resolve_video([os.path.join(root, video_id + e) for e in VIDEO_EXTENSIONS])
    extra: dict[str, Any] = {"videoID": video_id}
    if rule == "sampled_frames":
        text = _read_srt(subs, video_id)
        blocks = tuple(parse_srt_blocks(text)) if text is not None else ()
        prefix, extra[FRAME_SUBTITLES] = "", blocks
        extra["has_subtitles"] = bool(blocks)
    else:
        prefix = subtitle_prefix(subs, video_id)
        extra["has_subtitles"] = bool(prefix)
    sample = Sample(
        id=field("question_id"),
        video=video,
        question=mcq_prompt(field("question"), options, prefix),
        answer=check_gold(field("answer"), options, path, index, "answer"),
        question_type="mcq",
        options=options,
        data_source="videomme_sub" if subs is not None else "videomme",
        extra=extra,
    )
    groups = {key: (field(key),) for key in GROUP_FIELDS}
    return EvalItem(sample=sample, groups=groups, video_missing=missing)


def load_videomme(
    annotations: str,
    video_root: str,
    limit: int | None = None,
    subtitle_root: str | None = None,
    subtitles: str = "all",
) -> list[EvalItem]:
    rows = take(read_rows(annotations), limit)
    make = partial(_item, path=annotations, root=video_root, subs=subtitle_root, rule=subtitles)
    return build_items(enumerate(rows), make, annotations, "Video-MME")


def videomme() -> MultipleChoiceBenchmark:
    return MultipleChoiceBenchmark(name="videomme", loader=load_videomme)


def videomme_sub(
    subtitle_root: str | None = None, subtitles: str = "all"
) -> MultipleChoiceBenchmark:
    """Video-MME with subtitles; `subtitles`: "all" lines, or "sampled_frames" (module doc)."""
    if subtitles not in SUBTITLE_RULES:
        raise ValueError(
            f"videomme_sub: subtitles={subtitles!r} is unknown; choose one of {SUBTITLE_RULES} "
            "(benchmark.options.subtitles)"
        )
    if not subtitle_root:
        raise ValueError(
            "videomme_sub needs subtitle_root=<folder holding {videoID}.srt files>; "
            "use 'videomme' for the no-subtitle variant"
        )
    if not os.path.isdir(subtitle_root):
        raise FileNotFoundError(f"videomme_sub: subtitle_root {subtitle_root!r} is not a folder")
    loader = partial(load_videomme, subtitle_root=subtitle_root, subtitles=subtitles)
    return MultipleChoiceBenchmark(name="videomme_sub", loader=loader)
