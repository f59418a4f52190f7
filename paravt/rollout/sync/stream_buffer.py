"""The scheduling of streaming rollouts (`rollout.mode=stream`), as a pure state machine.

Streaming keeps up to `max_concurrent` trajectories in flight; a group (the G rollouts of one
prompt) enters a bounded buffer once all its trajectories end, and the trainer takes the next
batch of `batch_groups` whole groups as soon as the buffer holds one. `StreamScheduler` makes
every decision of that loop and nothing else, so the real generator
(`paravt.generator.stream_rollouts`) and a discrete-event simulator on a virtual clock
(`benchmarks/scale_model.py`) run the same rules. It deliberately knows nothing of processes,
queues, threads, engines or clocks: the caller tells it what happened, in order, and asks what
may happen next.

The rules (versions count optimiser updates, as in `paravt.rollout.sync.staleness`):
- Admission: a new group starts only when (a) G trajectory slots are free under
  `max_concurrent`; (b) the buffer could still take it: buffered + running groups <
  `buffer_groups`; (c) the staleness gate lets it (AReaL's `max_head_offpolicyness` capacity):
  accepted + running groups < (lag + trained + 1) * batch_groups, where trained counts the
  batches behind the newest published weights, lag = `staleness.lag_steps` (steps generation
  may run ahead) and accepted counts groups finished and not dropped; (d) under
  `on_sync="drain"`, the engine holds the newest published weights. A group's version is the
  engine's when it starts.
- Staleness per trajectory: a group's version is the oldest policy version behind any of its
  trained tokens (`staleness.oldest_version`, which the caller reports per trajectory; by
  default the version it started under). When the trainer takes a batch at published version
  V, every buffered group with V - version > max_staleness is dropped and counted, never
  trained; a running group that already fails the bound is dropped at the publication that
  dooms it (`publish` returns it, so the caller can stop its trajectories).
- Weight syncs: `on_sync="continue"` (the default) lets the engine load new weights at any turn
  boundary: in-flight trajectories go on under them (partial rollouts, every token recording
  its version). `on_sync="drain"` loads them only once nothing is in flight, and starts no new
  group meanwhile: every trajectory is sampled by one policy.
- Order: batches take groups in the order they finished (first in, first out).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from paravt.rollout.sync.staleness import lag_steps, too_stale

ON_SYNC = ("continue", "drain")


@dataclass(frozen=True)
class StreamLimits:
    """The knobs of streaming (`rollout.*` keys of the same names)."""

    group_size: int  # G: trajectories per group
    batch_groups: int  # whole groups per trainer step
    max_concurrent: int = 64  # trajectories in flight at once (the reference runs 64)
    max_staleness: int = 2  # updates a trained token may lag (the reference runs 2)
    updates_per_step: int = 1  # optimiser updates per trainer step (one publication each step)
    buffer_groups: int | None = None  # finished + running groups at most (None: the gate's)
    on_sync: str = "continue"  # what in-flight trajectories do at a weight sync

    def __post_init__(self) -> None:
        if min(self.group_size, self.batch_groups, self.updates_per_step) < 1:
            raise ValueError(
                f"streaming needs group_size, batch_groups and updates_per_step >= 1, got "
                f"{self.group_size}, {self.batch_groups}, {self.updates_per_step}"
            )
        if self.max_concurrent < self.group_size:
            raise ValueError(
                f"rollout.max_concurrent={self.max_concurrent} cannot hold one group of "
                f"rollout.group_size={self.group_size} trajectories: raise it to >= "
                f"{self.group_size}"
            )
        if self.buffer_groups is not None and self.buffer_groups < self.batch_groups:
            raise ValueError(
                f"rollout.buffer_groups={self.buffer_groups} can never hold one batch of "
                f"{self.batch_groups} groups: raise it to >= {self.batch_groups} (or null)"
            )
        if self.on_sync not in ON_SYNC:
            raise ValueError(f"rollout.on_sync must be one of {ON_SYNC}, got {self.on_sync!r}")
        lag_steps(self.max_staleness, self.updates_per_step)  # rejects a negative bound

    @property
    def capacity(self) -> int:
        """Groups buffered or running at most: `buffer_groups`, else what the gate allows."""
        gate = (lag_steps(self.max_staleness, self.updates_per_step) + 1) * self.batch_groups
        return gate if self.buffer_groups is None else self.buffer_groups


@dataclass(frozen=True)
class StreamBatch:
    """What the trainer takes: whole groups in finishing order, and those dropped to get it."""

    groups: tuple[int, ...]  # group ids
    versions: tuple[int, ...]  # each group's oldest token version
    version: int  # the published version the batch is trained from
    dropped: tuple[int, ...]  # buffered groups dropped as too stale at this take

    @property
    def staleness(self) -> tuple[int, ...]:
        """Updates each group's oldest token lags the weights it is trained from."""
        return tuple(self.version - v for v in self.versions)


@dataclass
class _Running:
    version: int  # the oldest version reported so far (its start version at first)
    left: int  # trajectories still in flight


