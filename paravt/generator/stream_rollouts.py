"""`rollout.mode=stream`: the RolloutDataModule's side of the streaming generator.

The same generator process, shared weights and FSDP2 handling as `rollout.mode=async`
(`AsyncRollouts`, whose start, publication and close it keeps), with the generator running
`paravt.generator.streaming.serve_stream`: up to `rollout.max_concurrent` trajectories in
flight, finished groups in a bounded buffer, the staleness bound checked per group on its
oldest token (`paravt.rollout.sync.stream_buffer`). At step t the trainer publishes its
weights, feeds prompt steps ahead (every step the gate could need, one more, and another each
time the generator says it has none left: dropped groups are replaced from the prompts that
follow), sends a `StreamTake` and gets the next batch of whole groups as soon as one is there.
The batch is turned into the (task, result) pair of async mode, so the sharing among ranks
(`keep_share`) and the `RolloutBatch` (`rollout_batch`) are async mode's.

Resume: a run resumed at step t starts a fresh generator that streams from step t's prompts;
groups in flight or buffered when the run died are lost with it, as in async mode.
"""

from __future__ import annotations

from paravt.generator.async_rollouts import AsyncRollouts, check_partial, keep_share
from paravt.generator.messages import GenResult, GenTask, StreamResult, StreamTake
from paravt.parallel.collectives import on_rank0_each
from paravt.rollout.sync.staleness import lag_steps, oldest_version
from paravt.rollout.sync.stream_buffer import StreamLimits

STREAM_COUNTS = ("rollout/stream_in_flight", "rollout/stream_buffered")


class StreamRollouts(AsyncRollouts):
    """Rank 0's streaming generator and the prompt steps fed to it."""

    def __init__(self, datamodule, module):
        self.skipped: tuple = ()  # prompts of the steps fed since the last batch, left out
        super().__init__(datamodule, module)
        self.counts = dict.fromkeys(STREAM_COUNTS, 0.0)

    def stream_limits(self, module) -> StreamLimits:
        cfg = self.cfg
        if cfg.on_sync == "continue":
            check_partial(getattr(module, "algo", None))
        return StreamLimits(
            group_size=cfg.group_size,
            batch_groups=self.dm.batch_size,
            max_concurrent=cfg.max_concurrent,
            max_staleness=cfg.max_staleness,
            updates_per_step=self.updates_per_step,
            buffer_groups=cfg.buffer_groups,
            on_sync=cfg.on_sync,
        )

    def _feed(self, upto: int) -> None:
        """Submit the prompt steps up to `upto` not submitted yet."""
        while self.next_step <= upto:
            self._submit_next()

    def _submit_next(self) -> None:
        task = self._task(self.next_step)
        self.generator.submit(task)
        self.skipped += task.skipped
        self.next_step += 1

    def _fetch(self, step: int, version: int) -> tuple[GenTask, GenResult, float, dict]:
        """Rank 0: feed prompts, ask for step `step`'s batch, wait for it."""
        if self.next_step is None:
            self.next_step = step
        self._feed(step + lag_steps(self.cfg.max_staleness, self.updates_per_step) + 1)
        self.generator.submit(StreamTake(step, version))
        got, waited = self.generator.take(
            step, self.cfg.generator_timeout_s, on_starved=self._submit_next
        )
        task, result = as_step(got, self.cfg.group_size, self.skipped, version)
        self.skipped = ()
        counts = {"dropped": got.dropped, "in_flight": got.in_flight, "buffered": got.buffered}
        return task, result, waited, counts

    def take(self, step: int, module) -> tuple[GenTask, GenResult, float]:
        """Step `step`'s batch of whole groups, this rank's share (publishing the weights
        first: every rank joins the gather)."""
        self._publish(module)
        version, world = module.policy_version, self.rank.world_size
        task, result, waited, counts = on_rank0_each(
            lambda: self._fetch(step, version),
            lambda got, r: (got[0], keep_share(got[0], got[1], r, world), *got[2:]),
        )
        self.wait_s += waited
        self.dropped = counts["dropped"] * self.cfg.group_size  # trajectories, as async counts
        self.counts = {
            "rollout/stream_in_flight": float(counts["in_flight"]),
            "rollout/stream_buffered": float(counts["buffered"]),
        }
        return task, result, waited


def as_step(got: StreamResult, group_size: int, skipped, version: int) -> tuple[GenTask, GenResult]:
    """A streamed batch as async mode's (task, result) of one step: its groups' prompts, budgets
    and trajectories in batch order, its version the oldest of any trained token (`version`,
    the trainer's, when none is trained)."""
    groups = got.groups
    trajs = tuple(t for g in groups for t in g.trajectories)
    errors = {g.sample.id: g.video_error for g in groups if g.video_error is not None}
    task = GenTask(
        got.step,
        tuple(g.sample for g in groups),
        tuple(g.budget for g in groups),
        group_size,
        None,
        tuple(skipped),
        tuple(g.position for g in groups),
    )
    oldest = oldest_version(trajs, default=version)
    return task, GenResult(got.step, oldest, trajs, errors, got.busy_s, {})
