"""`rollout.mode=stream`: the generator's loop, groups in flight on a rolling basis.

Every decision is `paravt.rollout.sync.stream_buffer.StreamScheduler`'s; this loop carries them
out on the real engine. The trainer sends prompt steps (`GenTask`s: each prompt a group) and,
at each step, a `StreamTake` with the version it just published. A reader thread takes them as
they come: prompts join a queue; a take publishes the version to the scheduler (in-flight
groups it dooms are abandoned) and is answered at once if a batch of whole groups is buffered,
else as soon as one is. The main loop, between two rounds (a turn boundary), loads the newest
published weights when the scheduler allows (on_sync=continue: in-flight trajectories go on
under them, every token recording its version), starts the groups it admits, then plays ONE
round of every group in flight in one engine call (`AgentLoop.advance`), and reports each
trajectory that ended. A group's version is the oldest behind its trained tokens
(`staleness.oldest_version`); too-stale groups are dropped by the scheduler, never sent.

Each group is started alone (its own `Rounds`), with its prompt step's sampling seed and its
position in that step's batch: a prompt's rollouts are those sync mode samples for it under the
same weights. What it deliberately does not do: keep anything across a generator restart (a
run resumed from its checkpoint streams again from the resumed step's prompts).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass

from paravt.generator.messages import GenStarved, GenTask, StreamGroup, StreamResult, StreamTake
from paravt.rollout.sync.staleness import oldest_version
from paravt.rollout.sync.stream_buffer import StreamLimits, StreamScheduler
from paravt.rollout.sync.weight_sync import WeightSync
from paravt.types import Sample, Trajectory


@dataclass
class _Group:
    step: int
    position: int
    sample: Sample
    budget: int
    params: object  # its prompt step's SamplingParams
    version: int = 0  # the engine's when it started
    rounds: object = None  # paravt.agent.loop.Rounds, once started
    reported: int = 0  # trajectories reported ended to the scheduler
    out: StreamGroup | None = None  # once every trajectory ended


class _Stream:
    """The child's state, shared by the reader thread and the main loop under `cond`."""

    def __init__(self, limits: StreamLimits, results, version: int):
        self.sched = StreamScheduler(limits, version=version)
        self.cond = threading.Condition()
        self.results = results
        self.prompts: deque[_Group] = deque()
        self.groups: dict[int, _Group] = {}  # id -> running or buffered group
        self.want: int | None = None  # the step waiting for a batch
        self.next_id, self.busy_s = 0, 0.0
        self.starved = self.stopped = False
        self.error: str | None = None  # the reader thread's traceback

    # ---- reader thread ----------------------------------------------------------------------
    def receive(self, tasks) -> None:
        """Take the trainer's messages until the stop signal (None)."""
        try:
            while (item := tasks.get()) is not None:
                with self.cond:
                    self._on_message(item)
                    self.cond.notify_all()
        except BaseException:
            self.error = traceback.format_exc()
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def _on_message(self, item) -> None:
        if isinstance(item, StreamTake):
            for gid in self.sched.publish(item.version):
                self.groups.pop(gid)  # doomed: its rounds are played no more
            self.want = item.step
            self.send_ready()
            return
        task: GenTask = item
        positions = task.positions or range(len(task.samples))
        for pos, sample, budget in zip(positions, task.samples, task.budgets, strict=True):
            self.prompts.append(_Group(task.step, pos, sample, budget, task.params))
        self.starved = False

    # ---- both -------------------------------------------------------------------------------
    def send_ready(self) -> None:
        """Answer the waiting take if a batch is buffered (under `cond`)."""
        if self.want is None or not self.sched.ready():
            return
        batch = self.sched.take()
        for gid in batch.dropped:
            self.groups.pop(gid)
        groups = tuple(self.groups.pop(gid).out for gid in batch.groups)
        s = self.sched
        self.results.put(
            StreamResult(self.want, groups, s.dropped, self.busy_s, s.in_flight, s.buffered)
        )
        self.want, self.busy_s = None, 0.0

    # ---- main loop --------------------------------------------------------------------------
    def idle(self) -> bool:
        """Nothing to do until a message comes: nothing in flight, no weights to load, no group
        to start (asking the trainer for prompts when one could start)."""
        if self.sched.running or self.sched.may_load():
            return False
        if not self.sched.admissible():
            return True
        if not self.prompts and not self.starved:
            self.starved = True
            self.results.put(GenStarved())
        return not self.prompts

    def reserve(self) -> list[tuple[int, _Group]]:
        """The groups the scheduler admits now, taken from the prompt queue."""
        out = []
        while self.prompts and self.sched.admissible():
            gid, group = self.next_id, self.prompts.popleft()
            self.next_id += 1
            group.version = self.sched.start(gid)
            self.groups[gid] = group
            out.append((gid, group))
        return out

    def settle(self, agent, running: list[tuple[int, _Group]]) -> None:
        """Report the trajectories that ended in the last round (under `cond`)."""
        g = self.sched.limits.group_size
        for gid, group in running:
            if gid not in self.sched.running:
                continue  # doomed meanwhile
            rounds = group.rounds
            ended = g if rounds.done else sum(map(_ended, rounds.groups[0]))
            done = ended == g
            new, group.reported = ended - group.reported, ended
            for _ in range(new - done):
                self.sched.finish(gid)
            if done:  # the last one carries the group's oldest token version
                run = agent.finish(rounds)
                error = run.video_errors.get(group.sample.id)
                group.out = StreamGroup(
                    group.step, group.position, group.sample, group.budget, tuple(run), error
                )
                self.sched.finish(gid, oldest_version(tuple(run), default=group.version))
        self.send_ready()


def _ended(state) -> bool:
    return isinstance(state, Trajectory) or state.done  # a VIDEO_ERROR one never started


def _start(agent, picked, group_size: int, skip_bad_videos: bool) -> None:
    """Each admitted group's rollouts before their first round (its video decoded here)."""
    for _, group in picked:
        group.rounds = agent.start(
            [group.sample],
            [group.budget],
            group_size,
            group.params,
            skip_bad_videos=skip_bad_videos,
            positions=(group.position,),
        )


def serve_stream(tasks, results, weights, model, engine, agent, skip_bad_videos, limits) -> None:
    """Serve the trainer's prompts and takes until the stop signal (see the module doc)."""
    st = _Stream(limits, results, engine.weight_version)
    threading.Thread(target=st.receive, args=(tasks,), daemon=True, name="paravt-stream").start()
    while True:
        with st.cond:
            while not st.stopped and st.idle():
                st.cond.wait()
            if st.stopped:
                break
            load = st.sched.may_load()
        if load:  # a turn boundary: nothing is mid-round
            WeightSync.into_generator(engine, model, weights)
        with st.cond:
            if load:
                st.sched.load(engine.weight_version)
            picked = st.reserve()
        _start(agent, picked, limits.group_size, skip_bad_videos)
        with st.cond:
            running = [(gid, g) for gid, g in st.groups.items() if gid in st.sched.running]
        t0 = time.perf_counter()
        agent.advance([g.rounds for _, g in running])
        with st.cond:
            st.busy_s += time.perf_counter() - t0
            st.settle(agent, running)
    if st.error:
        raise RuntimeError(f"the stream generator's reader failed:\n{st.error}")
