"""Tools as plugins: `VideoTool` / `tool`, schema checks, per-tool limits and hostile tools.

Every tool here runs on the real executor with the real reader and the grey test video (20 s at
2 fps, 64x64; tests/agent/conftest.py); a hostile tool must give the model an error text and
never stop the round.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from paravt.agent.parsing import parse_tool_calls
from paravt.agent.schema import check_arguments
from paravt.agent.toolkit import Clip, ToolError, VideoTool, build_toolbox, tool
from paravt.agent.tools import CropConfig, CropVideoTool, ParallelToolExecutor
from paravt.types import Frames
from paravt.video.reader import VideoReader

NO_ARGS = {"type": "object", "properties": {}}


@tool("duration", "The video's length in seconds.", NO_ARGS)
def duration(args, video):
    return f"{video.info().duration:.1f} s"


@tool("nap", "Sleeps.", {"type": "object", "properties": {"s": {"type": "number"}}})
def nap(args, video):
    time.sleep(args.get("s", 0.2))
    return "rested"


class Hostile(VideoTool):
    """A tool that misbehaves as `kind` says."""

    def __init__(self, name: str, kind: str, timeout_s: float | None = None):
        self.name, self.kind, self.timeout_s = name, kind, timeout_s
        self.release = threading.Event()

    def run(self, args, video):
        if self.kind == "raise":
            raise RuntimeError("disk on fire\nsecond line")
        if self.kind == "hang":
            self.release.wait(30)  # set at the end of the test: the abandoned thread ends
            return "too late"
        if self.kind == "frames":
            pixels = np.zeros((10_000, 32, 32, 3), dtype=np.uint8)
            return Frames(pixels, tuple(range(10_000)), tuple(range(10_000)), 1.0, 1e4)
        if self.kind == "text":
            return "x" * 100_000_000
        if self.kind == "object":
            return {"not": "a result"}
        raise ToolError("window is outside the video")


def executor(*tools, **crop) -> ParallelToolExecutor:
    return ParallelToolExecutor(build_toolbox(tools), VideoReader(), CropConfig(**crop))


def calls(text_calls: str, names) -> tuple:
    return parse_tool_calls(text_calls, max_calls=20, known_tools=names)


def call(name: str, args: str = "{}") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def test_hostile_tools_give_error_texts_in_call_order_and_the_round_goes_on(grey_video):
    hang = Hostile("hang", "hang", timeout_s=0.3)
    tools = [
        Hostile("boom", "raise"),
        hang,
        Hostile("flood", "frames"),
        Hostile("novel", "text"),
        Hostile("odd", "object"),
        Hostile("refuse", "refuse"),
        duration(),
    ]
    names = [t.name for t in tools]
    text = "".join(call(n) for n in names) + call("nope")
    with executor(*tools, max_calls_per_turn=10) as ex:
        t0 = time.monotonic()
        results = ex.run_turn(calls(text, names), grey_video)
        spent = time.monotonic() - t0
    hang.release.set()
    assert [r.name for r in results] == [*names, ""]  # the parser refused "nope": no name
    errors = [r.error for r in results]
    assert errors[0] == "boom failed: disk on fire"  # first line only
    assert errors[1] == "hang timed out after 0.3 s" and results[1].timed_out
    assert errors[2] == "flood returned 10000 frames; a result may hold 1 to 64 frames"
    assert errors[3] == "novel returned 100000000 characters of text; at most 20000 characters"
    assert errors[4] == "odd failed: it returned a dict, not text, Frames or a Clip"
    assert errors[5] == "window is outside the video"  # a ToolError's text, as is
    # 40 frames at 2 fps: 20.0 s; the one good call of the turn is unharmed.
    assert results[6].ok and results[6].text == "20.0 s"
    assert errors[7] == (
        "unknown tool 'nope' in tool call 8; known tools: boom, duration, flood, hang, novel, "
        "odd, refuse"
    )
    assert spent < 5  # the hanging tool cost its 0.3 s timeout, not its 30 s


def test_schema_violations_name_the_argument_and_never_run_the_tool(grey_video):
    ran = []

    @tool(
        "pick",
        "Pick a colour.",
        {
            "type": "object",
            "properties": {
                "colour": {"type": "string", "enum": ["red", "blue"]},
                "n": {"type": "integer", "minimum": 1},
            },
            "required": ["colour"],
        },
    )
    def pick(args, video):
        ran.append(args)
        return args["colour"]

    bad = [
        ("{}", "tool call 1: pick: missing required argument 'colour'"),
        ('{"colour": "green"}', "tool call 2: pick: argument 'colour' must be one of red, blue"),
        ('{"colour": "red", "n": 1.5}', "tool call 3: pick: argument 'n' must be a integer"),
        ('{"colour": "red", "n": true}', "tool call 4: pick: argument 'n' must be a integer"),
        ('{"colour": "red", "n": 0}', "tool call 5: pick: argument 'n' must be >= 1, got 0"),
        ('{"colour": "red", "path": "x"}', "tool call 6: pick: unknown argument 'path'"),
    ]
    text = "".join(call("pick", a) for a, _ in bad) + call("pick", '{"colour": "blue", "n": 2}')
    with executor(pick(), max_calls_per_turn=10) as ex:
        results = ex.run_turn(calls(text, ["pick"]), grey_video)
    for result, (_, expected) in zip(results, bad, strict=False):
        assert result.error.startswith(expected), result.error
    assert results[-1].text == "blue" and ran == [{"colour": "blue", "n": 2}]


def test_a_user_tools_arguments_are_not_aliased_to_crop_videos():
    (parsed,) = calls(call("pick", '{"path": "a", "start": "0:30"}'), ["pick"])
    assert parsed.call.arguments == {"path": "a", "start": "0:30"}  # as written
    (crop,) = calls(call("crop_video", '{"start": "0:30", "end": 40}'), ["crop_video"])
    assert crop.call.arguments == {"start_time": 30.0, "end_time": 40.0}


def test_per_tool_call_caps_and_the_turn_cap(grey_video):
    capped = duration()
    capped.max_calls_per_turn = 2
    text = call("duration") * 3 + call("crop_video", '{"start_time": 0, "end_time": 4}')
    with executor(capped, CropVideoTool()) as ex:
        results = ex.run_turn(calls(text, ["duration", "crop_video"]), grey_video)
    assert [r.ok for r in results] == [True, True, False, True]
    assert results[2].error == (
        "tool call 3: duration call ignored: at most 2 duration calls per turn"
    )


def test_mixed_tools_of_one_turn_run_concurrently_and_limits_serialise_one_tool(grey_video):
    other = type("nap2", (nap,), {"name": "nap2"})
    text = call("nap", '{"s": 0.4}') + call("nap2", '{"s": 0.4}')
    with executor(nap(), other()) as ex:
        ex.run_turn(calls(call("nap", '{"s": 0.01}'), ["nap"]), grey_video)  # warm the pool
        t0 = time.monotonic()
        both = ex.run_turn(calls(text, ["nap", "nap2"]), grey_video)
        together = time.monotonic() - t0
    assert [r.text for r in both] == ["rested", "rested"]
    assert together < 0.75  # two 0.4 s calls side by side, not 0.8 s in a row
    assert all(r.latency_s >= 0.4 for r in both)
    limited = nap()
    limited.max_concurrency = 1
    with executor(limited) as ex:
        t0 = time.monotonic()
        ex.run_turn(calls(call("nap", '{"s": 0.3}') * 2, ["nap"]), grey_video)
        assert time.monotonic() - t0 >= 0.6  # one at a time


def test_a_clip_result_keeps_its_window_and_frames_get_their_span(grey_video):
    @tool("first_two", "The first two frames.", NO_ARGS)
    def first_two(args, video):
        return video.read([0, 1], max_pixels=64 * 64)

    @tool("later", "Frames 4 and 5 as a clip.", NO_ARGS)
    def later(args, video):
        return Clip(video.read([4, 5], max_pixels=64 * 64), (2.0, 3.0))

    @tool("photo", "One frame.", NO_ARGS)
    def photo(args, video):
        return video.read([6], max_pixels=64 * 64)

    with executor(first_two(), later()) as ex:
        a, b = ex.run_turn(
            calls(call("first_two") + call("later"), ["first_two", "later"]), grey_video
        )
    # 2 fps: frames 0, 1 are at 0.0 s and 0.5 s; the reader keeps 64x64 (a multiple of 32).
    assert a.window == (0.0, 0.5) and a.frames.pixels.shape == (2, 64, 64, 3)
    assert b.window == (2.0, 3.0) and b.frames.timestamps == (2.0, 2.5)
    # an image (one frame, here frame 6 at 3.0 s) comes back as a clip of it twice
    (image,) = executor(photo()).run_turn(calls(call("photo"), ["photo"]), grey_video)
    assert image.frames.indices == (6, 6) and image.frames.timestamps == (3.0, 3.0)
    assert image.window == (3.0, 3.0) and image.frames.pixels.shape == (2, 64, 64, 3)


def test_a_bad_toolbox_is_refused_naming_the_entry():
    with pytest.raises(ValueError, match=r"toolbox\[1\].*two tools are named 'duration'"):
        build_toolbox([duration(), duration()])
    with pytest.raises(ValueError, match=r"rollout\.toolbox is empty"):
        build_toolbox([])
    with pytest.raises(ValueError, match=r"toolbox\[0\] \(object\): a tool needs a name"):
        build_toolbox([object()])
    with pytest.raises(TypeError, match="unknown settings"):
        tool("x", "y", NO_ARGS, timeout=3)(lambda a, v: "")


def test_check_arguments_accepts_what_the_schema_allows():
    schema = {"type": "object", "properties": {"x": {"type": "number", "maximum": 1}}}
    assert check_arguments(schema, {"x": 1}) is None  # an int is a number
    assert check_arguments(schema, {}) is None  # nothing required
    assert check_arguments(schema, {"x": 1.5}) == "argument 'x' must be <= 1, got 1.5"
