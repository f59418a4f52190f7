"""Data-parallel bookkeeping that keeps W ranks in lock-step: prompt shards, agreed counts.

Under FSDP every forward and backward pass is a collective (parameters are all-gathered layer by
layer, gradients reduce-scattered), so every rank must run the same NUMBER of passes even when
its rollouts differ. This file holds the small rules that make that true:
- `shard_prompts`: rank r of W takes its own contiguous share of every global step's B prompts,
  dealt as evenly as B allows (7 prompts on 8 ranks: one each, the last rank none; a prompt's
  G rollouts stay on one rank, so group advantages are computed locally; the batch
  normalisation after them sums over the ranks: `global_float_sums`);
- `agree_max` / `pad_micro_batches`: all ranks do max-over-ranks micro-batches, the missing ones
  being zero-weight dummies (still a real forward/backward, so the collectives match);
- `token_loss_scale`: the weight that makes FSDP's gradient average over ranks equal the
  token-mean over the GLOBAL batch (what one rank with the whole batch would compute);
- `generate_sync_kwargs`: transformers `generate` keeps stepping until every rank is done;
- `load_buckets`: full weights gathered from the shards bucket by bucket (the one bucketer,
  `paravt.models.full_weights`), into each rank's own unsharded rollout engine;
- `mean_over_ranks` / `global_sums` / `global_float_sums`: step metrics, loss divisors and
  advantage statistics of the global batch, sent through `paravt.parallel.collectives` (the
  device and dtype each backend requires).
It works without an initialised process group (world size 1), and deliberately knows nothing of
Lightning, Hydra or the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from paravt.parallel import collectives

T = TypeVar("T")


@dataclass(frozen=True)
class Rank:
    """This process's place in the data-parallel group."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def current(cls, group: dist.ProcessGroup | None = None) -> Rank:
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        return cls(dist.get_rank(group), dist.get_world_size(group))


