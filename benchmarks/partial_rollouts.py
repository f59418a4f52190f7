"""Side-by-side: sync, async, and async + partial rollouts on a long-tailed turn count.

Most trajectories end after 1 or 2 turns, a tail takes 4 to 6 (`turns_of`: 40 % 1, 40 % 2, 7 %
4, 7 % 5, 6 % 6 turns, fixed per trajectory). The turn count is scripted (`TurnScript`): every
turn is sampled by the real tiny Qwen3-VL with the real transformers engine, batched as the agent
loop batches it (its cost and its weight version are real), then the engine's tokens are
replaced by a scripted turn of the same length (a crop call, or the answer) so that the number of
turns is the one drawn; crops run for real. The trainer makes one real update per step on the
tiny model (a no-grad proximal pass, then the decoupled PPO loss's forward and backward and an
AdamW step) and publishes its weights as `rollout.mode=async` does (`SharedWeights`). Async modes
use the real generator process (`AsyncGenerator`, `serve_steps` or `serve_partial`), the
staleness gate (`last_startable_step`, `--max-staleness`, default 1) and the cores split in
two.

Printed per mode: steps per minute (after `--warmup` steps: spawning and start-up are left out),
the trainer's idle fraction (time waiting for rollouts / wall time), the share of trained tokens
sampled by an older policy than the trainer's, the share of trajectories with tokens of two
policies, and the generator's busy time per step. The log-probs of the scripted tokens are 0, so
nothing here learns: it measures the schedule only.

    python benchmarks/partial_rollouts.py [--steps 10] [--warmup 2] [--prompts 2] [--group 4]
        [--max-staleness 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import zlib
from dataclasses import replace
from pathlib import Path

import torch

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.agent.tools import CropConfig
from paravt.generator.async_rollouts import split_cores
from paravt.generator.worker import AsyncGenerator, GeneratorSpec, GenTask
from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.models.loading import PolicySpec, load_policy
from paravt.rl.losses import decoupled_ppo_loss
from paravt.rollout.engine import EngineConfig, GenerationOutput, SamplingParams
from paravt.rollout.engines.hf import TransformersEngine
from paravt.rollout.sync.shared_weights import SharedWeights
from paravt.rollout.sync.staleness import last_startable_step, version_metrics
from paravt.video.reader import VideoReader

AGENT = AgentConfig(max_rounds=5, max_new_tokens=48, max_total_tokens=8192)


def turns_of(name: str) -> int:
    """The scripted number of turns of trajectory `name` (most 1-2, a tail of 4-6)."""
    h = zlib.crc32(name.encode()) % 100
    return 1 if h < 40 else 2 if h < 80 else 4 if h < 87 else 5 if h < 94 else 6


class TurnScript:
    """An engine that samples with the real engine and answers with a scripted turn."""

    def __init__(self, engine, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def sync_weights(self, policy, version: int) -> None:
        self.engine.sync_weights(policy, version)

    def _turn(self, request) -> list[int]:
        done = self.tokenizer.decode(list(request.token_ids)).count("<tool_response>")
        if done + 1 < turns_of(request.name):
            text = "look</think>\n" + call_text(2.0 * done, 2.0 * done + 4.0)
        else:
            text = "done</think>\n<answer>A</answer>"
        return self.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]

    def generate(self, requests, params):
        turns = [self._turn(r) for r in requests]
        longest = max((len(t) for t in turns), default=1)
        self.engine.generate(requests, replace(params, max_new_tokens=longest))  # the real cost
        return [[GenerationOutput(tuple(t), (0.0,) * len(t), "stop")] for t in turns]


def scripted_main(*args) -> None:
    """The generator process of the benchmark: `generator_main` with its engine scripted."""
    from paravt.generator import worker as async_worker

    build = async_worker._build

    def scripted_build(spec, weights, device="cpu", stack=None):
        model, engine, agent = build(spec, weights, device, stack)
        agent.engine = TurnScript(engine, agent.tokenizer)
        return model, agent.engine, agent

    async_worker._build = scripted_build  # this child only: the benchmark's engine wrapper
    async_worker.generator_main(*args)


def samples_of(data_dir: Path, steps: int, prompts: int):
    """`prompts` distinct prompts per step (the needle videos reused under new ids)."""
    from paravt.data.datasets import load_samples
    from paravt.video.synthetic import NeedleConfig, ensure_needle_data

    ensure_needle_data(NeedleConfig(num_train=4, num_eval=1, duration=16.0), data_dir)
    base, _ = load_samples(data_dir / "train.jsonl")
    return [
        tuple(replace(base[(s + b) % len(base)], id=f"p{s}_{b}") for b in range(prompts))
        for s in range(steps)
    ]


class Trainer:
    """The tiny policy, its optimizer and one update per step."""

    def __init__(self, spec: PolicySpec):
        self.policy, self.processor = load_policy(spec)
        self.policy.train()
        self.opt = torch.optim.AdamW(
            [p for p in self.policy.parameters() if p.requires_grad], lr=1e-5
        )
        self.ids = TokenIds.from_tokenizer(self.processor.tokenizer)
        self.version = 0

    def update(self, trajs) -> float:
        t0 = time.perf_counter()
        adv = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(trajs))])
        with torch.no_grad():
            prox, _, _ = trajectory_logprobs(self.policy, trajs, self.ids, only_trained=True)
        logp, batch, _ = trajectory_logprobs(self.policy, trajs, self.ids, only_trained=True)
        loss, _ = decoupled_ppo_loss(logp, prox, batch.old_logp, adv, batch.loss_mask)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.version += 1
        return time.perf_counter() - t0


def task(step: int, prompts, group: int) -> GenTask:
    params = SamplingParams(temperature=1.0, seed=step)
    return GenTask(step, prompts[step], (4,) * len(prompts[step]), group, params)


def summary(ends, waits, stale, mixed, busy, updates, warmup: int) -> dict[str, float]:
    print(f"  step ends (s): {[round(e - ends[0], 1) for e in ends]}", flush=True)
    wall = ends[-1] - ends[warmup - 1]
    n = len(ends) - warmup
    return {
        "steps/min": 60 * n / wall,
        "trainer idle frac": sum(waits[warmup:]) / wall,
        "older-policy tokens": sum(stale[warmup:]) / n,
        "mixed trajectories": sum(mixed[warmup:]) / n,
        "generator s/step": sum(busy[warmup:]) / n,
        "trainer update s/step": sum(updates[warmup:]) / n,
    }


def run_sync(spec: PolicySpec, prompts, group: int, warmup: int) -> dict[str, float]:
    """Generation, then the update, in this process, with one torch thread (as each side of
    the async modes has): on a shared 2-core machine two threads per op of a model this small
    spend their time waiting on each other (a first run here: 94 s of generation a step with 2
    threads, against 5 s for the async generator on 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _sync_steps(spec, prompts, group, warmup)
    finally:
        torch.set_num_threads(threads)


def _sync_steps(spec: PolicySpec, prompts, group: int, warmup: int) -> dict[str, float]:
    trainer = Trainer(spec)
    tok = trainer.processor.tokenizer
    engine = TurnScript(TransformersEngine(trainer.policy, tok), tok)
    agent = AgentLoop(engine, ChatRenderer(trainer.processor), VideoReader(), AGENT, CropConfig())
    ends, waits, stale, mixed, busy, updates = [], [], [], [], [], []
    for step in range(len(prompts)):
        engine.sync_weights(trainer.policy, trainer.version)
        t0 = time.perf_counter()
        t = task(step, prompts, group)
        trajs = list(agent.run(list(t.samples), list(t.budgets), group, t.params))
        waits.append(time.perf_counter() - t0)  # the trainer has nothing to do meanwhile
        busy.append(waits[-1])
        m = version_metrics(trajs, trainer.version)
        stale.append(m["rollout/stale_token_frac"])
        mixed.append(m["rollout/mixed_version_frac"])
        updates.append(trainer.update(trajs))
        ends.append(time.perf_counter())
    return summary(ends, waits, stale, mixed, busy, updates, warmup)


def run_async(spec: PolicySpec, prompts, group: int, warmup: int, partial: bool, staleness: int):
    trainer = Trainer(spec)
    cores = sorted(os.sched_getaffinity(0))
    mine, theirs = split_cores(cores, None)
    ctx = torch.multiprocessing.get_context("spawn")
    weights = SharedWeights.create(trainer.policy, 0, ctx)
    gen_spec = GeneratorSpec(
        policy=spec,
        engine=EngineConfig(),
        agent=AGENT,
        crop=CropConfig(),
        cores=tuple(theirs),
        threads=len(theirs),
        partial=partial,
    )
    gen = AsyncGenerator(gen_spec, weights, max_pending=staleness + 1, main=scripted_main)
    os.sched_setaffinity(0, set(mine))
    torch.set_num_threads(len(mine))
    ends, waits, stale, mixed, busy, updates = [], [], [], [], [], []
    submitted = 0
    try:
        for step in range(len(prompts)):
            weights.publish(trainer.policy, trainer.version)
            while submitted <= min(last_startable_step(step, staleness, 1), len(prompts) - 1):
                gen.submit(task(submitted, prompts, group))
                submitted += 1
            result, waited = gen.take(step)
            waits.append(waited)
            busy.append(result.busy_s)
            m = version_metrics(result.trajectories, trainer.version)
            stale.append(m["rollout/stale_token_frac"])
            mixed.append(m["rollout/mixed_version_frac"])
            if trainer.version - result.version > staleness:
                raise RuntimeError(f"step {step}: the staleness bound was broken")
            updates.append(trainer.update(list(result.trajectories)))
            ends.append(time.perf_counter())
    finally:
        gen.close()
        os.sched_setaffinity(0, set(cores))
        torch.set_num_threads(len(cores))
    return summary(ends, waits, stale, mixed, busy, updates, warmup)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the figures")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step (B)")
    p.add_argument("--group", type=int, default=4, help="rollouts per prompt (G)")
    p.add_argument("--max-staleness", type=int, default=1, help="of both async modes")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        spec = PolicySpec(path=str(Path(tmp) / "tiny"), build_tiny="qwen3_vl")
        load_policy(spec)  # build the tiny checkpoint once
        prompts = samples_of(Path(tmp) / "needle", args.steps, args.prompts)
        turns = [
            turns_of(f"trajectory {s.id}#{g}")
            for ps in prompts
            for s in ps
            for g in range(args.group)
        ]
        rows = {}
        for mode in ("sync", "async", "async+partial"):
            print(f"{mode}: {args.steps} steps", flush=True)
            if mode == "sync":
                rows[mode] = run_sync(spec, prompts, args.group, args.warmup)
            else:
                partial = mode == "async+partial"
                rows[mode] = run_async(
                    spec, prompts, args.group, args.warmup, partial, args.max_staleness
                )
    hist = {n: turns.count(n) for n in sorted(set(turns))}
    print(f"turns per trajectory (count): {hist}; {args.prompts} x {args.group} rollouts a step")
    print(f"{'':<22}" + "".join(f"{m:>15}" for m in rows))
    for key in rows["sync"]:
        print(f"{key:<22}" + "".join(f"{rows[m][key]:>15.3f}" for m in rows))
    a, pa, s = rows["async"], rows["async+partial"], rows["sync"]
    print(f"async/sync steps per minute: {a['steps/min'] / s['steps/min']:.2f}x")
    print(f"async+partial/async steps per minute: {pa['steps/min'] / a['steps/min']:.2f}x")
    print(
        f"trainer idle fraction async -> async+partial: {a['trainer idle frac']:.3f} -> "
        f"{pa['trainer idle frac']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
