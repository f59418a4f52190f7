"""Evaluation entry point: `python evaluate.py benchmark=NAME model.path=... [key=value ...]`.

Thin on purpose: Hydra composes conf/eval.yaml (the model, the benchmark, training's agent/crop
settings from conf/rollout and a dispatch-mode preset from conf/mode), this file checks the paths,
loads the policy (for vLLM, which reads `model.path` itself, only its config and processor),
builds the engine (`paravt.rollout.build_engine`, chosen as in training with
`rollout/engine=hf|vllm`) and the agent loop for the benchmark's forced-answer message, and hands
over to `paravt.eval.runner.run_benchmark` (predictions.jsonl, metrics.json, results.md under
`out_dir`, resuming a killed run of the same model, annotations, engine and protocol). Bad input
stops with one line naming the problem and the fix. `-m ... mode=parallel,sequential,no_tool`
prints one comparison table (`paravt.eval.compare`). `judge=openai` scores open-ended answers with
an LLM judge (`paravt.eval.judging`); the judge's counts are printed, a fallback warned about, and
`judge_max_fallback_share` can make it an error. Every benchmark is scored by its official rules
and by lmms-eval's (`paravt.eval.lmms_scoring`); the table shows both, `benchmark.scoring=
official|lmms_eval` picks whose figures come first and take the plain metric names. Only
`torch.no_grad` inference happens here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
from dataclasses import replace

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from paravt.errors import UserError, check_model_path, check_number, user_message
from paravt.eval.adapters.base import AnnotationError, collect_row_errors
from paravt.eval.judging import check_fallbacks, check_max_share, fallback_warning, judge_line
from paravt.eval.results import check_run_identity, load_metrics, primary_scoring
from paravt.eval.runner import (
    EvalConfig,
    build_agent_loop,
    default_identity,
    format_metrics,
    make_benchmark,
    run_benchmark,
)
from paravt.eval.trained_protocol import describe, override_keys, read_protocol, trained_settings

log = logging.getLogger("evaluate")


def pick_device(name: str) -> str:
    """`device`: auto (cuda when available, else cpu), cpu, cuda or cuda:N."""
    import re

    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", str(name)):
        raise UserError(f"device={name!r}: choose auto, cpu, cuda or cuda:N")
    if name != "cpu" and not torch.cuda.is_available():
        raise UserError(f"device={name} but no CUDA GPU is visible: use device=auto or cpu")
    return name


def load_model(cfg: DictConfig, spec):
    """(model, processor) for the configured engine: the weights on `cfg.device` for the
    transformers engine; for vLLM, which loads `model.path` itself, a meta-device skeleton (config
    and processor only), so no second copy takes the GPU memory vLLM's start-up wants."""
    from paravt.models.loading import load_policy
    from paravt.rollout.factory import loads_from_path

    skeleton = loads_from_path(cfg.rollout.engine.name, cfg.model.path)
    model, processor = load_policy(spec, on_meta=skeleton)
    if not skeleton:
        model.eval().to(pick_device(cfg.device))
    return model, processor


def policy_spec(cfg: DictConfig):
    """The model spec; a missing model.path is an error unless a tiny model is built there (the
    rule and the message of train.py: only at model.tiny_dir, `paravt.errors.check_model_path`)."""
    spec = instantiate(cfg.model)
    check_model_path(spec.path, spec.build_tiny, cfg.model.get("tiny_dir"))
    if os.path.isfile(os.path.join(os.path.expanduser(spec.path), "config.json")):
        return replace(spec, build_tiny=None)
    return spec


def use_trained_protocol(cfg: DictConfig, overrides: list[str]) -> str:
    """Apply the protocol `model.path` was trained with (`paravt_protocol.json`) to `cfg`,
    except what the command line sets; returns one line saying which protocol runs."""
    record = read_protocol(cfg.model.path) if cfg.trained_protocol else None
    if record is None:
        why = "trained_protocol=false" if not cfg.trained_protocol else "no paravt_protocol.json"
        return (
            f"protocol: conf/eval.yaml's with mode={cfg.mode.name} ({why} at model.path; "
            f"protocol.frame_budget={cfg.protocol.frame_budget})"
        )
    applied, kept = trained_settings(
        record, cfg.mode.name, cfg.benchmark.name, override_keys(overrides)
    )
    changed = {k: v for k, v in applied.items() if OmegaConf.select(cfg, k) != v}
    for key, value in changed.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return describe(cfg.model.path, changed, kept)


def protocol_of(cfg: DictConfig) -> EvalConfig:
    """The protocol: training's agent/crop settings (conf/rollout) plus the eval knobs."""
    agent, crop = instantiate(cfg.rollout.agent), instantiate(cfg.rollout.crop)
    return EvalConfig(agent=agent, crop=crop, **OmegaConf.to_container(cfg.protocol))


def run_identity(cfg: DictConfig, protocol: EvalConfig) -> dict:
    """What an out_dir's predictions depend on: model, annotation file, engine, mode, protocol."""
    return {
        "benchmark": cfg.benchmark.name,
        "model": os.path.abspath(os.path.expanduser(cfg.model.path)),
        "annotations": os.path.abspath(cfg.benchmark.annotations),
        "engine": cfg.rollout.engine.name,
        "mode": cfg.mode.name,
        "protocol": protocol.identity(),
        # the adapter's options (e.g. Video-MME's subtitle rule) change the prompts too
        "options": benchmark_options(cfg),
        # a judge changes the open-ended scores (absent without one: older out_dirs resume)
        **judge_identity(cfg),
        **toolbox_identity(cfg),
    }


