"""Policy-gradient losses of PARA-GRPO: the PPO clipped surrogate, its decoupled off-policy form,
PPO corrected for the engine / trainer mismatch (capped weights, or verl's truncated / masked
importance sampling), all in one registry, `POLICY_LOSSES`; the KL loss term, token aggregation
and entropy. `paravt.rl.paragrpo_loss.PARAGRPOLoss` puts them in one object.

Conventions shared by every function here:
- `mask` is the loss mask [N, T] (1 = a token the policy wrote and is trained on). Inputs are
  replaced outside the mask BEFORE any arithmetic, so padding or prompt positions holding -inf or
  garbage never produce a NaN value or gradient; an all-zero mask gives a loss of exactly 0.
- Log-ratios are clamped to +-LOG_RATIO_CLAMP before exp, so ratios stay finite (also for a
  -inf log-prob). A NaN at a trained position is NOT hidden: it propagates, as it signals a bug
  upstream (NaN logits, a suppressed id in a trained position).
- Losses are to be minimised (the negated surrogate).

This module deliberately does not compute log-probs (logprobs.py), advantages (advantages.py) or
the structural-token anchoring term (rewards/structural.py), and never calls backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from torch import Tensor

from paravt.rl import importance
from paravt.rl.kl import LOG_RATIO_CLAMP, kl_penalty

Aggregation = Callable[[Tensor, Tensor, int | None], Tensor]


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over `mask`; 0 (not NaN) where the mask is empty."""
    keep = mask.bool()
    total = torch.where(keep, x, 0.0)
    if dim is None:
        return total.sum() / keep.sum().clamp(min=1)
    return total.sum(dim) / keep.sum(dim).clamp(min=1)


def token_mean(x: Tensor, mask: Tensor, norm_length: int | None = None) -> Tensor:
    """Token-mean (DAPO / the GRPO reference): every trained token of the batch weighs the same."""
    return masked_mean(x, mask)


def seq_mean_token_mean(x: Tensor, mask: Tensor, norm_length: int | None = None) -> Tensor:
    """Sequence-mean of token-means (original GRPO): each non-empty sequence weighs the same."""
    per_seq = masked_mean(x, mask, dim=-1)
    non_empty = mask.bool().any(dim=-1)
    return masked_mean(per_seq, non_empty)


def seq_mean_token_sum_norm(x: Tensor, mask: Tensor, norm_length: int | None = None) -> Tensor:
    """Dr.GRPO (Liu et al. 2025): token sum / a constant length L, mean over non-empty rows.

    L must be a constant (the trainer passes the maximum response length); the default T, the
    padded length of this batch, is a convenience for one-piece calls only: it moves with the
    micro-batch cut. Rows without trained tokens are left out of the mean, as in the two other
    aggregations and verl.
    """
    length = mask.shape[-1] if norm_length is None else norm_length
    if length < 1:
        raise ValueError(f"norm_length must be >= 1 (e.g. the max response length), got {length}")
    per_seq = torch.where(mask.bool(), x, 0.0).sum(dim=-1) / length
    return masked_mean(per_seq, mask.bool().any(dim=-1))


AGGREGATIONS: dict[str, Aggregation] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
}


