"""`rollout.mode=stream` on the stand-ins, every decision taken by paravt's `StreamScheduler`.

Each trajectory runs turn by turn on its own (no round barrier): its turn goes to the servers
(paravt's `Router`: a group whole to the least loaded server), its crops run, its next turn
goes. The scheduler decides which groups start (free slots, buffer room, the staleness gate),
when the engines may load new weights (at a turn boundary; in-flight trajectories go on under
them, their oldest token's version kept), which groups are dropped as too stale, and which
batch of whole groups the trainer takes. Group `i` is step i // B's prompt i % B, so every mode
times the same trajectories. A load pauses the servers for `sync_s`; a request in the middle
of its turn then goes on under the new weights (counted at its turn's start version).
"""

from __future__ import annotations

from paravt.rollout.sync.stream_buffer import StreamLimits, StreamScheduler

from .clock import Request, tools_s
from .modes import Setup, Stats, _record
from .rounds import Playing, play_round
from .workload import Rollout, step_rollouts


class _Stream:
    def __init__(self, setup: Setup, max_staleness: int, on_sync: str):
        self.setup, self.p = setup, setup.p
        self.sim, self.trainer = setup.build()
        self.sched = StreamScheduler(
            StreamLimits(
                group_size=self.p.group,
                batch_groups=self.p.prompts,
                max_concurrent=self.p.max_num_seqs * max(1, setup.servers),
                max_staleness=max_staleness,
                on_sync=on_sync,
            )
        )
        self.stats = Stats(engines=len(self.sim.engines))
        self.groups: dict[int, list[Rollout]] = {}  # running groups
        self.done_groups: dict[int, list[Rollout]] = {}  # buffered groups
        self.oldest: dict[str, int] = {}
        self.next_group = 0
        self.waiting = False
        self.loading = False

    # ---- generator ----------------------------------------------------------------------
    def fill(self) -> None:
        self.maybe_load()
        while self.sched.admissible() > 0:
            gid = self.next_group
            self.next_group += 1
            step, prompt = divmod(gid, self.p.prompts)
            self.sched.start(gid)
            rollouts = step_rollouts(self.p, step, self.sim.drawer)[prompt]
            self.groups[gid] = rollouts
            reqs = [self._request(gid, r, 0, 0) for r in rollouts]
            for req, url in zip(reqs, self.sim.place(reqs, self.p.max_new_tokens), strict=True):
                self.sim.engines[url].submit(req)

    def _request(self, gid: int, r: Rollout, turn: int, ctx: int) -> Request:
        return Request(r.name, ctx, r.turns[turn], lambda req: self.turn_done(gid, r, turn, req))

    def turn_done(self, gid: int, r: Rollout, turn: int, req: Request) -> None:
        if gid not in self.sched.running:
            return  # dropped while running
        self.oldest[r.name] = min(self.oldest.get(r.name, req.version), req.version)
        ctx = req.ctx + req.turn.prefill + req.turn.decode
        if turn + 1 == len(r.turns):
            self.maybe_load()
            if self.sched.finish(gid, self.oldest.pop(r.name)):
                self.done_groups[gid] = self.groups.pop(gid)
                self.try_take()
            self.fill()
            return

        def next_turn() -> None:
            if gid in self.sched.running:
                nxt = self._request(gid, r, turn + 1, ctx)
                self.sim.engines[self.sim.place([nxt], self.p.max_new_tokens)[0]].submit(nxt)
            self.maybe_load()

        self.sim.clock.after(tools_s(self.p, [req.turn.crops]), next_turn)

    def maybe_load(self) -> None:
        """A turn boundary: load the newest published weights if the scheduler lets."""
        if self.loading or not self.sched.may_load():
            return
        version, seconds = self.sched.version, self.setup.sync_s
        for e in self.sim.engines:
            e.load(version, seconds)
        self.loading = True

        def loaded() -> None:
            self.loading = False
            self.sched.load(version)
            self.fill()

        self.sim.clock.after(seconds, loaded)

    def abandon(self, doomed: tuple[int, ...]) -> None:
        """Stop the trajectories of groups dropped while running."""
        names = {r.name for g in doomed for r in self.groups.pop(g)}
        if names:
            for e in self.sim.engines:
                e.cancel(names)

    # ---- trainer ------------------------------------------------------------------------
    def begin_step(self) -> None:
        self.abandon(self.sched.publish(self.trainer.version))
        self.fill()
        self.waiting = True
        self.try_take()

    def try_take(self) -> None:
        if not (self.waiting and self.sched.ready()):
            return
        self.waiting = False
        batch = self.sched.take()
        groups = [self.done_groups.pop(g) for g in batch.groups]
        for g in batch.dropped:
            self.done_groups.pop(g, None)
        seconds = self.trainer.update_s(groups)
        staleness = max(batch.staleness)

        def trained() -> None:
            _record(self.stats, self.sim, self.trainer, seconds, staleness)
            if len(self.stats.ends) < self.p.steps:
                self.begin_step()

        self.trainer.update(groups, trained)
        self.fill()


