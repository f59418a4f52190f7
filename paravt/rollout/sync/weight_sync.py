"""`WeightSync`: when a rollout engine gets the trainer's weights, and `iter_weights`: how.

What syncs. A rollout engine samples with weights of its own unless it shares the policy module
(the transformers engine at `rollout.max_staleness: 0`, unsharded): vLLM always, the transformers
engine's unsharded copy of an FSDP2 policy or of a stale-allowed one, and the asynchronous
generator's policy copy in its own process. `RolloutEngine.sync_weights(policy, version)` moves
them; a shared module's engine only takes the version.

When. Every sync goes through one `WeightSync` method, named for its moment:

- `at_batch` (training, `rollout.mode: sync`): in the DataModule's batch hook of step t, which
  Lightning runs after the optimiser update of step t-1 and before step t's rollouts, i.e. right
  after the optimiser step with nothing sampled in between. The engine is synced only when its
  weights lag the policy by more than `rollout.max_staleness` updates (or it discarded them in a
  level-2 sleep, `needs_sync`); the step after the last one never comes, so the last update is
  never synced for nothing. Returns the seconds it took: the step's `time/sync` metric.
- `to_version` (evaluation, `paravt.agent.greedy`): the engine must sample with the policy's
  current update exactly (held-out validation, budget reports, the prior diagnostic), so it syncs
  whenever the versions differ, staleness or not.
- `changed` (cold start): the weights changed without an optimiser update (the version did not
  move), so the engine syncs unconditionally.
- `publish` / `into_generator` (`rollout.mode: async`): after each update the trainer publishes
  the new weights into the shared host copy (`paravt.rollout.sync.shared_weights`; every rank joins
  the gather, rank 0 holds the copy); the generator process loads them into its own policy copy
  and engine before its next task when the shared version moved (a generator on rollout servers
  has no copy: its engine's sync reads the shared tensors in place).

Version bookkeeping. `policy_version` counts the trainer's optimiser updates; an engine's
`weight_version` is the update its weights come from, set by `sync_weights`. Their difference is
the rollouts' staleness (`RolloutBatch.staleness`); in async mode the shared copy's `version` is
the one the generator compares.

How. `iter_weights` is the one gather: buckets of (name, full tensor) of a policy, gathered from
FSDP2 DTensor shards and with LoRA adapters merged into the base weights under the base model's
names (`paravt.models.lora.merged_items`), moved to the engine's device and dtype, cut into
buckets by the one bucketer the exports use too (`paravt.models.full_weights`).
Under FSDP2 it is a collective: `full_tensor()` is called by every rank for the same tensor in the
same order, so every rank runs the same sync at the same moment (each for its own engine, or
`gather_only` on a rank without one); the gathered tensors stay on the shards' device until moved,
since NCCL refuses CPU tensors in its collectives.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from paravt.models.full_weights import Bucket, buckets, state_items
from paravt.rollout.engine import RolloutEngine


def iter_weights(
    policy: torch.nn.Module,
    bucket_bytes: int = 256 << 20,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    merge_lora: bool = True,
) -> Iterator[Bucket]:
    """Buckets of (name, full tensor) of `policy`'s weights, about `bucket_bytes` each.

    Gathered from the shards of an FSDP2 policy (a collective: every rank iterates to the end);
    a LoRA policy's adapters merged into the base weights under the base model's names
    (`merge_lora=False`: its own state dict, adapter factors included, as a LoRA copy loads it).
    `device` None keeps each tensor where it is; `dtype` None keeps each dtype, otherwise the
    floating-point tensors are cast to it: shard by shard before the gather (half the traffic
    of fp32 for bf16), after it when LoRA factors are merged (the merge in full precision). At
    most one bucket of full weights exists at a time when the consumer drops each before taking
    the next. The one bucketer (`paravt.models.full_weights.buckets`) cuts either stream; only
    the stream differs.
    """
    from paravt.models.lora import is_lora, merged_items

    merged = merge_lora and is_lora(policy)
    items = merged_items(policy) if merged else state_items(policy, dtype)
    return buckets(items, bucket_bytes, device, dtype)


def host_weights(
    policy: torch.nn.Module, bucket_bytes: int = 256 << 20, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of `policy`'s own state dict (LoRA factors unmerged), for a host copy:
    an unsharded policy's tensors where they are; an FSDP2 policy's gathered from the shards
    bucket by bucket and moved to the host (a collective: every rank iterates to the end)."""
    from paravt.parallel.distributed import is_sharded

    device = "cpu" if is_sharded(policy) else None
    for bucket in iter_weights(policy, bucket_bytes, device, dtype, merge_lora=False):
        yield from bucket


