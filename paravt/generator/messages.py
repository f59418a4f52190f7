"""The messages between the trainer and its asynchronous rollout generator process.

A `GenTask` goes to the generator (one step's prompts), a `GenResult` or a `GenFailure` comes
back. With `rollout.mode=stream` the trainer also sends a `StreamTake` per step and gets a
`StreamResult` (whole groups) back, or a `GenStarved` when the generator needs more prompts.
Kept apart from `worker` (the process) so that the loops it runs (`worker.serve_steps`,
`partial_rollouts.serve_partial`, `streaming.serve_stream`) share them without importing each
other.
"""

from __future__ import annotations

from dataclasses import dataclass

from paravt.types import Sample, Trajectory


@dataclass(frozen=True)
class GenTask:
    step: int
    samples: tuple[Sample, ...]
    budgets: tuple[int, ...]
    group_size: int
    params: object  # paravt.rollout.engine.SamplingParams
    skipped: tuple[tuple[str, str], ...] = ()  # (prompt id, error): left out for their video
    positions: tuple[int, ...] | None = None  # each sample's index in the step's whole batch


@dataclass(frozen=True)
class GenResult:
    step: int
    version: int  # the oldest policy version behind the step's trained tokens
    trajectories: tuple[Trajectory, ...]
    video_errors: dict[str, str]
    busy_s: float  # generation time in the child
    timings: dict[str, float]


@dataclass(frozen=True)
class GenFailure:
    error: str  # the child's traceback


@dataclass(frozen=True)
class StreamTake:
    """`rollout.mode=stream`, trainer to generator: step `step` wants its batch of whole groups;
    the trainer's weights (just published) are at `version`."""

    step: int
    version: int


@dataclass(frozen=True)
class StreamGroup:
    """One finished group: the prompt it answers (its prompt step, position, frame budget) and
    its G trajectories (VIDEO_ERROR ones when its video failed: `video_error` says why)."""

    step: int
    position: int
    sample: Sample
    budget: int
    trajectories: tuple[Trajectory, ...]
    video_error: str | None = None


@dataclass(frozen=True)
class StreamResult:
    """A batch of whole groups for trainer step `step`, in the order they finished."""

    step: int
    groups: tuple[StreamGroup, ...]
    dropped: int  # groups dropped as too stale so far (the run's total)
    busy_s: float  # generator time since the last batch
    in_flight: int  # trajectories in flight when it was sent
    buffered: int  # finished groups left waiting


@dataclass(frozen=True)
class GenStarved:
    """`rollout.mode=stream`, generator to trainer: a group may start but no prompt is left."""
