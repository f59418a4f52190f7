"""A tiny real LightningModule and DataModule for running the callbacks in a real Trainer.

The module's training step fabricates a `RolloutRecord` from hand-made Trajectory and
RewardBreakdown objects (test data chosen by each test through `scenario`), takes a real optimizer
step on a linear layer, and records what it saw (budgets, reward weights, anchor coefficient).
Event files written by the real TensorBoardLogger are read back with tensorboard's
EventAccumulator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from paravt.callbacks.records import RolloutRecord
from paravt.rewards.compose import RewardWeights
from paravt.types import (
    Frames,
    ParsedCall,
    RewardBreakdown,
    Sample,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
)

Scenario = Callable[[int, list[str], list[int]], RolloutRecord]


def make_trajectory(
    sample_id: str,
    group_index: int,
    crops: Sequence[tuple[float, float]] = (),
    errors: Sequence[str] = (),
    text: str = "<think>look</think><answer>A</answer>",
) -> Trajectory:
    """A one- or two-turn rollout: one call per crop (ok) and per error (failed), then an answer."""
    calls = tuple(
        ParsedCall(i, f"<tool_call>{i}</tool_call>", ToolCall("crop_video", {"start_time": s}))
        for i, (s, _) in enumerate(crops)
    ) + tuple(ParsedCall(len(crops) + i, "<tool_code>x", error=e) for i, e in enumerate(errors))
    frames = Frames(pixels=None, indices=(0, 1), timestamps=(0.0, 1.0), fps=1.0, duration=60.0)
    results = tuple(
        ToolResult(i, "crop_video", frames=frames, window=w) for i, w in enumerate(crops)
    ) + tuple(ToolResult(len(crops) + i, "crop_video", error=e) for i, e in enumerate(errors))
    turns = (Turn("<think>crop</think>", calls, results), Turn(text)) if calls else (Turn(text),)
    return Trajectory(
        sample_id=sample_id,
        group_index=group_index,
        token_ids=(1, 2, 3),
        loss_mask=(0, 1, 1),
        logprobs=(0.0, -0.5, -0.5),
        visuals=(),
        prompt_length=1,
        turns=turns,
        num_calls=len(calls),
        num_valid_calls=len(crops),
        num_tool_responses=len(crops) + len(errors),
        num_rounds=2 if calls else 1,
    )


def default_scenario(step: int, ids: list[str], budgets: list[int]) -> RolloutRecord:
    """G = 2: rollout 0 crops [10, 20] and scores 1.0, rollout 1 skips the tool and scores 0.0."""
    trajectories, rewards = [], []
    for pid in ids:
        trajectories += [make_trajectory(pid, 0, crops=[(10.0, 20.0)]), make_trajectory(pid, 1)]
        rewards += [RewardBreakdown(1.0, accuracy=1.0), RewardBreakdown(0.0)]
    return RolloutRecord(
        step, tuple(trajectories), tuple(rewards), 2, tuple(budgets),
        tuple(((10.0, 20.0),) for _ in ids), tuple(60.0 for _ in ids),
    )  # fmt: skip


class ToyModule(pl.LightningModule):
    """A linear layer trained on a constant input; its rollouts come from `scenario`."""

    def __init__(
        self, scenario: Scenario = default_scenario, manual: bool = False, steps_per_batch: int = 1
    ) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.frozen = torch.nn.Linear(1, 1).eval()  # a submodule that must stay in eval mode
        self.scenario = scenario
        self.automatic_optimization = not manual
        self.steps_per_batch = steps_per_batch  # manual only: optimizer steps per batch
        self.last_rollout: RolloutRecord | None = None
        self.reward_weights = RewardWeights()
        self.anchor_coef = 0.0
        self.seen: list[dict] = []
        self.eval_calls: list[dict] = []

    def training_step(self, batch, batch_idx):
        ids, budgets = batch
        self.seen.append(
            {
                "step": self.global_step,
                "training": self.training,
                "budgets": list(budgets),
                "fmt": self.reward_weights.format_weight,
                "anchor": self.anchor_coef,
            }
        )
        loss = self.layer(torch.ones(1, 2)).pow(2).sum()
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            for _ in range(self.steps_per_batch):  # like several PPO epochs
                optimizer.zero_grad()
                self.manual_backward(self.layer(torch.ones(1, 2)).pow(2).sum())
                optimizer.step()
        self.last_rollout = self.scenario(self.global_step, list(ids), list(budgets))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    # paravt.callbacks.format_anchor.FormatWeighted
    def set_format_weight(self, weight: float) -> None:
        self.reward_weights = replace(self.reward_weights, format_weight=weight)

    def set_anchor_coef(self, coef: float) -> None:  # paravt.callbacks.format_anchor.AnchorWeighted
        self.anchor_coef = coef

    def evaluate_agent(self, samples: Sequence[Sample], greedy: bool = True) -> list[Trajectory]:
        """Rollout i of a sample makes `extra["calls"]` tool calls (test data in the file)."""
        self.eval_calls.append(
            {
                "step": self.global_step,
                "ids": [s.id for s in samples],
                "greedy": greedy,
                "training": self.training,
                "frozen_training": self.frozen.training,
                "grad": torch.is_grad_enabled(),
            }
        )
        crops = [(0.0, 5.0)]
        return [make_trajectory(s.id, 0, crops=crops * int(s.extra["calls"])) for s in samples]

    def score(self, trajectory: Trajectory, sample: Sample) -> RewardBreakdown:
        accuracy = 1.0 if sample.answer == "A" else 0.0
        fmt = float(sample.extra["fmt"])
        return RewardBreakdown(accuracy + fmt, accuracy=accuracy, format=fmt)


class ToyDataModule(pl.LightningDataModule):
    """Batches of (prompt ids, frame budgets); budgets come from `budget_sampler` per batch."""

    def __init__(self, ids: Sequence[str] = ("p0", "p1", "p2", "p3"), batch_size: int = 2):
        super().__init__()
        self.ids = list(ids)
        self.batch_size = batch_size
        self.budget_sampler: Callable[[str, int], int] = lambda prompt_id, epoch: 64

    def set_budget_sampler(self, sampler: Callable[[str, int], int]) -> None:  # BudgetSink
        self.budget_sampler = sampler

    def _collate(self, ids: list[str]) -> tuple[list[str], list[int]]:
        epoch = self.trainer.current_epoch
        return ids, [self.budget_sampler(pid, epoch) for pid in ids]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.ids, batch_size=self.batch_size, collate_fn=self._collate)


def fit(
    tmp_path: Path,
    callbacks: list[pl.Callback],
    module: pl.LightningModule | None = None,
    datamodule: pl.LightningDataModule | None = None,
    max_steps: int = 3,
    logger: object = "tensorboard",
    **trainer_kwargs,
) -> tuple[pl.Trainer, ToyModule, str]:
    """Run a real CPU Trainer; returns it, the module and the TensorBoard log dir."""
    module = module or ToyModule()
    if logger == "tensorboard":
        logger = TensorBoardLogger(str(tmp_path), name="tb")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **{"log_every_n_steps": 1, **trainer_kwargs},
    )
    trainer.fit(module, datamodule=datamodule or ToyDataModule())
    log_dir = getattr(trainer.logger, "log_dir", None) or str(tmp_path)
    return trainer, module, log_dir


def read_events(log_dir: str) -> EventAccumulator:
    """Every scalar, text (tensor) and image event written under `log_dir`."""
    events = EventAccumulator(log_dir, size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    events.Reload()
    return events


def scalars(events: EventAccumulator, tag: str) -> dict[int, float]:
    """step -> value of one scalar tag."""
    return {e.step: e.value for e in events.Scalars(tag)}


@pytest.fixture
def toy():
    """The helpers above, as one namespace (conftest modules are not importable by tests)."""

    class Toy:
        Module = ToyModule
        DataModule = ToyDataModule
        trajectory = staticmethod(make_trajectory)
        default_scenario = staticmethod(default_scenario)
        fit = staticmethod(fit)
        read_events = staticmethod(read_events)
        scalars = staticmethod(scalars)

    return Toy
