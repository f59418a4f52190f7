"""One rank of the distributed tests: `python worker.py SCENARIO MODEL_DIR OUT_DIR [CKPT_DIR]`.

Launched W times by `tests/distributed/launch.py` (RANK / WORLD_SIZE / MASTER_* in the
environment, gloo on CPU). Each rank writes what it saw to OUT_DIR/rank{r}.pt; the tests assert
on those files. `train_steps` is also run in the test process itself (one rank, no FSDP) as the
reference the sharded run must reproduce.

The loop is a real PARA-GRPO update in miniature: a global batch of B prompts x G synthetic
trajectories per step, group advantages (`compute_advantages`), the PPO loss of `paravt.rl`
with token-mean aggregation over the global batch, token-budget micro-batches padded to equal
counts across ranks, gradient clipping, AdamW.
"""

from __future__ import annotations

import os
import random
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.parallel.collectives import leave_group
from paravt.parallel.distributed import (
    Rank,
    generate_sync_kwargs,
    global_sum,
    pad_micro_batches,
    shard_prompts,
    token_loss_scale,
)
from paravt.rl.losses import get_policy_loss
from paravt.rl.microbatch import token_budget_chunks
from paravt.rl.objective import AdvantageConfig, compute_advantages
from paravt.types import Trajectory

PROMPTS, B, G = 12, 4, 2  # a pool of prompts; B prompts x G rollouts per global step
MICRO_TOKENS = 48
LR = 1e-3


def load(model_dir: str):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    return model, AutoProcessor.from_pretrained(model_dir)


