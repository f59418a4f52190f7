"""Build the run's experiment trackers from the `logger` config group and record the run in them.

`conf/logger/<name>.yaml` holds one entry keyed by its name (tensorboard, csv, wandb, mlflow), so
`logger=[tensorboard,wandb]` composes `{tensorboard: {...}, wandb: {...}}`: `build_loggers` turns
that into Lightning loggers (one flat `_target_` node is accepted too, and no node means none).
`record_run` writes the run's name, its resolved config and the git revision of the code into
each of them (`log_hyperparams`; MLflow also gets the standard source tags).

This module deliberately writes no metrics, texts or images (the module and the callbacks do,
`paravt.callbacks.tracker_io`) and holds no credentials: W&B reads `WANDB_API_KEY` itself.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from paravt.errors import UserError

# Where a logger's package comes from, for the error when it is missing.
_EXTRAS = {"wandb": "wandb", "mlflow": "mlflow-skinny"}
_SECRETS = ("api_key", "token", "password", "secret")


def build_loggers(cfg: DictConfig) -> list | bool:
    """The Lightning loggers the config names (False when it names none)."""
    node = cfg.get("logger")
    if not node:
        return False
    nodes = {"logger": node} if "_target_" in node else dict(node.items())
    loggers = []
    for name, sub in nodes.items():
        if sub is None:  # an entry switched off with logger.NAME=null
            continue
        if str(sub.get("tracking_uri") or "").startswith("file:"):
            # MLflow >= 3.7 refuses its file store unless told: it is what an offline run wants.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            loggers.append(instantiate(sub))
        except Exception as err:
            _raise_missing_package(name, err)
            raise
    return loggers or False


def _raise_missing_package(name: str, err: Exception) -> None:
    """A logger whose package is not installed: one line naming the package and the fix."""
    text = f"{err} {err.__cause__ or ''}"
    for key, package in _EXTRAS.items():
        if key in str(name) and ("No module named" in text or "requires" in text):
            raise UserError(
                f"logger={name} needs the `{package}` package: pip install 'paravt[trackers]' "
                f"(or pip install {package}), or choose logger=tensorboard / csv"
            ) from err


def git_revision(where: str | Path | None = None) -> str | None:
    """`git rev-parse HEAD` of the code's checkout (`+dirty` with uncommitted changes), or None
    outside a git checkout."""
    cwd = Path(where) if where else Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_record(cfg: DictConfig) -> dict[str, Any]:
    """What every tracker gets: run name, git revision and the config (resolved where it can
    be; outside a Hydra run `${hydra:...}` cannot, so the unresolved text is kept)."""
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation only Hydra's runtime resolves
        config = OmegaConf.to_container(cfg, resolve=False)
    config = _redact(config)
    return {"run_name": cfg.get("name"), "git_revision": git_revision() or "unknown", **config}


def _redact(node: Any) -> Any:
    """The config with every credential-like value (`api_key`, `token`, `password`) hidden."""
    if isinstance(node, dict):
        return {
            k: "***" if v and any(s in str(k).lower() for s in _SECRETS) else _redact(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_redact(v) for v in node]
    return node


def record_run(loggers, cfg: DictConfig) -> None:
    """Write `run_record(cfg)` into every logger, on global rank 0 only."""
    if not loggers or rank_zero_only.rank != 0:
        return
    record = run_record(cfg)
    for logger in loggers:
        logger.log_hyperparams(record)
        if isinstance(logger, MLFlowLogger):
            logger.experiment.set_tag(
                logger.run_id, "mlflow.source.git.commit", record["git_revision"]
            )


class FileSafeMLFlowLogger(MLFlowLogger):
    """`_target_` of conf/logger/mlflow.yaml: Lightning's MLFlowLogger, except that under a
    `file:` store a metric name's `/` becomes `.` (that store keeps `a/b` as a file, and then
    cannot keep `a/b/c` beside it; a database or server store keeps the names as they are)."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if str(self._tracking_uri or "").startswith("file:"):
            metrics = {k.replace("/", "."): v for k, v in metrics.items()}
        super().log_metrics(metrics, step)
