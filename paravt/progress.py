"""Counts and ETA for long loops: a tqdm bar on a terminal, a log line every few items otherwise.

Pure of any framework (tqdm is imported only on a terminal), so core loops (data generation,
supervised steps, teacher tracing, evaluation) can wrap their iterables in `track`. The Lightning
side (the RL step display) is `callbacks.progress.StepProgress`, which formats with
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


def progress_line(
    desc: str, done: int, total: int | None, elapsed: float, fresh: int, metrics: Mapping
) -> str:
    """One line: `RL step 7/20 | 2.1 s/it | ETA 0:27 | reward 0.412`.

    `fresh` counts the items done in this process (a resume starts with done > 0), so the rate
    and the ETA come from this run's own speed.
    """
    head = f"{desc} {done}/{total}" if total else f"{desc} {done}"
    parts = [head]
    if fresh > 0:
        rate = elapsed / fresh
        # tqdm's convention: items per second once an item takes under a tenth of a second.
        parts.append(f"{rate:.1f} s/it" if rate >= 0.1 else f"{1 / max(rate, 1e-9):.1f} it/s")
        if total:
            parts.append(f"ETA {format_duration(rate * max(0, total - done))}")
    parts += [f"{key} {float(value):.3f}" for key, value in metrics.items()]
    return " | ".join(parts)


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
    start = time.perf_counter()
    done = 0
    for done, item in enumerate(items, start=1):
        yield item
        if done % every == 0 or done == total:
            log.info(progress_line(desc, done, total, time.perf_counter() - start, done, {}))
