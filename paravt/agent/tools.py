"""The `crop_video` tool and the executor that runs every tool call of a round concurrently.

`crop_video` validates the requested window against the video's duration, samples frame indices
inside it (`paravt.video.sampling.window_indices`) and reads those frames from a `FrameSource`.
It always crops the sample's own video: the model's `video_path` argument is never opened.
Failures come back as short error texts in `ToolResult.error`, never as exceptions.

`ParallelToolExecutor` runs the calls of a round (of all trajectories) on a shared thread pool;
crops of one video are planned first and decoded with ONE `FrameSource.read`, so K crops (or G
rollouts cropping the same prompt video) decode it once. A `CropCache` keeps decoded crops for the
rest of the step: a window a sibling already cropped (this round or an earlier one) is not read
again.

This module deliberately does not decode video (a `FrameSource` does; `paravt.video.reader` is
the decord one), render tool responses into tokens (the agent loop and prompts do), or write
sub-agent summaries (`paravt.agent.subagent`).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol, runtime_checkable

from paravt.agent.parsing import cap_error, parse_time
from paravt.agent.schema import check_arguments
from paravt.types import Frames, ParsedCall, ToolCall, ToolResult
from paravt.video.sampling import VideoInfo, window_indices

# How often the executor looks for overdue calls while it waits for results.
_POLL_S = 0.05


class FrameSource(Protocol):
    """What a tool needs from a video decoder (`paravt.video.reader.VideoReader` is one)."""

    def info(self, path: str) -> VideoInfo: ...

    def read(
        self,
        path: str,
        indices: Sequence[int],
        max_pixels: int,
        factor: int = 32,
        min_pixels: int = 0,
    ) -> Frames: ...


@dataclass(frozen=True)
class CropConfig:
    """Crop sampling (docs/method.md section 2) and executor limits; pixel sizes are per frame."""

    sample_fps: float = 1.0
    min_frames: int = 2
    max_frames: int = 16
    max_pixels: int = 50176
    min_pixels: int = 784
    factor: int = 32  # the model's patch x merge; `AgentLoop` sets it from the processor
    max_calls_per_turn: int = 5  # the one call-cap knob: 1 is sequential dispatch
    timeout_s: float = 30.0
    max_workers: int = 8

    def __post_init__(self) -> None:
        for name in ("sample_fps", "timeout_s", "max_calls_per_turn", "max_workers"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CropConfig.{name} must be > 0 (got {getattr(self, name)})")
        if not 1 <= self.min_frames <= self.max_frames:
            raise ValueError(
                "CropConfig needs 1 <= min_frames <= max_frames "
                f"(got {self.min_frames}, {self.max_frames})"
            )


@dataclass(frozen=True)
class CropPlan:
    """What one crop will show: the clamped window (seconds) and its source frame indices."""

    window: tuple[float, float]
    indices: tuple[int, ...]


class CropCache:
    """Decoded crops by (video, window, sampling, resolution), shared by every rollout of a step.

    G rollouts of a prompt often crop the same window, in the same round or a later one; a hit
    skips the decode (and the frames are the same object, so they are identical by
    construction). Least recently used crops leave once the cached pixels pass `max_bytes`
    (0: nothing is cached). `hits` / `lookups` count the crops asked since `take_stats`.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"crop cache: max_bytes must be >= 0 (0: off), got {max_bytes}")
        self.max_bytes = max_bytes
        self._crops: OrderedDict[tuple, Frames] = OrderedDict()
        self._lock = threading.Lock()  # the executor reads videos on several threads
        self.nbytes = 0
        self.hits = 0
        self.lookups = 0

    @staticmethod
    def key(video: str, window: tuple[float, float], cfg: CropConfig) -> tuple:
        """What decides a crop's frames: the file, the window and the crop sampling settings."""
        sampling = (cfg.sample_fps, cfg.min_frames, cfg.max_frames)
        resolution = (cfg.max_pixels, cfg.min_pixels, cfg.factor)
        return (os.path.abspath(video), window, sampling, resolution)

    def get(self, key: tuple) -> Frames | None:
        with self._lock:
            found = self._crops.get(key)
            if found is not None:
                self._crops.move_to_end(key)
            return found

    def put(self, key: tuple, frames: Frames) -> None:
        size = int(frames.pixels.nbytes)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._crops.pop(key, None)
            self.nbytes += size - (int(old.pixels.nbytes) if old is not None else 0)
            self._crops[key] = frames
            while self.nbytes > self.max_bytes:
                _, gone = self._crops.popitem(last=False)
                self.nbytes -= int(gone.pixels.nbytes)

    def count(self, hits: int, lookups: int) -> None:
        with self._lock:
            self.hits += hits
            self.lookups += lookups

    def take_stats(self) -> tuple[int, int]:
        """(hits, lookups) since the last call, then zeroed."""
        with self._lock:
            out = (self.hits, self.lookups)
            self.hits = self.lookups = 0
            return out

    def __len__(self) -> int:
        return len(self._crops)


