"""The public way to give the agent a tool of one's own: `VideoTool` and the `tool` decorator.

A tool is a JSON schema (name, description, parameters) and a `run(args, video)` that gets the
call's arguments, already checked against the schema, and a `Video`: the SAMPLE's own video
(the model never names a file; a `video_path` it writes is not opened). `run` returns text
(`str`), frames (`Frames`, a clip whose timestamps the model is shown) or a `Clip` (frames with
the window they cover); one frame (an image) is shown as a two-frame clip. Whatever `run` does,
the model gets a result or a short error text: an exception, a timeout (`timeout_s`), too many
frames, too large a frame or too long a text all become error texts, never a failed step.

`VideoTool.__call__` is the executor's `Tool` protocol (paravt.agent.tools), so a user's tool
runs beside `crop_video` on the same thread pool. `build_toolbox` turns the config's list
(`rollout.toolbox`) into the executor's name -> tool mapping and refuses a bad list.

`toolbox_system` picks the system prompt of a toolbox (the paper's for the default one).
This module deliberately does not parse calls (paravt.agent.parsing) nor render results
(paravt.agent.prompts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from paravt.agent.prompts import tools_system_prompt
from paravt.agent.tools import (
    CropConfig,
    CropVideoTool,
    FrameSource,
    Tool,
    failure_text,
    tool_name,
)
from paravt.types import Frames, ToolCall, ToolResult
from paravt.video.sampling import VideoInfo


@dataclass(frozen=True)
class Clip:
    """Frames and the [start, end] seconds of the video they cover (shown in the response)."""

    frames: Frames
    window: tuple[float, float]


class ToolError(Exception):
    """Raised by `run` for a call the tool refuses: its message is the model's error text, as
    is (any other exception becomes "<name> failed: <message>")."""


class Video:
    """The sample's own video, as a tool sees it: its facts and frames at a pixel budget."""

    def __init__(self, path: str, source: FrameSource, factor: int):
        self.path = path
        self.factor = factor  # the model's patch x merge: frame sides are multiples of it
        self._source = source

    def info(self) -> VideoInfo:
        return self._source.info(self.path)

    def read(self, indices: Sequence[int], max_pixels: int, min_pixels: int = 0) -> Frames:
        """Frames at source `indices`, each resized to at most `max_pixels` on the model's grid."""
        return self._source.read(self.path, list(indices), max_pixels, self.factor, min_pixels)


class VideoTool:
    """Base class of a tool: set the schema attributes, write `run`; limits are per tool.

    `max_calls_per_turn`, `timeout_s`, `max_concurrency`: None takes `rollout.crop`'s call cap
    and timeout, and no concurrency limit. `max_frames` / `max_pixels` / `max_text_chars` bound
    what one result may hold (a bigger one becomes an error text for the model).
    """

    name: str = ""
    description: str = ""
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}
    example: Mapping[str, Any] | None = None  # the compact prompt's example arguments
    max_calls_per_turn: int | None = None
    timeout_s: float | None = None
    max_concurrency: int | None = None
    max_frames: int = 64
    max_pixels: int = 1 << 20
    max_text_chars: int = 20_000

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema, as chat templates render a `tools` list."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def run(self, args: dict[str, Any], video: Video) -> str | Frames | Clip:
        raise NotImplementedError(f"{type(self).__name__}.run")

    def __call__(
        self, call: ToolCall, video: str, source: FrameSource, cfg: CropConfig, *, index: int = 0
    ) -> ToolResult:
        """The executor's protocol: run and bound the result; never raises."""
        try:
            out = self.run(dict(call.arguments), Video(video, source, cfg.factor))
            return self._result(out, index)
        except ToolError as err:
            return ToolResult(index=index, name=self.name, error=str(err)[:500])
        except Exception as err:  # a tool answers with text, whatever it raised
            return ToolResult(index=index, name=self.name, error=failure_text(self.name, err))

    def _result(self, out: Any, index: int) -> ToolResult:
        if isinstance(out, str):
            if len(out) > self.max_text_chars:
                return self._error(index, f"{len(out)} characters of text", self.max_text_chars)
            return ToolResult(index=index, name=self.name, text=out)
        if isinstance(out, Frames):
            out = Clip(out, _span(out))
        if not isinstance(out, Clip):
            kind = type(out).__name__
            return ToolResult(
                index=index,
                name=self.name,
                error=f"{self.name} failed: it returned a {kind}, not text, Frames or a Clip",
            )
        clip = out
        count, height, width = (int(n) for n in clip.frames.pixels.shape[:3])
        if count > self.max_frames or count == 0:
            return self._error(index, f"{count} frames", self.max_frames, "frames")
        if height * width > self.max_pixels:
            return self._error(index, f"frames of {height}x{width} px", self.max_pixels, "px")
        frames = clip.frames if count > 1 else _doubled(clip.frames)
        return ToolResult(index=index, name=self.name, frames=frames, window=clip.window)

    def _error(self, index: int, got: str, cap: int, unit: str = "characters") -> ToolResult:
        limit = {
            "characters": f"at most {cap} characters",
            "frames": f"a result may hold 1 to {cap} frames",
            "px": f"a frame may hold at most {cap} px",
        }[unit]
        return ToolResult(index=index, name=self.name, error=f"{self.name} returned {got}; {limit}")


