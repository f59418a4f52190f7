"""Kill -9 during sharded (DCP) saves, then `ckpt_path=last`: the FSDP2 trainer's checkpoint
(Lightning's ModelParallelStrategy, one gloo process on CPU) is published atomically by
`ResumableModelCheckpoint`, so whatever the moment of the kill, `last.ckpt` is a whole sharded
checkpoint and the run resumes from it. Each run is a process of its own, forked from one that
imported torch and Lightning once (tests/forkserver.py)."""

from __future__ import annotations

import random
import signal
import textwrap
import time
from pathlib import Path

import pytest

from paravt.modules.checkpoint import is_complete_checkpoint
from tests import forkserver

SCRIPT = textwrap.dedent(
    """
    import sys
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard

    from paravt.modules.checkpoint import ResumableModelCheckpoint

    run_dir, max_steps, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1024, 1024)  # 4 MB of weights, 12 MB with Adam

        def configure_model(self):
            fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch, _):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    data = torch.utils.data.TensorDataset(torch.randn(10_000, 1024))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1,
                                       process_group_backend="gloo"),
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ResumableModelCheckpoint(dirpath=f"{run_dir}/checkpoints", save_last=True,
                                            every_n_train_steps=1, save_top_k=0)],
        default_root_dir=run_dir,
    )
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=8),
                ckpt_path="last" if resume else None)
    print("GLOBAL_STEP", trainer.global_step)
    """
)


def _launch(tmp_path: Path, max_steps: int, resume: bool) -> forkserver.Child:
    """The script in a process of its own, forked from an interpreter holding the imports."""
    env = {"OMP_NUM_THREADS": "1", "MASTER_PORT": "29731"}
    args = [str(tmp_path), str(max_steps), "1" if resume else "0"]
    out = tmp_path / f"run-{time.monotonic_ns()}.log"
    return forkserver.start(SCRIPT, ["run.py", *args], out, env, tmp_path)


def _step(last: Path) -> int:
    import torch

    return int(torch.load(last / "meta.pt", weights_only=False)["global_step"])


@pytest.mark.slow
def test_sigkill_during_sharded_saves_then_resume_from_last(tmp_path: Path) -> None:
    rng = random.Random(7)
    last = tmp_path / "checkpoints" / "last.ckpt"
    for _ in range(3):
        proc = _launch(tmp_path, max_steps=100_000, resume=last.exists())
        start = time.monotonic()
        while not last.exists():
            if proc.poll() is not None or time.monotonic() - start > 300:
                proc.kill()
                pytest.fail(f"no checkpoint appeared:\n{proc.communicate()[0][-3000:]}")
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))  # anywhere in a step, often inside a save
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert last.is_symlink() and is_complete_checkpoint(last)
        assert _step(last) >= 1
    step = _step(last)
    proc = _launch(tmp_path, max_steps=step + 3, resume=True)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert f"GLOBAL_STEP {step + 3}" in out, out[-3000:]
    staged = sorted(p.name for p in last.parent.iterdir() if p.name != "last.ckpt")
    assert staged == [f".last-step{step + 3}.dcp"], staged