class Tool(Protocol):
    """A tool the agent can call; it reads only the sample's own `video`."""

    name: str

    @property
    def schema(self) -> dict[str, Any]: ...

    def __call__(
        self, call: ToolCall, video: str, source: FrameSource, cfg: CropConfig, *, index: int = 0
    ) -> ToolResult: ...


@runtime_checkable
class PlannedTool(Tool, Protocol):
    """A tool whose frames can be planned without decoding, so that reads can be shared."""

    def plan(self, call: ToolCall, info: VideoInfo, cfg: CropConfig) -> CropPlan | str: ...


def validate_window(start: float, end: float, duration: float) -> tuple[float, float] | str:
    """The window clamped to the video, or a short error text for the model.

    A negative start is clamped to 0 (the model meant "from the beginning"); an end beyond the
    duration is clamped to it. Errors: an empty window (end <= start, after clamping the start)
    and a start at or beyond the duration (nothing left to show).
    """
    if not (math.isfinite(start) and math.isfinite(end)):
        return f"start_time and end_time must be finite seconds (got {start}, {end})"
    clamped_start = max(start, 0.0)
    if end <= clamped_start:
        return f"invalid window [{start:g}, {end:g}]: end_time must be greater than start_time"
    if clamped_start >= duration:
        return f"start_time {start:g} s is beyond the video's duration of {duration:g} s"
    return clamped_start, min(end, duration)


class CropVideoTool:
    """`crop_video(video_path, start_time, end_time)`: frames of one window of the video."""

    name = "crop_video"

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema for the system prompt (a fresh dict: callers may edit it)."""
        seconds = {"type": "number", "minimum": 0}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": (
                    "Crop the video to the window [start_time, end_time] (seconds) and return "
                    "frames sampled inside it. Several calls in one turn run in parallel."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "video_path": {"type": "string", "description": "The video to crop."},
                        "start_time": {**seconds, "description": "Window start in seconds."},
                        "end_time": {**seconds, "description": "Window end in seconds."},
                    },
                    "required": ["video_path", "start_time", "end_time"],
                },
            },
        }

    def plan(self, call: ToolCall, info: VideoInfo, cfg: CropConfig) -> CropPlan | str:
        """Validate the call's window and choose its frame indices; an error text on bad input."""
        if "start_time" not in call.arguments or "end_time" not in call.arguments:
            return (
                "crop_video needs start_time and end_time in seconds, "
                'e.g. {"start_time": 30.0, "end_time": 50.0}'
            )
        start = parse_time(call.arguments["start_time"])
        end = parse_time(call.arguments["end_time"])
        for key, value in (("start_time", start), ("end_time", end)):
            if isinstance(value, str):
                return f"crop_video {key}: {value}"
        window = validate_window(float(start), float(end), info.duration)
        if isinstance(window, str):
            return window
        indices = window_indices(
            info.num_frames, info.fps, *window, cfg.sample_fps, cfg.min_frames, cfg.max_frames
        )
        return CropPlan(window=window, indices=tuple(indices))

    def __call__(
        self, call: ToolCall, video: str, source: FrameSource, cfg: CropConfig, *, index: int = 0
    ) -> ToolResult:
        """Crop `video` (the sample's own; `call.arguments["video_path"]` is ignored)."""
        try:
            plan = self.plan(call, source.info(video), cfg)
            if isinstance(plan, str):
                return ToolResult(index=index, name=self.name, error=plan)
            frames = source.read(video, plan.indices, cfg.max_pixels, cfg.factor, cfg.min_pixels)
        except Exception as err:  # a tool answers with text, whatever the source raised
            return ToolResult(index=index, name=self.name, error=failure_text(self.name, err))
        return ToolResult(index=index, name=self.name, frames=frames, window=plan.window)


