"""Convert one raw RL prompt row (a dict) into a `Sample`, and back.

Two layouts are read (see docs/method.md section 8):
- "paravt": what paravt's synthetic generator writes. `prompt` (chat messages, `<video>` marks the
  video), `videos` ([{"video": path}]), `extra_info` with `answer` and `question_type` (required),
  and optionally `options`, `windows` and anything else (kept in `Sample.extra`).
- "verl": the LongVT / verl layout. Same `prompt` / `videos` / `extra_info`, plus
  `reward_model: {"ground_truth": ..., "style": ...}`. The answer is `extra_info.answer` when
  present, else `reward_model.ground_truth`; the question type is `extra_info.question_type` when
  present, else inferred from the gold: "mcq" when it is a single letter A-Z that the question
  lists as an option line ("B. green"), "tvg" when it parses as an interval ("[12.0, 15.0]",
  "12-15", or a two-number list), else "oe".

Shared rules: a field whose value is None counts as absent (parquet fills the struct fields one row
lacks with None); `id` falls back to f"{data_source}-{extra_info.index}", then to
f"{data_source}-{row_index}"; a relative video path is joined to `base_dir`; an mcq answer must be
one option letter; a tvg sample without `windows` gets its gold interval as its window. A row that
breaks a rule raises `DataRowError`, which names the row, the field and what was expected.

This module is pure (no torch, no file access): reading files and checking that videos exist is
`paravt.data.datasets`' job.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from paravt.errors import UserError
from paravt.types import QUESTION_TYPES, Sample

VIDEO_MARKER = "<video>"
# extra_info keys that become Sample fields; every other key is kept in Sample.extra.
_CONSUMED_EXTRA = ("answer", "question_type", "options", "windows")
# Sample.extra key holding the system message, so that sample_to_row can write it back.
SYSTEM_KEY = "system_prompt"
_VIDEO_PART_TYPES = ("video", "video_url")
_MARKER_LINE = re.compile(rf"^[ \t]*{re.escape(VIDEO_MARKER)}[ \t]*(?:\n|$)", re.MULTILINE)
_MARKER_INLINE = re.compile(rf"[ \t]*{re.escape(VIDEO_MARKER)}[ \t]*")
_OPTION_LINE = re.compile(r"^\s*\(?([A-Z])[.):]\s*(.+?)\s*$", re.MULTILINE)
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_INTERVAL = re.compile(rf"^\s*[\[(]?\s*({_NUMBER})\s*(?:,|-|to)\s*({_NUMBER})\s*[\])]?\s*$")


class DataRowError(ValueError):
    """A malformed data row: names the row, the offending field and what was expected."""

    def __init__(self, row_id: str, field: str, reason: str) -> None:
        self.row_id = row_id
        self.field = field
        self.reason = reason
        super().__init__(f"row {row_id!r}: field {field!r}: {reason}")


def detect_layout(row: Mapping[str, Any]) -> str:
    """ "verl" when the row carries a `reward_model`, else "paravt"."""
    return "verl" if _get(row, "reward_model") is not None else "paravt"


def row_to_sample(
    row: Mapping[str, Any],
    *,
    base_dir: str | os.PathLike[str] | None,
    row_index: int,
    layout: str = "auto",
) -> Sample:
    """Convert one raw row to a Sample; raises DataRowError naming the field that is wrong."""
    if not isinstance(row, Mapping):
        raise DataRowError(f"row {row_index}", "<row>", f"expected a dict, got {_kind(row)}")
    extra_info = _get(row, "extra_info") or {}
    source = str(_get(row, "data_source") or "")
    row_id = _row_id(row, extra_info, source, row_index)
    if not isinstance(extra_info, Mapping):
        raise DataRowError(row_id, "extra_info", f"expected a dict, got {_kind(extra_info)}")
    chosen = detect_layout(row) if layout == "auto" else layout
    if chosen not in _LAYOUTS:
        known = ", ".join(["auto", *_LAYOUTS])
        raise DataRowError(
            row_id, "<layout>", f"unknown layout {layout!r}; expected one of {known}"
        )
    system, question = _read_prompt(_get(row, "prompt"), row_id)
    answer, question_type = _LAYOUTS[chosen](row, extra_info, question, row_id)
    options = _read_options(extra_info, question, question_type, row_id)
    _check_mcq_answer(answer, options, question_type, row_id)
    windows = _read_windows(_get(extra_info, "windows"), row_id)
    if not windows and question_type == "tvg":
        windows = _gold_window(answer)
    extra = {k: v for k, v in extra_info.items() if k not in _CONSUMED_EXTRA and v is not None}
    if system:
        extra[SYSTEM_KEY] = system
    style = _get(_get(row, "reward_model") or {}, "style")
    if style is not None:
        extra["reward_style"] = style
    return Sample(
        id=row_id,
        video=_read_video(_get(row, "videos"), base_dir, row_id),
        question=question,
        answer=answer,
        question_type=question_type,  # type: ignore[arg-type]  # checked against QUESTION_TYPES
        options=options,
        windows=windows,
        data_source=source,
        extra=extra,
    )


def sample_to_row(sample: Sample, base_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The inverse of row_to_sample, in the ParaVT layout.

    With `base_dir`, a video inside it is written relative to it (so the annotation file and its
    videos can move together); other paths are written as they are.
    """
    extra = dict(sample.extra)
    system = extra.pop(SYSTEM_KEY, None)
    prompt = [{"role": "system", "content": system}] if system else []
    prompt.append({"role": "user", "content": f"{VIDEO_MARKER}\n{sample.question}"})
    extra_info: dict[str, Any] = {
        "answer": sample.answer,
        "question_type": sample.question_type,
        "options": list(sample.options),
        "windows": [[start, end] for start, end in sample.windows],
        **extra,
    }
    return {
        "id": sample.id,
        "data_source": sample.data_source,
        "prompt": prompt,
        "videos": [{"video": _relative_video(sample.video, base_dir)}],
        "extra_info": extra_info,
    }


