"""Side-by-side: grouped needle rollouts with the transformers engine vs the vLLM engine.

The same B prompts x G samples run through the real agent loop (overview clip, parallel crops,
tool responses) with each engine, built by `paravt.rollout.build_engine`, in one run; it prints
wall time, sampled tokens per second and the ratio. Run it in the vLLM environment:

    .venv-vllm/bin/python benchmarks/rollout_engines.py [--prompts 4 --group 4 --new-tokens 64]
    # a real checkpoint on a GPU (tests/gpu/run.sh):
    python benchmarks/rollout_engines.py --model /path/to/Qwen3-VL-8B --dtype bfloat16 ...

Without --model it uses a tiny random Qwen3-VL (on which vLLM's per-step overhead dominates:
the case for vLLM is GPUs and real models). The first call of each engine is a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _setup(args, tmp: Path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.data.datasets import load_samples
    from paravt.models.tiny import TinyModelConfig, build_tiny_model
    from paravt.video.synthetic import NeedleConfig, generate

    path = args.model or build_tiny_model(tmp / "model", TinyModelConfig("qwen3_vl"))
    processor = AutoProcessor.from_pretrained(path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=getattr(torch, args.dtype))
    generate(NeedleConfig(num_train=args.prompts, num_eval=0), tmp / "data")
    samples, _ = load_samples(tmp / "data" / "train.jsonl")
    return str(path), model.to(device).eval(), processor, samples


def _time(loop, samples, args) -> tuple[float, int]:
    from paravt.rollout.engine import SamplingParams

    params = SamplingParams(temperature=0.7, seed=0)
    budgets = [args.frame_budget] * len(samples)
    times, tokens = [], 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        trajs = loop.run(samples, budgets, args.group, params)
        times.append(time.perf_counter() - t0)
        tokens = sum(t.num_trained_tokens for t in trajs)
    return statistics.median(times), tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF checkpoint dir (default: tiny Qwen3-VL)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--frame-budget", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=8192)
    args = p.parse_args(argv)

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout import EngineConfig, build_engine
    from paravt.video.reader import VideoReader

    with tempfile.TemporaryDirectory() as tmp:
        path, model, processor, samples = _setup(args, Path(tmp))
        cfg = AgentConfig(max_rounds=args.rounds, max_new_tokens=args.new_tokens)
        rows = {}
        for name in ("hf", "vllm"):
            engine_cfg = EngineConfig(name=name, dtype=args.dtype, max_model_len=args.max_model_len)
            t0 = time.perf_counter()
            engine = build_engine(engine_cfg, model, processor, model_path=path)
            start = time.perf_counter() - t0
            loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)
            loop.run(samples[:1], [args.frame_budget], 1, _warm_params())  # warm-up
            seconds, tokens = _time(loop, samples, args)
            rows[name] = (start, seconds, tokens)
    n = args.prompts * args.group
    print(f"{args.prompts} prompts x G={args.group} rollouts ({n}), <= {args.rounds} tool rounds,")
    print(f"{args.new_tokens} new tokens per turn, model {args.model or 'tiny Qwen3-VL'}")
    print("engine   start s   rollout s   sampled tokens   tokens/s")
    for name, (start, seconds, tokens) in rows.items():
        print(f"{name:6} {start:9.1f} {seconds:11.2f} {tokens:16d} {tokens / seconds:10.1f}")
    (_, hf_s, hf_t), (_, v_s, v_t) = rows["hf"], rows["vllm"]
    print(f"vLLM / transformers throughput: {(v_t / v_s) / (hf_t / hf_s):.2f}x")
    return 0


def _warm_params():
    from paravt.rollout.engine import SamplingParams

    return SamplingParams(greedy=True, max_new_tokens=4)


if __name__ == "__main__":
    raise SystemExit(main())
