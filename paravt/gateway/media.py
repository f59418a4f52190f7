"""Request messages -> paravt messages and clips: what the gateway accepts as video, and how.

An agent sends OpenAI chat messages. Text parts pass through unchanged; a video part is

    {"type": "video_url", "video_url": {"url": "<path or file:// URL under the media root>",
                                        "frames": [source frame indices] | "num_frames": K,
                                        "max_pixels": 50176, "min_pixels": 0}}

or, for frames the agent's own tool decoded, `{"images": [data URLs], "timestamps": [s],
"fps": F}` in place of `url`; a lone `image_url` data URL is a still, shown as two frames as
paravt shows a one-frame video. A video file part is decoded by paravt's own reader (the
frames paravt's loop would show: `num_frames` picks the overview's K frames, `frames` names a
crop's indices). Either becomes `{"type": "video"}`, the placeholder paravt's renderer expands
with the clip's real timestamps, so the frames an agent's own tool chose reach the policy as
paravt's crops do (a file part: exactly; images: resized bicubic, as the reader's fallback).
Paths outside the media root, remote
URLs and malformed parts are refused with a `RequestError` that names the problem (HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
from PIL import Image

from paravt.errors import VideoError
from paravt.types import Frames
from paravt.video.sampling import fit_pixels, overview_indices

VIDEO_PART = "video_url"
MAX_FRAMES = 256  # per video part: more is a mistake, not a clip
_DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,(.*)", re.S)


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
    if isinstance(spec, dict) and "images" in spec:
        return frames_from_images(spec, media)
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


def decode_image(url: object) -> np.ndarray:
    """The RGB pixels [H, W, 3] of a `data:image/...;base64,` URL (no other URL is fetched)."""
    match = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
    if match is None:
        raise RequestError("an image must be a data:image/<type>;base64,<data> URL")
    try:
        image = Image.open(io.BytesIO(base64.b64decode(match.group(1), validate=True)))
        return np.asarray(image.convert("RGB"))
    except (binascii.Error, OSError, ValueError, Image.DecompressionBombError) as err:
        raise RequestError(f"bad image data URL: {err}") from err


def frames_from_images(spec: dict[str, Any], media: MediaConfig) -> Frames:
    """A clip of the agent's own frames: data URLs at `timestamps` (s) of a video at `fps`,
    resized as paravt's reader resizes (bicubic, to fit `max_pixels` on the model's grid)."""
    images, times, fps = spec.get("images"), spec.get("timestamps"), spec.get("fps")
    if not isinstance(images, list) or not 0 < len(images) <= MAX_FRAMES:
        raise RequestError(f"video_url.images must list 1..{MAX_FRAMES} image data URLs")
    if not isinstance(times, list) or len(times) != len(images) or times != sorted(times):
        raise RequestError("video_url.timestamps must give each image's time, in order")
    if not isinstance(fps, (int, float)) or fps <= 0:
        raise RequestError("video_url.fps (the source video's frame rate, > 0) is required")
    arrays = [decode_image(u) for u in images]
    if len({a.shape for a in arrays}) != 1:
        raise RequestError("the images of one video_url part must share one size")
    h, w = arrays[0].shape[:2]
    max_pixels = int(spec.get("max_pixels", media.max_pixels))
    height, width = fit_pixels(h, w, max_pixels, media.factor, int(spec.get("min_pixels", 0)))
    pixels = np.stack(
        [
            np.asarray(Image.fromarray(a).resize((width, height), Image.Resampling.BICUBIC))
            for a in arrays
        ]
    )  # [K, H, W, 3]
    if len(arrays) == 1:  # a still: two frames, as a one-frame video is shown
        pixels, times = np.concatenate([pixels, pixels]), [times[0], times[0]]
    indices = tuple(round(float(t) * fps) for t in times)
    duration = float(spec.get("duration", float(times[-1]) + 1.0 / fps))
    return Frames(pixels, indices, tuple(float(t) for t in times), float(fps), duration)


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
        elif kind == "image_url" and isinstance(part.get("image_url"), dict):
            still = {"images": [part["image_url"].get("url")], "timestamps": [0.0], "fps": 1.0}
            clips.append(frames_from_images(still, media))
            parts.append({"type": "video"})
        else:
            raise RequestError(
                f"content part {kind!r} is not supported: use text, video_url or image_url"
            )
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
