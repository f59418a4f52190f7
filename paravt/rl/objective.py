"""The PARA-GRPO objective in one place: rewards -> advantages, and one micro-batch's loss.

- `compute_advantages`: shaped, group-normalised (and optionally batch-normalised) advantages
  from a [B, G] reward batch (docs/method.md sections 4 and 5);
- `micro_objective`: the loss one micro-batch backpropagates, policy loss + structural anchor +
  KL loss, each scaled by its micro-batch weight (`paravt.rl.microbatch`: the weights that make
  gradient accumulation over micro-batches exact), with its metrics;
- `advantage_metrics` / `rollout_metrics`: the step's figures for logging.
Pure functions over tensors and plain values, composed from the registries of `advantages`,
`losses` and `kl` and from `rewards.structural`. This file deliberately runs no model (the
LightningModule passes log-probs from its forward passes) and never calls backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from paravt.rewards.structural import structural_anchor_loss
from paravt.rl import importance
from paravt.rl.advantages import (
    batch_normalize,
    get_advantage_fn,
    shape_rewards,
    zero_variance_groups,
)
from paravt.rl.losses import LossMetrics, check_mask, get_aggregation, get_policy_loss, kl_loss
from paravt.rl.metrics import (
    drift_metrics,
    f_tau,
    format_compliance,
    kappa,
    reversions,
    ruler_format,
    tag_reversion,
)
from paravt.rl.microbatch import MicroWeights
from paravt.rl.mismatch import MODES, check_mode
from paravt.rl.tool_metrics import tool_metrics
from paravt.types import RewardBreakdown, Trajectory


@dataclass(frozen=True)
class AdvantageConfig:
    """How rewards become advantages (docs/method.md sections 4 and 5)."""

    estimator: str = "grpo"
    shaping: bool = False
    shaping_scale: float = 10.0
    shaping_shift: float = -0.2
    shaping_clip: float = 20.0
    batch_norm: bool = False
    drop_zero_variance: bool = False
    # Group std with Bessel's correction (G - 1), as verl and TRL: see grpo_advantages.
    unbiased_std: bool = True


@dataclass(frozen=True)
class Advantages:
    values: Tensor  # [N] one advantage per trajectory
    keep: Tensor  # [N] bool: trajectories that take part in the update
    zero_variance: Tensor  # [B] bool


def compute_advantages(
    rewards: Tensor,  # [B, G]
    cfg: AdvantageConfig,
) -> Advantages:
    """Optionally shape, then group-normalise, drop zero-variance groups, batch-normalise."""
    r = rewards.double()
    if r.numel() == 0:  # every prompt of the step was skipped: nothing to normalise
        empty = torch.zeros(0)
        return Advantages(empty, empty.bool(), torch.zeros(r.shape[0], dtype=torch.bool))
    if cfg.shaping:
        r = shape_rewards(r, cfg.shaping_scale, cfg.shaping_shift, cfg.shaping_clip)
    adv = get_advantage_fn(cfg.estimator)(r, unbiased=cfg.unbiased_std)  # [B, G]
    zero = zero_variance_groups(r)
    keep = torch.ones_like(adv, dtype=torch.bool)
    if cfg.drop_zero_variance:
        keep &= ~zero[:, None]
    if cfg.batch_norm:
        adv = batch_normalize(adv, keep)
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
    return {k: float(v) for k, v in out.items()}


@dataclass(frozen=True)
class LossSettings:
    """The objective's knobs (from `AlgorithmConfig`; `anchor_coef` as the curriculum set it).

    `loss` names an entry of `paravt.rl.losses.POLICY_LOSSES`. Its behaviour importance weights
    (`behaviour_weights`): `decoupled_ppo` caps them at `iw_cap`, `ppo_engine_is` (the engine-
    mismatch correction) at `engine_is_cap`; `engine_is_correction` picks the capping rule of
    either (null: masking for decoupled_ppo, token_truncate for ppo_engine_is). Plain `ppo`
    applies no weight, so a correction set beside it is refused rather than ignored.
    """

    loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    iw_cap: float | None = 5.0
    aggregation: str = "token_mean"
    norm_length: int | None = None  # Dr.GRPO's constant divisor
    kl_estimator: str = "k3"  # of the KL loss term (k1 is refused there: it only adds noise)
    kl_coef: float = 0.0
    anchor_coef: float = 0.0
    engine_is_correction: str | None = None  # paravt.rl.mismatch.ALL_MODES
    engine_is_cap: float = 2.0
    engine_is_level: str = "token"  # tis / mis: token or sequence (geometric mean) ratios

    def __post_init__(self) -> None:
        get_policy_loss(self.loss)
        get_aggregation(self.aggregation)
        check_mode(self.engine_is_correction)
        if self.engine_is_cap < 1.0:
            raise ValueError(f"algorithm.engine_is_cap must be >= 1, got {self.engine_is_cap}")
        if self.engine_is_correction in importance.MODES:
            importance.check(self.engine_is_correction, self.engine_is_level, self.engine_is_cap)
        if self.loss == "ppo" and self.engine_is_correction is not None:
            raise ValueError(
                f"algorithm.engine_is_correction={self.engine_is_correction} does nothing with "
                "loss=ppo: the engine-mismatch correction is its own loss; fix: "
                "algorithm.loss=ppo_engine_is (or engine_is_correction=null)"
            )

    def behaviour_weights(self) -> tuple[float | None, str]:
        """(cap, capping rule) of the policy loss's behaviour importance weights (the
        token_truncate / token_mask rules; tis / mis weigh in `policy_loss`)."""
        if self.loss == "ppo_engine_is":
            return self.engine_is_cap, MODES[self.engine_is_correction or "token_truncate"]
        return self.iw_cap, MODES[self.engine_is_correction or "token_mask"]

    def policy_loss(self) -> Callable[..., tuple[Tensor, LossMetrics]]:
        """The registry's `loss` with its behaviour weights bound: capped by `behaviour_weights`,
        or, with tis / mis, verl's rollout correction of `paravt.rl.importance` in their place
        (decoupled PPO against the trainer's pre-update log-probs)."""
        if self.engine_is_correction in importance.MODES:
            return partial(
                importance.corrected_loss,
                mode=self.engine_is_correction,
                level=self.engine_is_level,
                cap=self.engine_is_cap,
            )
        cap, rule = self.behaviour_weights()
        return partial(get_policy_loss(self.loss), iw_cap=cap, iw_cap_mode=rule)


@dataclass(frozen=True)
class MicroBatchTerms:
    """One micro-batch's inputs to the objective, all aligned with its padded tokens."""

    logp: Tensor  # [N, T] log pi_theta (with gradient)
    proximal: Tensor  # [N, T] pi_prox log-probs (the behaviour's unless decoupled)
    behaviour: Tensor  # [N, T] the engine's log-probs at sampling time
    advantages: Tensor  # [N] one advantage per row
    mask: Tensor  # [N, T] bool (or 0/1), trained tokens
    entropy: Tensor | None = None  # [N, T] for the entropy metric
    structural: Tensor | None = None  # [N, T] bool, anchored positions (None: no anchor term)
    reference: Tensor | None = None  # [N, T] reference log-probs (None: no KL loss term)


def micro_objective(
    terms: MicroBatchTerms, settings: LossSettings, weights: MicroWeights
) -> tuple[Tensor, dict[str, float]]:
    """(the scalar to backpropagate, metrics) of one micro-batch:

        weights.policy * L_policy + weights.anchor * L_anchor + weights.kl * L_kl

    L_anchor only with `structural` and a non-zero coefficient, L_kl only with `reference`
    (the KL as a loss term; folded into the reward instead, it is not here)."""
    logp, mask, behaviour = terms.logp, check_mask(terms.mask), terms.behaviour
    loss, m = settings.policy_loss()(
        logp,
        terms.proximal,
        behaviour,
        terms.advantages,
        mask,
        settings.clip_low,
        settings.clip_high,
        agg=settings.aggregation,
        norm_length=settings.norm_length,
        entropy=terms.entropy,
    )
    objective = weights.policy * loss
    metrics = {f"loss/{k}": float(v) for k, v in m.as_dict().items()}
    gap = torch.where(mask, (logp.detach() - behaviour).abs(), torch.zeros_like(behaviour))
    metrics["loss/logprob_gap"] = float(gap.sum() / mask.sum().clamp(min=1))
    if settings.anchor_coef and terms.structural is not None:
        anchor = structural_anchor_loss(logp, terms.structural, settings.anchor_coef)
        objective = objective + weights.anchor * anchor
        metrics["loss/anchor"] = float(anchor.detach())
    if terms.reference is not None:
        kl = kl_loss(logp, terms.reference, mask, settings.kl_estimator, settings.kl_coef)
        objective = objective + weights.kl * kl
        metrics["loss/kl"] = float(kl.detach())
    return objective, metrics
