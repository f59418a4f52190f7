"""`rollout.mode=async`: the RolloutDataModule's side of the asynchronous generator.

At the first step it publishes the policy into `SharedWeights`, splits the cores between the
trainer and a generator process (`paravt.generator.worker`), and from then on, at each
step t (after update t-1): publishes the new weights, submits the prompt batches of every step
the staleness gate lets start (`paravt.rollout.sync.staleness`), and takes step t's trajectories,
waiting only if they are not there yet. A batch that arrives more than `rollout.max_staleness`
updates behind the trainer is dropped (counted in `rollout/stale_dropped`) and regenerated
in-process with the current weights. With max_staleness = 0 nothing overlaps and the rollouts
are those of `rollout.mode=sync`.

Under an FSDP2 trainer (W ranks) rank 0 owns the generator, which samples every step's whole
prompt batch: after each update every rank joins the gather of the full weights from the shards
(a collective) and rank 0 publishes them; rank 0 takes the step's rollouts and scatters them
(`paravt.parallel.collectives.on_rank0_each`, which hands a generator error to every rank too):
each rank is sent the step's prompts and only its own share of the trajectories, clips
included (`keep_share`: the groups `shard_bounds` deals it, as the prompt loader does), not the
whole batch's.
"""

from __future__ import annotations

import os
from dataclasses import replace

from paravt.generator.worker import (
    AsyncGenerator,
    GeneratorSpec,
    GenResult,
    GenTask,
    generator_device,
)
from paravt.parallel.collectives import on_rank0_each
from paravt.parallel.distributed import Rank, shard_bounds
from paravt.rollout.records import RolloutBatch
from paravt.rollout.sync.shared_weights import SharedWeights
from paravt.rollout.sync.staleness import last_startable_step, too_stale
from paravt.rollout.sync.weight_sync import WeightSync, gather_only

# Counts summed over the ranks (paravt.modules.grpo.SKIP_SUMS) that every rank here holds for
# the whole batch: reported by rank 0 alone.
WHOLE_BATCH_COUNTS = ("data/skipped_prompts", "data/undecodable_videos")
STREAM_PENDING = 64  # results the streaming generator queues: a batch and GenStarved notes


def split_cores(cores: list[int], generator_cores: int | None) -> tuple[list[int], list[int]]:
    """(trainer's cores, generator's cores): the generator gets `generator_cores` (default
    half); with one core both share it."""
    if len(cores) < 2:
        return cores, cores
    n = len(cores) // 2 if generator_cores is None else generator_cores
    n = min(max(1, n), len(cores) - 1)
    return cores[: len(cores) - n], cores[len(cores) - n :]


def check_partial(algo) -> None:
    """Partial rollouts mix behaviour policies inside a trajectory: a correction that averages
    a whole trajectory's log-ratio would mix them too, so it is refused."""
    named = {getattr(algo, "loss", None), getattr(algo, "engine_is_correction", None)}
    if named & {"tis", "mis"} and algo.engine_is_level == "sequence":
        raise ValueError(
            "rollout.partial=true samples one trajectory with several policy versions, but "
            "algorithm.engine_is_level=sequence averages the importance ratio over the whole "
            "trajectory: set algorithm.engine_is_level=token (per token, i.e. per segment) or "
            "rollout.partial=false"
        )


