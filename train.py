"""PARA-GRPO training entry point: `python train.py [experiment=NAME] [key=value ...]`.

Thin on purpose: Hydra composes conf/, `paravt.modules.build` instantiates the pieces, this file
runs the optional cold start, `fit`, the HF export, and prints the run's summary.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from paravt.modules.build import build_run, maybe_cold_start, summary


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    if cfg.get("stage", "rl") == "sft":  # cold-start SFT (experiment=sft_coldstart / demo_sft)
        from paravt.modules.build_sft import run_sft

        return run_sft(cfg)
    run = build_run(cfg)
    maybe_cold_start(cfg, run)
    run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=cfg.ckpt_path)
    if cfg.export_hf:
        run.module.export_hf(f"{cfg.run_dir}/hf")
    print(summary(cfg, run))
    reward = run.trainer.callback_metrics.get("reward")
    return None if reward is None else float(reward)


if __name__ == "__main__":
    main()