def toolbox_identity(cfg: DictConfig) -> dict:
    """Another tool list changes the prompts (absent for the default: older out_dirs resume)."""
    node = cfg.rollout.get("toolbox")
    listed = [] if node is None else OmegaConf.to_container(node, resolve=True)
    default = [{"_target_": "paravt.agent.tools.CropVideoTool"}]
    return {} if listed in ([], default) else {"toolbox": listed}


def build_tools(cfg: DictConfig) -> list | None:
    """`rollout.toolbox`, instantiated (None: the default `[crop_video]`)."""
    node = cfg.rollout.get("toolbox")
    return None if not node else [instantiate(t) for t in node]


def judge_identity(cfg: DictConfig) -> dict:
    node = cfg.get("judge")
    return {} if node is None else {"judge": {"model": node.client.model}}


def build_judge(cfg: DictConfig):
    """The `judge` group's LLMJudge (its client; the training guard is not used here), or None."""
    check_max_share(cfg.get("judge_max_fallback_share"))
    node = cfg.get("judge")
    return None if node is None else instantiate(node.client)


def report_judge(out_dir: str, max_share: float | None) -> None:
    """Print the judge line of metrics.json, warn on fallbacks, fail above `max_share`."""
    report = load_metrics(out_dir).get("judge")
    if report is None:
        return
    print(judge_line(report))
    warning = fallback_warning(report)
    if warning is not None:
        log.warning("%s", warning)
    check_fallbacks(report, max_share)


def benchmark_options(cfg: DictConfig) -> dict:
    raw = cfg.benchmark.get("options")  # an empty DictConfig is falsy: test for None, not truth
    return {} if raw is None else OmegaConf.to_container(raw, resolve=True)


def default_out_dir(identity: dict) -> str:
    """runs/eval/<benchmark>/<mode>/<model name>-<8 hex of the identity>."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(identity["model"].rstrip("/")))
    return os.path.join("runs", "eval", identity["benchmark"], identity["mode"], f"{name}-{digest}")


def load_items(cfg: DictConfig, benchmark):
    """The benchmark's items and the bad rows skipped (none skipped with fail_fast)."""
    spec = cfg.benchmark
    if cfg.fail_fast:
        return benchmark.load(spec.annotations, spec.video_root, cfg.limit), []
    with collect_row_errors() as errors:
        items = benchmark.load(spec.annotations, spec.video_root, cfg.limit)
    return items, [str(e) for e in errors]


def evaluate(cfg: DictConfig, overrides: list[str] | None = None) -> dict[str, float]:
    """Load the benchmark and the policy named by `cfg`, run the evaluation, return its metrics.
    `overrides`: the command line's (they win over the policy's trained protocol)."""
    import torch

    from paravt.agent.render import ChatRenderer
    from paravt.rollout.factory import build_engine
    from paravt.video.reader import VideoReader

    policy = policy_spec(cfg)  # a wrong model path fails before anything is read or built
    check_number("limit", cfg.limit, least=0, integer=True, optional=True)
    log.info(use_trained_protocol(cfg, overrides or []))
    protocol = protocol_of(cfg)
    spec = cfg.benchmark
    options = benchmark_options(cfg)
    benchmark = make_benchmark(spec.name, unparseable=spec.get("unparseable"), **options)
    scoring = spec.get("scoring") or "official"
    primary_scoring({}, scoring)  # a bad name fails before the model loads
    items, bad_rows = load_items(cfg, benchmark)
    identity = run_identity(cfg, protocol)
    out_dir = cfg.out_dir or default_out_dir(identity)
    # Fail fast: an out_dir of another run is refused before the model is loaded.
    os.makedirs(out_dir, exist_ok=True)
    check_run_identity(out_dir, {**default_identity(benchmark, protocol), **identity})
    judge = build_judge(cfg)
    model, processor = load_model(cfg, policy)
    engine = build_engine(
        instantiate(cfg.rollout.engine), model, processor, model_path=cfg.model.path
    )
    with VideoReader() as source, torch.no_grad():
        max_tokens = getattr(benchmark, "forced_answer_max_tokens", None)
        loop = build_agent_loop(
            engine,
            ChatRenderer(processor),
            source,
            protocol,
            benchmark.forced_answer,
            max_tokens,
            tools=build_tools(cfg),
        )
        log.info("agent tools: %s", ", ".join(loop.executor.names))
        try:
            metrics = run_benchmark(
                benchmark,
                items,
                loop,
                out_dir,
                protocol,
                identity,
                bad_rows,
                cfg.fail_fast,
                judge,
                scoring,
            )
        finally:
            loop.executor.close()
            close = getattr(engine, "close", None)  # vLLM: its process-wide state, for the next job
            if callable(close):
                close()
    print(format_metrics(f"{spec.name} ({cfg.mode.name})", metrics))
    print(f"results: {os.path.join(out_dir, 'results.md')} (and metrics.json, predictions.jsonl)")
    report_judge(out_dir, cfg.get("judge_max_fallback_share"))
    return metrics


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> dict[str, float]:
    from hydra.core.hydra_config import HydraConfig

    from paravt.progress import is_tty
    from paravt.video.reader import VideoError

    if not is_tty(sys.stderr):  # transformers' loading bars would put `\r` into log files
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    try:
        return evaluate(cfg, list(HydraConfig.get().overrides.task))
    except Exception as error:
        known = (AnnotationError, FileNotFoundError, VideoError, ValueError, UserError)
        # else a bad value under a `_target_` (Hydra's InstantiationException), or a bug
        message = str(error) if isinstance(error, known) else user_message(error, "evaluate.py")
        if message is None:
            raise
        print(f"evaluate.py: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    from pathlib import Path

    from paravt.config_hints import with_config_hints

    with_config_hints(main, Path(__file__).parent / "conf", "eval")
