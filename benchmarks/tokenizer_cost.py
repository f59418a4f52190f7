"""What Qwen's real vocabulary costs the tiny model: the same work on both tokenizers, side by side.

Builds the tiny Qwen3-VL twice with the same sizes (`tokenizer=tiny`: 512 rows; `tokenizer=qwen`:
151,936 rows), records one scripted trajectory per model with the real agent loop (one parallel
crop round and an answer), then times, alternating A/B so both see the same machine load:
  - train: teacher-forced log-probs of a batch + backward, the lm_head run over the trained
    tokens only (what the cold-start SFT and the RL update do)
  - train-all: the same with the lm_head over every token (the path before that change)
  - generate: the transformers engine sampling `--new-tokens` tokens for the same batch
and prints the median seconds of each and the qwen/tiny ratio, with the logits size per token.

    python benchmarks/tokenizer_cost.py [--repeats 3] [--batch 4] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def _trajectories(path: Path, sample, batch: int):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.scripts import call_text
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path)

    def respond(context: str) -> str:
        if "<tool_response>" not in context:
            return "Look.</think>\n" + call_text(0.0, 16.0) + call_text(16.0, 32.0)
        return "The square is red.</think>\n<answer>A</answer>"

    engine = ScriptedEngine(processor.tokenizer, respond)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=1))
    params = SamplingParams(greedy=True, max_new_tokens=200)
    return model, processor, loop.run([sample], [4], batch, params)


def _train_step(model, processor, trajs, only_trained: bool) -> float:
    from paravt.models.forward import TokenIds, trajectory_logprobs

    ids = TokenIds.from_tokenizer(processor.tokenizer)
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logp, batch, _ = trajectory_logprobs(model, trajs, ids, 1.0, only_trained=only_trained)
    (-logp[batch.loss_mask].mean()).backward()
    return time.perf_counter() - t0


def _generate(model, processor, trajs, new_tokens: int) -> float:
    from paravt.rollout import SamplingParams, build_engine
    from paravt.rollout.engine import GenerationRequest

    engine = build_engine("hf", model, processor)
    reqs = [GenerationRequest(t.token_ids[: t.prompt_length], t.visuals[:1]) for t in trajs]
    params = SamplingParams(temperature=1.0, seed=0, max_new_tokens=new_tokens)
    t0 = time.perf_counter()
    engine.generate(reqs, params)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    args = p.parse_args()

    from paravt.models.tiny import TinyModelConfig, build_tiny_model
    from paravt.video.synthetic import NeedleConfig, generate

    root = Path(tempfile.mkdtemp(prefix="tokenizer_cost_"))
    generate(NeedleConfig(num_train=1, num_eval=1, seed=0), root / "needle")
    from paravt.data.datasets import load_samples

    (sample,), _ = load_samples(root / "needle" / "train.jsonl")
    runs = {}
    for name in ("tiny", "qwen"):
        path = build_tiny_model(root / name, TinyModelConfig("qwen3_vl", tokenizer=name))
        runs[name] = _trajectories(path, sample, args.batch)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for name, (model, processor, trajs) in runs.items():
            for phase, only in (("train", True), ("train-all", False)):
                step = _train_step(model, processor, trajs, only)
                times.setdefault((name, phase), []).append(step)
            gen = _generate(model, processor, trajs, args.new_tokens)
            times.setdefault((name, "generate"), []).append(gen)
    tokens = {n: sum(len(t.token_ids) for t in r[2]) for n, r in runs.items()}
    print(f"batch {args.batch} trajectories, tokens {tokens}; medians of {args.repeats}")
    trained = {n: sum(t.num_trained_tokens for t in r[2]) for n, r in runs.items()}
    print(f"trained tokens {trained}")
    for phase in ("train", "train-all", "generate"):
        a = statistics.median(times[("tiny", phase)])
        b = statistics.median(times[("qwen", phase)])
        print(f"{phase:9s} tiny {a:7.3f} s   qwen {b:7.3f} s   qwen/tiny {b / a:5.2f}x")
    for name, (model, _, _) in runs.items():
        rows = model.get_output_embeddings().weight.shape[0]
        print(f"{name}: {rows} output rows, {rows * 4 / 1e6:.2f} MB of fp32 logits per token")


if __name__ == "__main__":
    main()
