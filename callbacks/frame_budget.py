"""Frame-budget gating as a Lightning callback (docs/method.md section 4 (ii)).

In `setup` the callback hands a deterministic `FrameBudgetSampler` to the DataModule through the
`BudgetSink` Protocol (`set_budget_sampler`), so every prompt's overview budget K comes from the
prompt's identity, the epoch and the seed (all G rollouts of a group share it). After every
training batch it logs, per budget, the gate ratio (the share of groups where tool-using
rollouts out-scored tool-free ones), the number of groups where that is undefined (only one side
present), and the mean budget.

The DataModule must call the sampler as `sampler(prompt_id, epoch)` when it builds a batch, not in
its own `setup`: Lightning runs the DataModule's `setup` before the callbacks' `setup`. With plain
dataloaders (no DataModule) the same sampler is the hook: call `callback.sampler.budget(prompt_id,
epoch)` where the batch is built (a collate function, a Dataset). Such a run is warned only when,
after its first batch, the budgets were evidently not drawn that way (none drawn in this process
by a loader without workers, or a K outside `frame_budgets`).

The gate is read from `pl_module.last_rollout` after each step: paravt's `RolloutRecord`, or the
light `GateRecord` (rewards [B, G], tool-call counts [B, G], budgets [B]) that is all it uses. A
module without `last_rollout` gets a warning and no gate logging, never an error. This module
deliberately does not sample frames or decide how K is applied (the DataModule and the agent do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from paravt.callbacks.records import RolloutRecord
from paravt.rl.budget import DEFAULT_BUDGETS, FrameBudgetSampler, GateStat, gate_ratio


@runtime_checkable
class BudgetSink(Protocol):
    """A DataModule that draws each prompt's frame budget K with a given sampler."""

    def set_budget_sampler(self, sampler: Callable[[str, int], int]) -> None:
        """Call `sampler(prompt_id, epoch) -> K` for every prompt of every batch from now on."""
        ...


@dataclass(frozen=True)
class GateRecord:
    """What the gate statistic reads of one step: rewards and tool calls [B, G], budgets [B]."""

    step: int
    rewards: torch.Tensor  # [B, G] total reward of each rollout
    tool_calls: torch.Tensor  # [B, G] tool calls each rollout made
    budgets: tuple[int, ...]  # [B] frame budget K of each prompt

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", tuple(int(k) for k in self.budgets))
        if (
            self.rewards.dim() != 2
            or self.tool_calls.shape != self.rewards.shape
            or len(self.budgets) != self.rewards.shape[0]
        ):
            raise ValueError(
                f"GateRecord needs rewards [B, G], tool_calls [B, G] and budgets [B]; got "
                f"{tuple(self.rewards.shape)}, {tuple(self.tool_calls.shape)}, "
                f"{len(self.budgets)} budgets"
            )

    @classmethod
    def of(cls, record: RolloutRecord) -> GateRecord:
        """The gate's view of a full `RolloutRecord` (group-major trajectories)."""
        shape = (record.num_groups, record.group_size)
        rewards = torch.tensor([r.total for r in record.rewards], dtype=torch.float64)
        calls = torch.tensor([t.num_calls for t in record.trajectories])
        return cls(record.step, rewards.view(shape), calls.view(shape), record.budgets)


def step_gate_stats(record: RolloutRecord | GateRecord) -> dict[int, GateStat]:
    """Per-budget gate statistic of one step's groups (tool use: more than 0 calls)."""
    gate = record if isinstance(record, GateRecord) else GateRecord.of(record)
    return gate_ratio(gate.rewards, gate.tool_calls, gate.budgets)


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


