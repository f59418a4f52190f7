"""Frame-budget randomisation as a Lightning callback (PARAVT section 4 (ii), "nFrames gating").

In `setup` the callback installs a deterministic `FrameBudgetSampler` as the DataModule's
`budget_sampler`, so every prompt's overview budget K comes from the prompt's identity, the epoch
and the seed (all G rollouts of a group share it). After every training batch it logs, per budget,
the gate ratio (the share of groups where tool-using rollouts out-scored tool-free ones), the
number of groups where that is undefined (only one side present), and the mean budget.

The DataModule must call `budget_sampler(prompt_id, epoch)` when it builds a batch, not in its own
`setup`: Lightning runs the DataModule's `setup` before the callbacks' `setup`. This module
deliberately does not sample frames or decide how K is applied (the DataModule and the agent do).
"""

from __future__ import annotations

from collections.abc import Sequence

import lightning.pytorch as pl
import torch

from callbacks.records import RolloutRecord, latest_rollout
from paravt.rl.budget import DEFAULT_BUDGETS, FrameBudgetSampler, gate_ratio


def budget_metrics(record: RolloutRecord) -> dict[str, float]:
    """Gate statistics of one step's rollouts, keyed as they are logged.

    `gate_ratio/K{k}` is present only for budgets with at least one defined group, so that a
    budget whose groups were all one-sided does not plot as a misleading 0.
    """
    num_groups, group_size = record.num_groups, record.group_size
    rewards = torch.tensor([r.total for r in record.rewards], dtype=torch.float64)
    calls = torch.tensor([t.num_calls for t in record.trajectories])
    stats = gate_ratio(
        rewards.view(num_groups, group_size),  # [B, G]
        calls.view(num_groups, group_size),  # [B, G]
        record.budgets,  # [B]
    )
    metrics: dict[str, float] = {}
    for k, stat in stats.items():
        if stat.defined:
            metrics[f"gate_ratio/K{k}"] = stat.ratio
        metrics[f"gate_undefined/K{k}"] = float(stat.undefined)
    if record.budgets:
        metrics["frame_budget/mean"] = sum(record.budgets) / len(record.budgets)
    return metrics


class FrameBudgetRandomization(pl.Callback):
    """Draw each prompt's frame budget from `budgets` (weighted by `weights`) and log the gate."""

    def __init__(
        self,
        budgets: Sequence[int] = DEFAULT_BUDGETS,
        weights: Sequence[float] | None = None,
        seed: int = 0,
    ) -> None:
        self.sampler = FrameBudgetSampler(
            tuple(budgets), None if weights is None else tuple(weights), seed
        )

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is None:
            raise RuntimeError(
                "FrameBudgetRandomization needs a LightningDataModule with a `budget_sampler` "
                "attribute; pass it as trainer.fit(model, datamodule=...) instead of bare "
                "dataloaders"
            )
        if not hasattr(datamodule, "budget_sampler"):
            raise AttributeError(
                f"FrameBudgetRandomization: {type(datamodule).__name__} has no `budget_sampler` "
                "attribute; give it one (a callable (prompt_id: str, epoch: int) -> int, e.g. "
                "`self.budget_sampler = lambda prompt_id, epoch: 64`) and call it for every prompt"
            )
        datamodule.budget_sampler = self.sampler.budget

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        record = latest_rollout(pl_module, type(self).__name__)
        if record is None or not record.num_groups:
            return
        pl_module.log_dict(budget_metrics(record), batch_size=record.num_groups)
