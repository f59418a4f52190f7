"""The number a Hydra sweeper optimises: a named metric of a finished run.

Held-out accuracy (`val/needle/accuracy`, from the BenchmarkValidation callback) is the default,
not the training reward: the reward's scale moves with the very reward weights a sweep varies.
The value is the newest one of the trainer's callback metrics, else the newest entry of a
callback's `history` (evaluations at the end of training are not in callback_metrics).
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)


def optimized_metric(trainer: Any, name: str | None) -> float | None:
    """The run's value of metric `name`; None (with a warning naming the fix) when not logged."""
    if name is None:
        return None
    found = None
    for cb in getattr(trainer, "callbacks", ()):
        for _, metrics in getattr(cb, "history", None) or ():
            if name in metrics:
                found = float(metrics[name])
    metric = trainer.callback_metrics.get(name)
    if found is None and metric is not None:
        found = float(metric)
    if found is None:
        known = sorted(trainer.callback_metrics)
        log.warning(
            "optimized_metric %r was not logged by this run (logged: %s); set optimized_metric "
            "to one of them, or enable the callback that logs it",
            name,
            known,
        )
        return None
    return found if math.isfinite(found) else None