def step_prompts(step: int) -> list[int]:
    """The global batch of `step`: a seeded permutation of the pool, B at a time."""
    per_epoch = PROMPTS // B
    order = list(range(PROMPTS))
    random.Random(1000 + step // per_epoch).shuffle(order)
    k = step % per_epoch
    return order[k * B : (k + 1) * B]


def trajectories(prompt: int, step: int) -> list[Trajectory]:
    """G text-only rollouts of `prompt` at `step`, of varied lengths (ids avoid special tokens)."""
    out = []
    for g in range(G):
        rng = random.Random(prompt * 7919 + step * 104729 + g)
        plen, rlen = rng.randint(3, 6), rng.randint(2, 14)
        ids = tuple(rng.randrange(10, 480) for _ in range(plen + rlen))
        mask = (0,) * plen + (1,) * rlen
        out.append(Trajectory(f"p{prompt}", g, ids, mask, (0.0,) * len(ids), (), plen))
    return out


def reward(traj: Trajectory) -> float:
    return float(sum(traj.token_ids) % 5) / 4.0


def update(model, opt, trajs: list[Trajectory], adv: torch.Tensor, ids: TokenIds) -> int:
    """One optimiser step over this rank's trajectories; returns the micro-batch count run."""
    me = Rank.current()
    lengths = [len(t.token_ids) for t in trajs]
    total = global_sum(sum(t.num_trained_tokens for t in trajs))
    micro = pad_micro_batches(token_budget_chunks(lengths, MICRO_TOKENS))
    loss_fn = get_policy_loss("ppo")
    for mb in micro:
        chosen = [trajs[i] for i in mb.indices]
        logp, batch, _ = trajectory_logprobs(model, chosen, ids)
        mask = batch.loss_mask
        a = adv[list(mb.indices)]
        loss, _ = loss_fn(logp, logp.detach(), logp.detach(), a, mask, 0.2, 0.2)
        n = sum(t.num_trained_tokens for t in chosen)
        scale = 0.0 if mb.dummy else token_loss_scale(n, total, me.world_size)
        (loss * scale).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return len(micro)


def train_steps(model, opt, ids: TokenIds, start: int, stop: int, seen: list) -> None:
    me = Rank.current()
    for step in range(start, stop):
        mine = shard_prompts(step_prompts(step), me.rank, me.world_size)
        seen.append((step, tuple(mine)))
        trajs = [t for p in mine for t in trajectories(p, step)]
        rewards = torch.tensor([reward(t) for t in trajs]).view(len(mine), G)
        adv = compute_advantages(rewards, AdvantageConfig(shaping=False, batch_norm=False)).values
        update(model, opt, trajs, adv, ids)


def full_weights(model) -> dict[str, torch.Tensor]:
    from paravt.rollout.sync.weight_sync import iter_weights

    own = iter_weights(model, device="cpu", merge_lora=False)  # a LoRA policy: factors kept
    return {n: t.clone() for bucket in own for n, t in bucket}


def _shard_report(model, reference, before: dict) -> dict:
    from paravt.parallel.fsdp import decoder_layers, local_numel

    layer = decoder_layers(model)[0]
    return {
        "policy_full": sum(p.numel() for p in model.parameters()),
        "policy_local": local_numel(model),
        "reference_full": sum(p.numel() for p in reference.parameters()),
        "reference_local": local_numel(reference),
        "layer_param_type": type(next(layer.parameters())).__name__,
        "before": before,
    }


def scenario_train(model_dir: str, out: Path, ckpt: Path) -> dict:
    from paravt.parallel.fsdp import export_hf, save_checkpoint, shard_policy
    from paravt.rollout.sync.weight_sync import iter_weights

    model, processor = load(model_dir)
    reference, _ = load(model_dir)
    reference.requires_grad_(False).eval()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    before = {"policy_local": sum(p.numel() for p in model.parameters())}
    shard_policy(model, activation_checkpointing=False)
    shard_policy(reference)
    res = _shard_report(model, reference, before)
    buckets = list(iter_weights(model, 64 << 10, "cpu"))
    res["bucket_sizes"] = [sum(t.numel() * t.element_size() for _, t in b) for b in buckets]
    gathered = {n: t for b in buckets for n, t in b}
    res["full_keys_match"] = sorted(gathered) == sorted(original)
    res["full_max_diff"] = max(float((gathered[k] - v).abs().max()) for k, v in original.items())
    del buckets, gathered
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    seen: list = []
    train_steps(model, opt, ids, 0, 2, seen)
    res["weights_2"] = full_weights(model)
    # Only state shared by every rank goes into `extra` (rank 0 writes it): the global step.
    save_checkpoint(ckpt, model, opt, extra={"step": 2})
    train_steps(model, opt, ids, 2, 4, seen)
    res["weights_4"] = full_weights(model)
    res["seen"] = seen
    res |= _engine_and_full_state(model_dir, model, opt, res["weights_4"])
    export_hf(model, processor, out / "hf")
    res |= scenario_uneven(model, processor, ids, opt)
    # The resume: a fresh model and optimiser restored from the step-2 checkpoint on disk (one
    # launch serves both: nothing of the run above is reused but the process group).
    res["resume"] = scenario_resume(model_dir, out, ckpt)
    return res


def _engine_and_full_state(model_dir: str, model, opt, weights: dict) -> dict:
    """An unsharded engine copy filled bucket by bucket; the full (rank-0 style) train state."""
    from paravt.parallel.distributed import load_buckets
    from paravt.parallel.fsdp import train_state
    from paravt.rollout.sync.weight_sync import iter_weights

    engine, _ = load(model_dir)
    copied = load_buckets(engine, iter_weights(model, 32 << 10, "cpu"))
    full = train_state(model, opt, full=True)  # rank 0 holds it; the others get empty dicts
    res = {
        "engine_copied": copied,
        "engine_diff": max(
            float((engine.state_dict()[k] - v).abs().max()) for k, v in weights.items()
        ),
        "full_state_sizes": (len(full["model"]), len(full["optimizer"].get("state", {}))),
    }
    if Rank.current().rank == 0:
        res["full_state_diff"] = max(
            float((full["model"][k] - v).abs().max()) for k, v in weights.items()
        )
        res["full_state_is_plain"] = all(type(v) is torch.Tensor for v in full["model"].values())
    return res


def scenario_resume(model_dir: str, out: Path, ckpt: Path) -> dict:
    from paravt.parallel.fsdp import load_checkpoint, shard_policy

    model, processor = load(model_dir)
    shard_policy(model)
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    extra = load_checkpoint(ckpt, model, opt)
    seen: list = []
    train_steps(model, opt, ids, extra["step"], 4, seen)
    return {"weights_4": full_weights(model), "seen": seen, "resumed_at": extra["step"]}


def scenario_uneven(model, processor, ids: TokenIds, opt) -> dict:
    """Rank 1 generates 12x more tokens and runs 3x the micro-batches of rank 0: no hang."""
    me = Rank.current()
    tok = processor.tokenizer
    new_tokens = 2 if me.rank == 0 else 24
    prompt = torch.tensor([[11, 12, 13, 14]])
    with torch.no_grad():
        seq = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            **generate_sync_kwargs(model),
        )
    n = 1 if me.rank == 0 else 6
    trajs = [t for p in range(n) for t in trajectories(p, 99)]
    adv = torch.linspace(-1, 1, len(trajs))
    count = update(model, opt, trajs, adv, ids)
    return {"generated": seq.shape[1] - prompt.shape[1], "micro_batches": count}


