"""Crash-safe checkpoints: atomic writes, and `ckpt_path=last` that never picks a torn file.

A run killed with SIGKILL (an OOM killer, a pre-empted node) can die while a checkpoint is being
written. Lightning's default writer (2.6) writes a temp file under TMPDIR and `shutil.move`s it
into place: when TMPDIR is on another filesystem than the checkpoints, that move copies into the
final path, so a kill leaves a truncated `last.ckpt` and `ckpt_path=last` then fails to load
(tests/modules/test_checkpoint_kill.py shows it); it never fsyncs either. Here:

- `AtomicCheckpointIO` (a Lightning CheckpointIO plugin, `trainer.plugins` in conf/trainer/)
  writes to a hidden temporary file in the same folder, fsyncs it, renames it over the target
  (atomic on POSIX) and fsyncs the folder. A reader sees the old complete file or the new
  complete file, never a part of one. Remote paths (`s3://...`) fall back to Lightning's writer.
- `ResumableModelCheckpoint` (the checkpoint callback, conf/callbacks/default.yaml) resolves
  `last` only among complete files (`is_complete_checkpoint`): a torn file left by an older
  writer, or by a sharded save that died before its metadata, is skipped with a warning.
- Sharded (DCP) checkpoints (trainer=fsdp) do not go through a CheckpointIO: Lightning rewrites
  the shards of the `last.ckpt` folder in place, and the previous save's `.metadata` stays there
  while they are half new, so a kill mid-save left a folder that looks complete. The callback
  writes each sharded save into a hidden folder of its own (`.last-step<N>.dcp`) and then points
  the `last.ckpt` symlink at it with one atomic rename (`publish_checkpoint_dir`); older folders
  are removed after that. How often it saves is ModelCheckpoint's `every_n_train_steps`.

This module deliberately does not decide what goes into a checkpoint (the LightningModule's
`on_save_checkpoint` does) nor when to write one (ModelCheckpoint's schedule).
"""

from __future__ import annotations

import logging
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

log = logging.getLogger(__name__)

TEMP_PREFIX = "."  # temporary files are hidden and end in .tmp-<pid>, never in .ckpt
SHARDED_METADATA = ".metadata"  # torch.distributed.checkpoint writes it last


def _is_remote(path: str | os.PathLike) -> bool:
    return "://" in str(path)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems do not open folders; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to `path` through temp file + fsync + rename: all of it or nothing lands."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{TEMP_PREFIX}{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(target.parent)


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """True for a checkpoint that was written to the end.

    A file must be a whole zip archive (torch.save's format writes its central directory last,
    so a truncated file fails the check); a sharded checkpoint folder must hold its metadata.
    """
    p = Path(path)
    if p.is_dir():
        return (p / SHARDED_METADATA).is_file()
    try:
        with zipfile.ZipFile(p) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO whose saves are atomic on a local filesystem (module docstring)."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
    ) -> None:
        if storage_options is not None or _is_remote(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_torch_save(checkpoint, path)


class ResumableModelCheckpoint(ModelCheckpoint):
    """ModelCheckpoint whose `ckpt_path=last` candidates are complete checkpoints only, and
    whose sharded saves land atomically (module docstring)."""

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        if _is_remote(filepath) or not _saves_folders(trainer):
            super()._save_checkpoint(trainer, filepath)
        else:
            _sharded_save(self, trainer, filepath)

    def _find_last_checkpoints(self, trainer) -> set[str]:
        found = super()._find_last_checkpoints(trainer)
        complete = {p for p in found if _is_remote(p) or is_complete_checkpoint(p)}
        for torn in sorted(found - complete):
            log.warning(
                "skipping incomplete checkpoint %s (a run was killed while writing it); "
                "resuming from the newest complete one instead. Delete it to silence this.",
                torn,
            )
        return complete


STAGE_SUFFIX = ".dcp"  # staged sharded saves: hidden, and never matched as a `last*.ckpt`


def stage_path(final: str | os.PathLike, step: int) -> Path:
    """The hidden folder a sharded save of `final` (e.g. last.ckpt) at `step` is written to."""
    f = Path(final)
    return f.with_name(f"{TEMP_PREFIX}{f.stem}-step{step}{STAGE_SUFFIX}")


def publish_checkpoint_dir(stage: Path, final: Path) -> None:
    """Point `final` (a symlink) at the complete folder `stage` atomically, then remove the
    other staged folders of `final` (older saves, or torn ones a kill left behind)."""
    if not is_complete_checkpoint(stage):
        raise RuntimeError(f"refusing to publish {stage}: it has no {SHARDED_METADATA}")
    if final.exists() and not final.is_symlink():  # a folder or file from an older writer
        shutil.rmtree(final) if final.is_dir() else final.unlink()
    link = final.with_name(f"{TEMP_PREFIX}{final.name}.link-{os.getpid()}")
    link.unlink(missing_ok=True)
    os.symlink(stage.name, link)
    os.replace(link, final)
    _fsync_dir(final.parent)
    for old in final.parent.glob(f"{TEMP_PREFIX}{final.stem}-step*{STAGE_SUFFIX}"):
        if old.name != stage.name:
            shutil.rmtree(old, ignore_errors=True)


def _saves_folders(trainer) -> bool:
    """ModelParallelStrategy(save_distributed_checkpoint=True): one folder of shards per save."""
    return bool(getattr(trainer.strategy, "_save_distributed_checkpoint", False))


def _sharded_save(callback: ModelCheckpoint, trainer, filepath: str) -> None:
    """ModelCheckpoint._save_checkpoint for sharded saves: staged folder, then atomic publish."""
    final = Path(filepath)
    stage = stage_path(final, trainer.global_step)
    if trainer.is_global_zero and stage.exists():  # torn by a kill at this same step
        shutil.rmtree(stage)
    trainer.strategy.barrier()
    ModelCheckpoint._save_checkpoint(callback, trainer, str(stage))
    trainer.strategy.barrier()
    if trainer.is_global_zero:
        publish_checkpoint_dir(stage, final)
    trainer.strategy.barrier()
    callback._last_checkpoint_saved = filepath
