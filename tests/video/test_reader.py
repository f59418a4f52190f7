"""VideoReader on real files: decoding, resizing, caching, threads, and every broken-file case."""

from __future__ import annotations

import time
import wave
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import av
import decord
import numpy as np
import pytest

from paravt.video.reader import VideoError, VideoReader


def _level(frame: np.ndarray) -> float:
    """The tiny video's frame i is grey level 10 * i (see conftest)."""
    return float(frame.mean())


def test_info_reports_frames_fps_and_size(tiny_video):
    with VideoReader() as reader:
        info = reader.info(str(tiny_video))
    assert (info.num_frames, info.width, info.height) == (20, 64, 48)
    assert info.fps == pytest.approx(2.5)
    assert info.duration == pytest.approx(8.0)  # 20 / 2.5


def test_read_returns_requested_frames_in_order_with_repeats(tiny_video):
    with VideoReader() as reader:
        # factor 16 keeps 48 x 64 as is: no resize blurs the levels
        frames = reader.read(str(tiny_video), [5, 1, 5, 19], max_pixels=10**6, factor=16)
    assert frames.pixels.shape == (4, 48, 64, 3) and frames.pixels.dtype == np.uint8
    assert [_level(f) for f in frames.pixels] == pytest.approx([50, 10, 50, 190], abs=2)
    assert np.array_equal(frames.pixels[0], frames.pixels[2])
    assert frames.indices == (5, 1, 5, 19)
    assert frames.timestamps == pytest.approx((2.0, 0.4, 2.0, 7.6))  # i / 2.5
    assert frames.fps == pytest.approx(2.5) and frames.duration == pytest.approx(8.0)


def test_read_resizes_to_fit_pixels(tiny_video):
    with VideoReader() as reader:
        # fit_pixels(48, 64, 2048, 32) -> (32, 64): 2048 px exactly
        frames = reader.read(str(tiny_video), [10], max_pixels=2048, factor=32)
    assert frames.pixels.shape == (1, 32, 64, 3)
    assert _level(frames.pixels[0]) == pytest.approx(100, abs=2)  # flat frames stay flat


@pytest.mark.parametrize("bad", [[20], [-1], [3, 25]])
def test_out_of_range_indices_name_the_file(tiny_video, bad):
    with VideoReader() as reader, pytest.raises(VideoError, match="20 frames") as caught:
        reader.read(str(tiny_video), bad, max_pixels=10**6)
    assert str(tiny_video) in str(caught.value)


def test_empty_index_list_is_an_error(tiny_video):
    with VideoReader() as reader, pytest.raises(VideoError, match="no frame indices"):
        reader.read(str(tiny_video), [], max_pixels=10**6)