def _paravt_targets(
    row: Mapping[str, Any], extra_info: Mapping[str, Any], question: str, row_id: str
) -> tuple[str, str]:
    """ParaVT layout: answer and question_type are both required in extra_info."""
    answer = _answer_text(_get(extra_info, "answer"), row_id, "extra_info.answer")
    question_type = _get(extra_info, "question_type")
    if question_type is None:
        raise DataRowError(
            row_id, "extra_info.question_type", f"missing; expected one of {QUESTION_TYPES}"
        )
    return answer, _check_question_type(question_type, row_id)


def _verl_targets(
    row: Mapping[str, Any], extra_info: Mapping[str, Any], question: str, row_id: str
) -> tuple[str, str]:
    """verl layout: answer from extra_info or reward_model.ground_truth; type given or inferred."""
    if _get(extra_info, "answer") is not None:
        answer = _answer_text(extra_info["answer"], row_id, "extra_info.answer")
    else:
        reward_model = _get(row, "reward_model") or {}
        if not isinstance(reward_model, Mapping):
            raise DataRowError(
                row_id, "reward_model", f"expected a dict, got {_kind(reward_model)}"
            )
        gold = _get(reward_model, "ground_truth")
        answer = _answer_text(gold, row_id, "reward_model.ground_truth")
    question_type = _get(extra_info, "question_type")
    if question_type is None:
        return answer, infer_question_type(answer, question)
    return answer, _check_question_type(question_type, row_id)


_LAYOUTS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any], str, str], tuple[str, str]]] = {
    "paravt": _paravt_targets,
    "verl": _verl_targets,
}
LAYOUTS = ("auto", *_LAYOUTS)  # what `layout` (config `data.layout`) may name


