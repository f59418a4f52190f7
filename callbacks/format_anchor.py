"""A curriculum for the two format signals of PARA-GRPO (PARAVT sections 3 and 4 (i)).

Before every training batch the callback sets, from the optimizer step (`trainer.global_step`,
the number of completed optimizer steps: 0 for the first batch, and advancing by k per batch
when the module steps its optimizer k times per batch):
- `pl_module.reward_weights.format_weight`, the weight w_fmt of the string-level format reward R_fmt
  (RewardWeights is frozen, so a new one is built with dataclasses.replace), and
- `pl_module.anchor_coef`, the coefficient of the structural-token log-prob anchor term,
and logs both under `curriculum/`. A schedule left as None leaves its coefficient alone.

The module must compute the step's rewards inside `training_step` (after `on_train_batch_start`)
for the new weight to apply to that same step. This file deliberately holds no schedule maths
(callbacks/schedules.py) and does not compute rewards or losses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

import lightning.pytorch as pl

from callbacks.schedules import check_schedule, schedule_value
from paravt.rewards.compose import RewardWeights

# The RewardWeights field that holds w_fmt; checked in setup so that a rename fails loudly.
FORMAT_FIELD = "format_weight"
FORMAT_KEY = "curriculum/format_weight"
ANCHOR_KEY = "curriculum/anchor_coef"


def _field_names(weights: RewardWeights) -> set[str]:
    return {f.name for f in fields(weights)}


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
        weights = getattr(pl_module, "reward_weights", None)
        if self.format_schedule is not None and not isinstance(weights, RewardWeights):
            raise AttributeError(
                f"FormatAnchorCurriculum: format_schedule needs {name}.reward_weights to be a "
                f"paravt.rewards.compose.RewardWeights, got {type(weights).__name__}; set it in "
                "__init__ or drop format_schedule"
            )
        if self.format_schedule is not None and FORMAT_FIELD not in _field_names(weights):
            raise AttributeError(
                f"FormatAnchorCurriculum: RewardWeights has no field {FORMAT_FIELD!r} (fields: "
                f"{sorted(_field_names(weights))}); update callbacks.format_anchor.FORMAT_FIELD"
            )
        if self.anchor_schedule is not None and not hasattr(pl_module, "anchor_coef"):
            raise AttributeError(
                f"FormatAnchorCurriculum: anchor_schedule needs {name}.anchor_coef (a float, the "
                "structural-token anchor coefficient); set it in __init__ or drop anchor_schedule"
            )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        values = self.values_at(trainer.global_step)
        if FORMAT_KEY in values:
            pl_module.reward_weights = replace(
                pl_module.reward_weights, **{FORMAT_FIELD: values[FORMAT_KEY]}
            )
        if ANCHOR_KEY in values:
            pl_module.anchor_coef = values[ANCHOR_KEY]
        pl_module.log_dict(values, batch_size=1)
