"""`PARAGRPOLoss`: the PARA-GRPO objective as one callable object, for any training loop.

    loss_fn = PARAGRPOLoss()                       # the paper's defaults
    loss = loss_fn(logprobs, old_logprobs, advantages, mask, structural_mask=struct)
    loss.backward(); log(loss_fn.metrics)          # metrics on the side, as TRL and torchtune

One module per loss, as torchtune has it: tensors in, a scalar to minimise out. It is the same
arithmetic the trainer runs (`paravt.rl.objective.micro_objective` with unit weights): the
policy loss of the registry (`paravt.rl.losses.POLICY_LOSSES`), plus the structural anchor when
a structural mask is given, plus a KL loss term when reference log-probs are given. Pure torch.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from paravt.rl.losses import NEEDS_PROXIMAL, check_mask
from paravt.rl.microbatch import MicroWeights
from paravt.rl.objective import LossSettings, MicroBatchTerms, micro_objective

UNIT = MicroWeights(policy=1.0, kl=1.0, anchor=1.0)  # one batch, no micro-batch cut


class PARAGRPOLoss(torch.nn.Module):
    """The PARA-GRPO loss: PPO-clip on group advantages + the structural-token anchor.

    `loss` is an entry of `POLICY_LOSSES`: "ppo" (the default), "decoupled_ppo" (stale
    rollouts) or "ppo_engine_is" (the engine / trainer mismatch correction); the last two also
    need `behaviour_logprobs`, the sampler's log-probs. `anchor_coef` scales the anchor term
    (also per call); `kl_coef` the KL term, estimated by `kl_estimator` (k3 or k2; k1 is
    refused). After each call `metrics` holds the figures the trainer logs (`loss/...`).
    """

    def __init__(
        self,
        loss: str = "ppo",
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        aggregation: str = "token_mean",
        norm_length: int | None = None,
        anchor_coef: float = 0.1,
        kl_coef: float = 0.01,
        kl_estimator: str = "k3",
        iw_cap: float | None = 5.0,
        engine_is_correction: str | None = None,
        engine_is_cap: float = 2.0,
        engine_is_level: str = "token",
    ):
        super().__init__()
        if kl_estimator == "k1":
            raise ValueError(
                "kl_estimator='k1' as a loss term only adds noise (its expected gradient is "
                "zero); use 'k3' or 'k2', or fold k1 into the rewards (paravt.rl.kl)"
            )
        self.settings = LossSettings(
            loss=loss,
            clip_low=clip_low,
            clip_high=clip_high,
            iw_cap=iw_cap,
            aggregation=aggregation,
            norm_length=norm_length,
            kl_estimator=kl_estimator,
            kl_coef=kl_coef,
            anchor_coef=anchor_coef,
            engine_is_correction=engine_is_correction,
            engine_is_cap=engine_is_cap,
            engine_is_level=engine_is_level,
        )
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
    ) -> Tensor:
        """The scalar to minimise; `self.metrics` gets this call's figures."""
        if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape:
            raise ValueError(
                f"logprobs and old_logprobs must both be [N, T], got {tuple(logprobs.shape)} "
                f"and {tuple(old_logprobs.shape)}"
            )
        if behaviour_logprobs is None and self.settings.loss in NEEDS_PROXIMAL:
            raise ValueError(
                f"loss={self.settings.loss!r} weights tokens by old / behaviour: pass "
                "behaviour_logprobs (the sampler's log-probs), or use loss='ppo'"
            )
        settings = self.settings
        if anchor_coef is not None:
            settings = replace(settings, anchor_coef=anchor_coef)
        structural = None if structural_mask is None else check_mask(structural_mask)
        terms = MicroBatchTerms(
            logp=logprobs,
            proximal=old_logprobs,
            behaviour=old_logprobs if behaviour_logprobs is None else behaviour_logprobs,
            advantages=advantages,
            mask=check_mask(mask),
            entropy=entropy,
            structural=structural,
            reference=ref_logprobs,
        )
        loss, self.metrics = micro_objective(terms, settings, UNIT)
        return loss
