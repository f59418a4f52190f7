"""PARA-GRPO training entry point: `python train.py [experiment=NAME] [key=value ...]`.

Thin on purpose: Hydra composes conf/, `paravt.modules.build` instantiates the pieces, this file
runs the optional cold start, `fit`, the HF export, and prints the run's summary.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from paravt.modules.build import build_run, maybe_cold_start, summary
from paravt.sweep import optimized_metric


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    run = build_run(cfg)
    maybe_cold_start(cfg, run)
    run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=cfg.ckpt_path)
    if cfg.export_hf:
        run.module.export_hf(f"{cfg.run_dir}/hf")
    print(summary(cfg, run))
    value = optimized_metric(run.trainer, cfg.get("optimized_metric"))
    print(f"optimized_metric {cfg.get('optimized_metric')} = {value}")
    return value


if __name__ == "__main__":
    main()
