"""Kill -9 and resume: atomic checkpoint writes, and `ckpt_path=last` never picks a torn file.

The subprocess tests run a real Lightning training loop built from the repository's own
conf/trainer/cpu.yaml plugins and conf/callbacks/default.yaml checkpoint callback (a small
linear model whose checkpoint is a few megabytes, so a kill often lands inside a write), kill it
with SIGKILL at random moments, then resume with ckpt_path="last". Each run is a process of its
own, forked from one that imported torch and Lightning once (tests/forkserver.py).
"""

from __future__ import annotations

import os
import random
import signal
import textwrap
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from paravt.modules.checkpoint import (
    AtomicCheckpointIO,
    ResumableModelCheckpoint,
    atomic_torch_save,
    is_complete_checkpoint,
)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    import lightning.pytorch as pl
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    root, run_dir, max_steps, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    trainer_cfg = OmegaConf.load(f"{root}/conf/trainer/cpu.yaml")
    callbacks_cfg = OmegaConf.load(f"{root}/conf/callbacks/default.yaml")
    ckpt_cfg = callbacks_cfg.checkpoint
    ckpt_cfg.dirpath = f"{run_dir}/checkpoints"

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1024, 1024)  # 4 MB of weights, 12 MB with Adam

        def training_step(self, batch, _):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    data = torch.utils.data.TensorDataset(torch.randn(10_000, 1024))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[instantiate(p) for p in trainer_cfg.plugins],
        callbacks=[instantiate(ckpt_cfg)],
        default_root_dir=run_dir,
    )
    trainer.fit(
        Model(),
        torch.utils.data.DataLoader(data, batch_size=8),
        ckpt_path="last" if resume == "1" else None,
    )
    print("GLOBAL_STEP", trainer.global_step)
    """
)


def _launch(tmp_path: Path, max_steps: int, resume: bool) -> forkserver.Child:
    """The script in a process of its own, forked from an interpreter holding the imports."""
    args = [str(ROOT), str(tmp_path), str(max_steps), str(int(resume))]
    out = tmp_path / f"run-{time.monotonic_ns()}.log"
    return forkserver.start(SCRIPT, ["run.py", *args], out, {"OMP_NUM_THREADS": "1"}, tmp_path)


def _wait_for_checkpoint(path: Path, proc: forkserver.Child, timeout: float = 120.0) -> None:
    start = time.monotonic()
    while not path.exists():
        if proc.poll() is not None or time.monotonic() - start > timeout:
            proc.kill()
            out = proc.communicate(timeout=60)[0]
            pytest.fail(f"no checkpoint appeared at {path}:\n{out[-3000:]}")
        time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_from_last(tmp_path: Path) -> None:
    rng = random.Random(12)
    last = tmp_path / "checkpoints" / "last.ckpt"
    for _ in range(4):
        proc = _launch(tmp_path, max_steps=100_000, resume=last.exists())
        _wait_for_checkpoint(last, proc)
        time.sleep(rng.uniform(0.0, 1.5))  # anywhere in a step, often inside a save
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # Whatever the moment of the kill, `last` is a whole checkpoint that loads.
        assert is_complete_checkpoint(last)
        state = torch.load(last, map_location="cpu", weights_only=False)
        assert state["global_step"] >= 1
    step = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    proc = _launch(tmp_path, max_steps=step + 3, resume=True)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert f"GLOBAL_STEP {step + 3}" in out, out[-3000:]


def test_last_skips_a_torn_checkpoint(tmp_path: Path) -> None:
    # A complete last.ckpt, then a newer torn last-v1.ckpt (an older writer killed mid-save):
    # Lightning resolves `last` to the newest file by mtime, which would fail to load.
    folder = tmp_path / "checkpoints"
    complete = folder / "last.ckpt"
    atomic_torch_save({"global_step": 3, "weights": torch.randn(1000)}, complete)
    torn = folder / "last-v1.ckpt"
    torn.write_bytes(complete.read_bytes()[: complete.stat().st_size // 2])
    os.utime(torn, (time.time() + 10, time.time() + 10))
    assert is_complete_checkpoint(complete) and not is_complete_checkpoint(torn)

    class _Trainer:  # what _find_last_checkpoints reads of the trainer
        default_root_dir = str(tmp_path)
        loggers: tuple = ()

    found = ResumableModelCheckpoint(dirpath=folder)._find_last_checkpoints(_Trainer())
    assert found == {os.path.normpath(complete)}


def test_atomic_save_keeps_the_old_file_when_the_write_fails(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        AtomicCheckpointIO().save_checkpoint({"step": 2, "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=False) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temp file left


def test_the_configured_trainer_and_callback_are_the_crash_safe_ones() -> None:
    from hydra.utils import instantiate

    cfg = OmegaConf.load(ROOT / "conf" / "trainer" / "cpu.yaml")
    assert [type(instantiate(p)) for p in cfg.plugins] == [AtomicCheckpointIO]
    # FSDP2 saves sharded DCP folders, whose `.metadata` file is written last: a folder without
    # it is incomplete, and `ckpt_path=last` resolution skips it (ResumableModelCheckpoint).
    fsdp = OmegaConf.load(ROOT / "conf" / "trainer" / "fsdp.yaml")
    assert fsdp.strategy.save_distributed_checkpoint is True
    callbacks = OmegaConf.load(ROOT / "conf" / "callbacks" / "default.yaml")
    assert callbacks.checkpoint._target_.endswith("ResumableModelCheckpoint")
