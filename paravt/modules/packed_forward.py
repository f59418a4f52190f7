"""Padding-free teacher-forced passes for the RL update (`algorithm.pack_update=true`).

The trajectories of one micro-batch are concatenated into ONE row with the SFT packer
(`paravt.data.packing.pack_batch`): every trajectory keeps the M-RoPE positions it has alone,
and the text-position row restarts at 0 per trajectory, so no trajectory attends to another:
under `paravt.models.varlen_attention.varlen_attention` each attends only to itself, causally,
with no [L, L] mask (flash-attention models do the same from the restarts; plain sdpa and eager
get transformers' dense block-diagonal mask). The lm_head scores the row a chunk at a time, as
the padded pass does. The per-token log-probs and entropies of the packed row are then laid back
out as right-padded [N, T] rows, so the losses, masks, proximal log-probs and micro-batch weights
of the padded path apply unchanged and the loss, and its gradient, equal the padded path's
(tests/modules/test_trainer_microbatch.py, tests/modules/test_packed_forward.py).

Micro-batches are cut by the SUM of their tokens (`packed_chunks`), not by rows x longest.
It deliberately computes no loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paravt.data.packing import RopeIndex, pack_batch, plan_packs
from paravt.data.sft_encode import SFTExample
from paravt.models.forward import PaddedBatch, TokenIds, pad_trajectories
from paravt.models.head_logprobs import head_logprobs, shift_head_output
from paravt.models.qwen_vl import visual_kwargs
from paravt.models.varlen_attention import varlen_active
from paravt.types import Trajectory


def packed_chunks(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Item indices in micro-batches of at most `max_tokens` tokens in all (first fit, in
    order); an item longer than the budget gets a micro-batch of its own."""
    return plan_packs(lengths, max_tokens)


def unpack_rows(
    packed: torch.Tensor,  # [1, L] values along the packed row
    lengths: Sequence[int],  # tokens of each trajectory, in packing order
    width: int,
) -> torch.Tensor:  # [N, width], zero on padding; differentiable
    """Cut a packed row back into right-padded rows, one per trajectory."""
    rows, at = [], 0
    for n in lengths:
        piece = packed[0, at : at + n]
        rows.append(torch.nn.functional.pad(piece, (0, width - n)))
        at += n
    return torch.stack(rows)


def packed_trajectory_logprobs(
    model,
    trajs: Sequence[Trajectory],
    ids: TokenIds,
    rope_index: RopeIndex,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 1024,
    only_trained: bool = False,
) -> tuple[torch.Tensor, PaddedBatch, torch.Tensor | None]:
    """(logp [N, T], the padded batch, entropy [N, T] if asked) from one packed forward.
    `only_trained`: only the trained tokens go through the lm_head (0 elsewhere), as in
    `trajectory_logprobs`.

    The lm_head scores `chunk_size` tokens at a time (paravt/models/head_logprobs.py), as the
    padded pass does: the [1, L, V] logits never exist at once. logp[:, 0] and entropy[:, 0] are
    0 for every trajectory (no prediction of a first token), exactly as in
    `paravt.models.forward.trajectory_logprobs`; the packed row's value there is read from the
    previous trajectory's last position.
    """
    examples = [SFTExample("", t, (0,) * len(t.token_ids)) for t in trajs]
    lengths = [len(t.token_ids) for t in trajs]
    packed = pack_batch(examples, rope_index, sum(lengths), ids.pad, ids.image, ids.video)
    device = next(model.parameters()).device
    input_ids = packed.input_ids.to(device)  # [1, L]
    at = packed.loss_mask if only_trained else None
    with head_logprobs(
        model, input_ids, temperature, ids.suppress, chunk_size, with_entropy, at=at
    ):
        out = model(
            input_ids=input_ids,
            position_ids=packed.position_ids.to(device),
            mm_token_type_ids=packed.mm_token_type_ids.to(device),
            use_cache=False,
            **visual_kwargs(packed.visuals, device),
        )
    logp, entropy = (unpack_rows(v, lengths, max(lengths)) for v in shift_head_output(out.logits))
    logp, entropy = (
        torch.cat([torch.zeros_like(v[:, :1]), v[:, 1:]], dim=1) for v in (logp, entropy)
    )
    if logp.requires_grad and varlen_active(model) and is_checkpointing(model):
        logp.register_hook(_varlen_still_active(model))
    return logp, pad_trajectories(trajs, ids.pad), (entropy if with_entropy else None)


def is_checkpointing(model) -> bool:
    return bool(getattr(model, "is_gradient_checkpointing", False))


def _varlen_still_active(model):
    """A backward hook: recomputed activations must be dispatched to the varlen attention too,
    or the recomputation attends across the packed trajectories (paravt.models.varlen_attention).
    """

    def check(grad: torch.Tensor) -> torch.Tensor:
        if not varlen_active(model):
            raise RuntimeError(
                "backward through a packed forward ran outside varlen_attention while the model "
                "recomputes activations (gradient checkpointing): hold varlen_attention(model) "
                "over the backward too"
            )
        return grad

    return check