def admit(tool: Tool, call: ToolCall, earlier: int) -> str | None:
    """Why a parsed call of `tool` must not run (the error text for the model), or None.

    `earlier`: the calls of this tool already admitted in the turn (the per-tool cap); the
    arguments are checked against the tool's `parameters` schema (a `VideoTool`'s; `crop_video`
    validates its own window, as it always has)."""
    cap = getattr(tool, "max_calls_per_turn", None)
    if cap is not None and earlier >= cap:
        return f"{tool_name(tool)} call ignored: at most {cap} {tool_name(tool)} calls per turn"
    parameters = getattr(tool, "parameters", None)
    if isinstance(parameters, Mapping):
        problem = check_arguments(parameters, call.arguments)
        if problem is not None:
            return f"{tool_name(tool)}: {problem}"
    return None


def tool_limits(tool: Tool, cfg: CropConfig) -> tuple[float, int | None]:
    """(timeout in seconds, concurrency limit or None) of one tool's calls."""
    timeout = getattr(tool, "timeout_s", None)
    return (cfg.timeout_s if timeout is None else float(timeout)), getattr(
        tool, "max_concurrency", None
    )


def tool_name(tool: Tool) -> str:
    return str(getattr(tool, "name", "") or "")


def failure_text(name: str, err: BaseException) -> str:
    """A one-line error text for a failed tool call (a `VideoError` already names the file)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{name} failed: {lines[0][:200] if lines else type(err).__name__}"


def slice_frames(frames: Frames, indices: Sequence[int]) -> Frames | None:
    """The frames at source `indices` (repeats allowed) out of a larger read; None if missing."""
    row = {index: r for r, index in enumerate(frames.indices)}
    if any(i not in row for i in indices):
        return None
    rows = [row[i] for i in indices]
    return Frames(
        pixels=frames.pixels[rows],  # [K, H, W, 3]
        indices=tuple(indices),
        timestamps=tuple(frames.timestamps[r] for r in rows),
        fps=frames.fps,
        duration=frames.duration,
    )


@dataclass(frozen=True)
class _Slot:
    """Where a result goes: trajectory `turn`, position `position`, with the call's index."""

    turn: int
    position: int
    index: int
    name: str


@dataclass(frozen=True)
class _Job:
    """One unit of pool work: a function returning one result per slot, in slot order."""

    run: Callable[[], list[ToolResult]]
    slots: tuple[_Slot, ...]
    gate: threading.BoundedSemaphore | None = None  # the tool's concurrency limit


