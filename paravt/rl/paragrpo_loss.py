"""`PARAGRPOLoss`: the PARA-GRPO objective as one callable object, the trainer's and yours.

    loss_fn = PARAGRPOLoss()                       # the reference recipe's knobs
    loss = loss_fn(logprobs, old_logprobs, advantages, mask, structural_mask=struct)
    loss.backward(); log(loss_fn.metrics)          # metrics on the side, as TRL and torchtune

One module per loss, as torchtune has it: tensors in, a scalar to minimise out. Its knobs are
`AlgorithmConfig`'s (the one list, with the recipe's defaults); `GRPOModule` holds one built
from `algorithm` and calls it per micro-batch with the micro-batch's `weights`. The loss is the
policy loss of the registry (`paravt.rl.losses.POLICY_LOSSES`), plus the structural anchor when
a structural mask is given, plus a KL loss term when reference log-probs are given. Pure torch.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from paravt.rewards.structural import structural_anchor_loss
from paravt.rl import importance
from paravt.rl.algorithm import AlgorithmConfig
from paravt.rl.losses import NEEDS_PROXIMAL, check_mask, get_policy_loss, kl_loss
from paravt.rl.microbatch import MicroWeights
from paravt.rl.mismatch import MODES

UNIT = MicroWeights(policy=1.0, kl=1.0, anchor=1.0)  # one batch, no micro-batch cut
# The knobs of AlgorithmConfig the loss reads; the others schedule the trainer's update.
LOSS_KNOBS = (
    "loss",
    "clip_low",
    "clip_high",
    "iw_cap",
    "aggregation",
    "norm_length",
    "kl_coef",
    "kl_estimator",
    "kl_in_reward",
    "anchor_coef",
    "engine_is_correction",
    "engine_is_cap",
    "engine_is_level",
)


def policy_loss_entry(cfg: AlgorithmConfig) -> tuple[str, dict[str, object]]:
    """(the `POLICY_LOSSES` entry `cfg` runs, its behaviour-weight knobs).

    tis / mis, named as the loss or as `engine_is_correction` beside decoupled_ppo /
    ppo_engine_is, weigh at `engine_is_cap` and `engine_is_level`; decoupled_ppo caps at
    `iw_cap`, ppo_engine_is at `engine_is_cap`, by the rule `engine_is_correction` names (null:
    masking for decoupled_ppo, token_truncate for ppo_engine_is); plain ppo weighs nothing."""
    correction = cfg.engine_is_correction
    name = correction if correction in importance.MODES else cfg.loss
    if name in importance.MODES:
        return name, {"iw_cap": cfg.engine_is_cap, "level": cfg.engine_is_level}
    if name == "ppo_engine_is":
        rule = MODES[correction or "token_truncate"]
        return name, {"iw_cap": cfg.engine_is_cap, "iw_cap_mode": rule}
    if name == "decoupled_ppo":
        return name, {"iw_cap": cfg.iw_cap, "iw_cap_mode": MODES[correction or "token_mask"]}
    return name, {}


class PARAGRPOLoss(torch.nn.Module):
    """The PARA-GRPO loss: PPO-clip on group advantages + the structural-token anchor.

    `PARAGRPOLoss(config)` takes an `AlgorithmConfig`, `PARAGRPOLoss(**knobs)` the recipe's with
    some of `LOSS_KNOBS` changed (e.g. `loss="decoupled_ppo"`, `clip_high=0.28`). `loss` is an
    entry of `POLICY_LOSSES`: "ppo" (the default) or one that weighs tokens by the sampler's
    log-probs, `behaviour_logprobs` ("decoupled_ppo" for stale rollouts; "ppo_engine_is", "tis",
    "mis" for the engine / trainer mismatch). The recipe folds the KL to the reference into the
    reward (`kl_in_reward=True`, paravt.rl.kl); `kl_in_reward=False` with `kl_estimator="k3"` (or
    k2) adds it here instead, scaled by `kl_coef`. After each call `metrics` holds the figures
    the trainer logs (`loss/...`).
    """

    def __init__(self, config: AlgorithmConfig | None = None, **knobs):
        super().__init__()
        if config is not None and not isinstance(config, AlgorithmConfig):
            raise TypeError(
                f"PARAGRPOLoss's first argument is an AlgorithmConfig, got {config!r}; name the "
                "policy loss by keyword: PARAGRPOLoss(loss='ppo')"
            )
        unknown = sorted(set(knobs) - set(LOSS_KNOBS))
        if unknown:
            raise TypeError(
                f"PARAGRPOLoss got unknown knob(s) {unknown}; the loss's knobs are "
                f"{list(LOSS_KNOBS)} (the rest of AlgorithmConfig schedules the trainer's update)"
            )
        self.config = replace(config or AlgorithmConfig(), **knobs)  # checked on construction
        name, self.weighting = policy_loss_entry(self.config)
        self.policy_loss = get_policy_loss(name)
        self.metrics: dict[str, float] = {}

    def forward(
        self,
        logprobs: Tensor,  # [N, T] log pi_theta of the sampled tokens (with gradient)
        old_logprobs: Tensor,  # [N, T] the policy before this update (no gradient)
        advantages: Tensor,  # [N] or [N, T]
        mask: Tensor,  # [N, T] bool or 0/1: the tokens the policy wrote
        *,
        behaviour_logprobs: Tensor | None = None,  # [N, T] the sampler's (engine's) log-probs
        structural_mask: Tensor | None = None,  # [N, T] bool or 0/1: anchored positions
        anchor_coef: float | None = None,  # this call's coefficient (a curriculum's)
        ref_logprobs: Tensor | None = None,  # [N, T] a frozen reference: adds the KL term
        entropy: Tensor | None = None,  # [N, T] for the entropy metric only
        weights: MicroWeights = UNIT,  # a micro-batch's share of each term (paravt.rl.microbatch)
    ) -> Tensor:
        """The scalar to minimise:

            weights.policy * L_policy + weights.anchor * L_anchor + weights.kl * L_kl

        L_anchor only with `structural_mask` and a non-zero coefficient, L_kl only with
        `ref_logprobs`; `self.metrics` gets this call's figures."""
        self._check(logprobs, old_logprobs, behaviour_logprobs, ref_logprobs)
        cfg, keep = self.config, check_mask(mask)
        behaviour = old_logprobs if behaviour_logprobs is None else behaviour_logprobs
        loss, m = self.policy_loss(
            logprobs, old_logprobs, behaviour, advantages, keep, cfg.clip_low, cfg.clip_high,
            agg=cfg.aggregation, norm_length=cfg.norm_length, entropy=entropy, **self.weighting,
        )  # fmt: skip
        objective = weights.policy * loss
        metrics = {f"loss/{k}": float(v) for k, v in m.as_dict().items()}
        gap = torch.where(keep, (logprobs.detach() - behaviour).abs(), torch.zeros_like(behaviour))
        metrics["loss/logprob_gap"] = float(gap.sum() / keep.sum().clamp(min=1))
        coef = cfg.anchor_coef if anchor_coef is None else anchor_coef
        if coef and structural_mask is not None:
            anchor = structural_anchor_loss(logprobs, check_mask(structural_mask), coef)
            objective = objective + weights.anchor * anchor
            metrics["loss/anchor"] = float(anchor.detach())
        if ref_logprobs is not None:
            kl = kl_loss(logprobs, ref_logprobs, keep, cfg.kl_estimator, cfg.kl_coef)
            objective = objective + weights.kl * kl
            metrics["loss/kl"] = float(kl.detach())
        self.metrics = metrics
        return objective

    def _check(self, logprobs, old_logprobs, behaviour_logprobs, ref_logprobs) -> None:
        """Refuse inputs the configured loss would misread or silently ignore."""
        if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape:
            raise ValueError(
                f"logprobs and old_logprobs must both be [N, T], got {tuple(logprobs.shape)} "
                f"and {tuple(old_logprobs.shape)}"
            )
        loss = self.config.loss
        if behaviour_logprobs is None and loss in NEEDS_PROXIMAL:
            raise ValueError(
                f"loss={loss!r} weights tokens by old / behaviour: pass "
                "behaviour_logprobs (the sampler's log-probs), or use loss='ppo'"
            )
        if behaviour_logprobs is not None and loss not in NEEDS_PROXIMAL:
            raise ValueError(
                f"loss={loss!r} takes its ratio against old_logprobs and applies no behaviour "
                "weight, so behaviour_logprobs would be ignored: pass the sampler's log-probs as "
                "old_logprobs, or use loss='decoupled_ppo' (old = the policy before this update)"
            )
        if ref_logprobs is not None and self.config.kl_in_reward:
            raise ValueError(
                "ref_logprobs given, but kl_in_reward=True (the recipe's): the KL to the "
                "reference belongs in the reward (paravt.rl.kl.fold_kl_into_rewards); for a KL "
                "loss term use PARAGRPOLoss(kl_in_reward=False, kl_estimator='k3')"
            )
