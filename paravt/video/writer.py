"""Encode RGB frames to an mp4 file with PyAV, byte-for-byte reproducibly.

The colour conversion to yuv420p is done here in numpy (not by swscale) and x264 runs single-
threaded without macroblock-tree rate control, so the same frames always give the same file.
This module deliberately draws nothing (`paravt.video.synthetic` does) and reads nothing back
(`paravt.video.reader` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import av
import numpy as np


@lru_cache(maxsize=1)
def video_codec() -> str:
    """The first H.264 encoder this PyAV build offers, else MPEG-4 part 2."""
    for name in ("libx264", "h264", "mpeg4"):
        try:
            av.codec.Codec(name, "w")
        except Exception:  # PyAV raises UnknownCodecError or ValueError depending on version
            continue
        return name
    raise RuntimeError("PyAV offers none of libx264, h264, mpeg4 encoders; install an FFmpeg build")


# BT.601 limited range, what decoders assume for an untagged stream: rows Y, Cb, Cr of RGB / 255.
_RGB_TO_YUV = (
    np.array([[65.481, 128.553, 24.966], [-37.797, -74.203, 112.0], [112.0, -93.786, -18.214]])
    / 255.0
)


def _yuv420p(pixels: np.ndarray) -> np.ndarray:
    """RGB [H, W, 3] -> planar yuv420p [H * 3 / 2, W], computed here rather than by swscale.

    swscale picks SIMD paths by buffer alignment, so its output (and the encoded bytes) varied
    between runs of the same frames; numpy makes the bytes a function of the pixels alone.
    """
    height, width = pixels.shape[:2]
    yuv = pixels.astype(np.float64) @ _RGB_TO_YUV.T + (16.0, 128.0, 128.0)  # [H, W, 3]
    luma = yuv[:, :, 0]
    chroma = yuv[:, :, 1:].reshape(height // 2, 2, width // 2, 2, 2).mean(axis=(1, 3))
    planes = [luma.ravel(), chroma[:, :, 0].ravel(), chroma[:, :, 1].ravel()]
    flat = np.clip(np.rint(np.concatenate(planes)), 0, 255).astype(np.uint8)
    return flat.reshape(height * 3 // 2, width)


def write_video(path: str | Path, frames: Iterable[np.ndarray], fps: float) -> Path:
    """Encode RGB frames [H, W, 3] uint8 (even H, W) to an mp4 at `fps`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    codec = video_codec()
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(10_000))
        stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            # crf 20 keeps the palette colours; one thread and no macroblock-tree rate control
            # keep the bytes a function of the frames (mbtree made them vary between runs).
            stream.options = {"crf": "20", "preset": "veryfast", "threads": "1"}
            stream.options["x264-params"] = "mbtree=0"
        for index, pixels in enumerate(frames):
            if index == 0:
                stream.height, stream.width = pixels.shape[:2]
            frame = av.VideoFrame.from_ndarray(_yuv420p(pixels), format="yuv420p")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path
