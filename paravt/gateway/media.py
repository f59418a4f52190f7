"""Request messages -> paravt messages and clips: what the gateway accepts as video, and how.

An agent sends OpenAI chat messages. Text parts pass through unchanged; a video part is

    {"type": "video_url", "video_url": {"url": "<path or file:// URL under the media root>",
                                        "frames": [source frame indices] | "num_frames": K,
                                        "max_pixels": 50176, "min_pixels": 0}}

and is decoded by paravt's own reader (the frames paravt's loop would show: `num_frames` picks
the overview's K frames, `frames` names a crop's indices), then becomes `{"type": "video"}`, the
placeholder paravt's renderer expands with the clip's real timestamps. So a frame the agent's own
tool chose reaches the policy exactly as paravt's crops do. Paths outside the media root, remote
URLs and malformed parts are refused with a `RequestError` that names the problem (HTTP 400).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from paravt.errors import VideoError
from paravt.types import Frames
from paravt.video.sampling import overview_indices

VIDEO_PART = "video_url"
MAX_FRAMES = 256  # per video part: more is a mistake, not a clip


class RequestError(ValueError):
    """A request the gateway refuses (HTTP 400); the message names the problem."""


@dataclass(frozen=True)
class MediaConfig:
    """Where videos may be read from and the default per-frame pixel cap (the overview's)."""

    root: str
    max_pixels: int = 50176
    factor: int = 32  # the model's patch x merge, from its processor


def local_path(url: str, root: str) -> str:
    """The real path of a `file://` URL or plain path, refused unless it lies under `root`
    (symlinks and `..` resolved first: no path traversal)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("", "file"):
        raise RequestError(f"video url {url!r}: only local paths or file:// URLs are served")
    path = os.path.realpath(unquote(parsed.path) if parsed.scheme == "file" else url)
    base = os.path.realpath(root)
    if os.path.commonpath([path, base]) != base:
        raise RequestError(f"video url {url!r} lies outside the gateway's media root")
    return path


def read_video_part(part: dict[str, Any], source, media: MediaConfig) -> Frames:
    """The frames one video part names, decoded by `source` (a paravt `FrameSource`)."""
    spec = part.get(VIDEO_PART)
    if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
        raise RequestError('a video_url part needs {"video_url": {"url": "...", ...}}')
    path = local_path(spec["url"], media.root)
    try:
        info = source.info(path)
        indices = _indices(spec, info.num_frames)
        max_pixels = int(spec.get("max_pixels", media.max_pixels))
        return source.read(path, indices, max_pixels, media.factor, int(spec.get("min_pixels", 0)))
    except VideoError as err:
        raise RequestError(str(err)) from err


def _indices(spec: dict[str, Any], num_frames: int) -> list[int]:
    if "frames" in spec:
        frames = spec["frames"]
        ok = isinstance(frames, list) and all(isinstance(i, int) for i in frames)
        if not ok or not 0 < len(frames) <= MAX_FRAMES:
            raise RequestError(f"video_url.frames must be 1..{MAX_FRAMES} integer frame indices")
        return frames
    k = spec.get("num_frames")
    if not isinstance(k, int) or not 0 < k <= MAX_FRAMES:
        raise RequestError(
            f"a video_url part needs frames (indices) or num_frames (1..{MAX_FRAMES})"
        )
    return overview_indices(num_frames, k)


def convert_message(
    message: dict[str, Any], source, media: MediaConfig
) -> tuple[dict[str, Any], list[Frames]]:
    """A non-assistant request message as paravt renders it, and the clips of its video parts."""
    role = message.get("role")
    if role not in ("system", "user", "tool"):
        raise RequestError(f"message role {role!r} is not system, user, tool or assistant")
    content = message.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}, []
    if not isinstance(content, list):
        raise RequestError(f"a {role} message's content must be a string or a list of parts")
    parts, clips = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == VIDEO_PART:
            clips.append(read_video_part(part, source, media))
            parts.append({"type": "video"})
        else:
            raise RequestError(f"content part {kind!r} is not supported: use text or video_url")
    return {"role": role, "content": parts}, clips


def video_part(path: str, indices: Sequence[int] = (), num_frames: int = 0, **pixels) -> dict:
    """The video part that names `indices` (a crop) or `num_frames` overview frames of `path`:
    what an agent (or paravt's task payload) sends."""
    spec: dict[str, Any] = {"url": path, **pixels}
    if indices:
        spec["frames"] = [int(i) for i in indices]
    else:
        spec["num_frames"] = int(num_frames)
    return {"type": VIDEO_PART, VIDEO_PART: spec}
