"""Data-parallel bookkeeping that keeps W ranks in lock-step: prompt shards, agreed counts.

Under FSDP every forward and backward pass is a collective (parameters are all-gathered layer by
layer, gradients reduce-scattered), so every rank must run the same NUMBER of passes even when
its rollouts differ. This file holds the small rules that make that true:
- `shard_prompts`: rank r of W takes its own contiguous B/W prompts of every global step (a
  prompt's G rollouts stay on one rank, so group advantages are computed locally);
- `agree_max` / `pad_micro_batches`: all ranks do max-over-ranks micro-batches, the missing ones
  being zero-weight dummies (still a real forward/backward, so the collectives match);
- `token_loss_scale`: the weight that makes FSDP's gradient average over ranks equal the
  token-mean over the GLOBAL batch (what one rank with the whole batch would compute);
- `generate_sync_kwargs`: transformers `generate` keeps stepping until every rank is done.
It works without an initialised process group (world size 1), and deliberately knows nothing of
Lightning, Hydra or the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

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


def shard_prompts(prompts: Sequence[T], rank: int, world_size: int) -> tuple[T, ...]:
    """Rank `rank`'s contiguous B/W slice of one global step's B prompts.

    Every rank sees the same global batch (same `step`, same order) and keeps its own slice, so
    the union over ranks is the global batch exactly once and no group is split.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    b = len(prompts)
    if b % world_size:
        fix = -(-b // world_size) * world_size
        raise ValueError(
            f"data.batch_size={b} prompts cannot be split evenly over {world_size} ranks; "
            f"set data.batch_size to a multiple of {world_size} (e.g. {fix})"
        )
    per = b // world_size
    return tuple(prompts[rank * per : (rank + 1) * per])


def _reduce(value: float, op: dist.ReduceOp, group: dist.ProcessGroup | None) -> float:
    if Rank.current(group).world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=op, group=group)
    return float(t.item())


def agree_max(n: int, group: dist.ProcessGroup | None = None) -> int:
    """The largest `n` over the ranks (all_reduce MAX); `n` itself on one rank."""
    return int(_reduce(float(n), dist.ReduceOp.MAX, group))


def global_sum(x: float, group: dist.ProcessGroup | None = None) -> float:
    """Sum of `x` over the ranks (all_reduce SUM); `x` itself on one rank."""
    return _reduce(float(x), dist.ReduceOp.SUM, group)


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
