"""Pure schedules: a coefficient as a function of the optimizer step.

Kinds (the `SCHEDULES` registry; `REQUIRED` lists the keys each needs):
    constant  `start` at every step
    linear    `start` -> `end` in a straight line over `steps` steps, then `end`
    cosine    `start` -> `end` along a half cosine over `steps` steps, then `end`
    step      `start`, then `values[i]` from step `milestones[i]` on (milestones increasing)

`schedule_value` computes one value; `check_schedule` validates a config mapping (as Hydra hands
it) once, so that a typo fails when the callback is built rather than mid-run.

This module deliberately knows nothing of Lightning, optimizers or learning rates (use
torch.optim.lr_scheduler for those); it maps integers to floats.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def _constant(step: int, start: float, end: float, steps: int, milestones, values) -> float:
    return start


def _linear(step: int, start: float, end: float, steps: int, milestones, values) -> float:
    return start + (end - start) * min(step / steps, 1.0)


def _cosine(step: int, start: float, end: float, steps: int, milestones, values) -> float:
    progress = min(step / steps, 1.0)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _step(step: int, start: float, end: float, steps: int, milestones, values) -> float:
    # bisect_right counts the milestones already reached (a milestone equal to step counts).
    passed = bisect.bisect_right(milestones, step)
    return start if passed == 0 else values[passed - 1]


ScheduleFn = Callable[[int, float, float, int, tuple[int, ...], tuple[float, ...]], float]

SCHEDULES: dict[str, ScheduleFn] = {
    "constant": _constant,
    "linear": _linear,
    "cosine": _cosine,
    "step": _step,
}

REQUIRED: dict[str, tuple[str, ...]] = {
    "constant": ("start",),
    "linear": ("start", "end", "steps"),
    "cosine": ("start", "end", "steps"),
    "step": ("start", "milestones", "values"),
}

KEYS: tuple[str, ...] = ("kind", "start", "end", "steps", "milestones", "values")


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _count(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def _check_step_kind(
    milestones: tuple[int, ...], values: tuple[float, ...], where: str
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    marks = tuple(_count(m, f"{where}: each milestone", 0) for m in milestones)
    levels = tuple(_finite(v, f"{where}: each value") for v in values)
    if not marks or len(marks) != len(levels):
        raise ValueError(
            f"{where}: kind 'step' needs one value per milestone and at least one of each, got "
            f"{len(marks)} milestones and {len(levels)} values"
        )
    if any(a >= b for a, b in itertools.pairwise(marks)):
        raise ValueError(f"{where}: milestones must be strictly increasing, got {list(marks)}")
    return marks, levels


def schedule_value(
    kind: str,
    step: int,
    *,
    start: float,
    end: float | None = None,
    steps: int | None = None,
    milestones: Sequence[int] = (),
    values: Sequence[float] = (),
    where: str = "schedule",
) -> float:
    """The value of schedule `kind` at optimizer step `step` (>= 0); `where` names it in errors."""
    fn = SCHEDULES.get(kind)
    if fn is None:
        raise ValueError(
            f"{where}: unknown schedule kind {kind!r}; expected one of {list(SCHEDULES)}"
        )
    _count(step, f"{where}: step", 0)
    given = {"start": start, "end": end, "steps": steps, "milestones": milestones, "values": values}
    missing = [key for key in REQUIRED[kind] if given[key] is None or given[key] == ()]
    if missing:
        raise ValueError(
            f"{where}: kind {kind!r} needs {missing} (it needs {list(REQUIRED[kind])})"
        )
    first = _finite(start, f"{where}: start")
    last = first if end is None else _finite(end, f"{where}: end")
    length = 1 if steps is None else _count(steps, f"{where}: steps", 1)
    marks, levels = (), ()
    if kind == "step":
        marks, levels = _check_step_kind(tuple(milestones), tuple(values), where)
    return fn(step, first, last, length, marks, levels)


def check_schedule(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate a schedule mapping; returns plain keyword arguments for `schedule_value`.

    Lists (or Hydra ListConfigs) become tuples. Raises ValueError naming `where` and the fix.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"{where} must be a mapping such as {{'kind': 'linear', 'start': 1.0, 'end': 0.2, "
            f"'steps': 100}}, got {type(spec).__name__}"
        )
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed keys are {list(KEYS)}")
    if "kind" not in spec:
        raise ValueError(f"{where}: missing 'kind'; expected one of {list(SCHEDULES)}")
    kwargs: dict[str, Any] = {key: spec[key] for key in KEYS if key in spec}
    for key in ("milestones", "values"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    kwargs["where"] = where
    schedule_value(step=0, **kwargs)  # validates every field the kind reads
    return kwargs


def crossed_multiple(step: int, last_step: int, every: int) -> bool:
    """Whether `step` passed a multiple of `every` since `last_step`.

    global_step stands still over accumulated micro-batches and may jump by several steps per
    batch (several PPO epochs), so a plain `step % every == 0` would repeat or miss.
    """
    return step // every > last_step // every
