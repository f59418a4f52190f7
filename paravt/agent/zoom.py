"""The `zoom` tool: a window of the video AND a box of the frame, at a higher pixel budget.

`crop_video` finds WHEN; `zoom` shows a small region closely: the frames of [start_time,
end_time] (sampled like a crop, fewer of them), cut to `bbox_2d` = [x1, y1, x2, y2] and resized
to `max_pixels` (4x a crop's default), so a detail a few pixels wide in the overview fills
several patches. The box is in the model's own grounding convention (`coords`):
    "relative" (Qwen3-VL): 0-1000 over the frame's width and height;
    "absolute" (Qwen2.5-VL): pixels of the frame as the model saw it in the overview, i.e. the
        video's frame resized to `overview_max_pixels` (keep it equal to rollout.agent's).
Window and box are validated like `crop_video`'s: clamped to the video and the frame, or refused
with a text (an empty window or box, a start past the end of the video).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from paravt.agent.toolkit import Clip, ToolError, Video, VideoTool
from paravt.agent.tools import validate_window
from paravt.types import Frames
from paravt.video.sampling import fit_pixels, window_indices

COORDS = ("relative", "absolute")
RELATIVE_SCALE = 1000.0  # Qwen3-VL's grounding grid


class ZoomTool(VideoTool):
    """`zoom(start_time, end_time, bbox_2d)`: a box of a window's frames, at `max_pixels`."""

    name = "zoom"

    def __init__(
        self,
        coords: str = "relative",
        max_pixels: int = 200704,
        overview_max_pixels: int = 50176,
        sample_fps: float = 1.0,
        min_frames: int = 2,
        max_frames: int = 4,
        max_calls_per_turn: int | None = None,
        timeout_s: float | None = None,
    ):
        if coords not in COORDS:
            raise ValueError(f"zoom: coords must be one of {COORDS}, got {coords!r}")
        if not 1 <= min_frames <= max_frames or not sample_fps > 0:
            raise ValueError(
                "zoom needs 1 <= min_frames <= max_frames and sample_fps > 0 "
                f"(got {min_frames}, {max_frames}, {sample_fps})"
            )
        self.coords, self.zoom_pixels = coords, int(max_pixels)
        self.overview_max_pixels = int(overview_max_pixels)
        self.sample_fps, self.min_frames, self.max_frames = sample_fps, min_frames, max_frames
        self.max_calls_per_turn, self.timeout_s = max_calls_per_turn, timeout_s
        unit = "0-1000 relative" if coords == "relative" else "absolute pixel"
        self.description = (
            "Zoom into the box bbox_2d = [x1, y1, x2, y2] (" + unit + " coordinates) of the "
            "frames in [start_time, end_time] (seconds), at a higher resolution."
        )
        seconds = {"type": "number"}  # a negative start is clamped to 0, as crop_video's
        self.parameters = {
            "type": "object",
            "properties": {
                "video_path": {"type": "string", "description": "The video (ignored)."},
                "start_time": {**seconds, "description": "Window start in seconds."},
                "end_time": {**seconds, "description": "Window end in seconds."},
                "bbox_2d": {
                    "type": "array",
                    "items": {"type": "number"},
                    "description": f"[x1, y1, x2, y2] in {unit} coordinates.",
                },
            },
            "required": ["start_time", "end_time", "bbox_2d"],
        }
        corner = 1000 if coords == "relative" else 224
        self.example = {"start_time": 30.0, "end_time": 34.0, "bbox_2d": [0, 0, corner, corner]}

    def run(self, args: dict[str, Any], video: Video) -> Clip:
        info = video.info()
        window = validate_window(float(args["start_time"]), float(args["end_time"]), info.duration)
        if isinstance(window, str):
            raise ToolError(window)
        box = self.box_pixels(args["bbox_2d"], info.height, info.width, video)
        if isinstance(box, str):
            raise ToolError(box)
        indices = window_indices(
            info.num_frames, info.fps, *window, self.sample_fps, self.min_frames, self.max_frames
        )
        # Native size (snapped to the model's grid): the box is cut before any downscale.
        frames = video.read(indices, info.height * info.width)
        return Clip(self.cut(frames, box, video), window)

    def box_pixels(
        self, box: Any, height: int, width: int, video: Video
    ) -> tuple[float, float, float, float] | str:
        """The box as fractions (x1, y1, x2, y2) of the frame, clamped; or an error text."""
        if not isinstance(box, list | tuple) or len(box) != 4:
            return f"bbox_2d must be 4 numbers [x1, y1, x2, y2], got {box!r}"[:120]
        if self.coords == "relative":
            scale_x = scale_y = RELATIVE_SCALE
        else:
            scale_y, scale_x = fit_pixels(height, width, self.overview_max_pixels, video.factor)
        x1, y1, x2, y2 = (float(v) for v in box)
        x1, x2 = (min(max(v / scale_x, 0.0), 1.0) for v in (x1, x2))
        y1, y2 = (min(max(v / scale_y, 0.0), 1.0) for v in (y1, y2))
        if x2 <= x1 or y2 <= y1:
            return f"empty box {list(box)}: need x1 < x2 and y1 < y2 inside the frame"
        return x1, y1, x2, y2

    def cut(self, frames: Frames, box: tuple[float, ...], video: Video) -> Frames:
        """`frames` cut to `box` (fractions) and resized to about `zoom_pixels` on the grid."""
        _, height, width, _ = frames.pixels.shape
        top, bottom = int(box[1] * height), max(int(np.ceil(box[3] * height)), 1)
        left, right = int(box[0] * width), max(int(np.ceil(box[2] * width)), 1)
        top, left = min(top, bottom - 1), min(left, right - 1)
        region = frames.pixels[:, top:bottom, left:right]
        size = fit_pixels(
            region.shape[1], region.shape[2], self.zoom_pixels, video.factor, self.zoom_pixels // 2
        )
        pixels = np.stack([_resize(frame, *size) for frame in region])
        return Frames(pixels, frames.indices, frames.timestamps, frames.fps, frames.duration)


def _resize(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    image = Image.fromarray(np.ascontiguousarray(frame))
    return np.asarray(image.resize((width, height), Image.Resampling.BICUBIC))