def scenario_lightning(model_dir: str, out: Path, ckpt: Path) -> dict:
    """The same 2 steps through Lightning's ModelParallelStrategy (trainer=fsdp_cpu's class)."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.utils.data import DataLoader

    from paravt.parallel.fsdp import shard_policy

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.policy, processor = load(model_dir)
            self.ids = TokenIds.from_tokenizer(processor.tokenizer)
            self.seen: list = []

        def configure_model(self):
            shard_policy(self.policy, self.device_mesh["data_parallel"])

        def configure_optimizers(self):
            return torch.optim.AdamW(
                [p for p in self.policy.parameters() if p.requires_grad], lr=LR
            )

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            return batch

        def training_step(self, batch, batch_idx):
            step = int(batch)  # the global step: every rank reads the same loader
            train_steps(self.policy, self.optimizers(), self.ids, step, step + 1, self.seen)

    module = Module()
    strategy = ModelParallelStrategy(2, 1, process_group_backend="gloo")  # 2-way data parallel
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        default_root_dir=str(out),
    )
    trainer.fit(module, DataLoader(list(range(2)), batch_size=None))
    res = {"weights_2": full_weights(module.policy), "seen": module.seen}
    res["layer_param_type"] = type(next(module.policy.model.language_model.parameters())).__name__
    return res


# ---- GRPOModule itself under Lightning's ModelParallelStrategy -------------------------------
def rollout_batches(model_dir: str, samples, steps: int, group: int) -> list:
    """`steps` RolloutBatches of real rollouts (the tiny model, the agent loop, real videos),
    sampled once so that a 1-rank and a 2-rank update see the very same trajectories."""
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.hf import TransformersEngine
    from paravt.rollout.records import RolloutBatch
    from paravt.video.reader import VideoReader

    model, processor = load(model_dir)
    engine = TransformersEngine(model, processor.tokenizer)
    cfg = AgentConfig(max_rounds=1, max_new_tokens=24)
    agent = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)
    out = []
    for step in range(steps):
        params = SamplingParams(temperature=1.0, seed=step)
        trajs = agent.run(samples, [4] * len(samples), group, params)
        durations = tuple(agent.source.info(s.video).duration for s in samples)
        budgets = (4,) * len(samples)
        out.append(
            RolloutBatch(
                step, 0, tuple(samples), budgets, tuple(trajs), group, 1.0, 0, 0, durations
            )
        )
    return out


def rank_share(batch, rank: int, world: int):
    """Rank `rank`'s prompts of `batch` with their groups (what the RolloutDataModule serves)."""
    from dataclasses import replace

    mine = shard_prompts(range(len(batch.samples)), rank, world)
    g = batch.group_size
    return replace(
        batch,
        samples=tuple(batch.samples[i] for i in mine),
        budgets=tuple(batch.budgets[i] for i in mine),
        durations=tuple(batch.durations[i] for i in mine),
        trajectories=tuple(t for i in mine for t in batch.trajectories[i * g : (i + 1) * g]),
    )


def without_variance(batch, step: int, prompts: int):
    """`batch` as step `step` with the first `prompts` groups made of one repeated rollout:
    zero reward variance, so those groups are dropped and their rank has nothing to train."""
    from dataclasses import replace

    g = batch.group_size
    trajs = list(batch.trajectories)
    for i in range(prompts):
        trajs[i * g : (i + 1) * g] = [trajs[i * g]] * g
    return replace(batch, step=step, trajectories=tuple(trajs))


def first_prompts(batch, step: int, prompts: int):
    """`batch` as step `step` with its first `prompts` prompts only (an odd global batch)."""
    from dataclasses import replace

    g = batch.group_size
    return replace(
        batch,
        step=step,
        samples=batch.samples[:prompts],
        budgets=batch.budgets[:prompts],
        durations=batch.durations[:prompts],
        trajectories=batch.trajectories[: prompts * g],
    )


