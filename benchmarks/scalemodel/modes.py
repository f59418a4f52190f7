"""paravt's rollout modes driven on the stand-ins, each with paravt's own decisions.

- sync (`rollout.mode=sync`): every trainer rank plays its own share of the step
  (`shard_bounds`) on its engine (colocated) or through the servers, the update waits for the
  last rank, then the weights go to the engines (the engines pause; nobody else works).
- async (`paravt.generator.async_rollouts`): rank 0's generator plays whole steps one after
  another on the servers, each with the newest weights at its start (`serve_steps`); before
  taking step t the trainer publishes its weights and submits every step up to
  `last_startable_step(t, max_staleness, 1)`; a result `too_stale` to train is dropped and
  regenerated with the current weights while the trainer waits.
- partial (`paravt.generator.partial_rollouts.serve_partial`): every submitted step in play at
  once, one round for all of them per engine call, the newest weights loaded between rounds;
  a step goes back whole, in order, and is checked on its oldest token's version.
The stream mode is `stream.py`. What is not modelled: the trainer's reward and data-loading
time, the prompt building on the CPU, a generator's result queue limit (`max_pending`, never
reached under the gate), failures and restarts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from paravt.parallel.distributed import shard_bounds
from paravt.rollout.sync.staleness import last_startable_step, too_stale

from .clock import Clock, Engine, Trainer
from .params import Params
from .rounds import Playing, Sim, play, play_round


@dataclass
class Stats:
    """What a mode's run recorded, step by step (`ends[i]`: step i's update finished)."""

    ends: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    engine_busy: list[float] = field(default_factory=list)  # all engines' busy s at each end
    staleness: list[int] = field(default_factory=list)  # trainer version - oldest token's
    dropped: int = 0  # groups dropped as too stale
    engines: int = 1


@dataclass
class Setup:
    """One topology: `ranks` FSDP trainer ranks, `servers` generation GPUs (0: each rank's
    in-process engine shares its GPU), the weight sync's seconds."""

    ranks: int
    servers: int
    p: Params
    drawer: object = None  # (step, prompt, index) -> Rollout; None: `workload.draw`

    @property
    def sync_s(self) -> float:
        gbps = self.p.server_sync_gbps if self.servers else self.p.colocated_sync_gbps
        return self.p.weights_gb / gbps

    def build(self, lockstep: bool = False) -> tuple[Sim, Trainer]:
        clock = Clock()
        engines = [Engine(clock, self.p) for _ in range(self.servers or self.ranks)]
        sim = Sim(clock, self.p, engines, lockstep, drawer=self.drawer)
        return sim, Trainer(clock, self.p, self.ranks)


def _record(stats: Stats, sim: Sim, trainer: Trainer, update_s: float, staleness: int) -> None:
    stats.ends.append(sim.clock.now)
    stats.update_s.append(update_s)
    stats.engine_busy.append(sum(e.busy_s for e in sim.engines))
    stats.staleness.append(staleness)


def run_sync(setup: Setup, lockstep: bool = False) -> Stats:
    """`rollout.mode=sync`: sync the weights, generate (each rank its share), update."""
    sim, trainer = setup.build(lockstep)
    p, stats = setup.p, Stats(engines=len(sim.engines))

    def step(t: int) -> None:
        groups = Playing.of(sim, t).groups
        shares = [
            groups[slice(*shard_bounds(len(groups), r, setup.ranks))] for r in range(setup.ranks)
        ]
        runs = [Playing.of(sim, t, share) for share in shares if share]
        waiting = [len(runs)]

        def generated() -> None:
            waiting[0] -= 1
            if waiting[0]:
                return
            seconds = trainer.update_s(groups)
            trainer.update(groups, lambda: trained(seconds))

        def trained(seconds: float) -> None:
            _record(stats, sim, trainer, seconds, 0)
            if t + 1 < p.steps:
                for e in sim.engines:
                    e.load(trainer.version, setup.sync_s)
                sim.clock.after(setup.sync_s, lambda: step(t + 1))

        for i, run in enumerate(runs):  # each rank's agent loop, on its engine or the servers
            engines = sim.engines if setup.servers else [sim.engines[i]]
            play(Sim(sim.clock, p, engines, lockstep, i, drawer=setup.drawer), [run], generated)

    step(0)
    sim.clock.run(lambda: len(stats.ends) >= p.steps)
    return stats


