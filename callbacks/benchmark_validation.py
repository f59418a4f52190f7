"""Held-out agent evaluation during training, as a Lightning callback.

Every `every_n_steps` optimizer steps, and once more when training ends, `BenchmarkValidation`
runs the module's own agent (greedy) on a held-out prompt file and logs
`val/{name}/accuracy` (mean R_acc, also per question type and needle family:
`val/{name}/accuracy/question_type=mcq`, ...), `val/{name}/f_tau` (mean format compliance, see
`paravt.rl.metrics.format_compliance`) and `val/{name}/kappa` (mean tool calls per rollout).
They are `paravt.eval.metrics.CategoryMean` torchmetrics Metrics (the same objects evaluate.py's
reports use): each rank evaluates its own slice of the samples (`samples[rank::world_size]`) and
`compute()` reduces the sums and counts across ranks the standard torchmetrics way, so the
means are exact whatever the split.

Metrics go to the loggers directly (at `trainer.global_step`) and, during a step, into
`trainer.callback_metrics` so that `ModelCheckpoint(monitor="val/needle/accuracy")` works.
The final evaluation runs in `on_train_end`, not `on_fit_end`: Lightning calls `on_fit_end` after
the strategy's teardown, when the model has already been moved back to the CPU. The samples are
read once, in `setup`, so that a bad path fails before the first step. This module deliberately
does not know how the agent runs or how a trajectory is scored; the module provides both
(`evaluate_agent`, `score`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import lightning.pytorch as pl
import torch

from paravt.callbacks.schedules import crossed_multiple
from paravt.data.datasets import load_samples
from paravt.eval.metrics import CategoryMean
from paravt.rl.metrics import format_compliance
from paravt.types import RewardBreakdown, Sample, Trajectory


@runtime_checkable
class AgentEvaluated(Protocol):
    """What the callback needs from the LightningModule (GRPOModule implements it)."""

    def evaluate_agent(self, samples: Sequence[Sample], greedy: bool = True) -> list[Trajectory]:
        """One trajectory per sample, in order, with the current weights."""
        ...

    def score(self, trajectory: Trajectory, sample: Sample) -> RewardBreakdown: ...


_REQUIRED = ("evaluate_agent", "score")  # AgentEvaluated's methods, named in the error


def _labels(sample: Sample) -> list[str]:
    """A sample's accuracy categories: its question type and, for needle rows, its family."""
    labels = [f"question_type={sample.question_type}"]
    family = sample.extra.get("family")
    return [*labels, f"family={family}"] if family else labels


def _categories(samples: list[Sample]) -> list[str]:
    # From ALL samples (not the shard): every rank builds the same metric states.
    return sorted({label for s in samples for label in _labels(s)})


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@contextlib.contextmanager
def _eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Eval mode for the duration, then each submodule's own previous mode (a frozen tower or
    reference model that was in eval mode stays there, unlike with module.train())."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