@dataclass
class StreamScheduler:
    """The state of one streaming run; see the module doc for the rules.

    Generator side: `admissible`, `start`, `finish`, `may_load`, `load`. Trainer side:
    `publish` (new weights, before each step's take), `ready`, `take`. Counters: `started`,
    `accepted`, `taken`, `dropped` (groups), `batches`, and the properties `in_flight`
    (trajectories) and `buffered` (groups).
    """

    limits: StreamLimits
    version: int = 0  # the newest published version (the trainer's weights)
    engine_version: int | None = None  # the generator's weights (None: the published ones)
    started: int = 0
    accepted: int = 0
    taken: int = 0
    dropped: int = 0
    batches: int = 0  # batches taken
    trained: int = 0  # batches taken before the newest publication: in its weights
    running: dict[int, _Running] = field(default_factory=dict)
    buffer: deque = field(default_factory=deque)  # (group id, version), finishing order

    def __post_init__(self) -> None:
        if self.engine_version is None:
            self.engine_version = self.version

    @property
    def in_flight(self) -> int:
        return sum(r.left for r in self.running.values())

    @property
    def buffered(self) -> int:
        return len(self.buffer)

    # ---- generator side -------------------------------------------------------------------
    def admissible(self) -> int:
        """How many new groups may start now (0 while any rule of the module doc forbids)."""
        lim = self.limits
        if lim.on_sync == "drain" and self.engine_version < self.version:
            return 0
        slots = (lim.max_concurrent - self.in_flight) // lim.group_size
        room = lim.capacity - self.buffered - len(self.running)
        steps = self.trained + lag_steps(lim.max_staleness, lim.updates_per_step) + 1
        gate = steps * lim.batch_groups - self.accepted - len(self.running)
        return max(0, min(slots, room, gate))

    def start(self, group: int) -> int:
        """Group `group` starts its G trajectories on the engine's weights; their version."""
        if group in self.running:
            raise ValueError(f"group {group} is already running")
        if self.admissible() < 1:
            raise RuntimeError(f"group {group} started while admission is closed")
        self.running[group] = _Running(self.engine_version, self.limits.group_size)
        self.started += 1
        return self.engine_version

    def finish(self, group: int, version: int | None = None) -> bool:
        """One trajectory of `group` ended; `version`: its oldest trained token's (None: its
        start version). True when that was the group's last: it is buffered now. A group
        dropped while running (see `publish`) is ignored: False."""
        run = self.running.get(group)
        if run is None:
            return False
        if version is not None:
            run.version = min(run.version, version)
        run.left -= 1
        if run.left:
            return False
        del self.running[group]
        self.buffer.append((group, run.version))
        self.accepted += 1
        return True

    def may_load(self) -> bool:
        """Whether the engine may load the newest published weights now (a turn boundary)."""
        if self.engine_version >= self.version:
            return False
        return self.limits.on_sync == "continue" or not self.running

    def load(self, version: int | None = None) -> None:
        """The engine now holds `version` (default: the newest published)."""
        self.engine_version = self.version if version is None else version

    # ---- trainer side ---------------------------------------------------------------------
    def publish(self, version: int) -> tuple[int, ...]:
        """The trainer's weights are at `version` now (each trainer step publishes once, even
        when `version` did not move: a step's batch was taken). Returns the running groups this
        dooms: already too stale to be trained, dropped and counted now."""
        if version < self.version:
            raise ValueError(f"published version went back from {self.version} to {version}")
        self.version = version
        self.trained = self.batches
        bound = self.limits.max_staleness
        doomed = tuple(g for g, r in self.running.items() if too_stale(version, r.version, bound))
        for g in doomed:
            del self.running[g]
        self.dropped += len(doomed)
        return doomed

    def _drop_stale(self) -> tuple[int, ...]:
        bound = self.limits.max_staleness
        stale = tuple(g for g, v in self.buffer if too_stale(self.version, v, bound))
        if stale:
            self.buffer = deque((g, v) for g, v in self.buffer if g not in stale)
            self.accepted -= len(stale)
            self.dropped += len(stale)
        return stale

    def ready(self) -> bool:
        """Whether a batch of whole groups trainable at the published version is buffered."""
        bound = self.limits.max_staleness
        fresh = sum(not too_stale(self.version, v, bound) for _, v in self.buffer)
        return fresh >= self.limits.batch_groups

    def take(self) -> StreamBatch:
        """The next batch: too-stale buffered groups dropped first, then the first
        `batch_groups` to finish. Raises unless `ready()`."""
        if not self.ready():
            raise RuntimeError(
                f"no batch ready: {self.buffered} groups buffered, {self.limits.batch_groups} "
                "needed (call ready() first)"
            )
        dropped = self._drop_stale()
        got = [self.buffer.popleft() for _ in range(self.limits.batch_groups)]
        self.taken += len(got)
        self.batches += 1
        return StreamBatch(
            tuple(g for g, _ in got), tuple(v for _, v in got), self.version, dropped
        )
