"""FSDP2 (`fully_shard`) for Qwen-VL policies: the sharding plan, checkpoint state dicts and a
rank-0 HF export (gathered by the one bucketer, `paravt.models.full_weights`).

The plan: each decoder layer of the language model is its own FSDP unit (all-gathered just
before its forward, resharded after), and the root unit, applied last, holds the rest: embeddings,
final norm, lm_head and the frozen vision tower. The vision tower stays in the root on purpose:
its forward runs only on ranks whose batch holds pixels (a dummy micro-batch has none), and a
unit of its own would then all-gather on some ranks only and hang.

Runs on CPU over gloo (the tests use 2 ranks) and on GPU over NCCL; mixed precision (bf16
parameters, fp32 gradient reduction) is applied on GPU only. This file deliberately does not
build process groups or meshes (Lightning's ModelParallelStrategy or the caller does) and does
not decide when to sync an engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from paravt.models.full_weights import is_writer, state_items, writer_state_dict
from paravt.parallel import collectives

EXTRA_FILE = "paravt_extra.pt"


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The language model's decoder layers of a Qwen-VL (`model.language_model.layers`)."""
    inner = getattr(model, "model", model)
    lm = getattr(inner, "language_model", None)
    layers = getattr(lm, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise AttributeError(
            f"{type(model).__name__} has no `model.language_model.layers`; shard_policy knows the "
            "Qwen3-VL / Qwen2.5-VL layout only"
        )
    return layers


def mixed_precision(device_type: str, compute_dtype: str | None = None) -> MixedPrecisionPolicy:
    """FSDP2's policy: `compute_dtype` (None: bfloat16 on GPU, float32 elsewhere) for forward and
    backward, gradients reduced in fp32. The sharded parameters themselves stay fp32 (the
    master weights AdamW updates: `fp32_master`); the trainer's precision must be `32-true`,
    since Lightning's `bf16-true` would cast them to bf16 before FSDP sees them."""
    name = compute_dtype or ("bfloat16" if device_type == "cuda" else "float32")
    dtype = getattr(torch, name)
    if dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def fp32_master(model: nn.Module) -> nn.Module:
    """`model`'s floating parameters and buffers (rotary `inv_freq`) in float32, in place: the
    master weights of a mixed-precision run (free on a meta skeleton). A bf16 master rounds an
    Adam step of lr 2e-6 to zero for most weights (docs/training.md)."""
    return model.to(torch.float32)


def shard_policy(
    model: nn.Module,
    mesh=None,
    *,
    mixed_precision: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """Shard `model` in place over `mesh` (1-D data-parallel; None: the default group).

    Decoder layers one by one, then the root. Frozen parameters (vision tower, a reference
    model) are sharded the same way and simply get no gradients.
    """
    if activation_checkpointing:
        # Non-reentrant checkpointing recomputes inside the layer's FSDP unit (gather once more).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mixed_precision is not None:
        kwargs["mp_policy"] = mixed_precision
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def is_meta(model: nn.Module) -> bool:
    """Whether `model` is a skeleton on the meta device (`load_policy(..., on_meta=True)`)."""
    return any(p.is_meta for p in model.parameters())


def materialize_sharded(model: nn.Module, spec, device: torch.device | str) -> None:
    """Fill a sharded meta-device skeleton with `spec`'s checkpoint, loaded by rank 0 only.

    Rank 0 loads the full model (CPU) with `load_policy` (so every key conversion transformers
    applies holds), the other ranks load nothing; each rank allocates its own shards and rank 0
    broadcasts the weights into them, then the non-persistent buffers (rotary frequencies,
    which no state dict holds). Peak memory: one full copy on rank 0's host, shards elsewhere.
    """
    from paravt.models.loading import load_policy

    source = load_policy(spec)[0] if dist.get_rank() == 0 else None
    model.to_empty(device=device)
    full = source.state_dict() if source is not None else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)
    persistent = set(model.state_dict())
    own = dict(source.named_buffers()) if source is not None else {}
    for name, buffer in model.named_buffers():
        if name not in persistent:  # a plain tensor on every rank: broadcast rank 0's values
            if source is not None:
                buffer.copy_(own[name].to(buffer.device))
            collectives.broadcast(buffer, src=0)
    del source, full


def configure_sharding(module, spec, policy: nn.Module, *frozen: nn.Module | None) -> None:
    """The `configure_model` of paravt's LightningModules under Lightning's ModelParallelStrategy.

    Shards `policy` (activation checkpointing when it has gradient checkpointing on) and the
    `frozen` models (a KL reference) over the data-parallel mesh, then fills every meta-device
    skeleton from rank 0's load of `spec`. Without a mesh (one device) it does nothing.
    """
    from paravt.models.loading import vision_tower

    mesh = module.device_mesh
    if mesh is None:
        if is_meta(policy):
            raise RuntimeError(
                f"{type(module).__name__}(init_on_meta=True) needs an FSDP2 trainer "
                "(trainer=fsdp / fsdp_cpu) to shard and fill the policy"
            )
        return
    if any(isinstance(p, DTensor) for p in policy.parameters()):
        return  # already sharded (configure_model may run more than once)
    if any(p.requires_grad for p in vision_tower(policy).parameters()):
        raise ValueError(
            "model.freeze_vision=false is not supported under FSDP: the vision tower gets "
            "gradients only on ranks whose micro-batch holds pixels, and FSDP2 reduces the "
            "gradients of the same parameters on every rank; keep model.freeze_vision=true "
            "(the paper's setting) with trainer=fsdp"
        )
    compute = getattr(spec, "compute_dtype", None)
    dp, mp = mesh["data_parallel"], mixed_precision(module.device.type, compute)
    fp32_master(policy)  # the frozen models keep model.dtype: they are never updated
    ckpt = bool(getattr(policy, "is_gradient_checkpointing", False))
    shard_policy(policy, dp, mixed_precision=mp, activation_checkpointing=ckpt)
    models = [policy, *(m for m in frozen if m is not None)]
    for model in models[1:]:
        shard_policy(model, dp, mixed_precision=mp)
    for model in models:
        if is_meta(model):  # no rank ever held the full weights
            if spec is None:
                raise RuntimeError("a meta-device policy needs its PolicySpec to be filled")
            materialize_sharded(model, spec, module.device)


def local_numel(module: nn.Module) -> int:
    """Elements of the parameters this rank holds (its shards only, for DTensors)."""
    total = 0
    for p in module.parameters():
        total += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return total


def train_state(model: nn.Module, optimizer: torch.optim.Optimizer, *, full: bool = False) -> dict:
    """{"model", "optimizer"} state dicts: sharded DTensors (for DCP), or with `full` plain CPU
    tensors on rank 0 (the other ranks take part in the gathers and get empty dicts)."""
    opts = StateDictOptions(full_state_dict=full, cpu_offload=full)
    return {
        "model": get_model_state_dict(model, options=opts),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=opts),
    }


