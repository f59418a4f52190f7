"""Evaluation entry point: `python evaluate.py benchmark=NAME model.path=... [key=value ...]`.

Thin on purpose: Hydra composes conf/eval.yaml, this file loads the policy, builds the agent loop
for the benchmark's forced-answer message and hands over to `paravt.eval.runner.run_benchmark`
(which writes predictions.jsonl and metrics.json under `out_dir`, resuming a killed run), then
prints the metrics as a table. Only `torch.no_grad` inference happens here; nothing is trained.
"""

from __future__ import annotations

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from paravt.eval.runner import build_agent_loop, format_metrics, make_benchmark, run_benchmark


def pick_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Load the benchmark and the policy named by `cfg`, run the evaluation, return its metrics."""
    import torch

    from paravt.agent.render import ChatRenderer
    from paravt.models.loading import load_policy
    from paravt.rollout.factory import build_engine
    from paravt.video.reader import VideoReader

    protocol = instantiate(cfg.protocol)
    spec = cfg.benchmark
    raw = spec.get("options")  # an empty DictConfig is falsy: test for None, not truth
    options = {} if raw is None else OmegaConf.to_container(raw, resolve=True)
    benchmark = make_benchmark(spec.name, **options)
    items = benchmark.load(spec.annotations, spec.video_root, cfg.limit)
    model, processor = load_policy(instantiate(cfg.model))
    model.eval().to(pick_device(cfg.device))
    engine = build_engine(
        instantiate(cfg.rollout.engine), model, processor, model_path=cfg.model.path
    )
    with VideoReader() as source, torch.no_grad():
        loop = build_agent_loop(
            engine,
            ChatRenderer(processor),
            source,
            protocol,
            benchmark.forced_answer,
            getattr(benchmark, "forced_answer_max_tokens", None),
        )
        try:
            return run_benchmark(benchmark, items, loop, cfg.out_dir, protocol)
        finally:
            loop.executor.close()


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> dict[str, float]:
    metrics = evaluate(cfg)
    print(format_metrics(cfg.benchmark.name, metrics))
    print(f"predictions and metrics.json: {cfg.out_dir}")
    return metrics


if __name__ == "__main__":
    main()
