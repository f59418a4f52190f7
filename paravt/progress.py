"""Counts and ETA for long loops: a tqdm bar on a terminal, a log line every few items otherwise.

Pure of any framework (tqdm is imported only on a terminal), so core loops (data generation,
supervised steps, teacher tracing, evaluation) can wrap their iterables in `track`. The Lightning
side (the RL step display) is `paravt.callbacks.progress.StepProgress`, which formats with
`progress_line` here.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

log = logging.getLogger("paravt.progress")
T = TypeVar("T")


def format_duration(seconds: float) -> str:
    """`0:42`, `3:05`, `1:02:03` (no days: runs here are hours, not weeks)."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def rate_text(seconds_per_item: float, unit: str | None = None) -> str:
    """`2.1 s/it` or `10.0 it/s`; `unit` fixes the unit (None: s/it from one second an item)."""
    unit = unit or ("s/it" if seconds_per_item >= 1.0 else "it/s")
    if unit == "s/it":
        return f"{seconds_per_item:.1f} s/it"
    return f"{1 / max(seconds_per_item, 1e-9):.1f} it/s"


def progress_line(
    desc: str,
    done: int,
    total: int | None,
    elapsed: float,
    fresh: int,
    metrics: Mapping,
    unit: str | None = None,
    seconds_per_item: float | None = None,
) -> str:
    """One line: `RL step 7/20 | 2.1 s/it | ETA 0:27 | reward 0.412`.

    `fresh` counts the items done in this process (a resume starts with done > 0), so the rate
    and the ETA come from this run's own speed: `elapsed / fresh`, or `seconds_per_item` when
    the caller smooths it. `unit` keeps one unit for a whole loop (no `s/it`/`it/s` flapping).
    """
    head = f"{desc} {done}/{total}" if total else f"{desc} {done}"
    parts = [head]
    if fresh > 0:
        rate = seconds_per_item if seconds_per_item is not None else elapsed / fresh
        parts.append(rate_text(rate, unit))
        if total:
            parts.append(f"ETA {format_duration(rate * max(0, total - done))}")
    parts += [f"{key} {float(value):.3f}" for key, value in metrics.items()]
    return " | ".join(parts)


class SmoothedRate:
    """Seconds per item for log lines: the first interval's, then an exponential moving average
    of each interval's (weight `alpha` on the newest), and one unit chosen at the first line."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha, self.value, self.unit = alpha, None, None
        self._last_time, self._last_done = time.perf_counter(), 0

    def update(self, done: int) -> float:
        now = time.perf_counter()
        interval = (now - self._last_time) / max(done - self._last_done, 1)
        self._last_time, self._last_done = now, done
        self.value = (
            interval
            if self.value is None
            else ((1 - self.alpha) * self.value + self.alpha * interval)
        )
        self.unit = self.unit or ("s/it" if self.value >= 1.0 else "it/s")
        return self.value


def is_tty(stream: Any) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


def track(
    items: Iterable[T], total: int | None = None, desc: str = "", every: int | None = None
) -> Iterator[T]:
    """Yield `items`, showing a tqdm bar on a terminal or a log line every `every` items
    (default: about 16 lines over a known total, else one per item)."""
    total = total if total is not None else (len(items) if isinstance(items, Sequence) else None)
    every = every or max(1, (total or 0) // 16)
    if is_tty(sys.stderr):
        from tqdm.auto import tqdm

        yield from tqdm(items, total=total, desc=desc, dynamic_ncols=True)
        return
    start, rate = time.perf_counter(), SmoothedRate()
    done = 0
    for done, item in enumerate(items, start=1):
        yield item
        if done % every == 0 or done == total:
            per_item = rate.update(done)
            elapsed = time.perf_counter() - start
            log.info(progress_line(desc, done, total, elapsed, done, {}, rate.unit, per_item))