class ParallelToolExecutor:
    """Runs the tool calls of a round concurrently, sharing decoded frames between crops.

    Every job (all crops of one video in the round, or one call of a tool without `plan`) runs
    on a shared thread pool. `cfg.timeout_s` applies to each job from the moment a worker starts
    it, so the grouped read of a video is what is timed: all crops of a video that timed out get
    "crop_video timed out after X s". A job still queued when no job has started or finished for
    `timeout_s` (every worker stuck) times out too. Python cannot stop a thread: a stuck read
    keeps its worker, so after a timeout the pool is replaced and the stuck thread is abandoned.
    """

    def __init__(
        self,
        tools: Mapping[str, Tool],
        source: FrameSource,
        cfg: CropConfig | None = None,
        cache: CropCache | None = None,
    ) -> None:
        self._tools = dict(tools)
        self._source = source
        self._cfg = cfg if cfg is not None else CropConfig()
        self.cache = cache if cache is not None and cache.max_bytes > 0 else None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def run_turn(self, calls: Sequence[ParsedCall], video: str) -> tuple[ToolResult, ...]:
        """One result per call of one turn, in call order; `video` is the sample's own video."""
        return self.run_many([(calls, video)])[0]

    def run_many(
        self, turns: Sequence[tuple[Sequence[ParsedCall], str]]
    ) -> list[tuple[ToolResult, ...]]:
        """Results of every (calls, video) turn of a round, all calls run concurrently."""
        results: list[list[ToolResult | None]] = [[None] * len(calls) for calls, _ in turns]
        groups: dict[tuple[str, str], list[tuple[_Slot, ToolCall]]] = {}
        jobs: list[_Job] = []
        gates = self._gates()
        for turn, (calls, video) in enumerate(turns):
            admitted: dict[str, int] = {}
            for position, parsed in enumerate(calls):
                slot = _Slot(turn, position, parsed.index, parsed.call.name if parsed.call else "")
                early = self._early_result(slot, parsed, admitted.get(slot.name, 0))
                if early is not None:
                    results[turn][position] = early
                    continue
                admitted[slot.name] = admitted.get(slot.name, 0) + 1
                tool = self._tools[slot.name]
                if isinstance(tool, PlannedTool):
                    groups.setdefault((slot.name, video), []).append((slot, parsed.call))
                else:
                    run = partial(
                        _run_single, tool, parsed.call, video, slot, self._source, self._cfg
                    )
                    jobs.append(_Job(run, (slot,), gates.get(slot.name)))
        for (name, video), members in groups.items():
            tool = self._tools[name]
            run = partial(_run_group, tool, video, members, self._source, self._cfg, self.cache)
            jobs.append(_Job(run, tuple(slot for slot, _ in members), gates.get(name)))
        for job, (outcome, seconds) in zip(jobs, self._gather(jobs), strict=True):
            for k, slot in enumerate(job.slots):
                if outcome is None:
                    timeout = tool_limits(self._tools[slot.name], self._cfg)[0]
                    text = f"{slot.name} timed out after {timeout:g} s"
                    found = replace(_error(slot, text), timed_out=True)
                else:
                    found = outcome[k]
                results[slot.turn][slot.position] = replace(found, latency_s=seconds)
        return [tuple(r for r in turn if r is not None) for turn in results]

    @property
    def names(self) -> tuple[str, ...]:
        """The tools' names, in configuration order (the parser's known tools)."""
        return tuple(self._tools)

    @property
    def tools(self) -> dict[str, Tool]:
        return dict(self._tools)

    def _gates(self) -> dict[str, threading.BoundedSemaphore]:
        """A fresh semaphore per tool with a concurrency limit, for one round (a call that hung
        in an earlier round keeps no slot of this one)."""
        out = {}
        for name, tool in self._tools.items():
            limit = tool_limits(tool, self._cfg)[1]
            if limit is not None:
                out[name] = threading.BoundedSemaphore(limit)
        return out

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> ParallelToolExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _early_result(self, slot: _Slot, parsed: ParsedCall, earlier: int) -> ToolResult | None:
        """The result of a call that never reaches a tool (over a cap, unparsed, unknown, or
        its arguments break the tool's schema); `earlier`: calls of its tool admitted before."""
        cap = self._cfg.max_calls_per_turn
        if slot.position >= cap:
            return _error(slot, cap_error(slot.position, cap))
        if parsed.call is None or parsed.error is not None:
            return _error(slot, parsed.error or f"tool call {slot.index + 1} could not be parsed")
        if slot.name not in self._tools:
            known = ", ".join(sorted(self._tools)) or "none"
            return _error(slot, f"unknown tool {slot.name!r}; known tools: {known}")
        refused = admit(self._tools[slot.name], parsed.call, earlier)
        return None if refused is None else _error(slot, f"tool call {slot.index + 1}: {refused}")

    def _gather(self, jobs: Sequence[_Job]) -> list[tuple[Any, float]]:
        """Each job's (results, seconds it ran), results None for a job that ran (or waited)
        past its tools' timeout."""
        timeouts = [max(tool_limits(self._tools[j.slots[0].name], self._cfg)[0], 0) for j in jobs]
        started: list[float | None] = [None] * len(jobs)
        ran = [0.0] * len(jobs)

        def launch(i: int) -> list[ToolResult]:
            with jobs[i].gate or contextlib.nullcontext():
                started[i] = time.monotonic()
                out = jobs[i].run()
                ran[i] = time.monotonic() - started[i]
                return out

        pool = self._get_pool()
        pending: dict[int, Future[list[ToolResult]]] = {
            i: pool.submit(launch, i) for i in range(len(jobs))
        }
        outcomes: list[Any] = [None] * len(jobs)
        progress, seen_started, timed_out = time.monotonic(), 0, False
        while pending:
            wait(pending.values(), timeout=_POLL_S, return_when=FIRST_COMPLETED)
            now = time.monotonic()
            if (count := sum(s is not None for s in started)) != seen_started:
                progress, seen_started = now, count
            for i, future in list(pending.items()):
                if future.done():
                    outcomes[i], progress = future.result(), now
                    del pending[i]
                elif _overdue(started[i], progress, now, timeouts[i]):
                    future.cancel()
                    del pending[i]
                    ran[i], timed_out = timeouts[i], True
        if timed_out:
            self.close()  # the stuck workers are abandoned; the next round gets a fresh pool
        return list(zip(outcomes, ran, strict=True))

    def _get_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._cfg.max_workers, "paravt-tool")
            return self._pool


