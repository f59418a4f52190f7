"""SIGKILL at the worst moments of a checkpoint write: `last.ckpt` stays whole, resume works.

A discriminating test: the kill lands the instant a new checkpoint's bytes
start to land (a new temporary file appears), or the instant `last.ckpt` is seen changed and not
a complete checkpoint while the run saves every step. With the paravt writer (conf/trainer/
cpu.yaml's AtomicCheckpointIO) `last.ckpt` is never seen torn and the run resumes after the
kill; the control shows Lightning's stock TorchCheckpointIO caught mid-copy, leaving a torn
`last.ckpt`, when its temporary folder is on another filesystem than the checkpoints (fsspec
then copies the file into place instead of renaming it), the common case of /tmp on local disk
and runs on a mounted volume. Each run is a process of its own, forked from one that imported
torch and Lightning once (tests/forkserver.py).
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
import torch

from paravt.modules.checkpoint import is_complete_checkpoint
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")

SCRIPT = textwrap.dedent(
    """
    import sys
    import lightning.pytorch as pl
    import torch
    from hydra.utils import instantiate
    from lightning.pytorch.plugins.io import TorchCheckpointIO
    from omegaconf import OmegaConf

    root, run_dir, writer, max_steps, resume = sys.argv[1:6]
    if writer == "paravt":
        plugins = [instantiate(p) for p in OmegaConf.load(f"{root}/conf/trainer/cpu.yaml").plugins]
    else:
        plugins = [TorchCheckpointIO()]
    ckpt = instantiate(OmegaConf.load(f"{root}/conf/callbacks/default.yaml").checkpoint,
                       dirpath=f"{run_dir}/checkpoints")

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1536, 1536)  # ~28 MB checkpoints with Adam's state

        def training_step(self, batch, _):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    trainer = pl.Trainer(accelerator="cpu", max_steps=int(max_steps), logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         plugins=plugins, callbacks=[ckpt], default_root_dir=run_dir)
    data = torch.utils.data.TensorDataset(torch.randn(64, 1536))
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=8),
                ckpt_path="last" if resume == "1" else None)
    print("GLOBAL_STEP", trainer.global_step)
    """
)


def _launch(tmp: Path, writer: str, max_steps: int, resume: bool, tmpdir: Path):
    """The script in a process of its own, forked from an interpreter holding the imports."""
    env = {"OMP_NUM_THREADS": "1", "TMPDIR": str(tmpdir)}
    args = [str(ROOT), str(tmp), writer, str(max_steps), str(int(resume))]
    out = tmp / f"run-{time.monotonic_ns()}.log"
    return forkserver.start(SCRIPT, ["run.py", *args], out, env, tmp)


def _state(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _files(folders: list[Path]) -> set[Path]:
    return {p for folder in folders if folder.exists() for p in folder.iterdir()}


def _wait_for_checkpoint(proc, last: Path, timeout: float) -> None:
    start = time.monotonic()
    while not is_complete_checkpoint(last):
        if proc.poll() is not None or time.monotonic() - start > timeout:
            pytest.fail(f"no checkpoint appeared:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.01)


def _kill(proc) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _kill_when_writing(proc, last: Path, tmpdir: Path, timeout: float = 120.0) -> None:
    """SIGKILL `proc` the instant a new checkpoint's bytes start to land: a new file appears
    next to last.ckpt or in TMPDIR (after the first complete last.ckpt)."""
    _wait_for_checkpoint(proc, last, timeout)
    folders = [last.parent, tmpdir]
    seen, start = _files(folders), time.monotonic()
    while not _files(folders) - seen:
        if proc.poll() is not None or time.monotonic() - start > timeout:
            pytest.fail(f"the run ended before the kill:\n{proc.communicate()[0][-3000:]}")
    _kill(proc)


def _watch_then_kill(proc, last: Path, seconds: float, timeout: float = 120.0) -> str:
    """Poll last.ckpt through `seconds` of saves; SIGKILL the instant it is seen changed and
    not a complete checkpoint, still so once the writer is stopped ("torn"), else at the end
    ("whole")."""
    _wait_for_checkpoint(proc, last, timeout)
    before, start = _state(last), time.monotonic()
    while time.monotonic() - start < seconds:
        now = _state(last)
        if now != before:
            if not is_complete_checkpoint(last):
                # Freeze the writer, then look again: what is killed is what was checked.
                proc.send_signal(signal.SIGSTOP)
                if not is_complete_checkpoint(last):
                    _kill(proc)
                    return "torn"
                proc.send_signal(signal.SIGCONT)
            before = _state(last)
        if proc.poll() is not None:
            pytest.fail(f"the run ended before the kill:\n{proc.communicate()[0][-3000:]}")
    _kill(proc)
    return "whole"


def _resumes(tmp_path: Path, tmpdir: Path, last: Path) -> None:
    step = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    assert step >= 1
    resumed = _launch(tmp_path, "paravt", step + 2, True, tmpdir)
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out[-3000:]
    assert f"GLOBAL_STEP {step + 2}" in out, out[-3000:]


@pytest.fixture
def other_fs_tmpdir(tmp_path):
    """A TMPDIR on another filesystem than tmp_path (where the checkpoints go)."""
    if not SHM.is_dir() or SHM.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's tmp folder")
    folder = SHM / f"paravt-ckpt-test-{os.getpid()}-{tmp_path.name}"
    folder.mkdir()
    yield folder
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


@pytest.mark.slow
def test_a_kill_as_a_new_checkpoint_starts_landing_leaves_the_old_one(tmp_path, other_fs_tmpdir):
    last = tmp_path / "checkpoints" / "last.ckpt"
    _kill_when_writing(
        _launch(tmp_path, "paravt", 100_000, False, other_fs_tmpdir), last, other_fs_tmpdir
    )
    assert is_complete_checkpoint(last)
    _resumes(tmp_path, other_fs_tmpdir, last)


@pytest.mark.slow
def test_last_ckpt_is_never_seen_torn_and_a_kill_anywhere_resumes(tmp_path, other_fs_tmpdir):
    last = tmp_path / "checkpoints" / "last.ckpt"
    proc = _launch(tmp_path, "paravt", 100_000, False, other_fs_tmpdir)
    assert _watch_then_kill(proc, last, seconds=6.0) == "whole"
    assert is_complete_checkpoint(last)
    _resumes(tmp_path, other_fs_tmpdir, last)


@pytest.mark.slow
def test_control_the_stock_writer_exposes_a_torn_last_ckpt(tmp_path, other_fs_tmpdir):
    last = tmp_path / "checkpoints" / "last.ckpt"
    proc = _launch(tmp_path, "stock", 100_000, False, other_fs_tmpdir)
    # The same watch catches Lightning's writer copying into last.ckpt, and the kill there
    # leaves it torn: `ckpt_path=last` would fail to load it.
    assert _watch_then_kill(proc, last, seconds=60.0) == "torn"
    assert last.exists() and not is_complete_checkpoint(last)