class BenchmarkValidation(pl.Callback):
    """Evaluate `pl_module.evaluate_agent` on `samples_path` and log accuracy, f_tau and kappa."""

    def __init__(
        self,
        samples_path: str | os.PathLike[str],
        every_n_steps: int = 50,
        limit: int | None = None,
        name: str = "needle",
        at_start: bool = False,
    ) -> None:
        if not _is_count(every_n_steps):
            raise ValueError(
                f"BenchmarkValidation.every_n_steps must be an int >= 1, got {every_n_steps!r}"
            )
        if limit is not None and not _is_count(limit):
            raise ValueError(
                f"BenchmarkValidation.limit must be None (all samples) or an int >= 1, "
                f"got {limit!r}"
            )
        if not name or "/" in name:
            raise ValueError(
                f"BenchmarkValidation.name must be a non-empty name without '/', got {name!r}"
            )
        self.samples_path = str(samples_path)
        self.every_n_steps = every_n_steps
        self.limit = limit
        self.name = name
        self.at_start = at_start
        self.samples: list[Sample] | None = None
        self._last_step = 0  # nothing to log before the first optimizer step
        self.history: list[tuple[int, dict[str, float]]] = []  # (global step, metrics)

    @property
    def state_key(self) -> str:
        # Several instances (one per benchmark) may sit in one Trainer.
        return self._generate_state_key(name=self.name)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        missing = [attr for attr in _REQUIRED if not callable(getattr(pl_module, attr, None))]
        if missing or not isinstance(pl_module, AgentEvaluated):
            raise AttributeError(
                f"BenchmarkValidation({self.name!r}) needs {type(pl_module).__name__} to provide "
                f"{missing}: evaluate_agent(samples, greedy=True) -> list[Trajectory] and "
                "score(trajectory, sample) -> RewardBreakdown"
            )
        if self.samples is None:
            self.samples = self._load()

    def _load(self) -> list[Sample]:
        samples, report = load_samples(self.samples_path, limit=self.limit)
        if not samples:
            reasons = (
                "; ".join(reason for _, reason in report.skipped[:3]) or "the file has no rows"
            )
            raise ValueError(
                f"BenchmarkValidation({self.name!r}): {self.samples_path} gave no usable samples "
                f"({report.total} rows read): {reasons}; fix the file or samples_path"
            )
        return samples

    def evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        """Run and score this rank's slice; returns the metrics reduced over all ranks."""
        if self.samples is None:
            self.samples = self._load()
        shard = self.samples[trainer.global_rank :: trainer.world_size]
        device = pl_module.device
        accuracy = CategoryMean(_categories(self.samples)).to(device)
        fmt, calls = CategoryMean().to(device), CategoryMean().to(device)
        # Every rank calls the agent, even with an empty shard: refreshing a rank's engine from
        # FSDP2 shards is a collective that all ranks must join.
        with _eval_mode(pl_module), torch.no_grad():
            trajectories = list(pl_module.evaluate_agent(shard, greedy=True))
        if len(trajectories) != len(shard):
            raise ValueError(
                f"BenchmarkValidation({self.name!r}): evaluate_agent returned "
                f"{len(trajectories)} trajectories for {len(shard)} samples; it must "
                "return one greedy trajectory per sample, in order"
            )
        rewards = [pl_module.score(t, s) for t, s in zip(trajectories, shard, strict=True)]
        accs = [float(r.accuracy) for r in rewards]
        fmts = [float(format_compliance(r)) for r in rewards]
        kappas = [float(t.num_calls) for t in trajectories]
        labels = [_labels(s) for s in shard] if accuracy.categories else None
        accuracy.update(torch.tensor(accs, dtype=torch.float64), categories=labels)
        fmt.update(torch.tensor(fmts, dtype=torch.float64))
        calls.update(torch.tensor(kappas, dtype=torch.float64))
        prefix = f"val/{self.name}"
        by_category = accuracy.per_category()  # reduced over all ranks
        out = {f"{prefix}/accuracy": by_category.pop("overall")}
        out.update({f"{prefix}/accuracy/{k}": v for k, v in by_category.items()})
        out[f"{prefix}/f_tau"] = float(fmt.compute())
        out[f"{prefix}/kappa"] = float(calls.compute())
        return out

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The baseline before any update (or at the resumed step), so every run reports a delta.
        if self.at_start:
            self._last_step = trainer.global_step
            self._publish(trainer, pl_module, self.evaluate(trainer, pl_module), in_step=False)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        if not crossed_multiple(step, self._last_step, self.every_n_steps):
            return
        self._last_step = step
        self._publish(trainer, pl_module, self.evaluate(trainer, pl_module), in_step=True)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.global_step
        if step == self._last_step:
            return
        self._last_step = step
        self._publish(trainer, pl_module, self.evaluate(trainer, pl_module), in_step=False)

    def _publish(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        metrics: dict[str, float],
        in_step: bool,
    ) -> None:
        # Written to the loggers directly: self.log would hold them back until the next
        # `log_every_n_steps` boundary, and drop them when that is not a validation step.
        self.history.append((trainer.global_step, dict(metrics)))
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        if in_step:  # self.log is not allowed in on_train_end
            # logger=False: only into callback_metrics, so that ModelCheckpoint can monitor them.
            pl_module.log_dict(metrics, logger=False, batch_size=len(self.samples or ()))
