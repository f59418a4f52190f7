"""Make a causal LM's forward return token log-probs (and entropy) instead of full logits.

The model's own forward runs unchanged up to its lm_head; for the duration of the context the
lm_head's `forward` is replaced by `paravt.rl.fused_logprobs.linear_logprobs` over the targets
given here, so `out.logits` comes back as [N, T, 2] (log-prob, entropy) and the [N, T, V] logits
never exist at once. The call still goes through the lm_head module, so FSDP2's unshard and
pre-backward hooks (the lm_head lives in the root unit, paravt/parallel/fsdp.py) see it as usual.
It deliberately knows nothing of trajectories or losses (forward.py, grpo.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from paravt.rl.fused_logprobs import linear_logprobs


@contextmanager
def head_logprobs(
    model,
    input_ids: torch.Tensor,  # [N, T] the ids the forward is run over
    temperature: float,
    suppress_ids: Sequence[int],
    chunk_size: int,
    entropy: bool,
) -> Iterator[None]:
    """Within the context `model(input_ids=...).logits` is [N, T, 2]: [..., 0] the log-prob of
    the NEXT token (ids[:, t + 1]; the last position is a dummy) and [..., 1] the entropy of that
    distribution (0 when `entropy` is False)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(
            f"head_logprobs needs a Linear lm_head, got {type(head).__name__}; score with "
            "paravt.rl.logprobs.causal_token_logprobs over the full logits instead"
        )
    targets = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)  # [N, T]; last is a dummy

    def forward(hidden: torch.Tensor) -> torch.Tensor:  # [N, T, H] -> [N, T, 2]
        logp, ent = linear_logprobs(
            hidden,
            head.weight,
            targets.to(hidden.device),
            temperature,
            suppress_ids,
            chunk_size,
            entropy,
            head.bias,
        )
        return torch.stack([logp, ent if ent is not None else torch.zeros_like(logp)], dim=-1)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def shift_head_output(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, T, 2] of `head_logprobs` -> (logp [N, T], entropy [N, T]) aligned with the tokens:
    index t scores ids[:, t]; index 0 (no prediction) holds 0."""
    zero = out.new_zeros(out.shape[0], 1, 2)
    aligned = torch.cat([zero, out[:, :-1]], dim=1)
    return aligned[..., 0], aligned[..., 1]