def _faststart_mp4(path: Path) -> Path:
    """An mp4 with its index at the front, so a truncated copy still opens its header."""
    rng = np.random.default_rng(0)
    with av.open(str(path), "w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=Fraction(2))
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(40):
            pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def _broken_files(tmp: Path, tiny_video: Path) -> dict[str, tuple[Path, str]]:
    data = tiny_video.read_bytes()
    (tmp / "empty.mp4").write_bytes(b"")
    (tmp / "half.mp4").write_bytes(data[: len(data) // 2])  # moov atom (at the end) is lost
    (tmp / "notes.mp4").write_text("these are my notes, not a video\n" * 20)
    (tmp / "folder.mp4").mkdir()
    with wave.open(str(tmp / "sound.wav"), "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(8000)
        audio.writeframes(b"\x00\x00" * 8000)
    return {
        "missing": (tmp / "nope.mp4", "not found"),
        "empty": (tmp / "empty.mp4", "empty"),
        "truncated": (tmp / "half.mp4", "truncated or corrupt"),
        "text": (tmp / "notes.mp4", "not a video file"),
        "directory": (tmp / "folder.mp4", "not a regular file"),
        "audio": (tmp / "sound.wav", "no video stream"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "truncated", "text", "directory", "audio"])
def test_broken_files_raise_video_error_quickly(tmp_path, tiny_video, case):
    path, problem = _broken_files(tmp_path, tiny_video)[case]
    began = time.monotonic()
    with VideoReader() as reader, pytest.raises(VideoError, match=problem) as caught:
        reader.info(str(path))
    assert str(path) in str(caught.value)
    assert time.monotonic() - began < 5.0


def test_truncated_faststart_file_raises_video_error(tmp_path):
    whole = _faststart_mp4(tmp_path / "whole.mp4").read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[: int(len(whole) * 0.6)])  # header intact, 40% of the frames gone
    with VideoReader() as reader, pytest.raises(VideoError, match="truncated or corrupt") as got:
        info = reader.info(str(cut))  # may already fail here ...
        reader.read(str(cut), range(info.num_frames), max_pixels=10**6)  # ... or on decode
    assert str(cut) in str(got.value)


def test_cache_keeps_most_recent_videos_open(tmp_path, tiny_video):
    other = tmp_path / "other.mp4"
    other.write_bytes(tiny_video.read_bytes())
    reader = VideoReader(cache_size=1)
    first = reader.read(str(tiny_video), [3], max_pixels=10**6, factor=16)
    reader.read(str(other), [3], max_pixels=10**6, factor=16)
    assert len(reader._open) == 1  # the first video was evicted ...
    again = reader.read(str(tiny_video), [3], max_pixels=10**6, factor=16)
    assert np.array_equal(first.pixels, again.pixels)  # ... and reopens transparently
    reader.close()
    assert len(reader._open) == 0


def test_concurrent_reads_match_sequential_reads(tiny_video):
    requests = [[i % 20, (7 * i) % 20, 19 - i % 20] for i in range(32)]
    with VideoReader() as reader:
        expected = [
            reader.read(str(tiny_video), r, max_pixels=10**6, factor=16).pixels for r in requests
        ]
    with VideoReader() as reader, ThreadPoolExecutor(max_workers=8) as pool:
        got = list(
            pool.map(lambda r: reader.read(str(tiny_video), r, 10**6, factor=16).pixels, requests)
        )
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


def test_read_works_under_the_torch_bridge(tiny_video):
    decord.bridge.set_bridge("torch")
    try:
        with VideoReader() as reader:
            frames = reader.read(str(tiny_video), [2], max_pixels=10**6, factor=16)
    finally:
        decord.bridge.set_bridge("native")
    assert isinstance(frames.pixels, np.ndarray)
    assert _level(frames.pixels[0]) == pytest.approx(20, abs=2)


def _textured_mp4(path: Path) -> Path:
    """A 192x108 video of drifting gradients and a moving box: detail a resize can get wrong."""
    ys, xs = np.mgrid[0:108, 0:192]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(10))
        stream.width, stream.height, stream.pix_fmt = 192, 108, "yuv420p"
        stream.options = {"crf": "18", "g": "8"}  # a keyframe every 8 frames: reads cross GOPs
        for i in range(30):
            pixels = np.stack([(xs * 2 + 5 * i) % 256, (ys * 2) % 256, (xs + ys + 9 * i) % 256], -1)
            pixels[20 + i : 50 + i, 40 + 3 * i : 70 + 3 * i] = (250, 30, 30)
            frame = av.VideoFrame.from_ndarray(pixels.astype(np.uint8), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def test_scaling_in_the_decoder_matches_decode_then_pil_resize(tmp_path):
    video = str(_textured_mp4(tmp_path / "textured.mp4"))
    wanted = [29, 3, 3, 17, 0, 11, 12, 25]  # unsorted, repeated, across GOPs
    with VideoReader(fast_decode=False) as plain, VideoReader() as fast:
        # fit_pixels(108, 192, 4096, 16) -> (48, 80): a 2.3x downscale
        slow = plain.read(video, wanted, max_pixels=4096, factor=16)
        quick = fast.read(video, wanted, max_pixels=4096, factor=16)
        assert next(iter(fast._open.values())).fast  # the fast path served the read
    assert quick.pixels.shape == slow.pixels.shape == (8, 48, 80, 3)
    assert (quick.indices, quick.timestamps) == (slow.indices, slow.timestamps)
    diff = np.abs(quick.pixels.astype(int) - slow.pixels.astype(int))  # [K, H, W, 3]
    # two bicubic filters differ by a few levels, mostly on the box's edges; a wrong frame
    # (the box moves 3 px and the gradient 5 levels per frame) is off by far more
    assert diff.mean(axis=(1, 2, 3)).max() < 4.0
    assert np.array_equal(quick.pixels[1], quick.pixels[2])  # a repeat is the same frame
    shifted = np.abs(quick.pixels[1:].astype(int) - slow.pixels[:-1].astype(int)).mean()
    assert shifted > 2 * diff.mean()  # the tolerance is tighter than a neighbouring frame


@pytest.fixture(scope="module")
def long_video(tmp_path_factory) -> Path:
    """160 s of 320x180 at 25 fps (4,000 frames): decoding all of it takes a noticeable time."""
    path = tmp_path_factory.mktemp("long") / "long.mp4"
    ys, xs = np.mgrid[0:180, 0:320]
    base = np.stack([xs % 256, ys % 256, (xs + ys) % 256], -1).astype(np.uint8)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(25))
        stream.width, stream.height, stream.pix_fmt = 320, 180, "yuv420p"
        stream.options = {"preset": "ultrafast", "g": "250", "threads": "1"}
        for i in range(4000):
            frame = av.VideoFrame.from_ndarray(np.roll(base, i, axis=1), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "decord"])
def test_an_open_reader_leaves_the_cores_idle(long_video, fast):
    # decord decodes ahead to the end of the file after every read, on a thread of its own; with
    # readers cached that stole a core per video from the model and the next crops
    with VideoReader(fast_decode=fast) as reader:
        frames = reader.read(str(long_video), [10, 1000], max_pixels=4096, factor=16)
        assert frames.indices == (10, 1000)
        start = time.process_time()
        time.sleep(0.4)
        busy = time.process_time() - start
    assert busy < 0.03, f"{busy:.3f} s of CPU used by an idle open reader"


def test_negative_decode_threads_are_rejected():
    with pytest.raises(ValueError, match="num_threads must be >= 0"):
        VideoReader(num_threads=-1)
