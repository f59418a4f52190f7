"""Per-token KL estimators between the policy and a frozen reference, and reward-side KL.

The estimators follow Schulman's "Approximating KL Divergence" (2020) with samples drawn from the
policy: with d = logp - ref_logp,
    k1 = d                              (unbiased, can be negative)
    k2 = 0.5 * d ** 2                   (biased, low variance, >= 0)
    k3 = exp(-d) - (-d) - 1             (unbiased, >= 0)
The reference recipe (docs/method.md section 4) folds k1 with coefficient 0.01 into the reward
(`sequence_kl`, then `fold_kl_into_rewards`); the KL-as-a-loss alternative lives in losses.py
(`kl_loss`).

This module deliberately does not aggregate over tokens into a loss, and does not compute
log-probabilities (see logprobs.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

KLEstimator = Callable[[Tensor, Tensor], Tensor]

# exp(20) ~ 4.9e8: far beyond any ratio that matters, far below float32 overflow.
LOG_RATIO_CLAMP = 20.0


def _log_ratio(logp: Tensor, ref_logp: Tensor) -> Tensor:
    # The clamp keeps exp() finite for -inf or extreme log-probs; NaN is left to surface a bug.
    return (logp - ref_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:  # [N, T] -> [N, T]
    """k1 = logp - ref_logp (Schulman 2020): the plain log-ratio."""
    return _log_ratio(logp, ref_logp)


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:  # [N, T] -> [N, T]
    """k2 = 0.5 * (logp - ref_logp)^2 (Schulman 2020)."""
    return 0.5 * _log_ratio(logp, ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:  # [N, T] -> [N, T]
    """k3 = exp(ref - logp) - (ref - logp) - 1 (Schulman 2020; the GRPO paper's KL term)."""
    neg = -_log_ratio(logp, ref_logp)
    return torch.exp(neg) - neg - 1.0


KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def get_kl_estimator(name: str) -> KLEstimator:
    """Look up a KL estimator by name."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; valid names: {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name]


def kl_penalty(
    logp: Tensor,  # [N, T]
    ref_logp: Tensor,  # [N, T]
    estimator: str = "k1",
    mask: Tensor | None = None,  # [N, T]; 1 = trained token
) -> Tensor:  # [N, T], 0 outside the mask
    """Per-token KL estimate of the policy from the reference, zeroed outside `mask`.

    Masked positions are replaced before the estimator runs, so a -inf log-prob at a padding or
    prompt position yields neither a NaN value nor a NaN gradient.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must match"
        )
    fn = get_kl_estimator(estimator)
    if mask is None:
        return fn(logp, ref_logp)
    keep = mask.bool()
    kl = fn(torch.where(keep, logp, 0.0), torch.where(keep, ref_logp, 0.0))
    return torch.where(keep, kl, 0.0)


def sequence_kl(kl: Tensor, mask: Tensor) -> Tensor:  # [N, T] x2 -> [N]
    """Sum of the per-token KL terms over each rollout's trained tokens, detached.

    The k1 terms are summed, not averaged: their sum over a response is an unbiased estimate of
    the sequence-level KL.
    """
    if kl.shape != mask.shape:
        raise ValueError(
            f"expected kl [N, T] and mask [N, T]; got {tuple(kl.shape)}, {tuple(mask.shape)}"
        )
    return torch.where(mask.bool(), kl.detach(), 0.0).sum(dim=1)


def fold_kl_into_rewards(
    rewards: Tensor,  # [N]
    seq_kl: Tensor,  # [N] `sequence_kl` of each rollout
    coef: float = 0.01,
) -> Tensor:  # [N]
    """Reward-side KL (reference recipe: k1, coef 0.01): R - coef * sum_t KL_t over trained tokens.

    Takes the per-rollout sums (`sequence_kl`), since the trainer computes them micro-batch by
    micro-batch. The result is detached, since a reward carries no gradient.
    """
    if rewards.shape != seq_kl.shape or rewards.dim() != 1:
        raise ValueError(
            f"expected rewards [N] and seq_kl [N]; got {tuple(rewards.shape)}, "
            f"{tuple(seq_kl.shape)}"
        )
    return (rewards - coef * seq_kl.detach()).detach()
