"""Real mp4 files for the tool tests: frame i of a video is filled with one grey level.

A uniform grey frame survives encoding and resizing almost exactly, so a test can read a
returned frame's pixel value and tell which source frame it is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest


def write_grey_video(
    path: Path, num_frames: int, fps: int, size: tuple[int, int], level: Callable[[int], int]
) -> Path:
    """Write `num_frames` frames of `size` (height, width); frame i is grey `level(i)`."""
    height, width = size
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "0", "preset": "ultrafast"}
        for i in range(num_frames):
            pixels = np.full((height, width, 3), level(i), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def grey_level(i: int) -> int:
    """Grey of frame i of the main test video: 0, 5, 10, ... (40 frames -> at most 195)."""
    return i * 5


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("videos")


@pytest.fixture(scope="session")
def grey_video(video_dir: Path) -> str:
    """20 s at 2 fps (40 frames), 64x64, frame i grey i*5."""
    return str(write_grey_video(video_dir / "grey.mp4", 40, 2, (64, 64), grey_level))


@pytest.fixture(scope="session")
def other_video(video_dir: Path) -> str:
    """10 s at 1 fps (10 frames), 64x64, frame i grey 250 - i*5: tells the two videos apart."""
    return str(write_grey_video(video_dir / "other.mp4", 10, 1, (64, 64), lambda i: 250 - i * 5))


@pytest.fixture(scope="session")
def large_video(video_dir: Path) -> str:
    """4 s at 1 fps, 360x480 (172,800 px per frame, above the 50,176 px crop cap)."""
    return str(write_grey_video(video_dir / "large.mp4", 4, 1, (360, 480), lambda i: 40 + i * 20))