def _overdue(started: float | None, progress: float, now: float, timeout: float) -> bool:
    if started is not None:
        return now - started > timeout
    return now - progress > timeout


def _run_single(
    tool: Tool, call: ToolCall, video: str, slot: _Slot, source: FrameSource, cfg: CropConfig
) -> list[ToolResult]:
    try:
        return [tool(call, video, source, cfg, index=slot.index)]
    except Exception as err:  # a third-party tool broke its contract; keep the round going
        return [_error(slot, failure_text(slot.name, err))]


def _run_group(
    tool: PlannedTool,
    video: str,
    members: Sequence[tuple[_Slot, ToolCall]],
    source: FrameSource,
    cfg: CropConfig,
    cache: CropCache | None = None,
) -> list[ToolResult]:
    """All crops of one video: plan each, read the union of their frames once, slice per crop.
    With a `cache`, crops already decoded (this step, or by a sibling earlier in this call) are
    served from it and only the others are read."""
    try:
        info = source.info(video)
    except Exception as err:
        return [_error(slot, failure_text(slot.name, err)) for slot, _ in members]
    plans: list[CropPlan | str] = []
    for slot, call in members:
        try:
            plans.append(tool.plan(call, info, cfg))
        except Exception as err:
            plans.append(failure_text(slot.name, err))
    crops = _cached_crops(plans, video, cfg, cache)
    wanted = sorted(
        {
            i
            for p in plans
            if isinstance(p, CropPlan) and _key(p, video, cfg) not in crops
            for i in p.indices
        }
    )
    frames: Frames | str | None = None
    if wanted:
        try:
            frames = source.read(video, wanted, cfg.max_pixels, cfg.factor, cfg.min_pixels)
        except Exception as err:
            frames = failure_text(tool.name, err)
    results = []
    for (slot, _), plan in zip(members, plans, strict=True):
        known = crops.get(_key(plan, video, cfg)) if isinstance(plan, CropPlan) else None
        result = _crop_result(slot, plan, known if known is not None else frames, known is None)
        if cache is not None and result.ok and known is None:
            crops[_key(plan, video, cfg)] = result.frames  # later siblings share these frames
            cache.put(_key(plan, video, cfg), result.frames)
        results.append(result)
    return results


def _key(plan: CropPlan, video: str, cfg: CropConfig) -> tuple:
    return CropCache.key(video, plan.window, cfg)


def _cached_crops(plans, video: str, cfg: CropConfig, cache: CropCache | None) -> dict:
    """The crops of `plans` already in `cache`; counts every planned crop as a lookup and
    every crop that needs no read (cached, or a repeat of an earlier plan) as a hit."""
    if cache is None:
        return {}
    keys = [_key(p, video, cfg) for p in plans if isinstance(p, CropPlan)]
    found = {k: f for k in dict.fromkeys(keys) if (f := cache.get(k)) is not None}
    cache.count(hits=len(keys) - len(set(keys) - set(found)), lookups=len(keys))
    return found


def _crop_result(
    slot: _Slot, plan: CropPlan | str, frames: Frames | str | None, read: bool = True
) -> ToolResult:
    """The crop of `plan` out of the round's read `frames`, or `frames` itself (`read=False`:
    a cached crop)."""
    if isinstance(plan, str):
        return _error(slot, plan)
    if isinstance(frames, str):
        return _error(slot, frames)
    if not read:
        return ToolResult(slot.index, slot.name, frames=frames, window=plan.window)
    crop = slice_frames(frames, plan.indices) if frames is not None else None
    if crop is None:
        return _error(slot, f"{slot.name} failed: the frame source skipped requested frames")
    return ToolResult(slot.index, slot.name, frames=crop, window=plan.window)


def _error(slot: _Slot, text: str) -> ToolResult:
    return ToolResult(slot.index, slot.name, error=text)
