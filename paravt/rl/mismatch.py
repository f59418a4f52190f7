"""Engine / trainer mismatch: truncated importance weights between the two sets of log-probs.

A bf16 rollout engine (vLLM, or transformers in bf16) and the FSDP trainer compute slightly
different log-probs for the same tokens. Plain PPO anchors its ratio to the ENGINE's log-probs,
so the mismatch is read as a policy change and clipped away. The standard correction (TRL's
`vllm_importance_sampling_correction`, on by default there, with `vllm_importance_sampling_mode`
and `vllm_importance_sampling_cap` = 2; truncated importance sampling of Yao et al. 2025)
anchors the ratio to the trainer's own log-probs before the update, pi_old, and weights each
token by w = pi_old / pi_engine, truncated at a cap:

    token_truncate   w = min(w, cap)                    (TRL's default mode, clamp)
    token_mask       w = 0 where w > cap, else w        (AReaL-style masking)
    tis / mis        verl's rollout correction (`paravt.rl.importance`): truncated, or masked
                     outside [1/cap, cap], per token or per sequence (`engine_is_level`)

That is decoupled PPO with pi_prox = pi_old and pi_behav = pi_engine, the loss registry's
named entry `ppo_engine_is` (`paravt.rl.losses.engine_is_ppo_loss`; `algorithm.loss:
ppo_engine_is`, its cap `engine_is_cap`, its rule `engine_is_correction`). This module names the
rules and measures the mismatch for logging. Pure tensors in, tensors and floats out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from paravt.rl import importance
from paravt.rl.losses import NEEDS_PROXIMAL, masked_mean

# algorithm.engine_is_correction -> the capping rule (`iw_cap_mode`) of the behaviour weights.
MODES = {"token_truncate": "clamp", "token_mask": "mask"}
# tis / mis at algorithm.engine_is_level token | sequence: paravt.rl.importance (verl's
# rollout correction; mis masks weights outside [1/cap, cap]).
ALL_MODES = (*MODES, *importance.MODES)


def check_mode(mode: str | None) -> None:
    if mode is not None and mode not in ALL_MODES:
        raise ValueError(
            f"algorithm.engine_is_correction must be null or one of {list(ALL_MODES)}, got {mode!r}"
        )


def needs_trainer_logprobs(loss: str) -> bool:
    """Whether the update needs the trainer's own pre-update log-probs (one no-grad pass)."""
    return loss in NEEDS_PROXIMAL


def mismatch_metrics(
    trainer_logp: Tensor,  # [N, T] the trainer's log-probs of the sampled tokens
    engine_logp: Tensor,  # [N, T] the engine's log-probs of the same tokens
    mask: Tensor,  # [N, T] trained tokens
    cap: float,
) -> dict[str, float]:
    """How far the engine is from the trainer on the trained tokens.

    `k3_kl`: (r - 1) - log r with r = pi_trainer / pi_engine, a non-negative estimate of
    KL(engine || trainer) from the engine's samples; `abs_logprob_diff` mean and max;
    `iw_above_cap`: share of tokens whose weight pi_trainer / pi_engine exceeds the cap.
    """
    keep = mask.bool()
    if not keep.any():
        return {}
    d = torch.where(keep, trainer_logp.detach().float() - engine_logp.float(), 0.0).clamp(-20, 20)
    r = torch.exp(d)
    out = torch.stack(
        [
            masked_mean((r - 1.0) - d, keep),
            masked_mean(d.abs(), keep),
            torch.where(keep, d.abs(), 0.0).amax(),
            masked_mean((r > cap).float(), keep),
        ]
    ).tolist()
    names = ("k3_kl", "abs_logprob_diff", "abs_logprob_diff_max", "iw_above_cap")
    return {f"mismatch/{k}": float(v) for k, v in zip(names, out, strict=True)}
