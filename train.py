"""PARA-GRPO training entry point: `python train.py [experiment=NAME] [key=value ...]`.

Thin on purpose: Hydra composes conf/, `paravt.run.build` instantiates the pieces, this file
checks the user's paths before anything is built, runs the optional cold start, `fit`, the HF
export, and prints the run's summary. A user's mistake (a missing path, a misspelt key under a
`_target_`) prints one line and exits with code 2; `HYDRA_FULL_ERROR=1` shows the traceback.
An override Hydra refuses (a misspelt key, an unknown experiment) exits with code 1 after
Hydra's message and a "did you mean" hint (`paravt.config_hints`).
"""

from __future__ import annotations

import time

import hydra
from omegaconf import DictConfig

from paravt.errors import check_data_path, check_model_path, exit_on_user_error
from paravt.run.run_dirs import register as register_run_dirs

register_run_dirs()  # conf/train.yaml's hydra.run.dir: runs/NAME, or NAME-2... when taken


def check_config(cfg: DictConfig) -> None:
    """Fail on a resume checkpoint that does not exist, a misspelt key or an unusable value under
    a `_target_` of the light groups (plain dataclasses), an optimizer that refuses its arguments,
    or a callback named by its old global package, before anything is built or logged (both
    stages)."""
    from hydra.utils import instantiate

    from paravt.errors import check_callback_target, check_ckpt_path, check_optimizer
    from paravt.run.recipe_problems import check_light_groups

    check_ckpt_path(cfg.get("ckpt_path"))
    check_light_groups(cfg)
    if cfg.get("optimizer") is not None:
        check_optimizer(instantiate(cfg.optimizer))
    for name, c in (cfg.get("callbacks") or {}).items():
        if c is not None:
            check_callback_target(name, str(c.get("_target_", "")))


def check_inputs(cfg: DictConfig) -> None:
    """Fail on a misspelt key of the light groups, a config that cannot run on its ranks
    (`paravt check-recipe`'s checks), or a missing model or data path, before anything is built,
    generated or logged."""
    from paravt.errors import UserError
    from paravt.run.recipe_problems import missing_installs, problems

    check_config(cfg)
    found = problems(cfg) + missing_installs(cfg)
    if found:
        raise UserError("; ".join(str(p) for p in found))
    model, data = cfg.get("model") or {}, cfg.get("data") or {}
    if "path" in model:
        check_model_path(model.path, model.get("build_tiny"), model.get("tiny_dir"))
    if "train_path" in data:
        gen = data.get("generate")
        check_data_path(data.train_path, bool(gen), gen.get("out_dir") if gen else None)


def export_policy(cfg: DictConfig, run) -> None:
    """The HF export and, beside it, the agent protocol it was trained with (evaluate.py uses it:
    `paravt.eval.trained_protocol`)."""
    from omegaconf import OmegaConf

    from paravt.eval.trained_protocol import protocol_of_training, write_protocol

    run.module.export_hf(f"{cfg.run_dir}/hf")
    if run.trainer.is_global_zero:
        callbacks = {  # resolved against the whole config
            k: OmegaConf.to_container(cfg.callbacks[k], resolve=True)
            for k in ("frame_budget_gating", "benchmark_validation")
            if OmegaConf.select(cfg, f"callbacks.{k}") is not None
        }
        plain = {
            "name": cfg.name,
            "rollout": OmegaConf.to_container(cfg.rollout, resolve=True),
            "data": OmegaConf.to_container(cfg.data, resolve=True),
            "callbacks": callbacks,
        }
        write_protocol(f"{cfg.run_dir}/hf", protocol_of_training(plain))


def announce_run_dir(cfg: DictConfig) -> None:
    """Say where this run writes when it is not runs/NAME, and what a resume continues."""
    import logging
    import re
    from pathlib import Path

    from paravt.run.run_dirs import shown

    log, folder = logging.getLogger("train"), Path(shown(cfg.run_dir))
    if cfg.get("ckpt_path"):
        log.info(
            "resuming in %s: the prompt order and the optimizer continue exactly where the "
            "checkpoint stopped (the data module's position is saved in it)",
            folder,
        )
    elif re.fullmatch(rf"{re.escape(str(cfg.name))}-\d+", folder.name):
        log.info("runs/%s holds an earlier run; this run writes to %s", cfg.name, folder)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from paravt.parallel.launch import end_job

    try:
        result = run_job(cfg)
    except BaseException:
        end_job(ok=False)  # a failed rank exits now; its peers may never reach the barrier
        raise
    end_job()  # the ranks leave together; a sweep's next job starts a fresh process group
    return result


def run_job(cfg: DictConfig) -> float | None:
    started = time.perf_counter()
    with exit_on_user_error():
        from hydra.core.hydra_config import HydraConfig

        from paravt.parallel.launch import export_job

        hc = HydraConfig.get()  # the ranks Lightning starts run this job, not the command line
        export_job(hc.overrides.task, hc.runtime.output_dir)
        sft = cfg.get("stage", "rl") == "sft"  # experiment=sft_coldstart / demo_sft
        # The config and paths are checked before the training stack (Lightning) is imported.
        check_config(cfg)
        if not sft:
            check_inputs(cfg)
        from paravt.callbacks.progress import route_lightning_logs
        from paravt.run.build import build_run, maybe_cold_start
        from paravt.run.summary import metric_line, summary
        from paravt.sweep import optimized_metric

        route_lightning_logs()
        announce_run_dir(cfg)
        if sft:
            from paravt.run.build_sft import run_sft

            return run_sft(cfg)
        run = build_run(cfg)
        run = maybe_cold_start(cfg, run)  # keeps the cold start's result for the summary
        fit_started = time.perf_counter()
        run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=cfg.ckpt_path)
        fit_seconds = time.perf_counter() - fit_started
        if cfg.export_hf:
            export_policy(cfg, run)
        value = optimized_metric(run.trainer, cfg.get("optimized_metric"))
        if run.trainer.is_global_zero:  # every rank of a multi-process run gets here
            print(summary(cfg, run, fit_seconds, time.perf_counter() - started))
            print(metric_line(cfg, value, run))
        return value


if __name__ == "__main__":
    import os
    import sys
    from pathlib import Path

    from paravt.parallel.launch import child_argv

    sys.argv = child_argv(sys.argv, os.environ) or sys.argv  # a rank runs its parent's job

    from paravt.config_hints import with_config_hints

    with_config_hints(main, Path(__file__).parent / "conf", "train")
