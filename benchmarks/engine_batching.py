"""Side-by-side: one batched `TransformersEngine.generate` for N rollouts vs N single calls.

The agent loop issues one engine call per round for every active trajectory; this measures what
that buys on the tiny Qwen3-VL with real needle prompts (overview clip included), in one run.

    python benchmarks/engine_batching.py [--requests 8] [--new-tokens 48] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.agent import prompts
from paravt.agent.render import ChatRenderer
from paravt.data.datasets import load_samples
from paravt.models.tiny import TinyModelConfig, build_tiny_model
from paravt.rollout.engine import GenerationRequest, SamplingParams
from paravt.rollout.engines.hf import TransformersEngine
from paravt.video.reader import VideoReader
from paravt.video.sampling import uniform_indices
from paravt.video.synthetic import NeedleConfig, generate


def prompt_requests(tmp: Path, n: int, processor) -> list[GenerationRequest]:
    generate(NeedleConfig(num_train=n, num_eval=0), tmp / "data")
    samples, _ = load_samples(tmp / "data" / "train.jsonl")
    reader, renderer = VideoReader(), ChatRenderer(processor)
    out = []
    for s in samples:
        info = reader.info(s.video)
        frames = reader.read(s.video, uniform_indices(info.num_frames, 8), 50176, 32)
        msgs = prompts.main_messages(s, frames.timestamps, info.duration)
        seg = renderer.prompt(msgs, [frames], prompts.FORCED_THINK)
        out.append(GenerationRequest(seg.token_ids, seg.visuals))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "model", TinyModelConfig("qwen3_vl"))
        processor = AutoProcessor.from_pretrained(path)
        engine = TransformersEngine(
            AutoModelForImageTextToText.from_pretrained(path), processor.tokenizer
        )
        requests = prompt_requests(Path(tmp), args.requests, processor)
    # Same requests, same token budget and stop rule on both sides.
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    single, batched = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for r in requests:
            engine.generate([r], params)
        single.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        engine.generate(requests, params)
        batched.append(time.perf_counter() - t0)
    s, b = statistics.median(single), statistics.median(batched)
    print(f"{args.requests} requests x {args.new_tokens} new tokens, tiny Qwen3-VL on CPU")
    print(f"one generate per request : {s:7.2f} s")
    print(f"one batched generate     : {b:7.2f} s")
    print(f"speed-up                 : {s / b:7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
