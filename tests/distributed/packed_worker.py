"""One rank of the packed update under FSDP2: the same micro-batch through the padded
pass and through the packed row with the varlen attention, with and without activation
checkpointing; each rank writes its largest log-prob and gradient-shard differences."""

from __future__ import annotations

import random
from contextlib import nullcontext

import torch


def _trajectories(rank: int):
    """Text rows of this rank, lengths 1..40 (a 1-token row among them), ids avoid specials."""
    from paravt.types import Trajectory

    rng = random.Random(rank)
    out = []
    for g, n in enumerate((17, 1, 40, 6) if rank == 0 else (3, 29, 11)):
        ids = tuple(rng.randrange(10, 480) for _ in range(n))
        mask = (0,) * (n // 3) + (1,) * (n - n // 3)
        out.append(Trajectory(f"r{rank}", g, ids, mask, (0.0,) * n, (), n // 3))
    return out


def _grads(model, ids, trajs, packed: bool):
    from paravt.data.packing import model_rope_index
    from paravt.models.forward import trajectory_logprobs
    from paravt.models.varlen_attention import text_config, varlen_attention
    from paravt.modules.packed_forward import packed_trajectory_logprobs

    with varlen_attention(model) if packed else nullcontext():  # padded: plain sdpa
        seen = text_config(model)._attn_implementation
        if packed:
            logp, batch, _ = packed_trajectory_logprobs(model, trajs, ids, model_rope_index(model))
        else:
            logp, batch, _ = trajectory_logprobs(model, trajs, ids)
        adv = torch.linspace(-1.0, 1.0, len(trajs))[:, None]
        (-(logp * adv * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
    grads = {
        n: p.grad.to_local().clone() for n, p in model.named_parameters() if p.grad is not None
    }
    model.zero_grad(set_to_none=True)
    return logp.detach() * batch.loss_mask, grads, seen


def _setting(model_dir: str, checkpointing: bool) -> dict:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.models.forward import TokenIds
    from paravt.models.varlen_attention import text_config
    from paravt.parallel.fsdp import shard_policy

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    ids = TokenIds.from_tokenizer(AutoProcessor.from_pretrained(model_dir).tokenizer)
    shard_policy(model, activation_checkpointing=checkpointing)
    model.train()  # checkpointing recomputes in training mode only; the tiny model has no dropout
    trajs = _trajectories(torch.distributed.get_rank())
    pad_logp, pad, _ = _grads(model, ids, trajs, packed=False)
    pack_logp, pack, seen = _grads(model, ids, trajs, packed=True)
    return {
        "logp": float((pad_logp - pack_logp).abs().max()),
        "grad": max(float((pad[n] - pack[n]).abs().max()) for n in pad),
        "grad_scale": max(float(g.abs().max()) for g in pad.values()),
        "same_keys": pad.keys() == pack.keys() and len(pad) > 0,
        "inside": seen,
        "after": text_config(model)._attn_implementation,
        "checkpointing": bool(model.is_gradient_checkpointing),
    }


def run(model_dir: str) -> dict:
    return {ckpt: _setting(model_dir, ckpt) for ckpt in (False, True)}
