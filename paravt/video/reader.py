"""Video reading (decord + PyAV): open a video once, serve many frame requests from many threads.

Glue around decord: file checks that turn missing, empty, truncated and non-video files into a
`VideoError` naming the file (before decord can misbehave on them), an LRU cache of open readers,
one lock per open video (decord readers are not thread-safe; the crop tool reads in parallel),
de-duplicated batch decoding in one sorted pass and the resize to `fit_pixels`.

Speed (benchmarks/crop_vs_qwen_vl_utils.py): a read decodes its sorted frames in one forward
pass with PyAV (seeking only when a keyframe lies between two wanted frames; runs of GOPs on
all cores, one single-threaded decoder each), tells FFmpeg to
skip non-reference frames that are not wanted (nothing depends on them), and converts only the
wanted frames, scaled by swscale straight to the target size. decord stays the source of truth
for what a video is (frame count, fps, size, broken-file checks); whenever the fast path cannot
serve a read exactly (frame count disagrees, a frame is missing, any PyAV error) the read falls
back to decord at full size plus a PIL bicubic resize. `fast_decode=False` forces that plain
path, which the tests compare the fast one against.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import av
import decord
import numpy as np
from av.video.reformatter import VideoReformatter
from PIL import Image

from paravt.errors import VideoError
from paravt.types import Frames
from paravt.video.sampling import VideoInfo, fit_pixels, timestamps

__all__ = ["VideoError", "VideoReader"]

_DECORD_PREFIX = re.compile(r"\[\d{2}:\d{2}:\d{2}\] [^\s:]+:\d+: ")
# Leading bytes of common containers, to tell "a damaged video" from "not a video at all".
_CONTAINER_MAGIC: tuple[tuple[int, bytes], ...] = (
    (4, b"ftyp"),  # mp4 / mov / m4v
    (4, b"moov"),  # old QuickTime
    (4, b"mdat"),
    (4, b"free"),
    (4, b"wide"),
    (0, b"\x1a\x45\xdf\xa3"),  # Matroska / WebM
    (0, b"RIFF"),  # AVI
    (0, b"FLV"),
    (0, b"\x00\x00\x01\xba"),  # MPEG program stream
)


@dataclass
class _Open:
    """One open video: its decord reader, what it reports, and the lock that serialises it."""

    reader: decord.VideoReader
    info: VideoInfo
    lock: threading.Lock
    index: _PtsIndex | None = None  # built on the first fast read
    fast: bool = True  # False once the fast path has failed on this video


class VideoReader:
    """Reads frames of local video files, keeping the `cache_size` most recent ones open."""

    def __init__(
        self, cache_size: int = 16, num_threads: int = 0, fast_decode: bool = True
    ) -> None:
        if cache_size < 1:
            raise ValueError(f"VideoReader: cache_size must be >= 1 (got {cache_size})")
        if num_threads < 0:
            raise ValueError(
                f"VideoReader: num_threads must be >= 0, 0 = all cores (got {num_threads})"
            )
        self._cache_size = cache_size
        self._num_threads = num_threads
        self._fast_decode = fast_decode
        self._open: OrderedDict[str, _Open] = OrderedDict()
        self._lock = threading.Lock()  # guards the cache only; decoding holds per-video locks
        self.read_seconds = 0.0  # wall time spent in `read`, summed over threads

    def info(self, path: str) -> VideoInfo:
        return self._get(path).info

    def read(
        self,
        path: str,
        indices: Sequence[int],
        max_pixels: int,
        factor: int = 32,
        min_pixels: int = 0,
    ) -> Frames:
        """Decode `indices` (repeats allowed, any order) resized to fit `max_pixels`."""
        t0 = time.perf_counter()
        try:
            return self._read(path, indices, max_pixels, factor, min_pixels)
        finally:
            elapsed = time.perf_counter() - t0
            with self._lock:
                self.read_seconds += elapsed

    def _read(
        self, path: str, indices: Sequence[int], max_pixels: int, factor: int, min_pixels: int
    ) -> Frames:
        video = self._get(path)
        info = video.info
        wanted = [int(i) for i in indices]
        if not wanted:
            raise VideoError(f"{path}: no frame indices requested; pass at least one index")
        bad = [i for i in wanted if not 0 <= i < info.num_frames]
        if bad:
            raise VideoError(
                f"{path}: frame indices {bad[:5]} are outside the video's "
                f"{info.num_frames} frames (valid: 0..{info.num_frames - 1})"
            )
        unique = sorted(set(wanted))  # one forward pass: each GOP is decoded at most once
        height, width = fit_pixels(info.height, info.width, max_pixels, factor, min_pixels)
        batch = self._fast_read(video, unique, height, width) if self._fast_decode else None
        try:
            if batch is None:
                with video.lock:
                    batch = _to_numpy(video.reader.get_batch(unique))  # [U, H, W, 3]
                    _stop_read_ahead(video.reader)
        except Exception as err:  # decord raises DECORDError / RuntimeError on damaged data
            self._forget(path)
            raise VideoError(
                f"{path}: decoding frames {unique[:5]} failed; the file is probably truncated "
                f"or corrupt ({_first_line(err)})"
            ) from err
        resized = _resize(batch, height, width)  # a no-op when the fast path scaled already
        position = {index: row for row, index in enumerate(unique)}
        pixels = resized[[position[i] for i in wanted]]  # [K, H, W, 3]
        return Frames(
            pixels=np.ascontiguousarray(pixels),
            indices=tuple(wanted),
            timestamps=tuple(timestamps(wanted, info.fps)),
            fps=info.fps,
            duration=info.duration,
        )

    def close(self) -> None:
        with self._lock:
            self._open.clear()

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fast_read(
        self, video: _Open, unique: list[int], height: int, width: int
    ) -> np.ndarray | None:
        """Frames [U, height, width, 3] via PyAV, or None where decord must serve the read."""
        if not video.fast:
            return None
        try:
            if video.index is None:
                with video.lock:
                    video.index = _pts_index(video.reader, video.info.path)
            if len(video.index.pts) != video.info.num_frames:
                raise ValueError("PyAV and decord count different frames")
            return _decode_parallel(
                video.info.path, video.index, unique, height, width, self._num_threads
            )
        except Exception:  # the plain decord path decides what is wrong and names it
            video.fast = False
            return None

    def _get(self, path: str) -> _Open:
        key = os.path.abspath(path)
        with self._lock:
            if key in self._open:
                self._open.move_to_end(key)
                return self._open[key]
        # Opened outside the cache lock so a slow open does not stall reads of other videos; if
        # two threads race on the same file, the first one inserted wins and the other is dropped.
        video = _open_video(path, self._num_threads)
        with self._lock:
            video = self._open.setdefault(key, video)
            self._open.move_to_end(key)
            while len(self._open) > self._cache_size:
                self._open.popitem(last=False)
        return video

    def _forget(self, path: str) -> None:
        with self._lock:
            self._open.pop(os.path.abspath(path), None)


def _open_video(path: str, num_threads: int) -> _Open:
    _check_file(path)
    try:
        reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=num_threads)
        num_frames = len(reader)
        fps = float(reader.get_avg_fps())
        # Decoding frame 0 proves the stream decodes and gives the size decord does not expose.
        first = _to_numpy(reader[0]) if num_frames > 0 else None
        _stop_read_ahead(reader)
    except Exception as err:
        raise VideoError(_open_failure(path, err)) from err
    if first is None:
        raise VideoError(f"{path}: the video stream has no frames; re-encode or replace the file")
    if not fps > 0 or not np.isfinite(fps):
        raise VideoError(f"{path}: the video reports an invalid frame rate ({fps}); re-encode it")
    height, width = int(first.shape[0]), int(first.shape[1])
    info = VideoInfo(path=path, num_frames=num_frames, fps=fps, width=width, height=height)
    return _Open(reader=reader, info=info, lock=threading.Lock())


def _stop_read_ahead(reader: decord.VideoReader) -> None:
    """Park decord's decoder at frame 0: after any read it decodes ahead to the end of the file.

    That read-ahead keeps a core busy for as long as decoding the rest of the video takes (5 s
    for a 10-minute 640x360 clip, every time), for every open reader in the cache, stealing the
    cores from the model and from the next crops. Seeking to frame 0 stops it and costs < 1 ms.
    """
    reader.seek(0)


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise VideoError(
            f"{path}: video file not found; check the path (relative to the data file)"
        )
    if not os.path.isfile(path):
        raise VideoError(f"{path}: is not a regular file; point to a video file")
    if os.path.getsize(path) == 0:
        raise VideoError(f"{path}: the video file is empty (0 bytes); regenerate or re-download it")


def _open_failure(path: str, err: Exception) -> str:
    detail = _first_line(err)
    if "video stream" in detail:
        return f"{path}: contains no video stream (audio-only or not a video file)"
    if _looks_like_container(path):
        return f"{path}: cannot be decoded; the video is truncated or corrupt ({detail})"
    return f"{path}: is not a video file (no known container header; {detail})"


def _looks_like_container(path: str) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(16)
    return any(head[at : at + len(magic)] == magic for at, magic in _CONTAINER_MAGIC)


def _first_line(err: Exception) -> str:
    """The error's first line without decord's `[hh:mm:ss] /src/file.cc:N:` log prefixes."""
    lines = [_DECORD_PREFIX.sub("", line).strip() for line in str(err).splitlines()]
    lines = [line for line in lines if line]
    return lines[0][:200] if lines else type(err).__name__


@dataclass(frozen=True)
class _PtsIndex:
    """Presentation timestamps of frames in display order (frame i = pts[i]), keyframe rows."""

    pts: np.ndarray  # [F] int64, in the stream's time base, increasing
    keyframes: tuple[int, ...]  # sorted frame indices of keyframes

    def frame_at(self, pts: int | None) -> int | None:
        """The frame whose pts is nearest `pts` within half a frame, else None."""
        if pts is None:
            return None
        at = int(np.searchsorted(self.pts, pts))
        best = min(
            (i for i in (at - 1, at) if 0 <= i < len(self.pts)),
            key=lambda i: abs(int(self.pts[i]) - pts),
        )
        gap = int(self.pts[min(best + 1, len(self.pts) - 1)] - self.pts[max(best - 1, 0)])
        return best if 4 * abs(int(self.pts[best]) - pts) <= max(gap, 1) else None


def _pts_index(reader: decord.VideoReader, path: str) -> _PtsIndex:
    """decord's frame clock (display order) in PyAV's time base; no packet is read twice."""
    starts = np.asarray(reader.get_frame_timestamp(list(range(len(reader)))), np.float64)[:, 0]
    with av.open(path) as container:
        stream = container.streams.video[0]
        base, first = float(stream.time_base), stream.start_time
    pts = np.rint(starts / base).astype(np.int64)  # [F]
    if first is not None and abs(int(pts[0]) - first) * base > 1e-3:
        raise ValueError("decord and PyAV disagree on the first frame's time")
    if len(pts) > 1 and not (np.diff(pts) > 0).all():
        raise ValueError("frame timestamps are not strictly increasing")
    return _PtsIndex(pts=pts, keyframes=tuple(int(k) for k in reader.get_key_indices()))


def _seek_points(index: _PtsIndex, unique: list[int]) -> dict[int, int]:
    """Wanted frame -> keyframe to seek to first, only where a keyframe lies since the last one."""
    points, previous = {}, -1
    for frame in unique:
        at = bisect.bisect_right(index.keyframes, frame) - 1
        key = index.keyframes[at] if at >= 0 else 0
        if previous < 0 or key > previous:
            points[frame] = key
        previous = frame
    return points


def _decode_parallel(
    path: str, index: _PtsIndex, unique: list[int], height: int, width: int, threads: int
) -> np.ndarray:
    """Share the sorted frames' GOP runs among the cores, decoded concurrently.

    A run starts at a seek point and costs about the frames from its keyframe to its last wanted
    frame; runs go longest first to the least loaded core, so one long crop window does not
    leave the other cores idle. Each core has its own demuxer and single-threaded decoder:
    cheaper than FFmpeg's frame threads, whose pipeline is refilled after every seek.
    """
    cores = threads or os.cpu_count() or 1
    seeks = _seek_points(index, unique)
    starts = [row for row, frame in enumerate(unique) if frame in seeks]
    parts = min(cores, len(starts))
    if parts <= 1:
        return _decode_sorted(path, index, unique, height, width, threads)
    runs = list(zip(starts, [*starts[1:], len(unique)], strict=True))
    cost = {run: unique[run[1] - 1] - seeks[unique[run[0]]] + 1 for run in runs}
    loads, rows = [0] * parts, [[] for _ in range(parts)]
    for run in sorted(runs, key=lambda r: -cost[r]):
        least = loads.index(min(loads))
        loads[least] += cost[run]
        rows[least].extend(range(*run))
    rows = [sorted(part) for part in rows if part]

    def decode(part: list[int]) -> np.ndarray:
        return _decode_sorted(path, index, [unique[r] for r in part], height, width, 1)

    out = np.empty((len(unique), height, width, 3), dtype=np.uint8)  # [U, H, W, 3]
    with ThreadPoolExecutor(len(rows), "paravt-decode") as pool:
        for part, decoded in zip(rows, pool.map(decode, rows), strict=True):
            out[part] = decoded
    return out


def _decode_sorted(
    path: str, index: _PtsIndex, unique: list[int], height: int, width: int, threads: int
) -> np.ndarray:
    """Decode sorted frame indices in one pass; unwanted non-reference frames are skipped."""
    row_of = {frame: row for row, frame in enumerate(unique)}
    out = np.empty((len(unique), height, width, 3), dtype=np.uint8)  # [U, H, W, 3]
    filled = np.zeros(len(unique), dtype=bool)
    seeks = _seek_points(index, unique)
    # One swscale context for every frame, single-threaded: its default thread pool is set up
    # per call and made a bicubic downscale ~20x slower here.
    scaler = VideoReformatter()
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type, stream.thread_count = "AUTO", threads
        context = stream.codec_context
        packets = None
        for row, frame in enumerate(unique):
            if filled[row]:
                continue
            if frame in seeks or packets is None:
                seek_to = int(index.pts[seeks.get(frame, 0)])
                container.seek(seek_to, stream=stream, backward=True)
                packets = container.demux(stream)
            for packet in packets:
                # A wanted frame never references a non-reference one, so those can be skipped.
                wanted = packet.pts is None or index.frame_at(packet.pts) in row_of  # None: flush
                context.skip_frame = "DEFAULT" if wanted else "NONREF"
                for decoded in packet.decode():
                    at = row_of.get(index.frame_at(decoded.pts))
                    if at is not None and not filled[at]:
                        scaled = scaler.reformat(
                            decoded, width, height, "rgb24", interpolation="BICUBIC", threads=1
                        )
                        out[at], filled[at] = scaled.to_ndarray(), True
                if filled[row]:
                    break  # later wanted frames continue from here: the decoder keeps its state
    if not filled.all():
        raise ValueError(f"PyAV returned {int(filled.sum())} of {len(unique)} frames")
    return out


def _to_numpy(frames: object) -> np.ndarray:
    """decord returns its own NDArray under the native bridge, a tensor under the torch bridge."""
    if hasattr(frames, "asnumpy"):
        return frames.asnumpy()
    return np.asarray(frames)


def _resize(batch: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bicubic resize of uint8 frames [U, h, w, 3] -> [U, height, width, 3]; PIL antialiases."""
    if batch.shape[1:3] == (height, width):
        return batch
    out = np.empty((batch.shape[0], height, width, 3), dtype=np.uint8)
    for row, frame in enumerate(batch):
        image = Image.fromarray(frame).resize((width, height), Image.Resampling.BICUBIC)
        out[row] = np.asarray(image)
    return out
