"""`rollout.mode=async`: the RolloutDataModule's side of the asynchronous generator.

At the first step it publishes the policy into `SharedWeights`, splits the cores between the
trainer and a generator process (`paravt.modules.async_worker`), and from then on, at each
step t (after update t-1): publishes the new weights, submits the prompt batches of every step
the staleness gate lets start (`paravt.rollout.staleness`), and takes step t's trajectories,
waiting only if they are not there yet. A batch that arrives more than `rollout.max_staleness`
updates behind the trainer is dropped (counted in `rollout/stale_dropped`) and regenerated
in-process with the current weights. With max_staleness = 0 nothing overlaps and the rollouts
are those of `rollout.mode=sync`. Glue: no arithmetic of its own.
"""

from __future__ import annotations

import os
from dataclasses import replace

from paravt.modules.async_worker import AsyncGenerator, GeneratorSpec, GenResult, GenTask
from paravt.rollout.records import RolloutBatch
from paravt.rollout.shared_weights import SharedWeights
from paravt.rollout.staleness import last_startable_step, too_stale


def split_cores(cores: list[int], generator_cores: int | None) -> tuple[list[int], list[int]]:
    """(trainer's cores, generator's cores): the generator gets `generator_cores` (default
    half); with one core both share it."""
    if len(cores) < 2:
        return cores, cores
    n = len(cores) // 2 if generator_cores is None else generator_cores
    n = min(max(1, n), len(cores) - 1)
    return cores[: len(cores) - n], cores[len(cores) - n :]


class AsyncRollouts:
    """The generator process, the weights it reads, and which steps were submitted."""

    def __init__(self, datamodule, module):
        import torch
        import torch.multiprocessing as mp

        from paravt.parallel.distributed import is_sharded

        if is_sharded(module.policy):
            raise ValueError(
                "rollout.mode=async is not implemented for a sharded (FSDP2) trainer yet; "
                "use rollout.mode=sync with trainer=fsdp"
            )
        cfg = datamodule.rollout
        self.dm, self.cfg = datamodule, cfg
        self.updates_per_step = int(getattr(module, "updates_per_step", 1))
        self.weights = SharedWeights.create(
            module.policy, module.policy_version, mp.get_context("spawn")
        )
        all_cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.saved = (set(all_cores), torch.get_num_threads())
        mine, theirs = split_cores(all_cores, cfg.generator_cores)
        spec = GeneratorSpec(
            policy=replace(module.spec, gradient_checkpointing=False),
            engine=cfg.engine,
            agent=cfg.agent,
            crop=datamodule.agent.crop,
            cores=tuple(theirs),
            threads=len(theirs) or 1,
            skip_bad_videos=not datamodule.fail_fast,
        )
        self.generator = AsyncGenerator(spec, self.weights, max_pending=cfg.max_staleness + 1)
        if mine and mine != all_cores:
            os.sched_setaffinity(0, set(mine))
            torch.set_num_threads(len(mine))
        self.submitted: dict[int, GenTask] = {}  # step -> its task, until taken
        self.next_step: int | None = None  # the first step not yet submitted
        self.dropped = 0  # trajectories dropped as too stale
        self.wait_s = 0.0

    def _task(self, step: int) -> GenTask | None:
        batch = self.dm.prompt_batch(step)
        if batch is None:
            return None
        samples = tuple(s for s in batch.samples if s.video not in self.dm.bad_videos)
        budgets = tuple(self.dm.budgets(samples, batch.epoch))
        return GenTask(step, samples, budgets, self.cfg.group_size, self.dm.sampling(step))

    def take(self, step: int, module) -> tuple[GenTask, GenResult, float] | None:
        """Step `step`'s rollouts (publishing the weights and submitting ahead first)."""
        if module.policy_version != self.weights.version:
            self.weights.publish(module.policy, module.policy_version)
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
        result, waited = self.generator.take(step)
        task = self.submitted.pop(step)
        self.wait_s += waited
        if too_stale(module.policy_version, result.version, self.cfg.max_staleness):
            self.dropped += len(result.trajectories)
            return None
        return task, result, waited

    def close(self) -> None:
        import torch

        self.generator.close()
        cores, threads = self.saved
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)


def rollout_batch(dm, batch, module, got: tuple[GenTask, GenResult, float]) -> RolloutBatch:
    """The `RolloutBatch` of a generator result (bad videos dropped as in sync mode)."""
    task, result, waited = got
    samples, budgets, trajs = list(task.samples), list(task.budgets), list(result.trajectories)
    skipped = [(s.id, dm.bad_videos[s.video]) for s in batch.samples if s not in task.samples]
    if result.video_errors:
        samples, budgets, trajs = dm._drop_bad(
            batch.step, samples, budgets, trajs, skipped, result.video_errors
        )
    dm.skipped_prompts += len(skipped)
    timings = {"sync": 0.0, "rollout": result.busy_s, "rollout_wait": waited} | result.timings
    dm.rollout_versions.append((batch.step, result.version))
    dm.seen_prompts.append((batch.step, tuple(s.id for s in samples)))
    dm.consumed = batch.step + 1
    counts = dm.skip_counts() | {"rollout/stale_dropped": float(dm.async_rollouts.dropped)}
    return RolloutBatch(
        step=batch.step,
        epoch=batch.epoch,
        samples=tuple(samples),
        budgets=tuple(budgets),
        trajectories=tuple(trajs),
        group_size=task.group_size,
        temperature=dm.rollout.temperature,
        weight_version=result.version,
        staleness=module.policy_version - result.version,
        durations=tuple(dm.agent.source.info(s.video).duration for s in samples),
        timings=timings,
        skipped=tuple(skipped),
        counts=counts,
    )
