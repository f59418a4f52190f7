"""The ParaVT SFT row schema (docs/method.md section 8), parsed and validated: pure, no torch.

A row is `{"id": ..., "messages": [...]}` with OpenAI content-part messages. Roles: system, user,
assistant, tool. A content is a string or a list of parts:
    {"type": "text", "text": "..."}
    {"type": "video_url", "video_url": {"url": "clip.mp4"}, <video options>}
    {"type": "image_url", "image_url": {"url": "frame.png"}}
Video options (all optional; on the part or inside `video_url`): `video_start` / `video_end`
(seconds), `fps` (sampling rate, default the config's 1 fps), `max_frames`, `max_pixels`,
`min_pixels`, and `frame_indices` (explicit source frames: what the SFT writer stores, so a
trajectory recorded from the agent loop is re-read frame for frame). In parquet, `messages` may
be a JSON string (content is a string in some messages and a list in others, which Arrow cannot
hold in one column). The parser turns a row into
frozen `SFTConversation`s and raises `SFTRowError` naming the defect; it reads no files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class SFTRowError(ValueError):
    """A row that does not follow the SFT schema; the message names the field and the fix."""


@dataclass(frozen=True)
class VideoPart:
    url: str
    start: float | None = None
    end: float | None = None
    fps: float | None = None
    max_frames: int | None = None
    max_pixels: int | None = None
    min_pixels: int | None = None
    frame_indices: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ImagePart:
    url: str


@dataclass(frozen=True)
class TextPart:
    text: str


Part = TextPart | VideoPart | ImagePart


@dataclass(frozen=True)
class SFTMessage:
    role: str
    parts: tuple[Part, ...]
    plain: bool  # content was a bare string (rendered as a string, as the agent loop does)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


@dataclass(frozen=True)
class SFTConversation:
    id: str
    messages: tuple[SFTMessage, ...]


_VIDEO_KEYS = {
    "video_start": ("start", float),
    "video_end": ("end", float),
    "fps": ("fps", float),
    "max_frames": ("max_frames", int),
    "max_pixels": ("max_pixels", int),
    "min_pixels": ("min_pixels", int),
}


def _video_part(part: Mapping[str, Any], where: str) -> VideoPart:
    inner = part.get("video_url")
    if isinstance(inner, str):
        inner = {"url": inner}
    if not isinstance(inner, Mapping) or not isinstance(inner.get("url"), str) or not inner["url"]:
        raise SFTRowError(f"{where}: a video_url part needs {{'video_url': {{'url': 'path.mp4'}}}}")
    opts = {**part, **inner}
    kwargs: dict[str, Any] = {}
    for key, (name, kind) in _VIDEO_KEYS.items():
        if opts.get(key) is not None:
            try:
                kwargs[name] = kind(opts[key])
            except (TypeError, ValueError) as err:
                msg = f"{where}: video option {key}={opts[key]!r} is not a number"
                raise SFTRowError(msg) from err
    if opts.get("frame_indices") is not None:
        idx = opts["frame_indices"]
        if not isinstance(idx, Sequence) or not idx or not all(isinstance(i, int) for i in idx):
            raise SFTRowError(f"{where}: frame_indices must be a non-empty list of integers")
        kwargs["frame_indices"] = tuple(idx)
    start, end = kwargs.get("start"), kwargs.get("end")
    if start is not None and end is not None and end <= start:
        raise SFTRowError(f"{where}: video_end ({end}) must be greater than video_start ({start})")
    return VideoPart(url=inner["url"], **kwargs)


def _part(part: Any, where: str) -> Part:
    if not isinstance(part, Mapping) or "type" not in part:
        raise SFTRowError(f"{where}: a content part must be a dict with a 'type'")
    kind = part["type"]
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise SFTRowError(f"{where}: a text part needs a string 'text'")
        return TextPart(part["text"])
    if kind == "video_url":
        return _video_part(part, where)
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, Mapping) else inner
        if not isinstance(url, str) or not url:
            raise SFTRowError(f"{where}: an image_url part needs {{'image_url': {{'url': ...}}}}")
        return ImagePart(url)
    raise SFTRowError(f"{where}: unknown part type {kind!r}; use text, video_url or image_url")


def _message(msg: Any, where: str) -> SFTMessage:
    if not isinstance(msg, Mapping):
        raise SFTRowError(f"{where}: a message must be a dict with 'role' and 'content'")
    role = msg.get("role")
    if role not in ROLES:
        raise SFTRowError(f"{where}: role {role!r} is unknown; use one of {ROLES}")
    content = msg.get("content")
    if isinstance(content, str):
        return SFTMessage(role, (TextPart(content),), plain=True)
    if not isinstance(content, list) or not content:
        raise SFTRowError(f"{where}: content must be a string or a non-empty list of parts")
    parts = tuple(_part(p, f"{where}.content[{j}]") for j, p in enumerate(content))
    if role == "assistant" and any(not isinstance(p, TextPart) for p in parts):
        raise SFTRowError(f"{where}: assistant content must be text only (visuals are context)")
    return SFTMessage(role, parts, plain=False)


def parse_row(row: Any, index: int = 0) -> SFTConversation:
    """Validate one row; `index` names it in errors when it has no `id`."""
    if not isinstance(row, Mapping):
        raise SFTRowError(f"row {index}: expected a JSON object, got {type(row).__name__}")
    rid = str(row.get("id", f"row{index}"))
    messages = row.get("messages")
    if isinstance(messages, str):  # parquet files may hold the messages as a JSON string
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as err:
            msg = f"row {rid!r}: 'messages' is a string but not JSON ({err.msg})"
            raise SFTRowError(msg) from err
    if not isinstance(messages, list) or not messages:
        raise SFTRowError(f"row {rid!r}: needs a non-empty 'messages' list (OpenAI chat format)")
    msgs = tuple(_message(m, f"row {rid!r} messages[{i}]") for i, m in enumerate(messages))
    if msgs[0].role == "assistant":
        raise SFTRowError(f"row {rid!r}: starts with an assistant turn; put the prompt first")
    if msgs[-1].role != "assistant":
        raise SFTRowError(
            f"row {rid!r}: ends with a {msgs[-1].role} turn; the last message must be the "
            "assistant's (drop trailing turns: nothing after it would be trained)"
        )
    return SFTConversation(rid, msgs)


def answer_spans(text: str, open_tag: str = "<answer>", close_tag: str = "</answer>"):
    """Character spans [(start, end)] of the contents of every closed answer block of `text`."""
    spans, pos = [], 0
    while (i := text.find(open_tag, pos)) >= 0:
        j = text.find(close_tag, i + len(open_tag))
        if j < 0:
            break
        spans.append((i + len(open_tag), j))
        pos = j + len(close_tag)
    return spans
