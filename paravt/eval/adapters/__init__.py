"""Benchmark adapters by name: `get_benchmark("videomme")`, or `BENCHMARKS` to list them (every
benchmark the README lists, paravt's own synthetic `needle` split included)."""

from __future__ import annotations

from collections.abc import Callable

from paravt.eval.adapters.base import AnnotationError, Benchmark, EvalItem
from paravt.eval.adapters.charades import charades
from paravt.eval.adapters.longvideobench import longvideobench
from paravt.eval.adapters.lvbench import lvbench
from paravt.eval.adapters.mlvu import mlvu
from paravt.eval.adapters.mmvu import mmvu
from paravt.eval.adapters.mmvu_open import mmvu_oe
from paravt.eval.adapters.videomme import videomme, videomme_sub


def _needle(**kwargs) -> Benchmark:
    # Imported on use: paravt.eval.needle builds on this package's base module.
    from paravt.eval.needle import needle

    return needle(**kwargs)


BENCHMARKS: dict[str, Callable[..., Benchmark]] = {
    "videomme": videomme,
    "videomme_sub": videomme_sub,
    "longvideobench": longvideobench,
    "lvbench": lvbench,
    "mlvu": mlvu,
    "mmvu": mmvu,
    "mmvu_oe": mmvu_oe,
    "charades": charades,
    "needle": _needle,
}


def get_benchmark(name: str, **kwargs) -> Benchmark:
    """The benchmark `name` built with `kwargs` (videomme_sub: subtitle_root; mmvu and mmvu_oe:
    disciplines)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of: {', '.join(BENCHMARKS)}")
    try:
        return BENCHMARKS[name](**kwargs)
    except TypeError as error:
        raise TypeError(f"benchmark {name!r}: bad arguments {sorted(kwargs)}: {error}") from error


__all__ = ["BENCHMARKS", "AnnotationError", "Benchmark", "EvalItem", "get_benchmark"]