def shard_bounds(batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s prompts among a global step's `batch_size`.

    Dealt contiguously and as evenly as possible: the first `batch_size % world_size` ranks take
    one prompt more. With fewer prompts than ranks (the paper's 7 prompts on 8 GPUs) the last
    ranks take none: they generate nothing and run zero-weight passes that keep the sharded
    model's collectives in step; the loss divisors are global, so the update equals one rank's.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    per, extra = divmod(batch_size, world_size)
    start = rank * per + min(rank, extra)
    return start, start + per + (rank < extra)


def shard_prompts(prompts: Sequence[T], rank: int, world_size: int) -> tuple[T, ...]:
    """Rank `rank`'s contiguous share (`shard_bounds`) of one global step's B prompts.

    Every rank sees the same global batch (same `step`, same order) and keeps its own slice, so
    the union over ranks is the global batch exactly once and no group is split.
    """
    start, stop = shard_bounds(len(prompts), rank, world_size)
    return tuple(prompts[start:stop])


def _integral(xs: Sequence[float]) -> list[int]:
    out = [round(float(x)) for x in xs]
    if any(abs(float(x) - i) > 1e-9 for x, i in zip(xs, out, strict=True)):
        raise ValueError(f"global sums carry counts (integers), got {list(xs)}")
    return out


def agree_max(n: int, group: dist.ProcessGroup | None = None) -> int:
    """The largest `n` over the ranks (all_reduce MAX, int64); `n` itself on one rank."""
    if Rank.current(group).world_size == 1:
        return int(n)
    return collectives.reduce_ints([int(n)], dist.ReduceOp.MAX, group)[0]


def global_sum(x: float, group: dist.ProcessGroup | None = None) -> float:
    """Sum of the count `x` over the ranks (all_reduce SUM); `x` itself on one rank."""
    return global_sums([x], group)[0]


def global_sums(xs: Sequence[float], group: dist.ProcessGroup | None = None) -> list[float]:
    """Element-wise sums of the counts `xs` over the ranks, in one int64 all_reduce (exact on
    every backend); `xs` itself on one rank. Counts only: a fractional value is refused."""
    if Rank.current(group).world_size == 1:
        return [float(x) for x in xs]
    return [float(v) for v in collectives.reduce_ints(_integral(xs), dist.ReduceOp.SUM, group)]


def global_float_sums(xs: Sequence[float], group: dist.ProcessGroup | None = None) -> list[float]:
    """Element-wise sums of the float figures `xs` over the ranks, in float64: gathered as
    Python floats (NCCL refuses float64 tensors, float32 would round) and added with `fsum`,
    so the sums do not depend on how the batch is split; `xs` itself on one rank."""
    if Rank.current(group).world_size == 1:
        return [float(x) for x in xs]
    parts = collectives.all_gather_object([float(x) for x in xs], group)
    return [math.fsum(column) for column in zip(*parts, strict=True)]


def mean_over_ranks(
    metrics: dict[str, float],
    sums: Sequence[str] = (),
    group: dist.ProcessGroup | None = None,
    weight: float = -1.0,
) -> dict[str, float]:
    """Each metric averaged over the ranks that report it (ranks may report different keys,
    e.g. a per-budget metric only where that budget was drawn); the `sums` keys (counts) are
    summed. One gather per call. `weight` (>= 0: this rank's trajectory count) weights each
    rank's value, so per-trajectory means are the global batch's even when the ranks hold
    unequal shares (a rank with no prompts counts for nothing); a key every reporting rank
    weighs 0, or `weight` < 0, gets the plain mean over ranks. Token-weighted figures (losses)
    are the ranks' trajectory-weighted average."""
    if Rank.current(group).world_size == 1:
        return dict(metrics)
    gathered = collectives.all_gather_object((dict(metrics), float(weight)), group)
    out = {}
    for k in sorted({k for m, _ in gathered for k in m}):
        pairs = [(m[k], w) for m, w in gathered if k in m]
        total = sum(w for _, w in pairs)
        if k in sums:
            out[k] = sum(v for v, _ in pairs)
        elif weight >= 0 and total > 0:
            out[k] = sum(v * w for v, w in pairs) / total
        else:
            out[k] = sum(v for v, _ in pairs) / len(pairs)
    return out


@dataclass(frozen=True)
class MicroBatch:
    """Indices of one micro-batch; a dummy one only keeps the collectives in step."""

    indices: tuple[int, ...]
    dummy: bool = False


def pad_micro_batches(
    chunks: Sequence[Sequence[int]], group: dist.ProcessGroup | None = None
) -> list[MicroBatch]:
    """`chunks` plus zero-weight dummies up to the maximum chunk count over the ranks.

    A dummy reuses the rank's last real chunk (or nothing, when the rank has none: the caller
    then runs a one-token input) and must contribute a loss multiplied by 0.
    """
    real = [MicroBatch(tuple(c)) for c in chunks if len(c)]
    target = agree_max(len(real), group)
    filler = real[-1].indices if real else ()
    return real + [MicroBatch(filler, dummy=True)] * (target - len(real))


def filler_trajectory(pad_id: int):
    """A 2-token text row (one trained token) for a rank with nothing to run: its zero-weight
    pass only keeps the sharded model's collectives in step."""
    from paravt.types import Trajectory

    return Trajectory("filler", 0, (pad_id, pad_id), (0, 1), (0.0, 0.0), (), 1)


def token_loss_scale(local_tokens: int, global_tokens: float, world_size: int) -> float:
    """Factor on a micro-batch's token-mean loss so the rank-averaged gradient is the global one.

    FSDP averages gradients over W ranks; a micro-batch holding n of the N trained tokens of the
    global mini-batch must therefore contribute (n / N) * W times its own token-mean.
    """
    if global_tokens <= 0:
        return 0.0
    return local_tokens / global_tokens * world_size


def generate_sync_kwargs(model: torch.nn.Module, group: dist.ProcessGroup | None = None) -> dict:
    """Extra `model.generate` kwargs: `synced_gpus=True` when `model` is sharded over ranks.

    A sharded model's forward is a collective; a rank whose sequences all stopped must keep
    running (discarded) forward passes until every rank has stopped. An unsharded model (one
    process, or an engine's own full copy) must not sync: its ranks generate independently.
    """
    from torch.distributed.tensor import DTensor

    sharded = any(isinstance(p, DTensor) for p in model.parameters())
    return {"synced_gpus": True} if sharded and Rank.current(group).world_size > 1 else {}


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether `module` holds FSDP2 (DTensor) parameters."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def on_meta(model) -> bool:
    """Whether any parameter of `model` (or its local shard) is on the meta device: a skeleton
    that holds no weights yet."""
    sharded = is_sharded(model)
    return any((p.to_local() if sharded else p).is_meta for p in model.parameters())


def load_buckets(target: torch.nn.Module, buckets) -> int:
    """Copy buckets of (name, full tensor) (`paravt.rollout.sync.weight_sync.iter_weights`) into an
    unsharded `target`; returns #tensors."""
    own = target.state_dict()
    count = 0
    with torch.no_grad():
        for bucket in buckets:
            for name, full in bucket:
                if name not in own:
                    raise KeyError(f"engine model has no tensor {name!r}; is it the same model?")
                own[name].copy_(full)
                count += 1
            del bucket
    return count