def get_aggregation(name: str) -> Aggregation:
    """Look up a token aggregation by name."""
    if name not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {name!r}; valid names: {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[name]


@dataclass(frozen=True)
class LossMetrics:
    """Diagnostics of one policy-loss call (means over trained tokens; 0.0 when there are none).

    `r` is the ratio pi / pi_old, pi_old being the policy the clip is anchored to (`old_logp` of
    PPO, `proximal_logp` of decoupled PPO). `approx_kl` is k3 = (r - 1) - log r: a non-negative,
    unbiased estimate of KL(pi_old || pi) from tokens sampled by pi_old. `clip_frac_high` counts
    tokens with A > 0 and r > 1 + clip_high, `clip_frac_low` tokens with A < 0 and
    r < 1 - clip_low (where the clip removes the gradient). `iw_*` describe the behaviour
    importance weights pi_prox / pi_behav before capping (`iw_capped_frac`: share above the cap)
    and are None for plain PPO; `entropy` is None unless an entropy was given.
    """

    loss: float
    clip_frac_low: float
    clip_frac_high: float
    approx_kl: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    num_tokens: int
    iw_mean: float | None = None
    iw_min: float | None = None
    iw_max: float | None = None
    iw_capped_frac: float | None = None
    entropy: float | None = None

    def as_dict(self) -> dict[str, float]:
        """Flat name -> value for a logger; fields that do not apply are left out."""
        return {k: float(v) for k, v in asdict(self).items() if v is not None}


def _masked_stats(x: Tensor, keep: Tensor) -> list[Tensor]:
    # [mean, min, max] over keep, 0 when keep is empty; tensors only, so no device sync here.
    any_kept = keep.any()
    low = torch.where(keep, x, float("inf")).amin()
    high = torch.where(keep, x, float("-inf")).amax()
    zero = x.new_zeros(())
    return [
        masked_mean(x, keep),
        torch.where(any_kept, low, zero),
        torch.where(any_kept, high, zero),
    ]


def _safe_log_ratio(logp: Tensor, other: Tensor, keep: Tensor) -> Tensor:
    d = torch.where(keep, logp, 0.0) - torch.where(keep, other, 0.0)
    return d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _token_advantages(adv: Tensor, mask: Tensor) -> Tensor:
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    if adv.dim() != 2 or adv.shape[0] != mask.shape[0]:
        raise ValueError(
            f"adv must be [N] or [N, T] matching mask {tuple(mask.shape)}, got {tuple(adv.shape)}"
        )
    return torch.where(mask.bool(), adv.detach(), 0.0)


def _check_clip(clip_low: float, clip_high: float) -> None:
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(
            f"need 0 <= clip_low < 1 and clip_high >= 0 (e.g. 0.2 / 0.28), "
            f"got clip_low={clip_low}, clip_high={clip_high}"
        )


def _clipped_surrogate(
    log_ratio: Tensor, adv: Tensor, keep: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, dict[str, list[Tensor]]]:
    """Per-token PPO loss -min(r A, clip(r, 1 - low, 1 + high) A) and its diagnostics."""
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        r = ratio.detach()
        hit_high = (adv > 0) & (r > 1.0 + clip_high)
        hit_low = (adv < 0) & (r < 1.0 - clip_low)
        k3 = (r - 1.0) - log_ratio.detach()
        stats = {
            "clip": [masked_mean(hit_low.float(), keep), masked_mean(hit_high.float(), keep)],
            "kl": [masked_mean(k3, keep)],
            "ratio": _masked_stats(r, keep),
        }
    return per_token, stats


def _metrics(
    loss: Tensor,
    stats: dict[str, list[Tensor]],
    keep: Tensor,
    entropy: Tensor | None,
    iw_stats: list[Tensor] | None = None,
) -> LossMetrics:
    named = {
        "loss": loss.detach(),
        "num_tokens": keep.sum(),
        **dict(zip(("clip_frac_low", "clip_frac_high"), stats["clip"], strict=True)),
        "approx_kl": stats["kl"][0],
        **dict(zip(("ratio_mean", "ratio_min", "ratio_max"), stats["ratio"], strict=True)),
    }
    if entropy is not None:
        named["entropy"] = masked_mean(entropy.detach().float(), keep)
    if iw_stats is not None:
        names = ("iw_mean", "iw_min", "iw_max", "iw_capped_frac")
        named.update(zip(names, iw_stats, strict=True))
    values = torch.stack([v.float() for v in named.values()]).tolist()  # one device sync
    read = dict(zip(named, values, strict=True))
    read["num_tokens"] = int(read["num_tokens"])
    return LossMetrics(**read)


def ppo_clip_loss(
    logp: Tensor,  # [N, T] current policy
    old_logp: Tensor,  # [N, T] policy the ratio is taken against
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T]
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token_mean",
    norm_length: int | None = None,
    entropy: Tensor | None = None,  # [N, T], e.g. entropy_from_logits(...), for metrics only
) -> tuple[Tensor, LossMetrics]:
    """PPO clipped surrogate (Schulman et al. 2017) with clip-higher (DAPO: separate bounds)."""
    _check_clip(clip_low, clip_high)
    keep = mask.bool()
    log_ratio = _safe_log_ratio(logp, old_logp.detach(), keep)
    per_token, stats = _clipped_surrogate(
        log_ratio, _token_advantages(adv, mask), keep, clip_low, clip_high
    )
    loss = get_aggregation(agg)(per_token, keep, norm_length)
    return loss, _metrics(loss, stats, keep, entropy)


