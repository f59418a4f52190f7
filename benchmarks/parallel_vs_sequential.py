"""Side-by-side: K crops issued in one turn (parallel) vs. one crop per turn (sequential).

The real agent loop runs on needle prompts with a scripted policy that crops the same K windows
(the video's K equal parts) either all at once or one per turn, then answers. A metering engine
wraps the script: for every generation request it counts the tokens a transformers engine
processes (the whole context is re-encoded each round, then the new tokens are decoded) and
times one forward pass of the tiny Qwen3-VL over those same tokens, vision included.
The paper's argument: parallel dispatch avoids re-reading a context that grows with each turn.

    python benchmarks/parallel_vs_sequential.py [--prompts 4] [--crops 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.agent.tools import CropConfig
from paravt.data.datasets import load_samples
from paravt.models.qwen_vl import mm_token_type_ids, visual_kwargs
from paravt.models.tiny import TinyModelConfig, build_tiny_model
from paravt.rollout.engine import GenerationOutput, GenerationRequest, SamplingParams
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader
from paravt.video.synthetic import NeedleConfig, generate


def responder(samples, crops: int, parallel: bool):
    """Crop the video's `crops` equal parts, all in the first turn or one per turn, then answer."""
    by_question = {s.question: s for s in samples}

    def respond(context: str) -> str:
        sample = next(s for q, s in by_question.items() if q in context)
        d = float(sample.extra.get("duration", 64.0))
        parts = [(d * i / crops, d * (i + 1) / crops) for i in range(crops)]
        done = context.count("<tool_response>")
        if done >= crops:
            return f"The crops show it.</think>\n<answer>{sample.answer}</answer>"
        todo = parts if parallel else parts[done : done + 1]
        return "Crop.</think>\n" + "\n".join(call_text(s, e) for s, e in todo)

    return respond


@dataclass
class Meter:
    prefill: int = 0
    decode: int = 0
    calls: int = 0
    forward_s: float = 0.0


class MeteredEngine:
    """The script's text, plus the cost a re-encoding transformers engine pays for it."""

    def __init__(self, scripted: ScriptedEngine, model, tokenizer) -> None:
        self.scripted, self.model, self.meter = scripted, model, Meter()
        self.image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.video_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")
        self.weight_version = 0

    @torch.no_grad()
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[GenerationOutput]]:
        outputs = self.scripted.generate(requests, params)
        for req, outs in zip(requests, outputs, strict=True):
            new = outs[0].token_ids
            self.meter.prefill += len(req.token_ids)
            self.meter.decode += len(new)
            self.meter.calls += 1
            ids = torch.tensor([list(req.token_ids) + list(new)])  # [1, T]
            t0 = time.perf_counter()
            self.model(
                input_ids=ids,
                mm_token_type_ids=mm_token_type_ids(ids, self.image_id, self.video_id),
                **visual_kwargs(req.visuals, "cpu"),
            )
            self.meter.forward_s += time.perf_counter() - t0
        return outputs


def run(loop_parts, samples, crops: int, parallel: bool) -> tuple[Meter, float, int]:
    model, processor = loop_parts
    tok = processor.tokenizer
    engine = MeteredEngine(ScriptedEngine(tok, responder(samples, crops, parallel)), model, tok)
    cfg = AgentConfig(max_rounds=crops + 1, max_total_tokens=32768)
    crop = CropConfig(max_calls_per_turn=5 if parallel else 1)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg, crop)
    t0 = time.perf_counter()
    trajs = loop.run(samples, [8] * len(samples), 1, SamplingParams(max_new_tokens=256))
    wall = time.perf_counter() - t0
    assert all(t.num_tool_responses == crops for t in trajs), [t.num_tool_responses for t in trajs]
    return engine.meter, wall, sum(len(t.token_ids) for t in trajs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--crops", type=int, default=3)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "model", TinyModelConfig("qwen3_vl"))
        processor = AutoProcessor.from_pretrained(path)
        model = AutoModelForImageTextToText.from_pretrained(path).eval()
        generate(NeedleConfig(num_train=args.prompts, num_eval=0), Path(tmp) / "data")
        samples, _ = load_samples(Path(tmp) / "data" / "train.jsonl")
        rows = {}
        for name, parallel in (("parallel", True), ("sequential", False)):
            rows[name] = run((model, processor), samples, args.crops, parallel)
    n = len(samples)
    print(f"{n} needle prompts, K={args.crops} crops each, tiny Qwen3-VL on CPU; per trajectory:")
    print(
        f"{'dispatch':<12}{'rounds':>7}{'prefill':>9}{'decode':>8}{'processed':>10}"
        f"{'final len':>10}{'forward s':>10}{'loop s':>8}"
    )
    for name, (m, wall, final) in rows.items():
        print(
            f"{name:<12}{m.calls / n:>7.1f}{m.prefill / n:>9.0f}{m.decode / n:>8.0f}"
            f"{(m.prefill + m.decode) / n:>10.0f}{final / n:>10.0f}"
            f"{m.forward_s / n:>10.2f}{wall / n:>8.2f}"
        )
    (mp, wp, _), (ms, ws, _) = rows["parallel"], rows["sequential"]
    tokens = (ms.prefill + ms.decode) / (mp.prefill + mp.decode)
    print(
        f"sequential / parallel: tokens processed {tokens:.2f}x, "
        f"forward time {ms.forward_s / mp.forward_s:.2f}x, loop wall time {ws / wp:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