def tool(
    name: str, description: str, parameters: Mapping[str, Any], **limits: Any
) -> Callable[[Callable[[dict, Video], Any]], type[VideoTool]]:
    """Make a `VideoTool` class of a function `fn(args, video)`; name the class in YAML as a
    `_target_` (or instantiate it). `limits`: the class attributes of `VideoTool` to set."""

    def wrap(fn: Callable[[dict, Video], Any]) -> type[VideoTool]:
        bad = set(limits) - set(vars(VideoTool))
        if bad:
            raise TypeError(f"tool {name!r}: unknown settings {sorted(bad)}")

        def run(self, args: dict, video: Video):
            return fn(args, video)

        attrs = {"name": name, "description": description, "parameters": parameters, **limits}
        cls = type(fn.__name__, (VideoTool,), {**attrs, "run": run, "__doc__": fn.__doc__})
        cls.__module__ = fn.__module__
        return cls

    return wrap


def _doubled(frames: Frames) -> Frames:
    """An image as a two-frame clip: Qwen-VL video patches span 2 frames (the processor pads
    one frame so on its own; the vLLM engine refuses a one-frame clip)."""
    pixels = np.concatenate([frames.pixels, frames.pixels])
    return replace(
        frames, pixels=pixels, indices=frames.indices * 2, timestamps=frames.timestamps * 2
    )


def _span(frames: Frames) -> tuple[float, float]:
    times = frames.timestamps
    return (float(times[0]), float(times[-1])) if times else (0.0, 0.0)


def build_toolbox(tools: Iterable[Tool]) -> dict[str, Tool]:
    """The executor's name -> tool mapping of the config's list; a bad list is refused with the
    entry it is about (no name, a duplicate, no schema or no call)."""
    box: dict[str, Tool] = {}
    for i, item in enumerate(tools):
        name = tool_name(item)
        where = f"rollout.toolbox[{i}] ({type(item).__name__})"
        if not name.isidentifier():
            raise ValueError(f"{where}: a tool needs a name that is an identifier, got {name!r}")
        if name in box:
            raise ValueError(f"{where}: two tools are named {name!r}")
        if not callable(item) or not isinstance(getattr(item, "schema", None), dict):
            raise ValueError(f"{where}: not a tool (see paravt.agent.toolkit.VideoTool)")
        box[name] = item
    if not box:
        raise ValueError(
            "rollout.toolbox is empty; list at least one tool, or set rollout.agent.tools=false "
            "(mode=no_tool) for an agent without tools"
        )
    return box


def example_call(item: Tool) -> dict[str, Any]:
    """One call of `item` for the compact prompt: its `example`, else its required arguments
    with a value of their type (an enum's first value)."""
    name = tool_name(item)
    given = getattr(item, "example", None)
    if given is not None:
        return {"name": name, "arguments": dict(given)}
    params = item.schema["function"].get("parameters", {})
    props = params.get("properties", {})
    filler = {"number": 1.0, "integer": 1, "boolean": True, "string": "..."}
    args = {
        key: props.get(key, {}).get("enum", [None])[0]
        if "enum" in props.get(key, {})
        else filler.get(props.get(key, {}).get("type"), "...")
        for key in params.get("required", ())
    }
    return {"name": name, "arguments": args}


def is_default_toolbox(box: Mapping[str, Tool]) -> bool:
    """The paper's `[crop_video]`: its prompts are SYSTEM_TEMPLATE / COMPACT_SYSTEM, unchanged."""
    return list(box) == ["crop_video"] and type(box["crop_video"]) is CropVideoTool


def toolbox_system(system: str | None, box: Mapping[str, Tool]) -> str | None:
    """`rollout.agent.system` for the toolbox: unchanged for the default one (prompts.
    main_messages resolves it), else the prompt that lists every tool (`tools_system_prompt`)."""
    if is_default_toolbox(box):
        return system
    tools = list(box.values())
    return tools_system_prompt(system, [t.schema for t in tools], [example_call(t) for t in tools])
