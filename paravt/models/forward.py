"""Teacher-forced forward passes over assembled trajectories (glue between model and core).

One padded forward over a list of trajectories with every clip they hold yields the per-token
log-probabilities under the same distribution the engine sampled from (temperature, suppressed
vision placeholders): the check that token ids and visual inputs are aligned, and the trainer's
source of policy and reference log-probs. It deliberately computes no loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paravt.models.head_logprobs import head_logprobs, shift_head_output
from paravt.models.qwen_vl import mm_token_type_ids, vision_placeholder_ids, visual_kwargs
from paravt.types import Trajectory


@dataclass(frozen=True)
class TokenIds:
    """The special ids the forward pass needs."""

    pad: int
    image: int
    video: int
    suppress: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TokenIds:
        return cls(
            pad=tokenizer.pad_token_id,
            image=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
            video=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
            suppress=tuple(vision_placeholder_ids(tokenizer)),
        )


@dataclass(frozen=True)
class PaddedBatch:
    """Right-padded tensors of a list of trajectories."""

    input_ids: torch.Tensor  # [N, T]
    attention_mask: torch.Tensor  # [N, T]
    loss_mask: torch.Tensor  # [N, T] bool
    old_logp: torch.Tensor  # [N, T] behaviour log-probs (0 where loss_mask is 0)


def pad_trajectories(trajs: Sequence[Trajectory], pad_id: int) -> PaddedBatch:
    width = max(len(t.token_ids) for t in trajs)
    n = len(trajs)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.bool)
    old = torch.zeros((n, width), dtype=torch.float32)
    for i, t in enumerate(trajs):
        length = len(t.token_ids)
        ids[i, :length] = torch.tensor(t.token_ids)
        attn[i, :length] = 1
        mask[i, :length] = torch.tensor(t.loss_mask, dtype=torch.bool)
        old[i, :length] = torch.tensor(t.logprobs)
    return PaddedBatch(ids, attn, mask, old)


def trajectory_logprobs(
    model,
    trajs: Sequence[Trajectory],
    ids: TokenIds,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_size: int = 1024,
    only_trained: bool = False,
) -> tuple[torch.Tensor, PaddedBatch, torch.Tensor | None]:
    """(logp [N, T] aligned with the tokens, the padded batch, entropy [N, T] if asked).

    The lm_head computes log-probs and entropy `chunk_size` tokens at a time with recomputation
    in backward (paravt/models/head_logprobs.py): the [N, T, V] logits never exist at once.
    `only_trained`: only the trained (loss-mask) tokens go through the lm_head; logp and entropy
    are 0 elsewhere (what every loss of the trainer reads, at a fraction of the head's cost).
    """
    batch = pad_trajectories(trajs, ids.pad)
    device = next(model.parameters()).device
    kwargs = visual_kwargs([v for t in trajs for v in t.visuals], device)
    input_ids = batch.input_ids.to(device)
    at = batch.loss_mask if only_trained else None
    with head_logprobs(
        model, input_ids, temperature, ids.suppress, chunk_size, return_entropy, at=at
    ):
        out = model(
            input_ids=input_ids,
            attention_mask=batch.attention_mask.to(device),
            mm_token_type_ids=mm_token_type_ids(batch.input_ids, ids.image, ids.video).to(device),
            use_cache=False,
            **kwargs,
        )
    logp, entropy = shift_head_output(out.logits)
    return logp, batch, (entropy if return_entropy else None)