def _cap_by_masking(iw: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """AReaL: tokens whose weight exceeds the cap are dropped from the loss (weight 0)."""
    over = iw > cap
    return torch.where(over, 0.0, iw), over


def _cap_by_clamping(iw: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Truncated importance sampling (IMPALA-style): weights above the cap are set to the cap."""
    over = iw > cap
    return iw.clamp(max=cap), over


IW_CAPS: dict[str, Callable[[Tensor, float], tuple[Tensor, Tensor]]] = {
    "mask": _cap_by_masking,
    "clamp": _cap_by_clamping,
}


def decoupled_ppo_loss(
    logp: Tensor,  # [N, T] current policy pi_theta
    proximal_logp: Tensor,  # [N, T] pi_prox: the policy before this update (recomputed)
    behaviour_logp: Tensor,  # [N, T] pi_behav: the (possibly stale) policy that sampled
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T]
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    iw_cap: float | None = 5.0,
    agg: str = "token_mean",
    norm_length: int | None = None,
    entropy: Tensor | None = None,  # [N, T], for metrics only
    iw_cap_mode: str = "mask",
) -> tuple[Tensor, LossMetrics]:
    """Decoupled PPO (Hilton et al. 2021; AReaL, Fu et al. 2025) for stale rollouts.

    Per token: w * -min(r A, clip(r) A) with r = pi_theta / pi_prox and the detached behaviour
    weight w = pi_prox / pi_behav. The clip trusts the proximal policy, not the stale sampler,
    while w corrects the sampling distribution. Weights above `iw_cap` are handled by
    `iw_cap_mode`: "mask" (AReaL's behav_imp_weight_cap: such tokens contribute 0, still counted
    in the denominator) or "clamp" (w = min(w, cap)). `iw_cap=None` leaves w uncapped.
    """
    _check_clip(clip_low, clip_high)
    if iw_cap is not None and iw_cap < 1.0:
        raise ValueError(f"iw_cap must be >= 1 (on-policy tokens have weight 1), got {iw_cap}")
    if iw_cap_mode not in IW_CAPS:
        raise ValueError(f"unknown iw_cap_mode {iw_cap_mode!r}; valid names: {sorted(IW_CAPS)}")
    keep = mask.bool()
    prox = proximal_logp.detach()
    log_ratio = _safe_log_ratio(logp, prox, keep)
    per_token, stats = _clipped_surrogate(
        log_ratio, _token_advantages(adv, mask), keep, clip_low, clip_high
    )
    raw_iw = torch.exp(_safe_log_ratio(prox, behaviour_logp.detach(), keep))
    iw, over = (raw_iw, torch.zeros_like(keep))
    if iw_cap is not None:
        iw, over = IW_CAPS[iw_cap_mode](raw_iw, iw_cap)
    loss = get_aggregation(agg)(per_token * iw, keep, norm_length)
    iw_stats = [*_masked_stats(raw_iw, keep), masked_mean(over.float(), keep)]
    return loss, _metrics(loss, stats, keep, entropy, iw_stats)


def ppo_policy_loss(
    logp: Tensor,  # [N, T]
    proximal_logp: Tensor,  # [N, T]
    behaviour_logp: Tensor,  # [N, T] unused: plain PPO applies no behaviour correction
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T]
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    iw_cap: float | None = 5.0,  # unused, kept so that registry entries share one signature
    agg: str = "token_mean",
    norm_length: int | None = None,
    entropy: Tensor | None = None,
    iw_cap_mode: str = "mask",  # unused, as iw_cap
) -> tuple[Tensor, LossMetrics]:
    """Registry form of plain PPO: the ratio is taken against the proximal (recomputed) policy."""
    return ppo_clip_loss(
        logp, proximal_logp, adv, mask, clip_low, clip_high, agg, norm_length, entropy
    )


def engine_is_ppo_loss(
    logp: Tensor,  # [N, T] current policy
    trainer_logp: Tensor,  # [N, T] the trainer's own log-probs before this update (no grad)
    engine_logp: Tensor,  # [N, T] the rollout engine's log-probs of the sampled tokens
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T]
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    iw_cap: float | None = 2.0,
    agg: str = "token_mean",
    norm_length: int | None = None,
    entropy: Tensor | None = None,
    iw_cap_mode: str = "clamp",
) -> tuple[Tensor, LossMetrics]:
    """PPO corrected for the engine / trainer log-prob mismatch (`paravt.rl.mismatch`).

    A bf16 engine and the trainer disagree slightly on the same tokens; plain PPO would read the
    gap as a policy change and clip it. Here the ratio is anchored to the trainer's own
    pre-update log-probs and each token weighted by w = pi_trainer / pi_engine capped at
    `iw_cap`: "clamp" (truncated importance sampling, TRL's `vllm_importance_sampling_correction`
    with mode token_truncate and cap 2, the defaults) or "mask" (weights above the cap count 0).
    That is decoupled PPO with pi_prox = the trainer and pi_behav = the engine.
    """
    return decoupled_ppo_loss(
        logp,
        trainer_logp,
        engine_logp,
        adv,
        mask,
        clip_low,
        clip_high,
        iw_cap,
        agg,
        norm_length,
        entropy,
        iw_cap_mode,
    )


def rollout_corrected_loss(
    logp: Tensor,  # [N, T] current policy
    proximal_logp: Tensor,  # [N, T] the trainer's pre-update log-probs (pi_old)
    behaviour_logp: Tensor,  # [N, T] the engine's
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T]
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    iw_cap: float | None = 2.0,
    agg: str = "token_mean",
    norm_length: int | None = None,
    entropy: Tensor | None = None,
    level: str = "token",
    *,
    mode: str,
) -> tuple[Tensor, LossMetrics]:
    """Decoupled PPO weighted by verl's rollout correction `mode` (`importance.engine_weights`:
    tis or mis, ratios per token or per trajectory at `level`, threshold `iw_cap`);
    `iw_capped_frac` is the share of trained tokens the correction clipped or masked."""
    if iw_cap is None:
        raise ValueError(f"the {mode} correction needs a threshold: iw_cap >= 1 (e.g. 2.0)")
    w = importance.engine_weights(proximal_logp, behaviour_logp, mask.bool(), mode, level, iw_cap)
    # exp(prox - behav') == w exactly, so decoupled PPO's uncapped weight is w.
    behaviour = proximal_logp.detach() - torch.log(w.weights.clamp(min=1e-30))
    loss, metrics = decoupled_ppo_loss(
        logp, proximal_logp, behaviour, adv, w.mask, clip_low, clip_high, None, agg,
        norm_length, entropy,
    )  # fmt: skip
    return loss, replace(metrics, iw_capped_frac=float(masked_mean(w.corrected.float(), mask)))


def tis_loss(*args, **kwargs) -> tuple[Tensor, LossMetrics]:
    """Truncated importance sampling (verl's rollout correction): `rollout_corrected_loss` with
    w = min(pi_old / pi_engine, iw_cap)."""
    return rollout_corrected_loss(*args, mode="tis", **kwargs)


def mis_loss(*args, **kwargs) -> tuple[Tensor, LossMetrics]:
    """Masked importance sampling (verl's rollout correction): `rollout_corrected_loss` with
    w = pi_old / pi_engine inside [1 / iw_cap, iw_cap]; tokens (or, at level=sequence, whole
    trajectories) outside it leave the loss and its denominator."""
    return rollout_corrected_loss(*args, mode="mis", **kwargs)


# Every entry is called as fn(logp, proximal, behaviour, adv, mask, clip_low, clip_high,
# iw_cap=, agg=, norm_length=, entropy=) plus its own weighting knob: `iw_cap_mode` (the capping
# rule of decoupled_ppo and ppo_engine_is) or `level` (tis, mis: token or sequence ratios).
# `NEEDS_PROXIMAL` says which read the trainer's own pre-update log-probs as `proximal` (one
# no-grad pass per step); plain ppo takes its ratio against the sampler's.
POLICY_LOSSES: dict[str, Callable[..., tuple[Tensor, LossMetrics]]] = {
    "ppo": ppo_policy_loss,
    "decoupled_ppo": decoupled_ppo_loss,
    "ppo_engine_is": engine_is_ppo_loss,
    "tis": tis_loss,
    "mis": mis_loss,
}
NEEDS_PROXIMAL = frozenset({"decoupled_ppo", "ppo_engine_is", "tis", "mis"})


def get_policy_loss(name: str) -> Callable[..., tuple[Tensor, LossMetrics]]:
    """Look up a policy loss by name; entries take (logp, proximal, behaviour, adv, mask, ...)."""
    if name not in POLICY_LOSSES:
        hint = (
            " ('grpo' is the advantage estimator, algorithm.advantage.estimator; GRPO's policy "
            "loss is 'ppo', the clipped surrogate on group-normalised advantages)"
            if name == "grpo"
            else ""
        )
        raise ValueError(
            f"unknown policy loss {name!r}; valid names: {sorted(POLICY_LOSSES)}{hint}"
        )
    return POLICY_LOSSES[name]


def check_mask(mask: Tensor, name: str = "mask") -> Tensor:
    """`mask` as bool: a bool mask, or one of 0/1 in any dtype; other values are refused."""
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"{name} must be bool or hold only 0 and 1 (1 = a trained token), got values "
            f"{sorted(set(mask.flatten().tolist()))[:5]}...; pass (mask > 0) if that is meant"
        )
    return mask.bool()


def kl_loss(
    logp: Tensor,  # [N, T]
    ref_logp: Tensor,  # [N, T] frozen reference
    mask: Tensor,  # [N, T]
    estimator: str = "k3",
    coef: float = 0.01,
    agg: str = "token_mean",
    norm_length: int | None = None,
) -> Tensor:  # scalar
    """KL to the reference as a loss term: coef * agg(estimator(logp, ref)).

    Use k3 (GRPO paper) or k2 here: the expected gradient of k1 is zero, so as a loss it only
    adds noise and is refused; k1 belongs on the reward side (kl.fold_kl_into_rewards).
    """
    if estimator == "k1":
        raise ValueError(
            "kl_estimator='k1' as a loss term only adds noise (its expected gradient is zero); "
            "use 'k3' (the GRPO paper) or 'k2', or put k1 on the reward side "
            "(algorithm.kl_in_reward=true)"
        )
    per_token = kl_penalty(logp, ref_logp.detach(), estimator, mask)
    return coef * get_aggregation(agg)(per_token, mask.bool(), norm_length)


def entropy_from_logits(
    logits: Tensor,  # [N, T, V] (already / temperature and suppressed, if that is the target)
    chunk_size: int = 1024,
) -> Tensor:  # [N, T] float32
    """Entropy logsumexp(z) - sum softmax(z) z, chunked over T; -inf logits contribute 0."""
    out = []
    for start in range(0, logits.shape[1], chunk_size):
        z = logits[:, start : start + chunk_size].float()
        lse = torch.logsumexp(z, dim=-1)
        p = torch.softmax(z, dim=-1)
        finite_z = torch.where(torch.isfinite(z), z, 0.0)
        out.append(lse - (p * finite_z).sum(dim=-1))
    if not out:
        return logits.new_zeros(logits.shape[:2], dtype=torch.float32)
    return torch.cat(out, dim=1)