def run_stream_per_turn(setup: Setup, max_staleness: int, on_sync: str = "continue") -> Stats:
    """Streaming without round barriers: each trajectory's turns go to the servers on their
    own (what the rollout servers could run), until `steps` batches are trained."""
    s = _Stream(setup, max_staleness, on_sync)
    s.begin_step()
    s.sim.clock.run(lambda: len(s.stats.ends) >= s.p.steps)
    s.stats.dropped = s.sched.dropped
    return s.stats


class _Rounds(_Stream):
    """`paravt.generator.streaming.serve_stream`: between two rounds, load the newest weights
    if the scheduler lets, start the groups it admits (each its own `Rounds`), then play ONE
    round of every group in flight in one engine call and report the trajectories that ended."""

    def __init__(self, setup: Setup, max_staleness: int, on_sync: str):
        super().__init__(setup, max_staleness, on_sync)
        self.playing: dict[int, Playing] = {}
        self.reported: dict[int, int] = {}
        self.idle = True

    def fill(self) -> None:  # the trainer published: wake the loop if it waits
        if self.idle:
            self.loop()

    def maybe_load(self) -> None:  # loads happen in `loop`, between rounds only
        return

    def abandon(self, doomed: tuple[int, ...]) -> None:  # their round ends, then they are left
        for g in doomed:
            self.playing.pop(g, None)

    def loop(self) -> None:
        sched = self.sched
        if not (sched.running or sched.may_load() or sched.admissible()):
            self.idle = True
            return
        self.idle = False
        load = sched.may_load()
        version = sched.version
        if load:
            for e in self.sim.engines:
                e.load(version, self.setup.sync_s)
        self.sim.clock.after(self.setup.sync_s if load else 0.0, lambda: self._round(load, version))

    def _round(self, load: bool, version: int) -> None:
        if load:
            self.sched.load(version)
        while self.sched.admissible() > 0:
            gid = self.next_group
            self.next_group += 1
            step, prompt = divmod(gid, self.p.prompts)
            self.sched.start(gid)
            groups = [step_rollouts(self.p, step, self.sim.drawer)[prompt]]
            self.playing[gid], self.reported[gid] = Playing.of(self.sim, step, groups), 0
        running = [(g, self.playing[g]) for g in list(self.playing) if g in self.sched.running]
        if not running:
            self.idle = True
            return
        play_round(self.sim, [pl for _, pl in running], lambda: self._settle(running))

    def _settle(self, running: list[tuple[int, Playing]]) -> None:
        for gid, pl in running:
            if gid not in self.sched.running:
                self.playing.pop(gid, None)  # doomed meanwhile
                continue
            rollouts = pl.groups[0]
            ended = (
                len(rollouts) if pl.done else sum(pl.turn[r.name] == len(r.turns) for r in rollouts)
            )
            for _ in range(ended - self.reported[gid] - (ended == len(rollouts))):
                self.sched.finish(gid)
            self.reported[gid] = ended
            if ended == len(rollouts) and self.sched.finish(gid, pl.oldest()):
                self.done_groups[gid] = rollouts
                self.playing.pop(gid)
        self.try_take()
        self.loop()


def run_stream(setup: Setup, max_staleness: int, on_sync: str = "continue") -> Stats:
    """`rollout.mode=stream` as paravt's generator plays it (rounds), until `steps` batches."""
    s = _Rounds(setup, max_staleness, on_sync)
    s.begin_step()
    s.sim.clock.run(lambda: len(s.stats.ends) >= s.p.steps)
    s.stats.dropped = s.sched.dropped
    return s.stats
