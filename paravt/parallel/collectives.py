"""The one door every paravt collective goes through, checked against its group's backend.

NCCL reduces only CUDA tensors ("No backend type associated with device type cpu" otherwise);
gloo reduces CPU tensors. paravt's own collectives (agreed counts, global loss divisors, metric
gathers, buffer broadcasts) therefore build their tensors on `collective_device(group)`, the
device the group's backend requires, and hand them to `torch.distributed` only through the
functions below, which check every tensor first (`check_tensor`):
- device: `cuda` for an NCCL group, `cpu` for gloo;
- dtype: counts travel as int64 (exact), float figures as float32. float64 is refused under the
  NCCL rule: NCCL can reduce it (ncclFloat64), but a figure that needs 53 bits is a count and
  should be an integer; the rule keeps the GPU path off slow double reductions.

A test rule simulates NCCL on gloo: with `PARAVT_COLLECTIVE_RULE=nccl` the checks apply the
NCCL rule while the transport stays gloo. The device the layer would have chosen under NCCL is
CUDA, which a CPU machine lacks, so under the simulated rule `collective_device` returns the
CPU and marks every tensor it builds as placed (an attribute); a tensor that did not come from
`on_collective_device` (a CPU tensor made by hand, as the old code did) fails the check exactly
as it would fail under real NCCL. The 2-rank tests run with that rule on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist

RULE_ENV = "PARAVT_COLLECTIVE_RULE"
_PLACED = "_paravt_placed_for_nccl"  # attribute marking tensors built for the simulated rule


class CollectiveError(RuntimeError):
    """A tensor handed to a collective is on a device (or of a dtype) its backend refuses."""


def backend_rule(group: dist.ProcessGroup | None = None) -> str:
    """The rule checks apply: `PARAVT_COLLECTIVE_RULE` when set (simulation), else the
    group's backend ("nccl", "gloo", ...)."""
    forced = os.environ.get(RULE_ENV, "").strip().lower()
    if forced:
        return forced
    return str(dist.get_backend(group)).lower()


def _simulated(group) -> bool:
    return backend_rule(group) == "nccl" and str(dist.get_backend(group)).lower() != "nccl"


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device the group's backend needs: the rank's current CUDA device for NCCL, else CPU
    (also under the simulated NCCL rule, whose transport is gloo)."""
    if backend_rule(group) == "nccl" and not _simulated(group):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def on_collective_device(
    values: Sequence[float | int], dtype: torch.dtype, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """`values` as a 1-D tensor of `dtype` on `collective_device(group)`."""
    t = torch.tensor(list(values), dtype=dtype, device=collective_device(group))
    if _simulated(group):
        setattr(t, _PLACED, True)
    return t


def check_tensor(t: torch.Tensor, rule: str, placed: bool = False) -> None:
    """Raise `CollectiveError` when `rule`'s backend would refuse `t` (see the module doc).

    `placed`: `t` was built by `on_collective_device` for the simulated rule (stands for CUDA).
    """
    if rule == "nccl":
        if t.device.type != "cuda" and not placed:
            raise CollectiveError(
                f"a {t.device.type} tensor was handed to an NCCL collective; NCCL needs CUDA "
                "tensors: build it with paravt.parallel.collectives.on_collective_device(group)"
            )
        if t.dtype == torch.float64:
            raise CollectiveError(
                "a float64 tensor was handed to an NCCL collective; send counts as int64 and "
                "float figures as float32 (paravt.parallel.collectives)"
            )
    elif rule == "gloo" and t.device.type != "cpu":
        raise CollectiveError(f"gloo collectives need CPU tensors, got {t.device}")


def _check(t: torch.Tensor, group) -> None:
    check_tensor(t, backend_rule(group), placed=getattr(t, _PLACED, False))


def all_reduce(t: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> torch.Tensor:
    """`dist.all_reduce` of `t` in place, after the backend check; returns `t`."""
    _check(t, group)
    dist.all_reduce(t, op=op, group=group)
    return t


def broadcast(t: torch.Tensor, src: int = 0, group=None) -> torch.Tensor:
    """`dist.broadcast` of `t` in place from `src`, after the backend check. Module buffers
    live on the module's device (CUDA under NCCL), which the check verifies."""
    check_tensor(t, backend_rule(group), placed=getattr(t, _PLACED, False) or _simulated(group))
    dist.broadcast(t, src=src, group=group)
    return t


