"""Turn a composed Hydra config into (trainer, module, datamodule): the glue behind train.py.

Kept out of train.py so tests can compose and instantiate every experiment without running it.
The summary a finished run prints is `paravt.run.summary`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from paravt.errors import check_callback_target
from paravt.run.loggers import build_loggers, record_run

log = logging.getLogger(__name__)

# Lightning warnings that do not apply to this module's design, silenced by message.
_EXPECTED_WARNINGS = (
    ".*Using ModelCheckpoint with manual optimization.*",  # post-update state is what we save
    ".*module\\(s\\) in eval mode at the start of training.*",  # the frozen reference
    ".*overridden `transfer_batch_to_device`.*",  # prompt batches hold no tensors
    ".*Detected an existing checkpoint in.*",  # DCP rewriting `last.ckpt` each step (FSDP2)
)


@dataclass(frozen=True)
class Run:
    """The assembled run; `cold_start` holds the cold start's result once it ran."""

    trainer: Any
    module: Any
    datamodule: Any
    cold_start: Any = None  # paravt.run.coldstart.ColdStartResult


def build_callbacks(cfg: DictConfig) -> list:
    entries = {k: c for k, c in (cfg.get("callbacks") or {}).items() if c is not None}
    for name, c in entries.items():
        check_callback_target(name, str(c.get("_target_", "")))
    return [instantiate(c) for c in entries.values()]


def build_module(cfg: DictConfig, init_on_meta: bool = False):
    from paravt.modules.grpo import GRPOModule

    return GRPOModule(
        model=instantiate(cfg.model),
        algorithm=instantiate(cfg.algorithm),
        reward=instantiate(cfg.reward),
        optimizer=instantiate(cfg.optimizer),
        scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        init_on_meta=init_on_meta,
        **_judge(cfg),
    )


def _judge(cfg: DictConfig) -> dict:
    """GRPOModule's judge and judge_guard from the `judge` group (none by default)."""
    node = cfg.get("judge")
    if not node:
        return {}
    return {"judge": instantiate(node.client), "judge_guard": instantiate(node.guard)}


def shards_model(trainer) -> bool:
    """Whether `trainer` runs FSDP2 (the module's configure_model shards the policy), so the
    module can start as a meta-device skeleton that rank 0 fills after sharding."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return isinstance(trainer.strategy, ModelParallelStrategy)


def build_run(cfg: DictConfig) -> Run:
    import lightning.pytorch as pl

    for pattern in _EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    pl.seed_everything(cfg.seed, workers=True)
    # The DataModule generates the rollouts: it gets the rollout group (agent, crop, engine).
    # (a partial: kwargs given to `instantiate` would be turned back into plain config dicts)
    datamodule = instantiate(cfg.data, _partial_=True)(rollout=instantiate(cfg.rollout))
    logger = build_loggers(cfg)
    trainer = instantiate(cfg.trainer, callbacks=build_callbacks(cfg), logger=logger)
    record_run(logger, cfg)
    module = build_module(cfg, init_on_meta=shards_model(trainer))
    return Run(trainer=trainer, module=module, datamodule=datamodule)


PRIOR_KEY_PARTS = ("model", "cold_start", "data.generate", "rollout.agent", "rollout.crop")


def prior_key_parts(cfg: DictConfig) -> dict:
    """The config sections the tool prior and cold start depend on (their cache key, with
    `paravt.run.prior.stage_key` dropping the agent fields only RL reads)."""
    return {
        p: OmegaConf.to_container(OmegaConf.select(cfg, p), resolve=True) for p in PRIOR_KEY_PARTS
    }


def maybe_cold_start(cfg: DictConfig, run: Run) -> Run:
    """Supervised steps on teacher trajectories before RL, unless resuming or not configured:
    the run with the cold start's result kept (`run.cold_start`), or `run` unchanged."""
    if cfg.get("cold_start") is None or cfg.get("ckpt_path"):
        return run
    if shards_model(run.trainer):
        from paravt.errors import UserError

        raise UserError(
            "cold_start runs in one process before fit and cannot use trainer=fsdp / fsdp_cpu: "
            "set cold_start=null and start from an SFT checkpoint (experiment=sft_coldstart, "
            "then model.path=runs/sft_coldstart/hf)"
        )
    from paravt.run.coldstart import cold_start
    from paravt.run.coldstart_cache import cached_cold_start

    run.datamodule.prepare_data()
    run.datamodule.setup("fit")
    dm = run.datamodule
    agent = dm.connect(run.module)
    if cfg.get("prior") is not None:  # a tool prior first; both stages cached (prior.py)
        from paravt.run.prior import prior_then_cold_start

        result = prior_then_cold_start(
            run.module, agent, dm.train_samples, dm.eval_samples,
            instantiate(cfg.prior), instantiate(cfg.cold_start), prior_key_parts(cfg),
        )  # fmt: skip
    else:
        result = cached_cold_start(  # a sweep's jobs share one identical cold start
            cfg,
            run.module,
            lambda: cold_start(
                run.module, dm.train_samples, instantiate(cfg.cold_start), agent, dm.eval_samples
            ),  # it syncs the engine with the new weights before measuring anything
        )
    if result.cached:  # an engine with its own weights (vLLM, a stale-allowed copy) needs them
        from paravt.rollout.sync.weight_sync import WeightSync

        WeightSync.changed(dm.engine, run.module.policy, run.module.policy_version)
    return replace(run, cold_start=result)
