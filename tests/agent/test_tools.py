"""Tests of the crop_video tool and the parallel executor on real mp4 files and the real reader.

The main test video is 20 s at 2 fps (40 frames); frame i is grey i*5, so a returned frame's
mean pixel value divided by 5 names its source frame. Frame indices expected below follow
`window_indices`: count = floor((end - start) * 1 fps) clamped to [2, 16]; the window touches
frames floor(start*2) .. ceil(end*2) - 1, split into `count` equal bins, centre of each taken.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from paravt.agent.parsing import parse_tool_calls
from paravt.agent.tools import (
    CropCache,
    CropConfig,
    CropVideoTool,
    ParallelToolExecutor,
    validate_window,
)
from paravt.types import Frames, ParsedCall, ToolCall, ToolResult
from paravt.video.reader import VideoReader
from paravt.video.sampling import VideoInfo

BOGUS = "/nonexistent/other_users_video.mp4"


class CountingSource:
    """Delegates to a real VideoReader, recording every read (path, indices) and sleeping first
    in the next `slow_reads` reads."""

    def __init__(self, reader: VideoReader, sleep_s: float = 0.0, slow_reads: int = 0) -> None:
        self.reader = reader
        self.reads: list[tuple[str, tuple[int, ...]]] = []
        self.sleep_s, self.slow_reads = sleep_s, slow_reads
        self._lock = threading.Lock()

    def info(self, path: str) -> VideoInfo:
        return self.reader.info(path)

    def read(
        self,
        path: str,
        indices: Sequence[int],
        max_pixels: int,
        factor: int = 32,
        min_pixels: int = 0,
    ) -> Frames:
        with self._lock:
            self.reads.append((path, tuple(indices)))
            slow = self.slow_reads > 0
            self.slow_reads -= slow
        if slow:
            time.sleep(self.sleep_s)
        return self.reader.read(path, indices, max_pixels, factor, min_pixels)


@pytest.fixture
def source() -> CountingSource:
    return CountingSource(VideoReader())


@pytest.fixture
def executor(source: CountingSource):
    with ParallelToolExecutor({"crop_video": CropVideoTool()}, source, CropConfig()) as ex:
        yield ex


def block(start: object, end: object, name: str = "crop_video", path: str = BOGUS) -> str:
    arguments = {"video_path": path, "start_time": start, "end_time": end}
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def calls(*blocks: str) -> tuple[ParsedCall, ...]:
    return parse_tool_calls("<think>crop</think>" + "".join(blocks))


def source_frames(result: ToolResult) -> list[int]:
    """Which grey-video frame each returned frame shows, from its grey level (level = 5 i)."""
    assert result.ok, result.error
    return [round(float(frame.mean()) / 5) for frame in result.frames.pixels]


def assert_crop(result: ToolResult, indices: list[int], window: tuple[float, float]) -> None:
    assert result.error is None
    assert result.window == window
    assert list(result.frames.indices) == indices
    assert source_frames(result) == indices  # the pixels really are those frames
    assert list(result.frames.timestamps) == [i / 2 for i in indices]  # 2 fps: t = i / 2
    assert result.frames.fps == 2.0
    assert result.frames.duration == 20.0


# --- validate_window --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (30.0, 50.0, (30.0, 50.0)),
        (90.0, 150.0, (90.0, 100.0)),  # end clamped to the duration
        (-5.0, 10.0, (0.0, 10.0)),  # negative start clamped to 0
        (0.0, 100.0, (0.0, 100.0)),
        (99.5, 1e9, (99.5, 100.0)),
    ],
)
def test_validate_window_clamps(start: float, end: float, expected: tuple[float, float]) -> None:
    assert validate_window(start, end, 100.0) == expected


@pytest.mark.parametrize(
    ("start", "end", "fragment"),
    [
        (50.0, 30.0, "end_time must be greater than start_time"),
        (30.0, 30.0, "end_time must be greater than start_time"),
        (-10.0, -5.0, "end_time must be greater than start_time"),  # start clamps to 0 > -5
        (100.0, 120.0, "start_time 100 s is beyond the video's duration of 100 s"),
        (150.0, 160.0, "start_time 150 s is beyond the video's duration of 100 s"),
        (float("nan"), 10.0, "must be finite seconds"),
        (0.0, float("inf"), "must be finite seconds"),
    ],
)
def test_validate_window_errors(start: float, end: float, fragment: str) -> None:
    error = validate_window(start, end, 100.0)
    assert isinstance(error, str)
    assert fragment in error


# --- CropConfig and the tool on its own --------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"sample_fps": 0.0}, "sample_fps must be > 0"),
        ({"min_frames": 3, "max_frames": 2}, "1 <= min_frames <= max_frames"),
        ({"max_calls_per_turn": 0}, "max_calls_per_turn must be > 0"),
        ({"max_workers": 0}, "max_workers must be > 0"),
        ({"timeout_s": 0.0}, "timeout_s must be > 0"),
    ],
)
def test_crop_config_rejects_bad_values(overrides: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        CropConfig(**overrides)


def test_schema_is_an_openai_function_and_json_serialisable() -> None:
    tool = CropVideoTool()
    schema = json.loads(json.dumps(tool.schema))
    assert schema["type"] == "function"
    assert schema["function"]["name"] == tool.name == "crop_video"
    parameters = schema["function"]["parameters"]
    assert parameters["required"] == ["video_path", "start_time", "end_time"]
    assert parameters["properties"]["start_time"]["type"] == "number"
    tool.schema["function"]["name"] = "edited"  # a fresh dict each time: edits do not leak
    assert tool.schema["function"]["name"] == "crop_video"


def test_tool_crops_the_samples_video_not_the_model_path(
    grey_video: str, source: CountingSource
) -> None:
    call = ToolCall("crop_video", {"video_path": BOGUS, "start_time": 3.0, "end_time": 8.0})
    result = CropVideoTool()(call, grey_video, source, CropConfig(), index=4)
    # 5 s -> 5 frames; frames 6..15 (10 frames) in 5 bins of 2, centres 7, 9, 11, 13, 15
    assert_crop(result, [7, 9, 11, 13, 15], (3.0, 8.0))
    assert result.index == 4
    assert [path for path, _ in source.reads] == [grey_video]


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"start_time": 3.0}, "crop_video needs start_time and end_time"),
        ({"start_time": "later", "end_time": 4.0}, "crop_video start_time: 'later' is not a time"),
        ({"start_time": 8.0, "end_time": 3.0}, "end_time must be greater than start_time"),
        ({"start_time": 20.0, "end_time": 30.0}, "beyond the video's duration of 20 s"),
    ],
)
def test_tool_errors_are_text(grey_video: str, source: CountingSource, arguments, fragment) -> None:
    result = CropVideoTool()(ToolCall("crop_video", arguments), grey_video, source, CropConfig())
    assert result.frames is None
    assert fragment in result.error
    assert source.reads == []  # nothing decoded for a rejected window


def test_tool_reports_a_missing_sample_video(tmp_path, source: CountingSource) -> None:
    missing = str(tmp_path / "gone.mp4")
    call = ToolCall("crop_video", {"start_time": 0.0, "end_time": 4.0})
    result = CropVideoTool()(call, missing, source, CropConfig())
    assert result.error == f"crop_video failed: {missing}: video file not found; " + (
        "check the path (relative to the data file)"
    )


# --- the executor ------------------------------------------------------------------------------


def test_parallel_calls_keep_order(executor, grey_video: str) -> None:
    results = executor.run_turn(calls(block(3, 8), block(0, 2), block(10, 12.5)), grey_video)
    assert [r.index for r in results] == [0, 1, 2]
    assert_crop(results[0], [7, 9, 11, 13, 15], (3.0, 8.0))
    # 2 s -> 2 frames; frames 0..3 in 2 bins, centres 1 and 3
    assert_crop(results[1], [1, 3], (0.0, 2.0))
    # 2.5 s -> 2 frames; frames 20..24 (5) in 2 bins: centres 20 + 5//4 = 21, 20 + 15//4 = 23
    assert_crop(results[2], [21, 23], (10.0, 12.5))


def test_errors_beside_valid_calls(source: CountingSource, grey_video: str) -> None:
    cfg = CropConfig(max_calls_per_turn=6)  # six blocks, all inside the cap
    executor = ParallelToolExecutor({"crop_video": CropVideoTool()}, source, cfg)
    bad_json = '<tool_call>{"name": "crop_video", "arguments": {"start_time": 1,</tool_call>'
    turn = calls(
        block(0, 2),
        block(8, 3),
        block(25, 30),
        block(1, 2, name="zoom"),
        bad_json,
        block(-4, 1),
    )
    results = executor.run_turn(turn, grey_video)
    assert [r.ok for r in results] == [True, False, False, False, False, True]
    assert_crop(results[0], [1, 3], (0.0, 2.0))
    assert "end_time must be greater than start_time" in results[1].error
    assert "start_time 25 s is beyond the video's duration of 20 s" in results[2].error
    assert results[3].error == "unknown tool 'zoom' in tool call 4; known tools: crop_video"
    assert results[4].error.startswith("invalid JSON in tool call 5: ")
    assert results[4].name == ""  # no tool name could be read
    # start -4 clamped to 0: 1 s -> floor(1) = 1 frame -> raised to 2; frames 0..1 -> [0, 1]
    assert_crop(results[5], [0, 1], (0.0, 1.0))


def test_end_beyond_duration_is_clamped(executor, grey_video: str) -> None:
    (result,) = executor.run_turn(calls(block(15, 100)), grey_video)
    # window (15, 20): 5 frames over frames 30..39 (10): centres 31, 33, 35, 37, 39
    assert_crop(result, [31, 33, 35, 37, 39], (15.0, 20.0))


def test_frame_count_limits(executor, grey_video: str) -> None:
    long, short = executor.run_turn(calls(block(0, 20), block(4, 4.2)), grey_video)
    # 20 s -> 20 frames, capped at 16: 40 frames in 16 bins, centre (2i+1)*40//32
    assert list(long.frames.indices) == [(2 * i + 1) * 40 // 32 for i in range(16)]
    assert source_frames(long) == list(long.frames.indices)
    # 0.2 s touches only frame 8 (t 4.0-4.5); the 2-frame floor repeats it
    assert_crop(short, [8, 8], (4.0, 4.2))


def test_frames_fit_max_pixels(large_video: str, source: CountingSource) -> None:
    executor = ParallelToolExecutor({"crop_video": CropVideoTool()}, source, CropConfig())
    (result,) = executor.run_turn(calls(block(0, 4)), large_video)
    # 360x480 scaled by sqrt(50176 / 172800) ~ 0.539 -> 194x258 -> 192x256 on the 32 grid
    assert result.frames.pixels.shape == (4, 192, 256, 3)
    assert result.frames.pixels.dtype == np.uint8
    assert 192 * 256 <= 50176
    levels = [float(f.mean()) for f in result.frames.pixels]
    assert levels == pytest.approx([40, 60, 80, 100], abs=2)  # frame i is 40 + 20 i


def test_model_video_path_is_never_opened(executor, source, grey_video, video_dir) -> None:
    other_path = str(video_dir / "other.mp4")
    results = executor.run_turn(calls(block(0, 2, path=other_path), block(2, 4)), grey_video)
    assert [r.ok for r in results] == [True, True]
    assert_crop(results[0], [1, 3], (0.0, 2.0))  # grey levels of the sample's video
    assert {path for path, _ in source.reads} == {grey_video}


def test_calls_beyond_the_cap_get_an_error(source: CountingSource, grey_video: str) -> None:
    executor = ParallelToolExecutor({"crop_video": CropVideoTool()}, source, CropConfig())
    results = executor.run_turn(calls(*(block(i, i + 2) for i in range(7))), grey_video)
    assert [r.ok for r in results] == [True] * 5 + [False, False]
    assert results[5].error == "call 6 ignored: at most 5 calls per turn"
    assert results[6].error == "call 7 ignored: at most 5 calls per turn"
    assert len(source.reads) == 1


def test_crops_of_one_video_share_one_read(
    executor, source: CountingSource, grey_video: str, other_video: str
) -> None:
    rounds = [
        (calls(block(0, 2), block(3, 8), block(7, 9)), grey_video),
        (calls(block(0, 2), block(30, 40)), grey_video),
        (calls(block(0, 3), block(5, 7)), other_video),
    ]
    results = executor.run_many(rounds)
    # one read per video for the 7 calls of the round
    assert sorted(path for path, _ in source.reads) == sorted([grey_video, other_video])
    grey_read = next(idx for path, idx in source.reads if path == grey_video)
    # union of [1, 3], [7, 9, 11, 13, 15], [15, 17] (7..9 s: frames 14..17 in 2 bins), [1, 3]
    assert grey_read == (1, 3, 7, 9, 11, 13, 15, 17)
    assert_crop(results[0][2], [15, 17], (7.0, 9.0))
    assert_crop(results[1][0], [1, 3], (0.0, 2.0))
    assert "beyond the video's duration of 20 s" in results[1][1].error
    # other video: 1 fps, frame i grey 250 - 5 i; 3 s -> 3 frames -> [0, 1, 2]; 2 s -> [5, 6]
    assert [list(r.frames.indices) for r in results[2]] == [[0, 1, 2], [5, 6]]
    levels = [float(f.mean()) for f in results[2][1].frames.pixels]
    assert levels == pytest.approx([225, 220], abs=2)  # 250 - 5*5, 250 - 5*6; codec error <= 1
    assert results[2][1].frames.timestamps == (5.0, 6.0)


def test_crop_cache_serves_siblings_without_reading_again(
    source: CountingSource, grey_video: str, other_video: str
) -> None:
    cache = CropCache(max_bytes=1 << 20)
    with ParallelToolExecutor({"crop_video": CropVideoTool()}, source, CropConfig(), cache) as ex:
        # Round 1: two siblings ask [3, 8] (one decode of its frames), one asks [0, 2].
        first = ex.run_many(
            [(calls(block(3, 8)), grey_video), (calls(block(3, 8), block(0, 2)), grey_video)]
        )
        assert source.reads == [(grey_video, (1, 3, 7, 9, 11, 13, 15))]
        assert first[0][0].frames is first[1][0].frames  # the same decoded crop, shared
        assert cache.take_stats() == (1, 3)
        # Round 2: [3, 8] again (cached), [7, 9] new, and the same window of another video.
        second = ex.run_many(
            [(calls(block(3, 8), block(7, 9)), grey_video), (calls(block(3, 8)), other_video)]
        )
        assert sorted(source.reads[1:]) == [(grey_video, (15, 17)), (other_video, (3, 4, 5, 6, 7))]
        assert cache.take_stats() == (1, 3)
    assert_crop(second[0][0], [7, 9, 11, 13, 15], (3.0, 8.0))  # cached pixels are the frames
    assert_crop(second[0][1], [15, 17], (7.0, 9.0))
    assert [round(float(f.mean())) for f in second[1][0].frames.pixels] == pytest.approx(
        [235, 230, 225, 220, 215], abs=2
    )


@pytest.mark.parametrize(("frames_held", "reads", "hits"), [(7, 2, 1), (5, 3, 0)])
def test_crop_cache_keys_on_sampling_and_stays_under_its_bound(
    source: CountingSource, grey_video: str, frames_held: int, reads: int, hits: int
) -> None:
    """[3, 8] at 1 fps (5 frames), at 0.5 fps (2 frames: another crop), at 1 fps again: served
    from the cache when the bound holds both crops, read again when the second evicted it."""
    cache = CropCache(max_bytes=frames_held * 64 * 64 * 3)
    for fps in (1.0, 0.5, 1.0):
        cfg = CropConfig(sample_fps=fps)
        with ParallelToolExecutor({"crop_video": CropVideoTool()}, source, cfg, cache) as ex:
            ex.run_many([(calls(block(3, 8)), grey_video)])
        assert cache.nbytes <= cache.max_bytes
    assert len(source.reads) == reads and cache.take_stats() == (hits, 3)


def test_crop_cache_refuses_a_negative_bound() -> None:
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        CropCache(-1)


def test_a_slow_read_times_out_and_the_next_round_still_runs(grey_video: str) -> None:
    source = CountingSource(VideoReader(), sleep_s=2.0, slow_reads=1)
    cfg = CropConfig(timeout_s=0.2, max_workers=1)
    executor = ParallelToolExecutor({"crop_video": CropVideoTool()}, source, cfg)
    begin = time.monotonic()
    results = executor.run_turn(calls(block(0, 2), block(8, 3), block(4, 6)), grey_video)
    assert time.monotonic() - begin < 1.5  # did not wait for the 2 s read
    # the whole group of the video is timed (its read is shared), invalid window included
    assert [r.error for r in results] == ["crop_video timed out after 0.2 s"] * 3
    # the stuck worker is abandoned: with max_workers=1 this would otherwise queue behind it
    begin = time.monotonic()
    (again,) = executor.run_turn(calls(block(0, 2)), grey_video)
    assert time.monotonic() - begin < 1.5
    assert_crop(again, [1, 3], (0.0, 2.0))
    executor.close()


class FailingSource(CountingSource):
    def read(self, *args, **kwargs) -> Frames:
        raise RuntimeError("disk on fire\nsecond line")


def test_a_failing_read_becomes_error_text(grey_video: str) -> None:
    executor = ParallelToolExecutor({"crop_video": CropVideoTool()}, FailingSource(VideoReader()))
    results = executor.run_turn(calls(block(0, 2), block(5, 1)), grey_video)
    assert results[0].error == "crop_video failed: disk on fire"
    assert "end_time must be greater than start_time" in results[1].error


def test_missing_sample_video_fails_every_call_with_text(executor, tmp_path) -> None:
    missing = str(tmp_path / "missing.mp4")
    results = executor.run_turn(calls(block(0, 2), block(2, 4)), missing)
    assert all(
        r.error.startswith(f"crop_video failed: {missing}: video file not found") for r in results
    )


class SkippingSource(CountingSource):
    """Returns one frame fewer than asked: a broken source the executor must not trust."""

    def read(self, path, indices, *args, **kwargs) -> Frames:
        return super().read(path, list(indices)[:-1], *args, **kwargs)


def test_frames_missing_from_a_read_are_an_error(grey_video: str) -> None:
    executor = ParallelToolExecutor({"crop_video": CropVideoTool()}, SkippingSource(VideoReader()))
    # the union [1, 3, 7, 9] loses frame 9: the first crop is whole, the second is not
    first, second = executor.run_turn(calls(block(0, 2), block(3, 5)), grey_video)
    assert_crop(first, [1, 3], (0.0, 2.0))
    assert second.error == "crop_video failed: the frame source skipped requested frames"


def test_a_round_of_only_bad_windows_decodes_nothing(executor, source, grey_video: str) -> None:
    results = executor.run_turn(calls(block(5, 1), block(40, 50)), grey_video)
    assert [r.ok for r in results] == [False, False]
    assert source.reads == []


class EchoTool:
    """A tool without `plan`: the executor must run it on its own, not in a video group."""

    name = "echo"

    @property
    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name}}

    def __call__(self, call, video, source, cfg, *, index=0) -> ToolResult:
        return ToolResult(index=index, name=self.name, error=f"echo {video} {call.arguments['x']}")


def test_tools_without_plan_run_individually(source: CountingSource, grey_video: str) -> None:
    tools = {"crop_video": CropVideoTool(), "echo": EchoTool()}
    executor = ParallelToolExecutor(tools, source, CropConfig())
    turn = (
        ParsedCall(0, "", call=ToolCall("echo", {"x": 1})),
        parse_tool_calls(block(0, 2))[0],
        ParsedCall(2, "", call=ToolCall("echo", {"x": 2})),
        ParsedCall(3, "", call=ToolCall("draw", {})),
    )
    results = executor.run_turn(turn, grey_video)
    assert [r.index for r in results] == [0, 0, 2, 3]  # the crop came from its own block 0
    assert results[0].error == f"echo {grey_video} 1"
    assert_crop(results[1], [1, 3], (0.0, 2.0))
    assert results[2].error == f"echo {grey_video} 2"
    assert results[3].error == "unknown tool 'draw'; known tools: crop_video, echo"


def test_empty_rounds(executor, grey_video: str) -> None:
    assert executor.run_turn((), grey_video) == ()
    assert executor.run_many([]) == []
