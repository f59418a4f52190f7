"""The SFT stage of train.py (`stage: sft`): compose -> SFTModule + SFTDataModule -> fit -> export.

Kept apart from `paravt.run.build` (the RL stage) so each stage builds only its own pieces;
the Trainer, logger and callbacks are built the same way for both.
"""

from __future__ import annotations

import warnings

from hydra.utils import instantiate
from omegaconf import DictConfig

from paravt.run.build import Run, build_callbacks, shards_model
from paravt.run.loggers import build_loggers, record_run
from paravt.run.run_dirs import shown


def build_sft_module(cfg: DictConfig, init_on_meta: bool = False):
    """The `SFTModule` of `cfg.sft` with the run's model, optimizer and scheduler."""
    scheduler = instantiate(cfg.scheduler) if cfg.get("scheduler") else None
    return instantiate(
        cfg.sft,
        model=instantiate(cfg.model),
        optimizer=instantiate(cfg.optimizer),
        scheduler=scheduler,
        init_on_meta=init_on_meta,
    )


def build_sft_run(cfg: DictConfig) -> Run:
    import lightning.pytorch as pl

    # SFT batches are encoded rows, not tensors: the module builds tensors on its device.
    warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
    pl.seed_everything(cfg.seed, workers=True)
    logger = build_loggers(cfg)
    trainer = instantiate(cfg.trainer, callbacks=build_callbacks(cfg), logger=logger)
    record_run(logger, cfg)
    # Before the data: builds a missing tiny model the data writer needs.
    module = build_sft_module(cfg, init_on_meta=shards_model(trainer))
    datamodule = instantiate(cfg.data)
    return Run(trainer=trainer, module=module, datamodule=datamodule)


def sft_summary(cfg: DictConfig, run: Run) -> str:
    losses = run.module.loss_history
    lines = [f"== paravt SFT run '{cfg.name}' ({run.trainer.global_step} optimiser steps) =="]
    if losses:
        k = max(1, min(5, len(losses) // 2))
        first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
        batches = f"{k} micro-batch" if k == 1 else f"{k} micro-batches"
        lines.append(f"SFT loss (mean of {batches}): first {first:.3f}, last {last:.3f}")
    skipped = getattr(run.datamodule, "skipped", [])
    lines.append(f"rows skipped at load: {len(skipped)}")
    folder = shown(cfg.run_dir)
    if cfg.export_hf:
        lines.append(
            f"HF checkpoint: {folder}/hf  (RL from it: python train.py model.path={folder}/hf "
            "model.build_tiny=null cold_start=null)"
        )
    lines.append(f"logs: {folder}/tb   checkpoints: {folder}/checkpoints")
    return "\n".join(lines)


def run_sft(cfg: DictConfig) -> float | None:
    """fit, export the HF checkpoint, print the summary; returns the last logged loss."""
    run = build_sft_run(cfg)
    run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=cfg.ckpt_path)
    if cfg.export_hf:
        run.module.export_hf(f"{cfg.run_dir}/hf")
    if run.trainer.is_global_zero:  # every rank of a multi-process run gets here
        print(sft_summary(cfg, run))
    loss = run.trainer.callback_metrics.get("loss")
    return None if loss is None else float(loss)
