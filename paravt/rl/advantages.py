"""Group advantages for GRPO-style training, reward shaping and batch normalisation.

Layout: rewards of one step come as a `[B, G]` view, row b holding the G rollouts of prompt b.
Trajectories are ordered group-contiguously (trajectory n = b * G + g), so a flat `[N]` reward
vector reshapes into that view. Advantages are per rollout.

Order of the recipe (`paravt.rl.objective.compute_advantages`): `shape_rewards` -> group
advantage (`grpo`) -> `batch_normalize` over the rollouts that take part in the update.

This module deliberately does not compute rewards, KL terms or losses (see kl.py, losses.py), and
knows nothing of trajectories or frameworks: tensors in, tensors out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

AdvantageFn = Callable[..., Tensor]
"""fn(rewards [B, G], *, unbiased: bool) -> advantages [B, G]."""
Sums = Callable[[Sequence[float]], list[float]]
"""Element-wise sums of figures over the ranks (`paravt.parallel.distributed.global_float_sums`)."""


def _check_groups(rewards: Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards must be a [B, G] tensor (one row per prompt), got shape "
            f"{tuple(rewards.shape)}; reshape a flat [N] vector with rewards.view(-1, group_size)"
        )


def zero_variance_groups(rewards: Tensor) -> Tensor:  # [B, G] -> [B] bool
    """Groups whose rollouts all scored the same (including G = 1): they carry no GRPO signal."""
    _check_groups(rewards)
    return rewards.amax(dim=1) == rewards.amin(dim=1)


def grpo_advantages(
    rewards: Tensor,  # [B, G]
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Tensor:  # [B, G]
    """GRPO (Shao et al. 2024, DeepSeekMath): (R - group mean) / (group std + eps).

    The std is the unbiased (Bessel-corrected, G - 1) one by default, as in verl
    (`torch.std`), TRL and the DeepSeekMath recipe, so advantages equal those frameworks' to the
    last digit and published hyper-parameters (clip ranges, KL coefficients) transfer.
    `unbiased=False` takes the population std instead: the spread of the G rollouts we actually
    have, which keeps |A| <= sqrt(G - 1); it scales every advantage of a group by
    sqrt(G / (G - 1)) relative to the default. G = 1 has no unbiased std and falls back to the
    population one (its advantage is 0 either way). Groups with all-equal rewards get exactly 0,
    not centred float noise divided by eps. Computed in float64 so that large finite rewards do
    not overflow the mean or the variance.
    """
    _check_groups(rewards)
    r = rewards.double()
    group_size = r.shape[1]
    centred = r - r.mean(dim=1, keepdim=True)
    correction = 1 if unbiased and group_size > 1 else 0
    std = r.std(dim=1, keepdim=True, correction=correction)
    adv = centred / (std + eps)
    adv = torch.where(zero_variance_groups(rewards).unsqueeze(1), torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def drgrpo_advantages(rewards: Tensor, unbiased: bool = True) -> Tensor:  # [B, G] -> [B, G]
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): R - group mean, no std.

    `unbiased` is accepted so every estimator shares one signature; there is no std to correct.
    """
    _check_groups(rewards)
    r = rewards.double()
    adv = r - r.mean(dim=1, keepdim=True)
    adv = torch.where(zero_variance_groups(rewards).unsqueeze(1), torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


ADVANTAGES: dict[str, AdvantageFn] = {"grpo": grpo_advantages, "drgrpo": drgrpo_advantages}


def get_advantage_fn(name: str) -> AdvantageFn:
    """Look up an advantage estimator by name."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; valid names: {sorted(ADVANTAGES)}")
    return ADVANTAGES[name]


def shape_rewards(
    rewards: Tensor,  # any shape
    scale: float = 10.0,
    shift: float = -0.2,
    clip: float = 20.0,
) -> Tensor:  # same shape
    """Reference reward shaping (docs/method.md §5): clip((R + shift) * scale, -clip, +clip)."""
    if clip < 0:
        raise ValueError(f"clip must be >= 0 (a symmetric bound), got {clip}")
    return ((rewards + shift) * scale).clamp(-clip, clip)


def batch_normalize(
    adv: Tensor,  # any shape, e.g. [N, T] token advantages or [N]
    mask: Tensor | None = None,  # same shape as adv; 1 = counted
    eps: float = 1e-6,
    sums: Sums | None = None,
) -> Tensor:  # same shape, 0 outside the mask
    """Batch-level advantage normalisation (AReaL adv_norm): (A - mean) / (std + eps) over `mask`.

    Mean and (biased) std are taken over the masked elements only, so padding and context tokens
    do not dilute the statistics. One element or zero spread gives 0, an empty mask gives zeros.
    `sums` adds figures over the ranks that hold the rest of the batch (data parallel): the
    statistics are then the whole batch's, as one process computes them, not this rank's share's
    (whose spread depends on which groups it drew); every rank must call it, an empty one too.
    """
    if mask is None:
        mask = torch.ones_like(adv, dtype=torch.bool)
    if mask.shape != adv.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal adv shape {tuple(adv.shape)}")
    sums = sums or _local
    keep = mask.bool()
    a = torch.where(keep, adv.double(), 0.0)
    total, n = sums([a.sum().item(), keep.sum().item()])
    mean = total / max(n, 1.0)
    (squares,) = sums([torch.where(keep, (a - mean) ** 2, 0.0).sum().item()])
    std = math.sqrt(squares / max(n, 1.0))
    out = torch.where(keep, (a - mean) / (std + eps), 0.0)
    return out.to(adv.dtype)


def _local(xs: Sequence[float]) -> list[float]:
    return [float(x) for x in xs]
