"""Turn a composed Hydra config into (trainer, module, datamodule): the glue behind train.py.

Kept out of train.py so tests can compose and instantiate every experiment without running it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig


@dataclass(frozen=True)
class Run:
    trainer: Any
    module: Any
    datamodule: Any


def build_callbacks(cfg: DictConfig) -> list:
    return [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]


def build_module(cfg: DictConfig):
    from paravt.modules.grpo import GRPOModule

    return GRPOModule(
        model=instantiate(cfg.model),
        rollout=instantiate(cfg.rollout),
        algorithm=instantiate(cfg.algorithm),
        reward=instantiate(cfg.reward),
        optimizer=instantiate(cfg.optimizer),
        seed=cfg.seed,
    )


def build_run(cfg: DictConfig) -> Run:
    import lightning.pytorch as pl

    pl.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    trainer = instantiate(
        cfg.trainer, callbacks=build_callbacks(cfg), logger=instantiate(cfg.logger)
    )
    return Run(trainer=trainer, module=build_module(cfg), datamodule=datamodule)
