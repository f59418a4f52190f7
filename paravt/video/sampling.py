"""Frame-index arithmetic: which frames of a video to show, and at what size.

Pure numbers in, numbers out (no decoder, no numpy arrays of pixels): the overview sampler
(K frames spread over the whole video), the `crop_video` window sampler (docs/method.md section 2),
frame timestamps and the per-frame resize target. This module deliberately does not open videos
(see `paravt.video.reader`) nor validate tool arguments such as `start >= end` (the crop tool does
that and turns it into an error text); it only guarantees that every index it returns is valid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Guards floor/ceil against binary round-off, e.g. 2.3 * 10 == 22.999999999999996.
_EPS = 1e-6


@dataclass(frozen=True)
class VideoInfo:
    """What is known about a video before decoding frames: its size and frame clock."""

    path: str
    num_frames: int
    fps: float
    width: int
    height: int

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps


def uniform_indices(num_frames: int, k: int) -> list[int]:
    """K frame indices at the centres of K equal bins over the whole video, sorted and unique.

    Bin i covers frames [i*n/k, (i+1)*n/k); its centre is floor((2i+1) * n / 2k), computed in
    integers so that the result does not depend on float round-off. When k >= num_frames every
    frame is returned once (never duplicates: an overview of a short video is just the video).
    """
    if k < 1:
        raise ValueError(f"uniform_indices: k must be >= 1 (got {k})")
    if num_frames < 1:
        raise ValueError(f"uniform_indices: num_frames must be >= 1 (got {num_frames})")
    if k >= num_frames:
        return list(range(num_frames))
    # Bins are wider than one frame here (n/k > 1), so the centres are strictly increasing.
    return [(2 * i + 1) * num_frames // (2 * k) for i in range(k)]


def overview_indices(num_frames: int, k: int, min_frames: int = 2) -> list[int]:
    """`uniform_indices`, with frames repeated evenly up to `min_frames` for a shorter video.

    Qwen-VL processors group frames in temporal patches of 2 and refuse a 1-frame clip, so a
    one-frame video (a still) is shown as that frame twice instead of failing the prompt.
    """
    picked = uniform_indices(num_frames, k)
    if len(picked) >= min_frames:
        return picked
    return [picked[i * len(picked) // min_frames] for i in range(min_frames)]


def window_indices(
    num_frames: int,
    fps: float,
    start: float,
    end: float,
    sample_fps: float = 1.0,
    min_frames: int = 2,
    max_frames: int = 16,
) -> list[int]:
    """Frame indices the crop tool shows for the window [start, end] (seconds), sorted.

    Count: floor((end - start) * sample_fps) — whole sampling periods that fit in the window, so a
    3.9 s window at 1 fps gives 3 frames — clamped to [min_frames, max_frames], and then reduced to
    the number of distinct video frames the window touches when the video is sparser than
    `sample_fps` (no point showing a frame twice). The chosen frames are the centres of equal bins
    over the frames touched by the window (frame i covers [i/fps, (i+1)/fps)).

    At least `min_frames` indices are always returned, repeating frames when the window touches
    fewer distinct frames (a window shorter than one frame): Qwen-VL processors group frames in
    temporal patches of 2, and a 1-frame clip fails. Indices are clamped to [0, num_frames - 1],
    so even a window past the end of the video (which the tool rejects first) yields valid frames.
    """
    if num_frames < 1 or fps <= 0 or sample_fps <= 0:
        raise ValueError(
            f"window_indices: need num_frames >= 1, fps > 0, sample_fps > 0 "
            f"(got {num_frames}, {fps}, {sample_fps})"
        )
    if not 1 <= min_frames <= max_frames:
        raise ValueError(
            f"window_indices: need 1 <= min_frames <= max_frames (got {min_frames}, {max_frames})"
        )
    last_frame = num_frames - 1
    first = min(max(math.floor(start * fps + _EPS), 0), last_frame)
    last = min(max(math.ceil(end * fps - _EPS) - 1, first), last_frame)
    touched = last - first + 1
    wanted = math.floor(max(end - start, 0.0) * sample_fps + _EPS)
    count = min(max(wanted, min_frames), max_frames)
    picked = [first + i for i in uniform_indices(touched, count)]
    if len(picked) >= min_frames:
        return picked
    # Fewer distinct frames than the floor: spread the repeats evenly over what there is.
    return [picked[i * len(picked) // min_frames] for i in range(min_frames)]


def timestamps(indices: Sequence[int], fps: float) -> list[float]:
    """Start time in seconds of each frame index (index / fps), the clock the model is shown."""
    if fps <= 0:
        raise ValueError(f"timestamps: fps must be > 0 (got {fps})")
    return [int(i) / fps for i in indices]


def fit_pixels(
    height: int, width: int, max_pixels: int, factor: int, min_pixels: int = 0
) -> tuple[int, int]:
    """Resize target (h, w): h*w <= max_pixels, both multiples of `factor`, aspect kept closely.

    The exact-aspect target is the original scaled down to `max_pixels` (or up to `min_pixels`);
    each side is snapped to the multiple of `factor` just below or above it, and the feasible pair
    nearest the target (sum of |log| ratios per side) wins.

    `factor` is the vision patch times the spatial merge: 32 for Qwen3-VL (16 x 2), 28 for
    Qwen2.5-VL (14 x 2). Frames are never upscaled past the original size unless that is needed to
    reach `factor` in a dimension or `min_pixels` in area. `max_pixels` is a hard cap;
    `min_pixels` is met whenever some multiple-of-factor size fits under the cap.
    """
    if height < 1 or width < 1 or factor < 1:
        raise ValueError(f"fit_pixels: need positive sizes (got {height}x{width}, {factor=})")
    if max_pixels < factor * factor:
        raise ValueError(
            f"fit_pixels: max_pixels={max_pixels} is below one {factor}x{factor} patch; "
            f"raise it to at least {factor * factor}"
        )
    if min_pixels > max_pixels:
        raise ValueError(f"fit_pixels: min_pixels={min_pixels} exceeds max_pixels={max_pixels}")
    area = height * width
    scale = min(1.0, math.sqrt(max_pixels / area))
    upscale = area * scale * scale < min_pixels
    if upscale:
        scale = math.sqrt(min_pixels / area)
    rows = _snap_options(height * scale, height, factor, upscale)
    cols = _snap_options(width * scale, width, factor, upscale)
    feasible = [(h, w) for h in rows for w in cols if min_pixels <= h * w <= max_pixels] or [
        (h, w) for h in rows for w in cols if h * w <= max_pixels
    ]
    if not feasible:
        # Extreme aspect: the short side is pinned at `factor`, shrink the long side to fit.
        if height <= width:
            h = rows[0]
            return h, max(factor, max_pixels // h // factor * factor)
        w = cols[0]
        return max(factor, max_pixels // w // factor * factor), w
    # Closest to the exact-aspect target size in log terms per side: keeps aspect and area.
    target_h, target_w = height * scale, width * scale
    return min(
        feasible, key=lambda hw: abs(math.log(hw[0] / target_h)) + abs(math.log(hw[1] / target_w))
    )


def _snap_options(target: float, original: int, factor: int, upscale: bool) -> list[int]:
    """The multiples of `factor` just below and above `target`, at least `factor`, sorted.

    Unless upscaling is wanted, neither may exceed the original size rounded down to the factor.
    """
    low = max(factor, math.floor(target / factor + _EPS) * factor)
    high = max(factor, math.ceil(target / factor - _EPS) * factor)
    if not upscale:
        cap = max(factor, original // factor * factor)
        low, high = min(low, cap), min(high, cap)
    return sorted({low, high})