def _rogue_collective() -> str:
    """What the checked layer says to a CPU float64 tensor made by hand (the old code's)."""
    from paravt.parallel import collectives

    try:
        collectives.all_reduce(torch.tensor([1.0], dtype=torch.float64))
    except collectives.CollectiveError as error:
        return str(error)
    return "accepted"


def scenario_grpo(model_dir: str, out: Path, batches_path: Path) -> dict:
    """2 PARA-GRPO steps of GRPOModule (KL on, anchor on, many micro-batches) on this rank's
    share of fixed rollout batches, through a Lightning Trainer on `WORLD_SIZE` CPU processes."""
    from functools import partial

    from paravt.models.loading import PolicySpec
    from paravt.modules.grpo import GRPOModule
    from paravt.rewards.compose import RewardWeights
    from paravt.rl.algorithm import AlgorithmConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    batches = torch.load(batches_path, weights_only=False)
    advantage = AdvantageConfig(shaping=False, batch_norm=False, drop_zero_variance=True)
    algo = AlgorithmConfig(advantage, kl_coef=0.05, anchor_coef=0.1, micro_batch_tokens=2048)
    # 2 ranks: the meta-device path (rank 0 alone loads, then fills every rank's shards).
    opt = partial(torch.optim.AdamW, lr=LR)
    spec = PolicySpec(path=model_dir)
    module = GRPOModule(spec, algo, RewardWeights(), opt, init_on_meta=world > 1)

    _, record = fit_on_ranks(module, batches, world, out)
    res = {"weights": full_weights(module.policy), "metrics": record.metrics}
    res["trajectories"] = record.trajectories
    if world > 1:
        res["rogue_collective"] = _rogue_collective()
    res["policy_local"] = _local(module.policy)
    res["reference_local"] = _local(module.reference)
    res["full"] = sum(p.numel() for p in module.reference.parameters())
    res["buffers"] = {n: b.clone() for n, b in module.policy.named_buffers()}
    return res


def fit_on_ranks(module, batches, world: int, out: Path):
    """Fit `module` one step per batch, each rank on its `rank_share`, on `world` CPU ranks
    (FSDP2 over gloo when > 1); (the trainer, per-step logged metrics and trajectory counts)."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy

    class Batches(pl.LightningDataModule):
        def train_dataloader(self):
            from torch.utils.data import DataLoader

            mine = [rank_share(b, self.trainer.global_rank, world) for b in batches]
            return DataLoader(mine, batch_size=None, collate_fn=_identity)

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            return batch

    class Record(pl.Callback):
        def __init__(self):
            self.metrics: list[dict[str, float]] = []
            self.trajectories: list[int] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.metrics.append({k: float(v) for k, v in trainer.logged_metrics.items()})
            self.trajectories.append(len(batch.trajectories))

    record = Record()
    strategy = "auto"
    if world > 1:
        strategy = ModelParallelStrategy(world, 1, process_group_backend="gloo")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_steps=len(batches),
        logger=False,
        callbacks=[record],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        default_root_dir=str(out),
    )
    trainer.fit(module, datamodule=Batches())
    return trainer, record


def _identity(item):
    return item


def _local(model) -> int:
    from paravt.parallel.fsdp import local_numel

    return local_numel(model)


def scenario_leave(wait: bool, out: Path, result: dict | None = None) -> None:
    """Rank 1 is slow to finish; rank 0 leaves the group waiting for it or not. Each rank
    writes when it arrived at `leave_group` and when it left, then `result` for launch()."""
    import time

    rank = dist.get_rank()
    if rank == 1:
        time.sleep(2.0)  # still saving its results
    arrived = time.time()
    leave_group(wait_for_peers=wait or rank == 1)
    (out / f"left{rank}.txt").write_text(f"{arrived} {time.time()}")
    torch.save(result or {}, out / f"rank{rank}.pt")  # what launch() collects


def scenario_each() -> dict:
    """What `on_rank0_each` hands this rank: rank 0's whole batch split in parts (3 each), then
    rank 0's error."""
    from paravt.parallel.collectives import on_rank0_each

    rank, calls = dist.get_rank(), []

    def fetch():
        calls.append(rank)
        return list(range(10, 16))  # the whole batch, made on rank 0 only

    def fails():
        raise ValueError("the generator failed")

    got = on_rank0_each(fetch, lambda whole, r: whole[3 * r : 3 * r + 3])
    try:
        on_rank0_each(fails, lambda whole, r: whole)
        error = None
    except ValueError as e:
        error = str(e)
    return {"got": got, "calls": calls, "error": error, "settle": _settle_after_rank1_fails()}


