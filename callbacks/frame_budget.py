"""Frame-budget randomisation as a Lightning callback (docs/method.md section 4 (ii), gating).

In `setup` the callback hands a deterministic `FrameBudgetSampler` to the DataModule through the
`BudgetSink` Protocol (`set_budget_sampler`), so every prompt's overview budget K comes from the
prompt's identity, the epoch and the seed (all G rollouts of a group share it). After every
training batch it logs, per budget, the gate ratio (the share of groups where tool-using
rollouts out-scored tool-free ones), the number of groups where that is undefined (only one side
present), and the mean budget.

The DataModule must call the sampler as `sampler(prompt_id, epoch)` when it builds a batch, not in
its own `setup`: Lightning runs the DataModule's `setup` before the callbacks' `setup`. This module
deliberately does not sample frames or decide how K is applied (the DataModule and the agent do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import lightning.pytorch as pl
import torch

from paravt.callbacks.records import RolloutRecord, latest_rollout
from paravt.rl.budget import DEFAULT_BUDGETS, FrameBudgetSampler, GateStat, gate_ratio


@runtime_checkable
class BudgetSink(Protocol):
    """A DataModule that draws each prompt's frame budget K with a given sampler."""

    def set_budget_sampler(self, sampler: Callable[[str, int], int]) -> None:
        """Call `sampler(prompt_id, epoch) -> K` for every prompt of every batch from now on."""
        ...


def step_gate_stats(record: RolloutRecord) -> dict[int, GateStat]:
    """Per-budget gate statistic of one step's groups (tool use: `num_calls > 0`)."""
    num_groups, group_size = record.num_groups, record.group_size
    rewards = torch.tensor([r.total for r in record.rewards], dtype=torch.float64)
    calls = torch.tensor([t.num_calls for t in record.trajectories])
    return gate_ratio(
        rewards.view(num_groups, group_size),  # [B, G]
        calls.view(num_groups, group_size),  # [B, G]
        record.budgets,  # [B]
    )


def merge_gate_stats(per_step: Sequence[dict[int, GateStat]]) -> dict[int, GateStat]:
    """Pool several steps' statistics: wins, defined and undefined add up per budget."""
    totals: dict[int, list[int]] = {}
    for stats in per_step:
        for k, stat in stats.items():
            wins, defined, undefined = totals.setdefault(k, [0, 0, 0])
            totals[k] = [wins + stat.wins, defined + stat.defined, undefined + stat.undefined]
    return {
        k: GateStat(wins, defined, undefined, wins / defined if defined else 0.0)
        for k, (wins, defined, undefined) in sorted(totals.items())
    }


def budget_metrics(stats: dict[int, GateStat], budgets: Sequence[int]) -> dict[str, float]:
    """Gate statistics and the mean of `budgets` (one per group), keyed as they are logged.

    `gate_ratio/K{k}` is present only for budgets with at least one defined group, so that a
    budget whose groups were all one-sided does not plot as a misleading 0.
    """
    metrics: dict[str, float] = {}
    for k, stat in stats.items():
        if stat.defined:
            metrics[f"gate_ratio/K{k}"] = stat.ratio
        metrics[f"gate_undefined/K{k}"] = float(stat.undefined)
    if budgets:
        metrics["frame_budget/mean"] = sum(budgets) / len(budgets)
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
        self._pending: list[dict[int, GateStat]] = []
        self._budgets: list[int] = []
        self._last_step = 0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is None:
            raise RuntimeError(
                "FrameBudgetRandomization needs a LightningDataModule implementing "
                "paravt.callbacks.frame_budget.BudgetSink; pass it as trainer.fit(model, "
                "datamodule=...) instead of bare dataloaders"
            )
        if not isinstance(datamodule, BudgetSink):
            raise TypeError(
                f"FrameBudgetRandomization: {type(datamodule).__name__} does not implement "
                "paravt.callbacks.frame_budget.BudgetSink; give it `set_budget_sampler(sampler)` "
                "and call `sampler(prompt_id, epoch) -> K` for every prompt when it builds a batch"
            )
        datamodule.set_budget_sampler(self.sampler.budget)

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
        self._pending.append(step_gate_stats(record))
        self._budgets.extend(record.budgets)
        self._last_step = record.step
        # Lightning's own cadence ((step + 1) % log_every_n_steps == 0), pooled over the steps in
        # between so that a ratio rests on more than the one or two groups a budget gets per step.
        if (record.step + 1) % trainer.log_every_n_steps == 0:
            self._flush(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer)  # the steps after the last logging boundary

    def _flush(self, trainer: pl.Trainer) -> None:
        if not self._pending:
            return
        metrics = budget_metrics(merge_gate_stats(self._pending), self._budgets)
        self._pending, self._budgets = [], []
        # Straight to the loggers: self.log would re-send a budget's last ratio on later steps
        # where that budget had no defined group.
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=self._last_step)
