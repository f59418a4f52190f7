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


def check_inputs(cfg: DictConfig) -> None:
    """Fail on a config that cannot run on its ranks (`paravt check-recipe`'s checks), or a
    missing model or data path, before anything is built or generated."""
    from paravt.errors import UserError
    from paravt.run.recipe import problems

    found = problems(cfg)
    if found:
        raise UserError("; ".join(str(p) for p in found))
    model, data = cfg.get("model") or {}, cfg.get("data") or {}
    if "path" in model:
        check_model_path(model.path, model.get("build_tiny"), model.get("tiny_dir"))
    if "train_path" in data:
        gen = data.get("generate")
        check_data_path(data.train_path, bool(gen), gen.get("out_dir") if gen else None)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from paravt.parallel.launch import end_job

    try:
        return run_job(cfg)
    finally:
        end_job()  # a sweep's next job starts a fresh process group


def run_job(cfg: DictConfig) -> float | None:
    started = time.perf_counter()
    with exit_on_user_error():
        from hydra.core.hydra_config import HydraConfig

        from paravt.parallel.launch import export_job

        hc = HydraConfig.get()  # the ranks Lightning starts run this job, not the command line
        export_job(hc.overrides.task, hc.runtime.output_dir)
        from callbacks.progress import route_lightning_logs
        from paravt.run.build import build_run, maybe_cold_start, summary
        from paravt.sweep import optimized_metric

        route_lightning_logs()
        if cfg.get("stage", "rl") == "sft":  # cold-start SFT (experiment=sft_coldstart / demo_sft)
            from paravt.run.build_sft import run_sft

            return run_sft(cfg)
        check_inputs(cfg)
        run = build_run(cfg)
        run = maybe_cold_start(cfg, run)  # keeps the cold start's result for the summary
        fit_started = time.perf_counter()
        run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=cfg.ckpt_path)
        fit_seconds = time.perf_counter() - fit_started
        if cfg.export_hf:
            run.module.export_hf(f"{cfg.run_dir}/hf")
        value = optimized_metric(run.trainer, cfg.get("optimized_metric"))
        if run.trainer.is_global_zero:  # every rank of a multi-process run gets here
            print(summary(cfg, run, fit_seconds, time.perf_counter() - started))
            print(f"optimized_metric {cfg.get('optimized_metric')} = {value}")
        return value


if __name__ == "__main__":
    import os
    import sys
    from pathlib import Path

    from paravt.parallel.launch import child_argv

    sys.argv = child_argv(sys.argv, os.environ) or sys.argv  # a rank runs its parent's job

    from paravt.config_hints import with_config_hints

    with_config_hints(main, Path(__file__).parent / "conf", "train")