class Generator:
    """Rank 0's generator process: tasks in, whole steps out (`serve_steps`, or
    `serve_partial` when `partial`)."""

    def __init__(self, sim: Sim, setup: Setup, partial: bool, on_result):
        self.sim, self.setup, self.partial, self.on_result = sim, setup, partial, on_result
        self.tasks: deque[int] = deque()
        self.published = 0
        self.flight: list[Playing] = []
        self.busy = False

    def submit(self, step: int) -> None:
        self.tasks.append(step)
        if not self.busy:
            self._next()

    def _load_newest(self) -> float:
        """A turn boundary: load the newest published weights if the engines lack them."""
        if self.published <= self.sim.engines[0].version:
            return 0.0
        for e in self.sim.engines:
            e.load(self.published, self.setup.sync_s)
        return self.setup.sync_s

    def _next(self) -> None:
        """The tasks queued now (one, or all with `partial`), then the newest weights, then
        their play: tasks that arrive during the load wait for the next turn boundary, as
        `serve_steps` and `serve_partial` take their tasks before loading."""
        if not self.tasks and not self.flight:
            self.busy = False
            return
        self.busy = True
        n = len(self.tasks) if self.partial else min(1, len(self.tasks))
        new = [self.tasks.popleft() for _ in range(n)]
        self.sim.clock.after(self._load_newest(), lambda: self._play(new))

    def _play(self, new: list[int]) -> None:
        if not self.partial:
            run = Playing.of(self.sim, new[0])
            play(self.sim, [run], lambda: self._out([run]))
            return
        self.flight += [Playing.of(self.sim, step) for step in new]
        play_round(self.sim, self.flight, lambda: self._out(self.flight))

    def _out(self, runs: list[Playing]) -> None:
        while runs and runs[0].done:  # in step order, whole steps only
            self.on_result(runs.pop(0))
        self._next()


def run_async(setup: Setup, max_staleness: int, partial: bool, lockstep: bool = False) -> Stats:
    """`rollout.mode=async` (with `rollout.partial` when `partial`) on the servers."""
    sim, trainer = setup.build(lockstep)
    p, stats = setup.p, Stats(engines=len(sim.engines))
    results: dict[int, Playing] = {}
    state = {"next": 0, "step": 0, "waiting": False}
    gen = Generator(sim, setup, partial, lambda run: arrived(run))

    def arrived(run: Playing) -> None:
        results[run.step] = run
        if state["waiting"] and run.step == state["step"]:
            state["waiting"] = False
            take()

    def begin() -> None:  # the trainer at step t: publish, submit what the gate allows, take
        t = state["step"]
        gen.published = trainer.version
        while state["next"] <= last_startable_step(t, max_staleness, 1):
            gen.submit(state["next"])
            state["next"] += 1
        if t in results:
            take()
        else:
            state["waiting"] = True

    def take() -> None:
        t = state["step"]
        run = results.pop(t)
        if too_stale(trainer.version, run.oldest(), max_staleness):
            stats.dropped += len(run.groups)
            fresh = Playing.of(sim, t)  # regenerated in-process with the current weights
            play(sim, [fresh], lambda: train(fresh))
            return
        train(run)

    def train(run: Playing) -> None:
        staleness = trainer.version - run.oldest()
        seconds = trainer.update_s(run.groups)

        def done() -> None:
            _record(stats, sim, trainer, seconds, staleness)
            state["step"] += 1
            if state["step"] < p.steps:
                begin()

        trainer.update(run.groups, done)

    begin()
    sim.clock.run(lambda: len(stats.ends) >= p.steps)
    return stats
