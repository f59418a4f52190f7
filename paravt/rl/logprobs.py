"""Teacher-forced token log-probabilities that mirror the rollout engine's sampling distribution.

The engine samples from softmax(logits / temperature) with the vision placeholder ids set to -inf
(docs/method.md pitfall 8). The trainer must score tokens under exactly that distribution, or
every PPO ratio is biased: divide by the temperature FIRST, then suppress, then normalise.

Alignment convention (`causal_token_logprobs`): the returned `logp[:, t]` is the log-probability
of `input_ids[:, t]` given the tokens before t, i.e. it is read from `logits[:, t - 1]`; there is
no prediction for the first token, so `logp[:, 0] = 0`. This matches `Trajectory.logprobs`.

A target that is itself a suppressed id has log-prob -inf (the engine can never sample it).
Prompt positions hold such ids (video placeholders), so mask with `torch.where(mask, logp, 0)`,
never with `logp * mask` (-inf * 0 is NaN); the losses in this package already do.

This module deliberately does not run the model, apply top-k / top-p truncation, or compute
entropy (see losses.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _validate(
    logits: Tensor, targets: Tensor, temperature: float, suppress_ids: Sequence[int]
) -> None:
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits [N, T, V] and targets [N, T]; got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (use 1.0 for greedy scoring), got {temperature}")
    vocab = logits.shape[-1]
    bad = [i for i in suppress_ids if not 0 <= int(i) < vocab]
    if bad:
        raise ValueError(f"suppress_ids {bad} are outside the vocabulary [0, {vocab})")


def token_logprobs(
    logits: Tensor,  # [N, T, V]
    targets: Tensor,  # [N, T] long
    temperature: float = 1.0,
    suppress_ids: Sequence[int] = (),
    chunk_size: int = 1024,
) -> Tensor:  # [N, T] float32
    """log softmax(logits / temperature, ids in `suppress_ids` -> -inf) gathered at `targets`.

    Memory: no full log_softmax copy of the logits is made. The vocabulary dimension is reduced
    chunk by chunk over T (`chunk_size` positions at a time), each chunk upcast to float32, as
    the logsumexp minus the target's logit. Gradients flow to `logits`.
    """
    _validate(logits, targets, temperature, suppress_ids)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ids = torch.as_tensor(list(suppress_ids), dtype=torch.long, device=logits.device)
    out = []
    for start in range(0, logits.shape[1], chunk_size):
        z = logits[:, start : start + chunk_size].float() / temperature
        if ids.numel():
            z = z.index_fill(-1, ids, float("-inf"))
        tgt = targets[:, start : start + chunk_size].long().unsqueeze(-1)
        out.append(z.gather(-1, tgt).squeeze(-1) - torch.logsumexp(z, dim=-1))
    if not out:
        return logits.new_zeros(logits.shape[:2], dtype=torch.float32)
    return torch.cat(out, dim=1)


def shift_for_causal(
    logits: Tensor,  # [N, T, V]
    input_ids: Tensor,  # [N, T]
) -> tuple[Tensor, Tensor]:  # ([N, T-1, V], [N, T-1])
    """Pair the prediction at position t - 1 with the token at t: (logits[:, :-1], ids[:, 1:])."""
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits [N, T, V] and input_ids [N, T]; got {tuple(logits.shape)} and "
            f"{tuple(input_ids.shape)}"
        )
    return logits[:, :-1], input_ids[:, 1:]


def causal_token_logprobs(
    logits: Tensor,  # [N, T, V] model outputs over input_ids
    input_ids: Tensor,  # [N, T]
    temperature: float = 1.0,
    suppress_ids: Sequence[int] = (),
    chunk_size: int = 1024,
) -> Tensor:  # [N, T]; logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t]), logp[:, 0] = 0
    """Per-token log-probs of a sequence under its own forward pass, aligned with the tokens."""
    shifted_logits, targets = shift_for_causal(logits, input_ids)
    logp = token_logprobs(shifted_logits, targets, temperature, suppress_ids, chunk_size)
    first = logp.new_zeros(logp.shape[0], 1)
    return torch.cat([first, logp], dim=1)