class _TrackedSampler(FrameBudgetSampler):
    """The callback's sampler: it also notes that it drew a budget in this process, so that a run
    with plain dataloaders is warned only when the documented hook was evidently not used."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "drawn", False)

    def budget(self, prompt_id: str, epoch: int = 0) -> int:
        object.__setattr__(self, "drawn", True)
        return super().budget(prompt_id, epoch)


class FrameBudgetGating(pl.Callback):
    """Draw each prompt's frame budget K from `frame_budgets` (weighted by `weights`) and log
    the gate. `budgets=` is the former name of `frame_budgets=` and is still accepted."""

    def __init__(
        self,
        frame_budgets: Sequence[int] | None = None,
        weights: Sequence[float] | None = None,
        seed: int = 0,
        *,
        budgets: Sequence[int] | None = None,
    ) -> None:
        if frame_budgets is not None and budgets is not None:
            raise TypeError(
                "FrameBudgetGating: pass frame_budgets= only (budgets= is its former name)"
            )
        chosen = frame_budgets if frame_budgets is not None else budgets
        self.sampler = _TrackedSampler(
            tuple(DEFAULT_BUDGETS if chosen is None else chosen),
            None if weights is None else tuple(weights),
            seed,
        )
        self._pending: list[dict[int, GateStat]] = []
        self._budgets: list[int] = []
        self._last_step = 0
        self._warned = False
        self._plain = False  # no DataModule took the sampler: the hook is checked after batch 1

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is None:  # plain dataloaders: the documented hook is checked later
            self._plain = True
            return
        if not isinstance(datamodule, BudgetSink):
            raise TypeError(
                f"FrameBudgetGating: {type(datamodule).__name__} does not implement "
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
        record = self._gate_record(pl_module)
        if self._plain:
            self._plain = False
            self._check_hook(trainer, record)
        if record is None or not len(record.budgets):
            return
        self._pending.append(step_gate_stats(record))
        self._budgets.extend(record.budgets)
        self._last_step = record.step
        # Lightning's own cadence ((step + 1) % log_every_n_steps == 0), pooled over the steps in
        # between so that a ratio rests on more than the one or two groups a budget gets per step.
        if (record.step + 1) % trainer.log_every_n_steps == 0:
            self._flush(trainer, pl_module)

    def _check_hook(self, trainer: pl.Trainer, record: GateRecord | None) -> None:
        """With plain dataloaders, warn once if the first batch's budgets were evidently not
        drawn with `callback.sampler.budget` (worker processes draw where this cannot see)."""
        loader = getattr(trainer, "train_dataloader", None)
        unseen = not self.sampler.drawn and not getattr(loader, "num_workers", 0)
        foreign = sorted(set(record.budgets if record else ()) - set(self.sampler.budgets))
        if unseen or foreign:
            why = f"budgets {foreign} are not among" if foreign else "no budget was drawn from"
            rank_zero_warn(
                f"FrameBudgetGating: no LightningDataModule took the sampler and {why} "
                f"frame_budgets {list(self.sampler.budgets)}; with plain dataloaders draw each "
                "prompt's budget with `callback.sampler.budget(prompt_id, epoch)` where the "
                "batch is built"
            )

    def _gate_record(self, pl_module: pl.LightningModule) -> GateRecord | None:
        if not hasattr(pl_module, "last_rollout"):
            if not self._warned:
                rank_zero_warn(
                    f"FrameBudgetGating: {type(pl_module).__name__} has no `last_rollout`,"
                    " so the gate ratio is not logged; set it to a GateRecord (rewards and tool "
                    "calls [B, G], budgets [B]) or a RolloutRecord after every training_step"
                )
                self._warned = True
            return None
        record = pl_module.last_rollout
        if record is None or isinstance(record, GateRecord):
            return record
        if isinstance(record, RolloutRecord):
            return GateRecord.of(record)
        raise TypeError(
            f"FrameBudgetGating: {type(pl_module).__name__}.last_rollout must be a "
            f"GateRecord, a RolloutRecord or None, got {type(record).__name__}"
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer, None)  # the steps after the last logging boundary

    def _flush(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None) -> None:
        if not self._pending:
            return
        metrics = budget_metrics(merge_gate_stats(self._pending), self._budgets)
        self._pending, self._budgets = [], []
        # To the loggers at this step: pl_module.log would re-send a budget's last ratio on
        # later steps where that budget had no defined group. Through pl_module.log with
        # logger=False too, so they are in callback_metrics for ModelCheckpoint / EarlyStopping
        # (not possible in on_train_end, where Lightning allows no self.log).
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=self._last_step)
        if pl_module is not None:
            pl_module.log_dict(metrics, logger=False, batch_size=len(metrics))


# The former name: code written against the earlier docs/reuse.md keeps working.
FrameBudgetRandomization = FrameBudgetGating
