"""The messages between the trainer and its asynchronous rollout generator process.

A `GenTask` goes to the generator (one step's prompts), a `GenResult` or a `GenFailure` comes
back. Kept apart from `worker` (the process) so that the step loops it runs
(`worker.serve_steps`, `partial_rollouts.serve_partial`) share them without importing each
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