def all_gather_object(obj, group=None) -> list:
    """Every rank's `obj`, in rank order. torch pickles it into a tensor on the current CUDA
    device under NCCL (the device Lightning sets per rank) and on the CPU under gloo."""
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def reduce_ints(values: Sequence[int], op=dist.ReduceOp.SUM, group=None) -> list[int]:
    """Element-wise reduction of integers over the ranks (int64, exact)."""
    t = all_reduce(on_collective_device([int(v) for v in values], torch.int64, group), op, group)
    return [int(v) for v in t.tolist()]


def on_rank0(fn, group=None):
    """`fn()` run by rank 0 only, its result (or its exception) handed to every rank: work
    done once per run instead of once per rank (e.g. opening every training video at setup).
    One process: `fn()` itself."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return fn()
    box: list = [None]
    if dist.get_rank(group) == 0:
        try:
            box[0] = ("ok", fn())
        except Exception as error:  # every rank must leave the broadcast, then raise
            box[0] = ("error", error)
    dist.broadcast_object_list(box, src=0, group=group)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def settle_ranks(error: BaseException | None, what: str = "rollouts", group=None) -> None:
    """After work every rank does at once (a step's rollouts): when one rank's failed (`error`
    there; it raises its own afterwards), every other rank raises too, quoting it, instead of
    going on into a collective that rank never reaches (NCCL's 30-minute timeout). One
    process: nothing to agree on."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return
    got = all_gather_object(None if error is None else f"{type(error).__name__}: {error}", group)
    failed = [(r, msg) for r, msg in enumerate(got) if msg is not None]
    if failed and error is None:
        rank, msg = failed[0]
        raise RuntimeError(
            f"trainer rank {rank}'s {what} failed, so rank {dist.get_rank(group)} stops too "
            f"(nothing is trained on it): {msg}"
        )


def on_rank0_each(fn, part, group=None):
    """`fn()` run by rank 0 only; rank r receives `part(result, r)` (or rank 0's exception):
    one scatter, each rank sent only its part of a large result, where `on_rank0` sends every
    rank all of it. Under NCCL torch stages each part on the current CUDA device (the one
    Lightning sets per rank). One process: `part(fn(), 0)`."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return part(fn(), 0)
    box: list = [None]
    parts = None
    if dist.get_rank(group) == 0:
        try:
            value = fn()
            parts = [("ok", part(value, r)) for r in range(dist.get_world_size(group))]
        except Exception as error:  # every rank must leave the scatter, then raise
            parts = [("error", error)] * dist.get_world_size(group)
    dist.scatter_object_list(box, parts, src=0, group=group)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def leave_group(wait_for_peers: bool = True) -> None:
    """Tear the default process group down once every rank has reached this point.

    A rank that destroys its group while a peer is still finishing (saving, logging) closes the
    transport under that peer; gloo's worker threads then abort the peer's process
    ("terminate called without an active exception") with no Python traceback. The barrier
    makes every rank arrive before any leaves. A rank leaving on an error passes
    `wait_for_peers=False`: its peers may never arrive, and it must exit, not wait out the
    group's timeout. No group: nothing to do."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if wait_for_peers and dist.get_world_size() > 1:
            dist.barrier()
    finally:
        _destroy_groups()


def _destroy_groups() -> None:
    """The default group and, when an in-process vLLM engine made groups of its own (its
    world, tensor- and pipeline-parallel groups; on a CPU the default group is vLLM's), those
    first, through vLLM's own teardown. Destroying only the default group left vLLM's groups
    registered: the engine's shutdown at interpreter exit then destroyed a group torch no longer
    knew and printed `ValueError: Invalid process group specified` after a finished
    `train.py rollout/engine=vllm`. vLLM is never imported here: only a process that runs it
    has its state module loaded."""
    vllm_state = sys.modules.get("vllm.distributed.parallel_state")
    if vllm_state is not None:
        vllm_state.destroy_model_parallel()
        vllm_state.destroy_distributed_environment()
    if dist.is_initialized():
        dist.destroy_process_group()