def check_layout(layout: str) -> None:
    """Refuse a layout no row can be read in, once, rather than every row for it."""
    if layout not in LAYOUTS:
        raise UserError(f"data.layout={layout!r}: choose one of {', '.join(LAYOUTS)}")


def infer_question_type(answer: str, question: str) -> str:
    """ "mcq" for a listed option letter, "tvg" for an interval gold, else "oe"."""
    letter = answer.strip()
    if len(letter) == 1 and "A" <= letter <= "Z" and letter in _option_lines(question):
        return "mcq"
    return "tvg" if parse_interval(answer) is not None else "oe"


def parse_interval(text: str) -> tuple[float, float] | None:
    """Parse "[s, e]", "(s, e)", "s-e", "s to e" with 0 <= s < e into floats; None otherwise."""
    match = _INTERVAL.match(text)
    if match is None:
        return None
    start, end = float(match.group(1)), float(match.group(2))
    return (start, end) if 0.0 <= start < end else None


def _row_id(row: Mapping[str, Any], extra_info: Any, source: str, row_index: int) -> str:
    given = _get(row, "id")
    if given is not None and str(given).strip():
        return str(given).strip()
    index = _get(extra_info, "index") if isinstance(extra_info, Mapping) else None
    return f"{source or 'row'}-{row_index if index is None else index}"


def _read_prompt(prompt: Any, row_id: str) -> tuple[str, str]:
    """Return (system text, user text without the video marker)."""
    if not isinstance(prompt, list) or not prompt:
        raise DataRowError(
            row_id, "prompt", f"expected a non-empty list of chat messages, got {_kind(prompt)}"
        )
    texts: dict[str, list[str]] = {"system": [], "user": []}
    for i, message in enumerate(prompt):
        role = _get(message, "role") if isinstance(message, Mapping) else None
        if role not in ("system", "user", "assistant"):
            raise DataRowError(
                row_id,
                f"prompt[{i}].role",
                "expected a message dict with role "
                f"system, user or assistant, got {_kind(message)}",
            )
        if role in texts:
            texts[role].append(_content_text(_get(message, "content"), row_id, f"prompt[{i}]"))
    question = _strip_marker("\n".join(texts["user"]))
    if not question:
        raise DataRowError(
            row_id, "prompt", "no user text; expected a user message with the question"
        )
    return "\n".join(texts["system"]).strip(), question


def _content_text(content: Any, row_id: str, where: str) -> str:
    """Text of a message whose content is a string or a list of OpenAI content parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DataRowError(
            row_id,
            f"{where}.content",
            f"expected a string or a list of content parts, got {_kind(content)}",
        )
    pieces = []
    for j, part in enumerate(content):
        kind = _get(part, "type") if isinstance(part, Mapping) else None
        if kind == "text":
            pieces.append(str(_get(part, "text") or ""))
        elif kind in _VIDEO_PART_TYPES:
            pieces.append(VIDEO_MARKER)
        else:
            raise DataRowError(
                row_id,
                f"{where}.content[{j}].type",
                f"expected 'text', 'video' or 'video_url', got {kind!r}",
            )
    return "\n".join(pieces)


def _strip_marker(text: str) -> str:
    # A marker alone on its line takes the line with it; a mid-sentence one leaves a single space
    # so the words on either side stay apart.
    text = _MARKER_LINE.sub("", text)
    return _MARKER_INLINE.sub(" ", text).strip()


def _read_video(videos: Any, base_dir: str | os.PathLike[str] | None, row_id: str) -> str:
    if not isinstance(videos, list) or not videos:
        raise DataRowError(
            row_id,
            "videos",
            f'no video; expected a list with one {{"video": path}}, got {_kind(videos)}',
        )
    if len(videos) > 1:
        raise DataRowError(
            row_id,
            "videos",
            f"expected exactly one video per prompt, got {len(videos)}; split the row",
        )
    entry = videos[0]
    path = _get(entry, "video") if isinstance(entry, Mapping) else entry
    if not isinstance(path, str) or not path.strip():
        raise DataRowError(row_id, "videos[0].video", f"expected a path string, got {_kind(path)}")
    path = path.strip()
    if os.path.isabs(path) or base_dir is None:
        return path
    return os.path.normpath(os.path.join(os.fspath(base_dir), path))


def _relative_video(video: str, base_dir: str | os.PathLike[str] | None) -> str:
    if base_dir is None or not os.path.isabs(video):
        return video
    base = os.path.normpath(os.path.abspath(os.fspath(base_dir)))
    relative = os.path.relpath(video, base)
    return video if relative.startswith(os.pardir) else relative


def _answer_text(value: Any, row_id: str, field: str) -> str:
    """Gold answer as text: strings stripped, numbers printed, a [s, e] pair as "[s, e]"."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_is_number, value)):
        return f"[{float(value[0])}, {float(value[1])}]"
    if _is_number(value):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise DataRowError(
        row_id,
        field,
        f"answer missing; expected a non-empty string, a number or "
        f"a [start, end] pair, got {_kind(value)}",
    )


