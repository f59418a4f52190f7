"""Engine / trainer importance weights: truncated (TIS) and masked (MIS), per token or sequence.

The trainer's pre-update log-probs pi_old and the engine's pi_engine of the same sampled tokens
give the ratio rho = pi_old / pi_engine, taken per token, or per trajectory as the geometric
mean over its trained tokens (exp of the mean log-ratio, so long trajectories are not pushed to
0 or infinity). As verl's rollout correction (rollout_is / rollout_rs) does:
- `tis` (truncated): w = min(rho, c); no token leaves the loss;
- `mis` (masked): w = rho where 1/c <= rho <= c; tokens (level=token) or whole trajectories
  (level=sequence) outside the band leave the loss mask, and with it the loss's denominator.
The loss registry's `tis` and `mis` entries (`paravt.rl.losses`) apply w to decoupled PPO
(pi_prox = pi_old, pi_behav = pi_engine). Also the step's mismatch figures (`gap_sums` /
`gap_metrics`). Pure tensors; no model runs and no loss is computed here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from paravt.rl.kl import LOG_RATIO_CLAMP

MODES = ("tis", "mis")
LEVELS = ("token", "sequence")


def check(mode: str, level: str, cap: float) -> None:
    if mode not in MODES:
        raise ValueError(f"importance mode must be one of {MODES}, got {mode!r}")
    if level not in LEVELS:
        raise ValueError(f"algorithm.engine_is_level must be one of {LEVELS}, got {level!r}")
    if cap < 1.0:
        raise ValueError(f"algorithm.engine_is_cap must be >= 1, got {cap}")


@dataclass(frozen=True)
class EngineWeights:
    weights: Tensor  # [N, T] detached w (0 off the mask)
    mask: Tensor  # [N, T] bool: trained tokens the correction keeps
    corrected: Tensor  # [N, T] bool: trained tokens it clipped (tis) or masked (mis)


def log_ratios(
    trainer_logp: Tensor,  # [N, T]
    engine_logp: Tensor,  # [N, T]
    mask: Tensor,  # [N, T] bool
    level: str,
) -> Tensor:  # [N, T]
    """log rho per token, or each row's mean over its trained tokens broadcast to them."""
    d = torch.where(mask, trainer_logp.detach().float() - engine_logp.float(), 0.0)
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if level == "sequence":
        mean = d.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        d = torch.where(mask, mean.expand_as(d), 0.0)
    return d


def engine_weights(
    trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor, mode: str, level: str, cap: float
) -> EngineWeights:
    """The detached weights of `mode` at `level` with threshold `cap` (see the module doc)."""
    check(mode, level, cap)
    keep = mask.bool()
    log_rho = log_ratios(trainer_logp, engine_logp, keep, level)
    rho = torch.exp(log_rho)
    if mode == "tis":
        corrected = keep & (rho > cap)
        return EngineWeights(torch.where(keep, rho.clamp(max=cap), 0.0), keep, corrected)
    bound = math.log(cap)
    corrected = keep & (log_rho.abs() > bound)
    kept = keep & ~corrected
    return EngineWeights(torch.where(kept, rho, 0.0), kept, corrected)


def gap_sums(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> tuple[float, float, int]:
    """(max |log pi_trainer - log pi_engine|, sum of k3, tokens) over the trained tokens;
    k3 = (r - 1) - log r with r = pi_trainer / pi_engine estimates KL(engine || trainer)."""
    keep = mask.bool()
    if not keep.any():
        return 0.0, 0.0, 0
    d = torch.where(keep, trainer_logp.detach().float() - engine_logp.float(), 0.0)
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    k3 = torch.where(keep, torch.exp(d) - 1.0 - d, 0.0)
    top, total = torch.stack([d.abs().amax(), k3.sum()]).tolist()
    return float(top), float(total), int(keep.sum())


def gap_metrics(parts: Sequence[tuple[float, float, int]]) -> dict[str, float]:
    """`mismatch/logprob_abs_max` and `mismatch/k3` (mean per token) of a step's parts."""
    tokens = sum(n for _, _, n in parts)
    if not tokens:
        return {}
    return {
        "mismatch/logprob_abs_max": max(top for top, _, n in parts if n),
        "mismatch/k3": sum(k3 for _, k3, _ in parts) / tokens,
    }