def _settle_after_rank1_fails() -> str | None:
    """`settle_ranks` after rank 1's rollouts raised (an in-process engine's, say): what this
    rank raised there (rank 1 raises its own error afterwards, not this)."""
    from paravt.parallel.collectives import settle_ranks

    mine = RuntimeError("vLLM died") if dist.get_rank() == 1 else None
    try:
        settle_ranks(mine)
    except RuntimeError as e:
        return str(e)
    return None


def scenario_server_faults(url: str) -> dict:
    """Two ranks on one rollout server (`url`): rank 1's rollouts fail (a server died under
    it) while rank 0's do not, then rank 0's weight sync fails (a checkpoint the manifest
    refuses). Each rank's outcome of both: every rank must leave with an error naming the
    cause, none left waiting in a collective."""
    from paravt.rollout.engine import EngineConfig
    from paravt.rollout.serving.client import RolloutServerError, ServerEngine

    cfg = EngineConfig(name="vllm_server", dtype="float32", max_model_len=4096)
    engine = ServerEngine([url], cfg, manifest={"lm_head.weight": (9, 9)}, started=True)
    rank, got = dist.get_rank(), {"before": engine.weight_version}
    died = RolloutServerError("rollout server http://gen1:8000 failed during /generate")
    try:
        engine.settle(died if rank == 1 else None)  # rank 1 raises its own error after it
        got["settle"] = None
    except RolloutServerError as e:
        got["settle"] = str(e)
    try:
        engine.sync_weights(torch.nn.Linear(3, 3), version=got["before"] + 1)
        got["sync"] = None
    except Exception as e:
        got["sync"] = f"{type(e).__name__}: {e}"
    got["after"] = engine.weight_version
    return got


SCENARIOS = {"train": scenario_train, "lightning": scenario_lightning}


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    scenario, model_dir, out = argv[0], argv[1], Path(argv[2])
    ckpt = Path(argv[3]) if len(argv) > 3 else out / "ckpt"
    if scenario in ("lightning", "grpo", "lora"):  # Lightning sets up (owns) the process group
        from lora_worker import run as scenario_lora  # tests/distributed/lora_worker.py

        run = {"lightning": scenario_lightning, "grpo": scenario_grpo, "lora": scenario_lora}
        run = run[scenario]
        res = run(model_dir, out, ckpt)
        torch.save(res, out / f"rank{int(os.environ.get('RANK', '0'))}.pt")
        leave_group()  # as train.py does after its job
        return
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    if scenario == "leave":  # leave_group's barrier: model_dir is "wait" or "nowait"
        scenario_leave(model_dir == "wait", out)
        return
    if scenario == "server_faults":  # model_dir: a rollout server's URL
        torch.save(scenario_server_faults(model_dir), out / f"rank{dist.get_rank()}.pt")
        leave_group()
        return
    if scenario == "each":  # on_rank0_each, then leave_group with a slow peer (model_dir unused)
        scenario_leave(True, out, scenario_each())
        return
    try:
        if scenario == "precision":  # tests/distributed/precision_worker.py
            sys.path.insert(0, str(Path(__file__).parent))
            from precision_worker import run as precision

            res = precision(model_dir)
        elif scenario == "packed":  # tests/distributed/packed_worker.py
            sys.path.insert(0, str(Path(__file__).parent))
            from packed_worker import run as packed

            res = packed(model_dir)
        elif scenario == "sync_gather":  # tests/distributed/sync_worker.py
            sys.path.insert(0, str(Path(__file__).parent))
            from sync_worker import run as sync_gather

            res = sync_gather(model_dir)
        elif scenario == "setup_once":  # tests/distributed/setup_worker.py
            sys.path.insert(0, str(Path(__file__).parent))
            from setup_worker import run as setup_once

            res = setup_once(model_dir)  # here: the training prompts' file
        else:
            res = SCENARIOS[scenario](model_dir, out, ckpt)
        torch.save(res, out / f"rank{dist.get_rank()}.pt")
    except BaseException:
        leave_group(wait_for_peers=False)
        raise
    leave_group()  # every rank saved before any closes the transport


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1:])