class AsyncRollouts:
    """The generator process (rank 0's), the weights it reads, and which steps were submitted."""

    def __init__(self, datamodule, module):
        import torch
        import torch.multiprocessing as mp

        cfg = datamodule.rollout
        if cfg.partial:
            check_partial(getattr(module, "algo", None))
        self.dm, self.cfg, self.rank = datamodule, cfg, Rank.current()
        self.updates_per_step = int(getattr(module, "updates_per_step", 1))
        self.bucket_bytes = cfg.engine.sync_bucket_mb << 20
        self.published = module.policy_version
        self.weights, self.generator = None, None  # rank 0's only
        self.saved = (set(), torch.get_num_threads())
        self.submitted: dict[int, GenTask] = {}  # step -> its task, until taken
        self.next_step: int | None = None  # the first step not yet submitted
        self.dropped = 0  # trajectories dropped as too stale
        self.counts: dict[str, float] = {}  # more counts logged each step (streaming's)
        self.wait_s = 0.0
        self.dtype = getattr(torch, module.spec.dtype)  # the generator's load dtype, not fp32
        self.limits = self.stream_limits(module)  # None but for rollout.mode=stream
        if self.rank.rank != 0:
            gather_only(module.policy, self.bucket_bytes, self.dtype)  # rank 0's create
            return
        self.weights = SharedWeights.create(
            module.policy,
            module.policy_version,
            mp.get_context("spawn"),
            self.dtype,
            self.bucket_bytes,
        )
        all_cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.saved = (set(all_cores), torch.get_num_threads())
        mine, theirs = split_cores(all_cores, cfg.generator_cores)
        spec = GeneratorSpec(
            policy=replace(module.spec, gradient_checkpointing=False),
            # rollout servers started here are shared with the generator, never started twice
            engine=getattr(datamodule.engine, "child_config", cfg.engine),
            agent=cfg.agent,
            crop=datamodule.agent.crop,
            cores=tuple(theirs),
            threads=len(theirs) or 1,
            skip_bad_videos=not datamodule.fail_fast,
            device=generator_device(getattr(module, "device", "cpu")),  # rank 0's GPU, if any
            partial=cfg.partial,
            tools=tuple(cfg.toolbox),
            stream=self.limits,
        )
        pending = cfg.max_staleness + 1 if self.limits is None else STREAM_PENDING
        self.generator = AsyncGenerator(spec, self.weights, max_pending=pending)
        if mine and mine != all_cores:
            os.sched_setaffinity(0, set(mine))
            torch.set_num_threads(len(mine))

    def stream_limits(self, module):
        """The generator's `StreamLimits` (`paravt.generator.stream_rollouts`); None here."""
        return None

    def _task(self, step: int) -> GenTask | None:
        # the whole batch: every rank's share (streaming may read past the last step)
        batch = self.dm.prompt_batch(step, past_end=self.limits is not None)
        if batch is None:
            return None
        bad = self.dm.bad_videos
        kept = batch.kept(bad)
        samples = tuple(s for _, s in kept)
        skipped = tuple((s.id, bad[s.video]) for s in batch.samples if s.video in bad)
        budgets = tuple(self.dm.budgets(samples, batch.epoch))
        params = self.dm.sampling(step)
        positions = tuple(p for p, _ in kept)  # the seeds' positions, as in sync mode
        return GenTask(step, samples, budgets, self.cfg.group_size, params, skipped, positions)

    def _publish(self, module) -> None:
        """The trainer's new weights into the shared copy (every rank joins the gather)."""
        if module.policy_version == self.published:
            return
        version, size = module.policy_version, self.bucket_bytes
        WeightSync.publish(self.weights, module.policy, version, size, self.dtype)
        self.published = module.policy_version

    def _fetch(self, step: int) -> tuple[GenTask, GenResult, float]:
        """Rank 0: submit every step the gate lets start, then wait for step `step`'s result."""
        if self.next_step is None:
            self.next_step = step
        last = last_startable_step(step, self.cfg.max_staleness, self.updates_per_step)
        while self.next_step <= last:
            task = self._task(self.next_step)
            if task is None:
                break
            self.generator.submit(task)
            self.submitted[task.step] = task
            self.next_step += 1
        result, waited = self.generator.take(step, self.cfg.generator_timeout_s)
        return self.submitted.pop(step), result, waited

    def take(self, step: int, module) -> tuple[GenTask, GenResult, float] | None:
        """Step `step`'s rollouts, the whole batch's on every rank (publishing the weights and
        submitting ahead first); None when they are too stale to train on."""
        self._publish(module)
        world = self.rank.world_size
        task, result, waited = on_rank0_each(
            lambda: self._fetch(step),
            lambda got, r: (got[0], keep_share(got[0], got[1], r, world), got[2]),
        )
        self.wait_s += waited
        if too_stale(module.policy_version, result.version, self.cfg.max_staleness):
            self.dropped += len(result.trajectories)
            return None
        return task, result, waited

    def close(self) -> None:
        import torch

        if self.generator is not None:
            self.generator.close()
        cores, threads = self.saved
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)


def keep_share(task: GenTask, result: GenResult, rank: int, world: int) -> GenResult:
    """`result` as rank `rank` needs it: the trajectories of its own share of the groups (the
    groups `rollout_batch` deals it: those whose video decoded, split by `shard_bounds`), every
    other one replaced by None, so the positions and counts stay the whole batch's."""
    g = task.group_size
    kept = [b for b, s in enumerate(task.samples) if s.id not in result.video_errors]
    lo, hi = shard_bounds(len(kept), rank, world)
    mine = set(kept[lo:hi])
    trajs = tuple(t if i // g in mine else None for i, t in enumerate(result.trajectories))
    return replace(result, trajectories=trajs)


def _share(task: GenTask, samples, budgets, trajs, rank: Rank) -> tuple[list, list, list]:
    """This rank's contiguous share of the whole batch's groups (as the prompt loader deals)."""
    lo, hi = shard_bounds(len(samples), rank.rank, rank.world_size)
    g = task.group_size
    return samples[lo:hi], budgets[lo:hi], trajs[lo * g : hi * g]


def rollout_batch(dm, batch, module, got: tuple[GenTask, GenResult, float]) -> RolloutBatch:
    """This rank's `RolloutBatch` of a generator result (bad videos dropped as in sync mode;
    every rank keeps the whole batch's record of them, rank 0 reports it)."""
    task, result, waited = got
    samples, budgets, trajs = list(task.samples), list(task.budgets), list(result.trajectories)
    skipped = list(task.skipped)
    if result.video_errors:
        samples, budgets, trajs = dm._drop_bad(
            batch.step, samples, budgets, trajs, skipped, result.video_errors
        )
    dm.skipped_prompts += len(skipped)
    rank = Rank.current()
    samples, budgets, trajs = _share(task, samples, budgets, trajs, rank)
    timings = {"sync": 0.0, "rollout": result.busy_s, "rollout_wait": waited} | result.timings
    counts = dm.skip_counts() | {"rollout/stale_dropped": float(dm.async_rollouts.dropped)}
    counts |= dm.async_rollouts.counts
    if rank.rank != 0:
        counts |= dict.fromkeys(WHOLE_BATCH_COUNTS, 0.0)
        skipped = []
    return dm.build_batch(
        batch, module, samples, budgets, trajs, skipped, result.version, timings, counts
    )