def gather_only(
    policy: torch.nn.Module, bucket_bytes: int = 256 << 20, dtype: torch.dtype | None = None
) -> None:
    """A rank without the host copy joins the collective gather of the rank that has one, at
    the same `dtype` (the collectives must match), and drops each bucket where it was gathered:
    no copy to the host of weights nobody reads."""
    for _ in iter_weights(policy, bucket_bytes, None, dtype, merge_lora=False):
        pass


class WeightSync:
    """The sync rules of one trainer: `max_staleness` and the last sync's seconds."""

    def __init__(self, max_staleness: int = 0):
        self.max_staleness = max_staleness
        self.last_s = 0.0  # the last `at_batch`'s seconds (the step's time/sync)

    @staticmethod
    def lag(engine: RolloutEngine, version: int) -> int:
        """Updates the engine's weights are behind the policy's `version`."""
        return version - engine.weight_version

    def due(self, engine: RolloutEngine, version: int, max_staleness: int | None = None) -> bool:
        """Whether a training step must sync first: the engine lags by more than
        `max_staleness` (None: this trainer's), or it discarded its weights in a sleep."""
        allowed = self.max_staleness if max_staleness is None else max_staleness
        return self.lag(engine, version) > allowed or bool(getattr(engine, "needs_sync", False))

    def at_batch(
        self, engine: RolloutEngine, policy: Any, version: int, max_staleness: int | None = None
    ) -> float:
        """Before a training step's rollouts: sync if `due`; the seconds taken (time/sync)."""
        t0 = time.perf_counter()
        if self.due(engine, version, max_staleness):
            engine.sync_weights(policy, version)
        self.last_s = time.perf_counter() - t0
        return self.last_s

    @staticmethod
    def to_version(engine: RolloutEngine, policy: Any | None, version: int) -> bool:
        """Before evaluation: give `engine` `policy`'s weights unless it already samples with
        update `version`; whether it synced. `policy=None` (an engine built on a fixed
        checkpoint) never syncs."""
        if policy is None or engine.weight_version == version:
            return False
        engine.sync_weights(policy, version)
        return True

    @staticmethod
    def changed(engine: RolloutEngine, policy: Any, version: int) -> None:
        """The weights changed under the same `version` (a cold start): sync unconditionally."""
        engine.sync_weights(policy, version)

    @staticmethod
    def publish(
        shared, policy: Any, version: int, bucket_bytes: int, dtype: torch.dtype | None = None
    ) -> None:
        """Async trainer, every rank: the new weights into the shared copy (`shared`, rank 0's
        `SharedWeights`, which gathers at its own dtype; None on the other ranks, which join
        the gather at `dtype`, the same)."""
        if shared is None:
            gather_only(policy, bucket_bytes, dtype)
        else:
            shared.publish(policy, version, bucket_bytes)

    @staticmethod
    def into_generator(engine: RolloutEngine, model: Any, shared) -> bool:
        """Async generator, before a task: when the shared copy's version moved, sync `engine`
        to it through `model` (loaded from it, or reading it in place: `SharedWeights.current`);
        whether it synced."""
        if shared.version == engine.weight_version:
            return False
        with shared.current(model) as version:
            engine.sync_weights(model, version)
        return True
