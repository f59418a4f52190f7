"""PromptDataModule: prompt batches for RL, in a resumable, deterministic order.

Every training step receives a `PromptBatch` of B samples; `paravt.modules.rollout_datamodule.
RolloutDataModule` (the glue subclass) turns it into B x G trajectories with the current weights
right before the step (the loader's prefetch only reads prompts ahead). The order of prompts is
a function of (seed, epoch), and the number of batches consumed is checkpointed, so a resumed
run continues the same sequence of prompts with no repeats. Bad rows are reported by
`load_samples` and skipped at setup (kept in `load_report`); `fail_fast=True` stops instead.
The synthetic needle data is generated on first use when `generate` is given.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset

from paravt.data.datasets import LoadReport, epoch_order, load_samples
from paravt.data.schemas import check_layout
from paravt.errors import UserError, check_data_path, generation_dir, may_generate_data
from paravt.parallel.collectives import on_rank0
from paravt.parallel.distributed import shard_bounds, shard_prompts
from paravt.types import Sample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptBatch:
    """The prompts of one RL step: `step` counts batches from the start of training; `first`
    is the index of `samples[0]` in the step's whole batch (a rank's share starts there), which
    seeds the rollouts by their global position, whatever the world size."""

    step: int
    epoch: int
    samples: tuple[Sample, ...]
    first: int = 0

    def kept(self, bad_videos) -> list[tuple[int, Sample]]:
        """(index in the step's whole batch, sample) of the samples whose video is not in
        `bad_videos`: the rollouts' seeds keep each sample's position when others are left out."""
        enumerated = enumerate(self.samples, start=self.first)
        return [(p, s) for p, s in enumerated if s.video not in bad_videos]


class _StepBatches(Dataset):
    """Item i is rank `rank`'s share (of W) of the prompt batch of global step `start + i`."""

    def __init__(
        self, samples, batch_size, seed, shuffle, start, steps, rank: int = 0, world: int = 1
    ):
        self.samples, self.batch_size, self.seed, self.shuffle = samples, batch_size, seed, shuffle
        self.start, self.steps, self.rank, self.world = start, steps, rank, world
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> PromptBatch:
        whole = self.whole(i)
        first, _ = shard_bounds(len(whole.samples), self.rank, self.world)
        samples = shard_prompts(whole.samples, self.rank, self.world)
        return replace(whole, samples=samples, first=first)

    def whole(self, i: int) -> PromptBatch:
        """The prompt batch of global step `start + i`, every rank's share."""
        step = self.start + i
        n = len(self.samples)
        first = step * self.batch_size
        picked, epoch = [], first // n
        for pos in range(first, first + self.batch_size):
            e, k = divmod(pos, n)
            if e not in self._orders:
                self._orders[e] = epoch_order(n, e, self.seed, self.shuffle)
            picked.append(self.samples[self._orders[e][k]])
        return PromptBatch(step=step, epoch=epoch, samples=tuple(picked))


class PromptDataModule(pl.LightningDataModule):
    """Loads RL prompts (ParaVT or verl layout, parquet or jsonl) and serves `PromptBatch`es."""

    def __init__(
        self,
        train_path: str,
        eval_path: str | None = None,
        batch_size: int = 7,
        max_steps: int = 100,
        seed: int = 0,
        shuffle: bool = True,
        layout: str = "auto",
        generate: Mapping[str, Any] | None = None,
        fail_fast: bool = False,
    ):
        super().__init__()
        check_layout(layout)  # before the model and the data are built
        self.train_path, self.eval_path = train_path, eval_path
        self.batch_size, self.max_steps = batch_size, max_steps
        self.seed, self.shuffle, self.layout = seed, shuffle, layout
        self.generate = dict(generate) if generate else None
        self.fail_fast = fail_fast  # stop on the first bad row or video instead of skipping it
        self.consumed = 0
        self.load_report: LoadReport | None = None  # what setup() skipped in train_path
        self.train_samples: list[Sample] = []
        self.eval_samples: list[Sample] = []

    def prepare_data(self) -> None:
        gen = dict(self.generate or {})
        out_dir = gen.pop("out_dir", None)
        check_data_path(self.train_path, bool(self.generate), out_dir)
        if self.generate and may_generate_data(self.train_path, out_dir):
            # (re)generated whenever its config.json differs from `generate`
            from paravt.video.synthetic import NeedleConfig, ensure_needle_data

            out = generation_dir(self.train_path, out_dir)
            try:
                needle = NeedleConfig(**gen)
            except (TypeError, ValueError) as err:  # a key or value of data.generate
                raise UserError(f"data.generate: {err}") from err
            if ensure_needle_data(needle, out):
                log.info("generated synthetic needle data in %s", out)

    def setup(self, stage: str | None = None) -> None:
        if self.train_samples:
            return
        check_data_path(self.train_path, False, None)
        # Rank 0 opens every training video once; the other ranks receive its result.
        self.train_samples, report = on_rank0(
            lambda: load_samples(
                self.train_path, layout=self.layout, video_check="open", fail_fast=self.fail_fast
            )
        )
        self.load_report = report
        log.info("loaded %d/%d training prompts from %s", report.kept, report.total, report.path)
        if not self.train_samples:
            why = "it has no rows" if not report.total else f"all {report.total} rows were skipped"
            first = "; ".join(f"{i}: {problem}" for i, problem in report.skipped[:3])
            raise UserError(
                f"no usable training prompts in {self.train_path}: {why}"
                + (f" (first: {first})" if first else "")
            )
        if self.eval_path and Path(self.eval_path).exists():
            self.eval_samples, _ = load_samples(self.eval_path, layout=self.layout)

    def train_dataloader(self) -> DataLoader:
        remaining = max(0, self.max_steps - self.consumed)
        t = self.trainer  # every rank reads every step (trainer.use_distributed_sampler=false)
        rank, world = (t.global_rank, t.world_size) if t is not None else (0, 1)
        data = _StepBatches(
            self.train_samples,
            self.batch_size,
            self.seed,
            self.shuffle,
            self.consumed,
            remaining,
            rank,
            world,
        )
        return DataLoader(data, batch_size=None, shuffle=False, num_workers=0)

    def on_batch_consumed(self, batch: PromptBatch) -> None:
        self.consumed = batch.step + 1

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.consumed = int(state_dict.get("consumed", 0))
