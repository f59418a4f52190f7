"""Make a causal LM's forward return token log-probs (and entropy) instead of full logits.

The model's own forward runs unchanged up to its lm_head; for the duration of the context the
lm_head's `forward` is replaced by `paravt.rl.fused_logprobs.linear_logprobs` over the targets
given here, so `out.logits` comes back as [N, T, 3] (log-prob, entropy, argmax hit) and the
[N, T, V] logits never exist at once. The call still goes through the lm_head module, so
FSDP2's unshard and pre-backward hooks (the lm_head lives in the root unit,
paravt/parallel/fsdp.py) see it as usual.
With `at`, only the positions whose log-prob a loss reads (the trained tokens) go through the
lm_head; at Qwen's 151,936-row head that is most of a teacher-forced pass's cost, and the prompt's
video and tool-response tokens are most of a trajectory. With `greedy_at`, a third channel says
whether each of those tokens is the argmax of its distribution (an SFT accuracy metric).
It deliberately knows nothing of trajectories or losses (forward.py, grpo.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from paravt.rl.fused_logprobs import linear_logprobs


@contextmanager
def head_logprobs(
    model,
    input_ids: torch.Tensor,  # [N, T] the ids the forward is run over
    temperature: float,
    suppress_ids: Sequence[int],
    chunk_size: int,
    entropy: bool,
    at: torch.Tensor | None = None,  # [N, T] bool: the tokens to score; None: every token
    greedy_at: torch.Tensor | None = None,  # [N, T] bool: the tokens to check against argmax
) -> Iterator[None]:
    """Within the context `model(input_ids=...).logits` is [N, T, 3], position t scoring the NEXT
    token ids[:, t + 1] (the last position is a dummy): [..., 0] its log-prob, [..., 1] the
    entropy of that distribution (0 when `entropy` is False), [..., 2] 1.0 where that token is
    the distribution's argmax. Channels 0-1 are 0 where `at` is False, channel 2 where
    `greedy_at` is; `at` and `greedy_at` are aligned with the tokens (shift_head_output)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(
            f"head_logprobs needs a Linear lm_head, got {type(head).__name__}; score with "
            "paravt.rl.logprobs.causal_token_logprobs over the full logits instead"
        )
    for name, mask in (("at", at), ("greedy_at", greedy_at)):
        if mask is not None and mask.shape != input_ids.shape:
            raise ValueError(
                f"{name} {tuple(mask.shape)} must match input_ids {tuple(input_ids.shape)}"
            )
    targets = _next(input_ids)  # [N, T]; the last is a dummy
    scored = None if at is None else _next(at.bool(), fill=False)
    greedy = None if greedy_at is None else _next(greedy_at.bool(), fill=False)

    def forward(hidden: torch.Tensor) -> torch.Tensor:  # [N, T, H] -> [N, T, 3]
        tgt = targets.to(hidden.device)
        sel = None if scored is None else scored.to(hidden.device)
        h, t = (hidden, tgt) if sel is None else (hidden[sel][None], tgt[sel][None])
        logp, ent = linear_logprobs(
            h, head.weight, t, temperature, suppress_ids, chunk_size, entropy, head.bias
        )
        vals = torch.stack([logp, ent if ent is not None else torch.zeros_like(logp)], dim=-1)
        if sel is not None:  # back to [N, T, 2], zero where nothing was scored
            out = vals.new_zeros(*hidden.shape[:2], 2)
            out[sel] = vals[0]
            vals = out
        hits = vals.new_zeros(hidden.shape[:2])
        if greedy is not None:
            g = greedy.to(hidden.device)
            hits[g] = _argmax_hits(hidden[g].detach(), head, tgt[g], suppress_ids, chunk_size)
        return torch.cat([vals, hits[..., None]], dim=-1)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def _next(x: torch.Tensor, fill: bool | None = None) -> torch.Tensor:
    """x shifted left by one along T (position t holds x[:, t + 1]); the last column is x[:, 0]
    or `fill`."""
    last = x[:, :1] if fill is None else torch.full_like(x[:, :1], fill)
    return torch.cat([x[:, 1:], last], dim=1)


@torch.no_grad()
def _argmax_hits(
    hidden: torch.Tensor,  # [M, H]
    head: torch.nn.Linear,
    targets: torch.Tensor,  # [M]
    suppress_ids: Sequence[int],
    chunk_size: int,
) -> torch.Tensor:  # [M] float: 1.0 where the target is the argmax of the suppressed logits
    out = []
    sup = torch.as_tensor(sorted({int(i) for i in suppress_ids}), dtype=torch.long)
    for s in range(0, hidden.shape[0], chunk_size):
        z = F.linear(hidden[s : s + chunk_size], head.weight, head.bias).float()
        if sup.numel():
            z.index_fill_(-1, sup.to(z.device), float("-inf"))
        out.append((z.argmax(-1) == targets[s : s + chunk_size]).float())
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


def shift_head_output(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, T, 3] of `head_logprobs` -> (logp [N, T], entropy [N, T]) aligned with the tokens:
    index t scores ids[:, t]; index 0 (no prediction) holds 0."""
    aligned = _aligned(out)
    return aligned[..., 0], aligned[..., 1]


def shift_head_greedy(out: torch.Tensor) -> torch.Tensor:
    """[N, T, 3] of `head_logprobs` -> [N, T] bool aligned with the tokens: True where ids[:, t]
    is the argmax of its distribution (only where `greedy_at` asked)."""
    return _aligned(out)[..., 2] > 0.5


def _aligned(out: torch.Tensor) -> torch.Tensor:
    return torch.cat([out.new_zeros(out.shape[0], 1, out.shape[2]), out[:, :-1]], dim=1)
