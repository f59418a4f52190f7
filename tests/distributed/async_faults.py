"""A callback for `train.py` runs under test (instantiated from the command line with
`+callbacks.async_probe._target_=tests.distributed.async_faults.AsyncProbe`): every rank appends
what it trained on to a JSON-lines file; rank 0 can SIGKILL its rollout generator after a given
step, as an OOM killer or an operator would, and one rank can raise after a given step, as a
bug in the trainer would."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import lightning.pytorch as pl


class AsyncProbe(pl.Callback):
    def __init__(
        self,
        path: str,
        kill_generator_after: int | None = None,
        raise_after: int | None = None,
        raise_on_rank: int = 0,
    ):
        self.path = Path(path)
        self.kill_after = kill_generator_after
        self.raise_after, self.raise_on_rank = raise_after, raise_on_rank

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        rollouts = trainer.datamodule.async_rollouts
        generator = rollouts.generator if rollouts is not None else None
        record = {
            "rank": trainer.global_rank,
            "pid": os.getpid(),
            "step": batch.step,
            "weight_version": batch.weight_version,
            "staleness": batch.staleness,
            "trajectories": len(batch.trajectories),
            "generator_pid": generator.pid if generator is not None else None,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if generator is not None and batch.step == self.kill_after:
            os.kill(generator.pid, signal.SIGKILL)
        if batch.step == self.raise_after and trainer.global_rank == self.raise_on_rank:
            raise RuntimeError(f"rank {trainer.global_rank} crashed on purpose")
