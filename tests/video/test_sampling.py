"""Frame-index arithmetic, against hand-computed values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paravt.video.sampling import (
    VideoInfo,
    fit_pixels,
    timestamps,
    uniform_indices,
    window_indices,
)


def test_video_info_duration_is_frames_over_fps():
    # 1918 frames / 29.97 fps = 63.997... s
    info = VideoInfo(path="v.mp4", num_frames=1918, fps=29.97, width=64, height=48)
    assert info.duration == pytest.approx(63.9973, abs=1e-4)


@pytest.mark.parametrize(
    ("num_frames", "k", "expected"),
    [
        # centres floor((2i+1) * n / 2k): n=10, k=4 -> 10//8, 30//8, 50//8, 70//8 = 1, 3, 6, 8
        (10, 4, [1, 3, 6, 8]),
        # n=128, k=4 -> 128//8, 384//8, 640//8, 896//8 = 16, 48, 80, 112 (8, 24, 40, 56 s @ 2fps)
        (128, 4, [16, 48, 80, 112]),
        # n=7, k=2 -> 7//4, 21//4 = 1, 5
        (7, 2, [1, 5]),
        (5, 8, [0, 1, 2, 3, 4]),  # K larger than the video: every frame once
        (5, 5, [0, 1, 2, 3, 4]),
        (1, 1, [0]),
        (1000, 1, [500]),  # one bin: its centre 1000 // 2
    ],
)
def test_uniform_indices(num_frames, k, expected):
    assert uniform_indices(num_frames, k) == expected


@pytest.mark.parametrize(("num_frames", "k"), [(10, 0), (0, 4), (-1, 1)])
def test_uniform_indices_rejects_bad_sizes(num_frames, k):
    with pytest.raises(ValueError, match="must be >= 1"):
        uniform_indices(num_frames, k)


@given(st.integers(1, 5000), st.integers(1, 300))
def test_uniform_indices_unique_sorted_in_range(num_frames, k):
    got = uniform_indices(num_frames, k)
    assert len(got) == min(k, num_frames)
    assert got == sorted(set(got))
    assert got[0] >= 0 and got[-1] < num_frames


@pytest.mark.parametrize(
    ("num_frames", "fps", "start", "end", "expected"),
    [
        # 2 fps, [12, 15]: frames 24..29 (6), floor(3 s * 1) = 3 -> 24 + [1, 3, 5]
        (128, 2.0, 12.0, 15.0, [25, 27, 29]),
        # shorter than one frame at 1 fps: only frame 10, repeated up to min_frames = 2
        (64, 1.0, 10.1, 10.2, [10, 10]),
        # the last 4 s of a 64 s video at 2 fps: frames 120..127, 4 frames -> 120 + [1, 3, 5, 7]
        (128, 2.0, 60.0, 64.0, [121, 123, 125, 127]),
        # end past the video: frames 124..127 touched, 8 wanted -> the 4 that exist
        (128, 2.0, 62.0, 70.0, [124, 125, 126, 127]),
        # start past the video (the tool rejects it first): clamped to the last frame
        (128, 2.0, 70.0, 80.0, [127, 127]),
        # end < start (not validated here): still valid, min_frames of the start frame
        (64, 1.0, 20.0, 10.0, [20, 20]),
        # 30 fps, [1, 2.5]: floor(1.5) = 1 -> min 2; frames 30..74 (45) -> 30 + [45//4, 135//4]
        (300, 30.0, 1.0, 2.5, [41, 63]),
        # 2.5 fps, [2, 6]: frames 5..14 (10), 4 wanted -> 5 + [10//8, 30//8, 50//8, 70//8]
        (40, 2.5, 2.0, 6.0, [6, 8, 11, 13]),
        # 0.5 fps video, [0, 20]: only frames 0..9 exist in the window (16 wanted): no repeats
        (32, 0.5, 0.0, 20.0, list(range(10))),
        # round-off: 2.3 * 10 = 22.999999999999996 must still start at frame 23; frames 23..25
        (100, 10.0, 2.3, 2.6, [23, 25]),
    ],
)
def test_window_indices(num_frames, fps, start, end, expected):
    assert window_indices(num_frames, fps, start, end) == expected


def test_window_indices_fractional_fps():
    # 29.97 fps, [10, 20]: first floor(299.7) = 299, last ceil(599.4) - 1 = 599 -> 301 frames;
    # 10 wanted: 299 + (2i+1)*301 // 20 -> 299 + 15 = 314, 299 + 903//20 = 344, ..., 299 + 5719//20
    got = window_indices(1918, 29.97, 10.0, 20.0)
    assert len(got) == 10
    assert got[:2] == [314, 344] and got[-1] == 584
    assert all(10.0 <= t <= 20.0 for t in timestamps(got, 29.97))


def test_window_indices_max_frames_cap():
    # 1 fps, [0, 100]: 100 wanted, capped at 16; 100 frames -> (2i+1)*100 // 32
    got = window_indices(600, 1.0, 0.0, 100.0)
    assert len(got) == 16
    assert got[:4] == [3, 9, 15, 21] and got[-1] == 96  # 3100 // 32 = 96


def test_window_indices_custom_floor_and_rate():
    # 2 fps, [0, 1] at sample_fps 2: floor(1 * 2) = 2 < min 3 -> 3 frames of frames 0..1
    assert window_indices(100, 2.0, 0.0, 1.0, sample_fps=2.0, min_frames=3) == [0, 0, 1]
    # sample_fps 4 over [0, 2] at 30 fps: 8 frames of frames 0..59 -> (2i+1)*60 // 16
    assert window_indices(300, 30.0, 0.0, 2.0, sample_fps=4.0) == [3, 11, 18, 26, 33, 41, 48, 56]


@pytest.mark.parametrize(
    "kwargs",
    [{"min_frames": 0}, {"min_frames": 5, "max_frames": 4}, {"sample_fps": 0.0}],
)
def test_window_indices_rejects_bad_limits(kwargs):
    with pytest.raises(ValueError, match="window_indices"):
        window_indices(100, 2.0, 0.0, 10.0, **kwargs)


@given(
    st.integers(1, 3000),
    st.floats(0.1, 60.0),
    st.floats(-10.0, 200.0),
    st.floats(0.0, 200.0),
)
def test_window_indices_always_valid(num_frames, fps, start, length):
    got = window_indices(num_frames, fps, start, start + length)
    assert 2 <= len(got) <= 16
    assert got == sorted(got)
    assert all(0 <= i < num_frames for i in got)


def test_timestamps():
    # index / fps: 3 / 2.5 = 1.2, 5 / 2.5 = 2.0
    assert timestamps([0, 3, 5], 2.5) == pytest.approx([0.0, 1.2, 2.0])
    with pytest.raises(ValueError, match="fps"):
        timestamps([1], 0.0)


@pytest.mark.parametrize(
    ("size", "max_pixels", "factor", "min_pixels", "expected"),
    [
        # scale sqrt(50176 / 307200) = 0.404: 194.0 -> {192, 224}, 258.7 -> {256, 288};
        # only 192 x 256 = 49152 fits
        ((480, 640), 50176, 32, 0, (192, 256)),
        # 1080p at factor 28: scale 0.1556 -> 168.0, 298.7 -> {280, 308}; 168*308 = 51744 > cap
        ((1080, 1920), 50176, 28, 0, (168, 280)),
        # 1080p at factor 32: 168 -> {160, 192}, 298.7 -> {288, 320}; only 160 x 288 = 46080 fits
        ((1080, 1920), 50176, 32, 0, (160, 288)),
        ((224, 224), 50176, 28, 0, (224, 224)),  # already fits
        ((64, 64), 50176, 32, 0, (64, 64)),  # never upscale
        ((48, 64), 50176, 32, 0, (32, 64)),  # 48 -> 32, not up to 64
        ((20, 20), 50176, 32, 0, (32, 32)),  # up to one patch: needed
        # extreme aspect: short side pinned at 32, long side 50176 // 32 // 32 * 32 = 1568
        ((10, 10000), 50176, 32, 0, (32, 1568)),
        ((10000, 10), 50176, 32, 0, (1568, 32)),
        # min_pixels upscales: 32 x 32 to reach 4096 px -> scale 2 -> 64 x 64
        ((32, 32), 50176, 32, 4096, (64, 64)),
    ],
)
def test_fit_pixels(size, max_pixels, factor, min_pixels, expected):
    assert fit_pixels(*size, max_pixels, factor, min_pixels) == expected


def test_fit_pixels_rejects_impossible_budgets():
    with pytest.raises(ValueError, match="at least 1024"):
        fit_pixels(480, 640, 1000, 32)
    with pytest.raises(ValueError, match="exceeds max_pixels"):
        fit_pixels(480, 640, 50176, 32, min_pixels=60000)


@given(st.integers(1, 4000), st.integers(1, 4000), st.sampled_from([28, 32]))
def test_fit_pixels_invariants(height, width, factor):
    h, w = fit_pixels(height, width, 50176, factor)
    assert h * w <= 50176
    assert h % factor == 0 and w % factor == 0
    # never larger than the original, except to reach one patch
    assert h <= max(factor, height) and w <= max(factor, width)


def test_overview_indices_repeat_a_still_to_two_frames():
    from paravt.video.sampling import overview_indices

    assert overview_indices(1, 8) == [0, 0]  # a one-frame video: its frame twice
    assert overview_indices(3, 8) == [0, 1, 2]  # enough distinct frames: none repeated
    assert overview_indices(100, 4) == uniform_indices(100, 4)
    assert overview_indices(1, 1, min_frames=3) == [0, 0, 0]
