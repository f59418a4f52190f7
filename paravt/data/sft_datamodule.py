"""SFTDataModule: ParaVT SFT rows (jsonl / parquet) -> batches of encoded examples, resumably.

Rows are validated at setup (`parse_row`); a row that breaks the schema is reported with its id
and reason and skipped. Encoding (video decoding, the processor) happens when a batch is served;
a row whose video is missing or corrupt, or that is too long, is reported and dropped from its
batch, never crashing the epoch. Item i of the loader is the micro-batch `start + i`, drawn from
a (seed, epoch) permutation; the number consumed is checkpointed, so a resumed run continues the
same sequence. The needle teacher data is written on first use when `generate` is given.
It deliberately builds no tensors for the model (`paravt.data.packing` does, on the module side).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset

from paravt.data.datasets import epoch_order, load_rows
from paravt.data.sft_encode import SFTEncoder, SFTExample, SFTVideoConfig
from paravt.data.sft_schema import SFTConversation, SFTRowError, parse_row

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTBatch:
    """The micro-batch `index` (counted from the start of training) and what was dropped."""

    index: int
    examples: tuple[SFTExample, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (row id, reason)


def load_conversations(path: str) -> tuple[list[SFTConversation], list[tuple[str, str]]]:
    """Every valid conversation of a file, and (row id, reason) for each invalid row."""
    kept, skipped = [], []
    for i, row in enumerate(load_rows(path)):
        try:
            kept.append(parse_row(row, i))
        except SFTRowError as err:
            rid = str(row.get("id", f"row{i}")) if isinstance(row, dict) else f"row{i}"
            skipped.append((rid, str(err)))
    return kept, skipped


class _Batches(Dataset):
    """Item i is this rank's micro-batch `start + i`: global micro-batch (start + i) * W + rank."""

    def __init__(self, convs, batch_size, seed, shuffle, start, count, encoder_args, world, rank):
        self.convs, self.batch_size, self.seed, self.shuffle = convs, batch_size, seed, shuffle
        self.start, self.count, self.encoder_args = start, count, encoder_args
        self.world, self.rank = world, rank
        self._encoder: SFTEncoder | None = None
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self.count

    def encoder(self) -> SFTEncoder:
        if self._encoder is None:  # built in the worker: processors and decoders do not pickle
            from transformers import AutoProcessor

            from paravt.agent.render import ChatRenderer
            from paravt.video.reader import VideoReader

            processor_path, video_cfg, _ = self.encoder_args
            renderer = ChatRenderer(AutoProcessor.from_pretrained(processor_path))
            self._encoder = SFTEncoder(renderer, VideoReader(), video_cfg)
        return self._encoder

    def positions(self, i: int) -> list[int]:
        """Indices into `convs` of item i's conversations."""
        first = ((self.start + i) * self.world + self.rank) * self.batch_size
        n = len(self.convs)
        out = []
        for pos in range(first, first + self.batch_size):
            epoch, k = divmod(pos, n)
            if epoch not in self._orders:
                self._orders[epoch] = epoch_order(n, epoch, self.seed, self.shuffle)
            out.append(self._orders[epoch][k])
        return out

    def __getitem__(self, i: int) -> SFTBatch:
        index = self.start + i
        examples, skipped = [], []
        for j in self.positions(i):
            conv = self.convs[j]
            try:
                examples.append(self.encoder().encode(conv, self.encoder_args[2]))
            except Exception as err:  # a bad row must not end the epoch: report and skip it
                log.warning("SFT row %r skipped: %s", conv.id, err)
                skipped.append((conv.id, f"{type(err).__name__}: {err}"))
        return SFTBatch(index, tuple(examples), tuple(skipped))


class SFTDataModule(pl.LightningDataModule):
    """Serves `SFTBatch`es of `batch_size` conversations per rank for `max_batches` micro-batches.

    `max_batches=None` derives it from the Trainer: max_steps x accumulate_grad_batches. Ranks
    read disjoint micro-batches themselves, so the Trainer must not add a distributed sampler
    (`use_distributed_sampler: false`, set by the SFT experiments).
    """

    def __init__(
        self,
        train_path: str,
        processor_path: str,
        batch_size: int = 4,
        max_batches: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        video: SFTVideoConfig | Mapping[str, Any] | None = None,
        video_root: str | None = None,
        num_workers: int = 0,
        generate: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.train_path, self.processor_path = train_path, processor_path
        self.batch_size, self.max_batches = batch_size, max_batches
        self.seed, self.shuffle, self.num_workers = seed, shuffle, num_workers
        self.video = video if isinstance(video, SFTVideoConfig) else SFTVideoConfig(**(video or {}))
        self.video_root = video_root
        self.generate = dict(generate) if generate else None
        self.consumed = 0
        self.conversations: list[SFTConversation] = []
        self.skipped: list[tuple[str, str]] = []

    def prepare_data(self) -> None:
        if self.generate and not Path(self.train_path).exists():
            from paravt.data.sft_writer import write_needle_sft_from_config

            log.info("writing needle teacher SFT data to %s", self.train_path)
            write_needle_sft_from_config(self.train_path, self.processor_path, self.generate)

    def setup(self, stage: str | None = None) -> None:
        if self.conversations:
            return
        if not Path(self.train_path).exists():
            raise FileNotFoundError(
                f"data.train_path {self.train_path!r} does not exist; point it at a .jsonl or "
                ".parquet file of SFT rows (or set data.generate to write needle teacher data)"
            )
        self.conversations, self.skipped = load_conversations(self.train_path)
        for rid, reason in self.skipped:
            log.warning("SFT row %r skipped: %s", rid, reason)
        log.info(
            "SFT data %s: %d rows kept, %d skipped",
            self.train_path,
            len(self.conversations),
            len(self.skipped),
        )
        if not self.conversations:
            raise ValueError(f"no usable SFT rows in {self.train_path}: {self.skipped[:3]}")

    def total_batches(self) -> int:
        if self.max_batches is not None:
            return self.max_batches
        trainer = self.trainer
        if trainer is None or trainer.max_steps is None or trainer.max_steps < 0:
            raise ValueError("data.max_batches is null and the Trainer sets no max_steps; set one")
        return trainer.max_steps * trainer.accumulate_grad_batches

    def dataset(self, start: int = 0, count: int | None = None) -> _Batches:
        count = self.total_batches() - start if count is None else count
        args = (self.processor_path, self.video, self.video_root)
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer else (1, 0)
        return _Batches(
            self.conversations,
            self.batch_size,
            self.seed,
            self.shuffle,
            start,
            max(0, count),
            args,
            world,
            rank,
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.dataset(self.consumed),
            batch_size=None,
            shuffle=False,
            num_workers=self.num_workers,
        )

    def on_batch_consumed(self, batch: SFTBatch) -> None:
        self.consumed = batch.index + 1

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.consumed = int(state_dict.get("consumed", 0))
