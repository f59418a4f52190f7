"""The virtual clock and the stand-ins whose time follows the model: engine, trainer, tools.

Nothing here sleeps or reads the wall clock: `Clock` pops events in time order and runs them.

`Engine` is one vLLM server (or one rank's in-process engine) as a fluid model of continuous
batching: up to `max_num_seqs` requests run at once (and only as many as the KV cache holds,
reserved at admission; the rest queue, first come first served). A request's prefill (its new
tokens at `prefill_tokens_per_s`, its frames through the vision tower) runs alone, ahead of
decoding, as vLLM schedules prefills first; then it decodes one token an iteration, and an
iteration costs `decode_base_s` (the weights, read once for the whole batch) plus the KV cache
of every running sequence (`kv_s_per_token` per context token). A weight load pauses the engine.
What it leaves out: chunked prefill's overlap with decoding, preemption, the attention FLOPs of
prefill, speculative decoding, prefix-cache misses (a later turn prefills only its new tokens).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from paravt.parallel.distributed import shard_bounds

from .params import Params
from .workload import Rollout, Turn

EPS = 1e-9


class Clock:
    """Events in time order; `now` is the virtual time in seconds."""

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._n = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, self._n, fn))
        self._n += 1

    def after(self, dt: float, fn: Callable[[], None]) -> None:
        self.at(self.now + dt, fn)

    def run(self, done: Callable[[], bool]) -> None:
        """Run events until `done()` holds (an error if events run out before)."""
        while not done():
            if not self._heap:
                raise RuntimeError("the simulation stalled: no event left and not done")
            t, _, fn = heapq.heappop(self._heap)
            self.now = max(self.now, t)
            fn()


@dataclass(eq=False)
class Request:
    """One turn of one trajectory on an engine."""

    name: str
    ctx: int  # context tokens before the turn (in the prefix cache)
    turn: Turn
    on_done: Callable[[Request], None]
    decode: int = -1  # tokens to sample (default: the turn's)
    version: int = -1  # the weight version its tokens were sampled with
    prefill_left: float = 0.0
    left: float = 0.0
    reserved: int = 0

    def __post_init__(self):
        self.decode = self.turn.decode if self.decode < 0 else self.decode


@dataclass
class Engine:
    clock: Clock
    p: Params
    version: int = 0
    busy_s: float = 0.0
    queued: deque = field(default_factory=deque)
    prefilling: deque = field(default_factory=deque)
    decoding: list = field(default_factory=list)
    load_end: float = -1.0
    pending_version: int = 0
    kv_used: int = 0
    _last: float = 0.0
    _token: int = 0

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def idle(self) -> bool:
        return not (self.running or self.queued)

    def submit(self, req: Request) -> None:
        self._advance()
        self.queued.append(req)
        self._kick()

    def load(self, version: int, seconds: float) -> None:
        """Take weights `version`: the engine pauses `seconds` (after any load in progress)."""
        self._advance()
        self.load_end = max(self.load_end, self.clock.now) + seconds
        self.pending_version = version
        self._kick()

    def cancel(self, names: set[str]) -> None:
        """Drop the requests of trajectories `names` (a group dropped while running)."""
        self._advance()
        for r in [*self.prefilling, *self.decoding]:
            if r.name in names:
                self.kv_used -= r.reserved
        self.queued = deque(r for r in self.queued if r.name not in names)
        self.prefilling = deque(r for r in self.prefilling if r.name not in names)
        self.decoding = [r for r in self.decoding if r.name not in names]
        self._kick()

    def _iteration_s(self) -> float:
        ctx = sum(r.ctx + r.turn.prefill + r.decode / 2 for r in self.decoding)
        return self.p.decode_base_s + self.p.kv_s_per_token * ctx

    def _advance(self) -> None:
        now = self.clock.now
        dt, self._last = now - self._last, now
        if dt <= 0:
            return
        if self.load_end > now - dt:  # loading during (part of) the interval: all busy
            self.busy_s += dt
        elif self.prefilling:
            self.prefilling[0].prefill_left -= dt
            self.busy_s += dt
        elif self.decoding:
            step = dt / self._iteration_s()
            for r in self.decoding:
                r.left -= step
            self.busy_s += dt

    def _admit(self) -> None:
        while self.queued and self.running < self.p.max_num_seqs:
            r = self.queued[0]
            need = r.ctx + r.turn.prefill + r.decode
            if self.running and self.kv_used + need > self.p.kv_capacity_tokens:
                return
            self.queued.popleft()
            r.reserved, self.kv_used = need, self.kv_used + need
            r.prefill_left = (
                r.turn.prefill / self.p.prefill_tokens_per_s
                + r.turn.frames * self.p.vision_s_per_frame
            )
            r.left = r.decode
            self.prefilling.append(r)

    def _kick(self) -> None:
        self._admit()
        self._token += 1
        token, now = self._token, self.clock.now
        if self.load_end > now:
            self.clock.at(self.load_end, lambda: self._event(token))
        elif self.prefilling:
            self.clock.at(
                now + max(0.0, self.prefilling[0].prefill_left), lambda: self._event(token)
            )
        elif self.decoding:
            soonest = min(r.left for r in self.decoding)
            self.clock.at(now + max(0.0, soonest) * self._iteration_s(), lambda: self._event(token))

    def _event(self, token: int) -> None:
        if token != self._token:
            return  # superseded by a later change
        self._advance()
        now = self.clock.now
        if self.load_end >= 0 and self.load_end <= now + EPS:
            self.version, self.load_end = max(self.version, self.pending_version), -1.0
        finished = []
        if self.load_end < 0:
            while self.prefilling and self.prefilling[0].prefill_left <= EPS:
                r = self.prefilling.popleft()
                r.version = self.version
                self.decoding.append(r)
            if self.decoding and self._iteration_s() <= 0:  # zero-time stand-ins
                for r in self.decoding:
                    r.left = 0.0
            finished = [r for r in self.decoding if r.left <= 1e-6]
            self.decoding = [r for r in self.decoding if r.left > 1e-6]
            for r in finished:
                self.kv_used -= r.reserved
        self._kick()
        for r in finished:
            r.on_done(r)


class Trainer:
    """The FSDP ranks: an update waits for the rank with the most tokens (`shard_bounds`
    deals the groups as the prompt loader does)."""

    def __init__(self, clock: Clock, p: Params, ranks: int):
        self.clock, self.p, self.ranks = clock, p, ranks
        self.busy_s = 0.0
        self.version = 0

    def update_s(self, groups: Sequence[Sequence[Rollout]]) -> float:
        share = []
        for r in range(self.ranks):
            lo, hi = shard_bounds(len(groups), r, self.ranks)
            share.append(sum(t.tokens for g in groups[lo:hi] for t in g))
        return self.p.update_fixed_s + max(share) * self.p.update_s_per_token

    def update(self, groups: Sequence[Sequence[Rollout]], on_done: Callable[[], None]) -> None:
        seconds = self.update_s(groups)
        self.busy_s += seconds

        def done():
            self.version += 1
            on_done()

        self.clock.after(seconds, done)


def tools_s(p: Params, crops: Sequence[int]) -> float:
    """Seconds a round's crops take on the node's cores: the slowest trajectory's calls run
    in parallel, and all of them share `cpu_cores`."""
    if not any(crops):
        return 0.0
    per_crop = p.crop_frames * p.crop_s_per_frame
    return max(per_crop, sum(crops) * per_crop / p.cpu_cores)
