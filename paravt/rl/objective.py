"""The PARA-GRPO advantages and the step's figures: rewards -> advantages, and what is logged.

- `compute_advantages`: shaped, group-normalised (and optionally batch-normalised) advantages
  from a [B, G] reward batch (docs/method.md sections 4 and 5);
- `advantage_metrics` / `rollout_metrics`: the step's figures for logging.
Pure functions over tensors and plain values, composed from the registry of `advantages` and
the metrics of `metrics`. The loss is `paravt.rl.paragrpo_loss.PARAGRPOLoss`; this file
deliberately runs no model (the LightningModule passes log-probs from its forward passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from paravt.errors import check_number
from paravt.rl.advantages import (
    Sums,
    batch_normalize,
    get_advantage_fn,
    shape_rewards,
    zero_variance_groups,
)
from paravt.rl.metrics import (
    drift_metrics,
    f_tau,
    format_compliance,
    kappa,
    reversions,
    ruler_format,
    tag_reversion,
)
from paravt.rl.tool_metrics import tool_metrics
from paravt.types import RewardBreakdown, Trajectory


@dataclass(frozen=True)
class AdvantageConfig:
    """How rewards become advantages (docs/method.md sections 4 and 5); the defaults are the
    reference recipe's (conf/algorithm/paragrpo.yaml: shaped, then group- and batch-normalised)."""

    estimator: str = "grpo"
    shaping: bool = True
    shaping_scale: float = 10.0
    shaping_shift: float = -0.2
    shaping_clip: float = 20.0
    batch_norm: bool = True
    drop_zero_variance: bool = False
    # Group std with Bessel's correction (G - 1), as verl and TRL: see grpo_advantages.
    unbiased_std: bool = True

    def __post_init__(self) -> None:
        get_advantage_fn(self.estimator)  # a known name, before the first step
        for name in ("shaping_scale", "shaping_shift"):
            check_number(f"algorithm.advantage.{name}", getattr(self, name))
        check_number("algorithm.advantage.shaping_clip", self.shaping_clip, above=0)


@dataclass(frozen=True)
class Advantages:
    values: Tensor  # [N] one advantage per trajectory
    keep: Tensor  # [N] bool: trajectories that take part in the update
    zero_variance: Tensor  # [B] bool


def compute_advantages(
    rewards: Tensor,  # [B, G]
    cfg: AdvantageConfig,
    sums: Sums | None = None,
) -> Advantages:
    """Optionally shape, then group-normalise, drop zero-variance groups, batch-normalise (over
    the whole batch where `sums` adds over the ranks: see `batch_normalize`)."""
    r = rewards.double()
    if r.numel() == 0:  # every prompt of the step was skipped: nothing to normalise
        empty = torch.zeros(0)
        if cfg.batch_norm:  # still one of the ranks whose figures are summed
            batch_normalize(empty, sums=sums)
        return Advantages(empty, empty.bool(), torch.zeros(r.shape[0], dtype=torch.bool))
    if cfg.shaping:
        r = shape_rewards(r, cfg.shaping_scale, cfg.shaping_shift, cfg.shaping_clip)
    adv = get_advantage_fn(cfg.estimator)(r, unbiased=cfg.unbiased_std)  # [B, G]
    zero = zero_variance_groups(r)
    keep = torch.ones_like(adv, dtype=torch.bool)
    if cfg.drop_zero_variance:
        keep &= ~zero[:, None]
    if cfg.batch_norm:
        adv = batch_normalize(adv, keep, sums=sums)
    adv = torch.where(keep, adv, torch.zeros_like(adv))
    return Advantages(adv.flatten().float(), keep.flatten(), zero)


def advantage_metrics(adv: Advantages) -> dict[str, float]:
    """Mean and std of the advantages taking part in the update, and the zero-variance share."""
    values = adv.values[adv.keep] if adv.keep.any() else adv.values
    if values.numel() == 0:  # every prompt of the step was skipped (undecodable videos)
        return {"advantage/mean": 0.0, "advantage/std": 0.0, "advantage/zero_variance_share": 0.0}
    return {
        "advantage/mean": float(values.mean()),
        "advantage/std": float(values.std(unbiased=False)),
        "advantage/zero_variance_share": float(adv.zero_variance.float().mean()),
    }


def rollout_metrics(
    trajs: Sequence[Trajectory],
    rewards: Sequence[RewardBreakdown],
) -> dict[str, float]:
    """The per-step health figures of the paper and of the loop (f_tau, kappa, lengths...).

    f_tau is each rollout's own R_fmt (this arm's formula, anchor bonus included, at most 1);
    f_tau_ruler the same rollouts on the one ruler of every arm (`metrics.ruler_format`), and
    f_tau_anchor the mean anchor bonus before its weight (0.4 closed think + 0.3 think -> answer
    - 0.3 unclosed think), whether or not this arm pays it. tag_reversion: the share of tool
    turns written in `<tool_code>`; rollout/reversions: such turns per rollout.
    Per-budget gate ratios are the `FrameBudgetGating` callback's (pooled over steps).
    """
    n = max(len(trajs), 1)
    total = torch.tensor([r.total for r in rewards], dtype=torch.float64)
    calls = torch.tensor([t.num_calls for t in trajs], dtype=torch.float64)
    out = {
        "reward/mean": float(total.mean()) if len(rewards) else 0.0,
        "reward/accuracy": sum(r.accuracy for r in rewards) / n,
        "reward/format": sum(r.format for r in rewards) / n,
        "reward/tool": sum(r.tool for r in rewards) / n,
        "reward/degenerate": sum(r.degenerate for r in rewards) / n,
        "f_tau": f_tau([format_compliance(r) for r in rewards]),
        "f_tau_ruler": f_tau([ruler_format(t.response_text) for t in trajs]),
        "f_tau_anchor": f_tau([r.components.get("format/anchor", 0.0) for r in rewards]),
        "kappa": kappa([t.num_calls for t in trajs]),
        "rollout/rounds": sum(t.num_rounds for t in trajs) / n,
        "rollout/response_tokens": sum(t.num_trained_tokens for t in trajs) / n,
        "rollout/length": sum(len(t.token_ids) for t in trajs) / n,
        "rollout/truncated": sum(t.truncated for t in trajs) / n,
        "tag_reversion": tag_reversion(trajs),
        "rollout/reversions": sum(reversions(t) for t in trajs) / n,
        "rollout/valid_call_share": sum(t.num_valid_calls for t in trajs) / max(calls.sum(), 1),
        **drift_metrics([t.response_text for t in trajs]),
        **tool_metrics(trajs),
    }
    forks = [t.forks for t in trajs if t.forks is not None]
    if forks:  # rollouts an agent program played through the gateway: its forked histories
        out["gateway/forks"] = sum(forks)
    return {k: float(v) for k, v in out.items()}
