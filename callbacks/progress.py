"""Progress for long phases: a bar with counts and ETA on a terminal, one line per step otherwise.

`StepProgress` replaces Lightning's bar for RL training (which reads `Epoch 0/-2` with
`max_steps` and no epochs, and `6/5` after a resume): it counts global steps against
`trainer.max_steps`, so a resumed run shows `7/20`, and when stdout is not a terminal (a log file,
CI) it logs one concise line per step instead of nothing. `track` gives any other long loop (data
generation, cold start, teacher tracing, evaluation) the same display. `route_lightning_logs`
makes each Lightning log line appear once, and drops the cloud-logging advert.
This module does not compute metrics; it shows the ones the module logs.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Sequence

from lightning.pytorch.callbacks import Callback

from paravt.progress import format_duration, is_tty, progress_line, track

__all__ = ["StepProgress", "format_duration", "progress_line", "route_lightning_logs", "track"]
log = logging.getLogger("paravt.progress")
_ADVERT = "litlogger"


class _DropAdvert(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _ADVERT not in record.getMessage()


def route_lightning_logs() -> None:
    """Let the root (Hydra's) handlers print Lightning's records, once; drop the cloud advert,
    Lightning's internal deprecation warning and, off a terminal, transformers' file bars."""
    import lightning  # noqa: F401  (its import attaches the console handler removed here)

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if logging.getLogger().handlers:
            logger.handlers.clear()
            logger.propagate = True
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAdvert) for f in logger.filters):
            logger.addFilter(_DropAdvert())
    # Lightning's own use of a deprecated torch API: nothing a user can act on.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    # On resume Lightning warns that the dataloader "is not resumable": it checks for a stateful
    # loader, but paravt's data modules save their position in the checkpoint and a resumed run
    # continues the same batches (train.py says so instead; tests/modules/test_run_folders.py).
    warnings.filterwarnings("ignore", message=r".*your dataloader is\s+not resumable.*")
    if not is_tty(sys.stderr):  # transformers' per-file bars are noise in a log file
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


class StepProgress(Callback):
    """RL-step progress: global step / max_steps with ETA and the chosen metrics.

    A plain Callback, not a Lightning ProgressBar: the trainer configs set
    `enable_progress_bar: false` so Lightning's epoch bar stays off, and this one still shows.

    Args:
        metrics: logged metric names to show (missing ones are left out).
        every_n_steps: line frequency when not on a terminal.
        desc: the label in front of the counts.
    """

    def __init__(
        self, metrics: Sequence[str] = ("reward", "loss"), every_n_steps: int = 1, desc="RL step"
    ) -> None:
        super().__init__()
        self.metric_names, self.every, self.desc = tuple(metrics), every_n_steps, desc
        self._bar, self._start, self._first = None, 0.0, 0

    def _shown(self, trainer) -> dict[str, float]:
        found = trainer.callback_metrics
        return {k: float(found[k]) for k in self.metric_names if k in found}

    def on_train_start(self, trainer, pl_module) -> None:
        self._start, self._first = time.perf_counter(), trainer.global_step
        if trainer.is_global_zero and is_tty(sys.stderr):
            from tqdm.auto import tqdm

            total = trainer.max_steps if trainer.max_steps > 0 else None
            self._bar = tqdm(total=total, initial=trainer.global_step, desc=self.desc)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.is_global_zero:
            return
        step, total = trainer.global_step, trainer.max_steps if trainer.max_steps > 0 else None
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix({k: f"{v:.3f}" for k, v in self._shown(trainer).items()})
        elif step % self.every == 0 or step == total:
            elapsed = time.perf_counter() - self._start
            line = progress_line(
                self.desc, step, total, elapsed, step - self._first, self._shown(trainer)
            )
            log.info(line)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