def load_train_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Inverse of `train_state(..., full=False)`: sharded state dicts back into place."""
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def save_checkpoint(path: str | Path, model, optimizer, extra: dict | None = None) -> None:
    """A sharded distributed checkpoint (every rank writes its own shards) plus `extra`, the
    plain state every rank shares (step, data position, weight version), written by rank 0."""
    import torch.distributed.checkpoint as dcp

    dcp.save(train_state(model, optimizer), checkpoint_id=str(path))
    if not _dist() or dist.get_rank() == 0:
        torch.save(extra or {}, Path(path) / EXTRA_FILE)
    if _dist():
        dist.barrier()


def load_checkpoint(path: str | Path, model, optimizer) -> dict:
    """Restore `save_checkpoint`'s model and optimiser in place; returns its `extra` state."""
    import torch.distributed.checkpoint as dcp

    if not (Path(path) / EXTRA_FILE).exists():
        raise FileNotFoundError(f"no distributed checkpoint at {path!s}; check ckpt_path")
    state = train_state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    load_train_state(model, optimizer, state)
    return torch.load(Path(path) / EXTRA_FILE, weights_only=False)


def export_hf(model, processor, path: str | Path, dtype: str | None = None) -> None:
    """One full HF checkpoint of `model` (with its processor), loadable by transformers and vLLM.
    A sharded model is gathered through the one bucketer (`paravt.models.full_weights`; every
    rank must call this) onto rank 0's host, bucket by bucket, and written by rank 0. `dtype`:
    the dtype the weights and config.json are written in, the one the policy was loaded in
    (`PolicySpec.dtype`), not the fp32 masters FSDP trains (35 GB instead of 17 for 8B, and
    `serve-rollout --dtype auto` would then serve fp32); None: the parameters' own."""
    sharded = any(isinstance(p, DTensor) for p in model.parameters())
    writes = is_writer() or not sharded  # unsharded: every process holds it all and writes
    cast = getattr(torch, dtype) if dtype else None
    device = "cpu" if sharded else None  # unsharded: the tensors stay where they are
    full = writer_state_dict(state_items(model), writes, dtype=cast, device=device)
    if writes:
        model.save_pretrained(str(path), state_dict=full)
        if cast is not None:  # save_pretrained writes the parameters' dtype into config.json
            model.config.dtype = dtype
            model.config.save_pretrained(str(path))
        if processor is not None:
            processor.save_pretrained(str(path))
    if sharded and _dist():
        dist.barrier()


def _dist() -> bool:
    return dist.is_available() and dist.is_initialized()
