"""Real video files for the video-layer tests (written with PyAV into a temporary directory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paravt.video.writer import write_video

# 20 frames at 2.5 fps (8.0 s), 48 x 64; frame i is flat grey level 10 * i so a decoded frame
# tells its own index: level / 10.
TINY_FRAMES = 20
TINY_FPS = 2.5


def tiny_frames() -> list[np.ndarray]:
    return [np.full((48, 64, 3), 10 * i, dtype=np.uint8) for i in range(TINY_FRAMES)]


@pytest.fixture(scope="session")
def tiny_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_video(tmp_path_factory.mktemp("video") / "tiny.mp4", tiny_frames(), TINY_FPS)