def _check_question_type(value: Any, row_id: str) -> str:
    if value not in QUESTION_TYPES:
        raise DataRowError(
            row_id,
            "extra_info.question_type",
            f"unknown question_type {value!r}; expected one of {QUESTION_TYPES}",
        )
    return str(value)


def _read_options(
    extra_info: Mapping[str, Any], question: str, question_type: str, row_id: str
) -> tuple[str, ...]:
    """Options from extra_info, else (for mcq) parsed from the question's "A. ..." lines."""
    options = _get(extra_info, "options")
    if options is None:
        return tuple(_option_lines(question).values()) if question_type == "mcq" else ()
    if not isinstance(options, (list, tuple)):
        raise DataRowError(
            row_id,
            "extra_info.options",
            f"options not a list; expected a list of option texts, got {_kind(options)}",
        )
    if not all(isinstance(o, str) or _is_number(o) for o in options):
        raise DataRowError(
            row_id,
            "extra_info.options",
            f"expected every option to be a string, got {[_kind(o) for o in options]}",
        )
    if len(options) > 26:
        raise DataRowError(
            row_id, "extra_info.options", f"expected at most 26 options (A-Z), got {len(options)}"
        )
    return tuple(str(o) for o in options)


def _option_lines(question: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _OPTION_LINE.finditer(question)}


def _check_mcq_answer(
    answer: str, options: tuple[str, ...], question_type: str, row_id: str
) -> None:
    if question_type != "mcq":
        return
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: len(options)] if options else ""
    if len(answer) != 1 or not ("A" <= answer <= "Z") or (letters and answer not in letters):
        expected = f"one of {letters}" if letters else "a single letter A-Z"
        raise DataRowError(
            row_id, "answer", f"mcq answer {answer!r} is not an option letter; expected {expected}"
        )


def _read_windows(value: Any, row_id: str) -> tuple[tuple[float, float], ...]:
    if value is None:
        return ()
    expected = "expected a list of [start, end] pairs in seconds with 0 <= start < end"
    if not isinstance(value, (list, tuple)):
        raise DataRowError(
            row_id, "extra_info.windows", f"windows malformed; {expected}, got {_kind(value)}"
        )
    windows = []
    for i, pair in enumerate(value):
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(map(_is_number, pair))
        if not ok or not 0.0 <= float(pair[0]) < float(pair[1]):
            raise DataRowError(
                row_id, f"extra_info.windows[{i}]", f"windows malformed; {expected}, got {pair!r}"
            )
        windows.append((float(pair[0]), float(pair[1])))
    return tuple(windows)


def _gold_window(answer: str) -> tuple[tuple[float, float], ...]:
    interval = parse_interval(answer)
    return () if interval is None else (interval,)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _get(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, Mapping) else None


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
