"""A curriculum for the two format signals of PARA-GRPO (docs/method.md sections 3 and 4 (i)).

Before every training batch the callback sets, from the optimizer step (`trainer.global_step`,
the number of completed optimizer steps: 0 for the first batch, and advancing by k per batch
when the module steps its optimizer k times per batch), through the module's Protocols:
- `pl_module.set_format_weight(w)` (`FormatWeighted`): the weight w_fmt of the string-level
  format reward R_fmt, and
- `pl_module.set_anchor_coef(c)` (`AnchorWeighted`): the coefficient of the structural-token
  log-prob anchor term,
and logs both under `curriculum/`. A schedule left as None leaves its coefficient alone; the
module needs only the Protocol of the schedules it has.

The module must compute the step's rewards inside `training_step` (after `on_train_batch_start`)
for the new weight to apply to that same step. This file deliberately holds no schedule maths
(callbacks/schedules.py) and does not compute rewards or losses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl

from paravt.callbacks.schedules import check_schedule, schedule_value

FORMAT_KEY = "curriculum/format_weight"
ANCHOR_KEY = "curriculum/anchor_coef"


@runtime_checkable
class FormatWeighted(Protocol):
    """A module whose format-reward weight w_fmt can be set between steps."""

    def set_format_weight(self, weight: float) -> None: ...


@runtime_checkable
class AnchorWeighted(Protocol):
    """A module whose structural-token anchor coefficient can be set between steps."""

    def set_anchor_coef(self, coef: float) -> None: ...


class FormatAnchorCurriculum(pl.Callback):
    """Schedule w_fmt (`format_schedule`) and the anchor coefficient (`anchor_schedule`).

    A schedule is a mapping `{"kind": "constant"|"linear"|"cosine"|"step", "start": ...,
    "end": ..., "steps": ..., "milestones": [...], "values": [...]}`; see callbacks/schedules.py.
    """

    def __init__(
        self,
        format_schedule: Mapping[str, Any] | None = None,
        anchor_schedule: Mapping[str, Any] | None = None,
    ) -> None:
        if format_schedule is None and anchor_schedule is None:
            raise ValueError(
                "FormatAnchorCurriculum needs format_schedule, anchor_schedule or both; "
                "remove the callback if neither coefficient should change"
            )
        self.format_schedule = (
            None if format_schedule is None else check_schedule(format_schedule, "format_schedule")
        )
        self.anchor_schedule = (
            None if anchor_schedule is None else check_schedule(anchor_schedule, "anchor_schedule")
        )

    def values_at(self, step: int) -> dict[str, float]:
        """The scheduled values at `step`, keyed as they are logged."""
        values: dict[str, float] = {}
        if self.format_schedule is not None:
            values[FORMAT_KEY] = schedule_value(step=step, **self.format_schedule)
        if self.anchor_schedule is not None:
            values[ANCHOR_KEY] = schedule_value(step=step, **self.anchor_schedule)
        return values

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        name = type(pl_module).__name__
        needs = (
            (self.format_schedule, FormatWeighted, "set_format_weight(weight)", "format_schedule"),
            (self.anchor_schedule, AnchorWeighted, "set_anchor_coef(coef)", "anchor_schedule"),
        )
        for schedule, protocol, method, key in needs:
            if schedule is not None and not isinstance(pl_module, protocol):
                raise TypeError(
                    f"FormatAnchorCurriculum: {key} needs {name} to implement "
                    f"paravt.callbacks.format_anchor.{protocol.__name__} (a method `{method}` that "
                    f"the step reads from then on); add it or drop {key}"
                )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        values = self.values_at(trainer.global_step)
        if FORMAT_KEY in values:
            pl_module.set_format_weight(values[FORMAT_KEY])
        if ANCHOR_KEY in values:
            pl_module.set_anchor_coef(values[ANCHOR_KEY])
        pl_module.log_dict(values, batch_size=1)
