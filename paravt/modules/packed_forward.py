"""Padding-free teacher-forced passes for the RL update (`algorithm.pack_update=true`).

The trajectories of one micro-batch are concatenated into ONE row with the SFT packer
(`paravt.data.packing.pack_batch`): every trajectory keeps the M-RoPE positions it has alone,
and the text-position row restarts at 0 per trajectory, from which transformers builds a
block-diagonal causal mask (no attention across trajectories). The per-token log-probs and
entropies of the packed row are then laid back out as right-padded [N, T] rows, so the losses,
masks, proximal log-probs and micro-batch weights of the padded path apply unchanged and the
loss, and its gradient, equal the padded path's (tests/modules/test_packed_update.py).

Micro-batches are cut by the SUM of their tokens (`packed_chunks`), not by rows x longest.
It deliberately computes no loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paravt.data.packing import RopeIndex, pack_batch, plan_packs
from paravt.data.sft_encode import SFTExample
from paravt.models.forward import PaddedBatch, TokenIds, pad_trajectories
from paravt.rl.logprobs import causal_token_logprobs
from paravt.rl.losses import entropy_from_logits
from paravt.rollout.hf import visual_kwargs
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
) -> tuple[torch.Tensor, PaddedBatch, torch.Tensor | None]:
    """(logp [N, T], the padded batch, entropy [N, T] if asked) from one packed forward.

    logp[:, 0] is 0 for every trajectory (no prediction of a first token), exactly as in
    `paravt.models.forward.trajectory_logprobs`; the packed row's value there would be read
    from the previous trajectory's last position.
    """
    examples = [SFTExample("", t, (0,) * len(t.token_ids)) for t in trajs]
    lengths = [len(t.token_ids) for t in trajs]
    packed = pack_batch(examples, rope_index, sum(lengths), ids.pad, ids.image, ids.video)
    device = next(model.parameters()).device
    out = model(
        input_ids=packed.input_ids.to(device),
        position_ids=packed.position_ids.to(device),
        mm_token_type_ids=packed.mm_token_type_ids.to(device),
        use_cache=False,
        **visual_kwargs(packed.visuals, device),
    )
    input_ids = packed.input_ids.to(device)
    logp = causal_token_logprobs(out.logits, input_ids, temperature, ids.suppress)  # [1, L]
    width = max(lengths)
    logp = unpack_rows(logp, lengths, width)
    logp = torch.cat([torch.zeros_like(logp[:, :1]), logp[:, 1:]], dim=1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = unpack_rows(entropy_from_logits(out.logits.detach()), lengths, width)
    return logp, pad_trajectories(trajs, ids.pad), entropy
