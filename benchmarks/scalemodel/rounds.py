"""The agent loop's rounds on the stand-ins, as `paravt.agent.loop.AgentLoop` plays them.

A round is ONE engine call for every active trajectory of the steps in play (`advance`): it
ends when the call's last request ends, then the crops of all those steps run in one executor
round (one `run_many`, as `advance` does), then the next round. Requests go to the servers by
paravt's own `Router` (a trajectory stays on its server, a new group goes whole to the least
loaded one). A trajectory's tokens record the engine's weight version of the round that
sampled them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from paravt.rollout.engine import GenerationRequest
from paravt.rollout.serving.routing import Router

from .clock import Clock, Engine, Request, tools_s
from .params import Params
from .workload import Rollout, step_rollouts


class Context:
    """Token ids as the router sees them: a length and a prefix hash, no tokens (a
    trajectory's contexts are prefixes of each other, as the agent loop's are)."""

    def __init__(self, name: str, n: int):
        self.name, self.n = name, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, s: slice) -> Context:
        return Context(self.name, len(range(self.n)[s]))

    def __hash__(self) -> int:
        return hash((self.name, self.n))


@dataclass
class Sim:
    """What every mode shares: the clock, the parameters, the engines and their router."""

    clock: Clock
    p: Params
    engines: list[Engine]
    lockstep: bool = False  # a call decodes its longest turn for all (the transformers engine)
    first: int = 0  # the router's tie-break rotation: the trainer rank
    drawer: object = None  # (step, prompt, index) -> Rollout; None: `workload.draw`
    router: Router | None = None

    def __post_init__(self):
        if len(self.engines) > 1:
            self.router = Router([str(i) for i in range(len(self.engines))], self.first)

    def place(self, reqs: Sequence[Request], new_tokens: int) -> list[int]:
        if self.router is None:
            return [0] * len(reqs)
        gen = [
            GenerationRequest(Context(r.name, r.ctx + r.turn.prefill), name=r.name) for r in reqs
        ]
        return [int(u) for u in self.router.assign(gen, new_tokens)]


@dataclass(eq=False)
class Playing:
    """One step's rollouts between `agent.start` and `agent.finish`."""

    step: int
    groups: list[list[Rollout]]
    turn: dict[str, int] = field(default_factory=dict)
    ctx: dict[str, int] = field(default_factory=dict)
    versions: dict[str, list[int]] = field(default_factory=dict)
    round_index: int = 0
    done: bool = False

    @classmethod
    def of(cls, sim: Sim, step: int, groups: list[list[Rollout]] | None = None) -> Playing:
        groups = step_rollouts(sim.p, step, sim.drawer) if groups is None else groups
        names = [t.name for g in groups for t in g]
        return cls(
            step, groups, dict.fromkeys(names, 0), dict.fromkeys(names, 0), {n: [] for n in names}
        )

    def active(self) -> list[Rollout]:
        return [t for g in self.groups for t in g if self.turn[t.name] < len(t.turns)]

    def oldest(self) -> int:
        return min(v for vs in self.versions.values() for v in vs)


class _Round:
    """One engine call for the active trajectories of `steps`, then their crops."""

    def __init__(self, sim: Sim, steps: Sequence[Playing], on_done: Callable[[], None]):
        self.sim, self.steps, self.on_done = sim, steps, on_done
        self.crops: dict[int, list[int]] = {id(st): [] for st in steps}
        self.left = 0

    def start(self, live: list[tuple[Playing, Rollout]]) -> None:
        sim = self.sim
        reqs = [
            Request(t.name, st.ctx[t.name], t.turns[st.turn[t.name]], self._done) for st, t in live
        ]
        if sim.lockstep:
            longest = max(r.decode for r in reqs)
            for r in reqs:
                r.decode = longest
        self.left = len(reqs)
        self.owner = {id(r): st for r, (st, _) in zip(reqs, live, strict=True)}
        self.work = {}
        for req, url in zip(reqs, sim.place(reqs, sim.p.max_new_tokens), strict=True):
            self.work[id(req)] = (url, req.ctx + req.turn.prefill + sim.p.max_new_tokens)
            if sim.router is not None:
                sim.router.start(str(url), self.work[id(req)][1])
            sim.engines[url].submit(req)

    def _done(self, req: Request) -> None:
        st = self.owner[id(req)]
        st.versions[req.name].append(req.version)
        st.ctx[req.name] += req.turn.prefill + req.turn.decode
        st.turn[req.name] += 1
        self.crops[id(st)].append(req.turn.crops)
        if self.sim.router is not None:
            url, work = self.work[id(req)]
            self.sim.router.finish(str(url), work)
        self.left -= 1
        if not self.left:  # the call is over: every step's crops in one executor round
            live = [s for s in self.steps if not s.done]
            seconds = tools_s(self.sim.p, [c for s in live for c in self.crops[id(s)]])
            self.sim.clock.after(seconds, self._end)

    def _end(self) -> None:
        for st in self.steps:
            if not st.done:
                st.round_index += 1
                st.done = st.round_index > self.sim.p.max_rounds or not st.active()
        self.on_done()


def play_round(sim: Sim, steps: Sequence[Playing], on_done: Callable[[], None]) -> None:
    """One round of every step in `steps` (those with nothing left are marked done)."""
    live = [(st, t) for st in steps if not st.done for t in st.active()]
    for st in steps:
        st.done = st.done or not st.active()
    if live:
        _Round(sim, steps, on_done).start(live)
    else:
        on_done()


def play(sim: Sim, steps: Sequence[Playing], on_done: Callable[[], None]) -> None:
    """Every round of `steps` (`AgentLoop.run`), then `on_done`."""

    def again() -> None:
        if all(st.done for st in steps):
            on_done()
        else:
            play_round(sim, steps, again)

    again()
