"""The one bucketer: a model's full tensors under their names, about `bucket_bytes` at a time.

Every reader of a policy's weights as a whole goes through `buckets`: the engines' weight sync
(`paravt.rollout.sync.weight_sync.iter_weights`), the asynchronous generator's host copy, and
the HF exports (`paravt.parallel.fsdp.export_hf`, `paravt.models.lora.export_lora`). What
varies is the stream of (name, tensor) it is fed, composed of two parts:
- the gather: `full_tensor` turns an FSDP2 shard (DTensor) into the full tensor, a collective
  every rank runs for the same tensor in the same order; a plain tensor passes through;
- the names: `state_items`, a model's own state dict; `paravt.models.lora.merged_items`, a LoRA
  model merged (W + scale * B @ A of the gathered factors) under the base model's names.
A stream gathers each tensor only when the bucketer pulls it, so at most one bucket of full
weights exists besides the shards when the consumer drops each bucket before taking the next;
`writer_state_dict` collects them on the rank that writes a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

Bucket = list[tuple[str, torch.Tensor]]


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The full tensor of an FSDP2 shard (a collective: every rank, same tensor, same order), or
    `t` itself (detached either way)."""
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t


def state_items(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of `model.state_dict()`, in its order, each gathered when pulled.
    `dtype` casts each floating-point shard before its gather (bf16 from fp32 master weights:
    half the traffic, and the values of casting the gathered tensor, the cast being
    elementwise)."""
    for name, tensor in model.state_dict().items():
        yield name, full_tensor(at_dtype(tensor.detach(), dtype))


def at_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`t` cast to `dtype` when it is floating-point (integer buffers keep theirs)."""
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def buckets(
    items: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int = 256 << 20,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Iterator[Bucket]:
    """`items` in buckets, each yielded once its tensors hold `bucket_bytes` (counted as gathered,
    before the cast), or at the end; a tensor larger than the bound is a bucket of its own.
    `device` None keeps each tensor where it is; `dtype` None keeps each dtype, otherwise the
    floating-point tensors are cast to it."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: Bucket = []
    size = 0
    for name, tensor in items:
        tensor = tensor if device is None else tensor.to(device)
        size += tensor.numel() * tensor.element_size()
        bucket.append((name, at_dtype(tensor, dtype)))
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def writer_state_dict(
    items: Iterable[tuple[str, torch.Tensor]],
    keep: bool,
    bucket_bytes: int = 256 << 20,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = "cpu",
) -> dict[str, torch.Tensor]:
    """The full state dict for a file writer: with `keep` each bucket is moved to `device` (the
    host) and kept; without, dropped before the next one is gathered, so no rank holds more than
    one bucket of full weights on its accelerator. Under FSDP2 every rank must call it (the
    gathers are collectives); the ranks that do not keep get {}."""
    out: dict[str, torch.Tensor] = {}
    for bucket in buckets(items, bucket_bytes, device if keep else None, dtype if keep else None):
        if keep:
            out.update(bucket)
        del bucket  # the other ranks: this bucket's gathered tensors are freed here
    return out


def is_writer() -> bool:
    """Whether this process writes a gathered file: rank 0, or the only process."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
