"""`AlgorithmConfig`: every knob of the PARA-GRPO objective and its update schedule, in one
frozen dataclass whose defaults are the reference recipe (conf/algorithm/paragrpo.yaml; a test
keeps the two equal).

Checked on construction, so a config that cannot run fails before a model is loaded: the loss,
aggregation and engine correction are known names (`LossSettings`), and the KL estimator fits
the side it is on (k1 belongs in the reward; as a loss term it is refused). Pure: no framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paravt.rewards.structural import STRUCTURAL_TAGS
from paravt.rl.kl import get_kl_estimator
from paravt.rl.objective import AdvantageConfig, LossSettings


def _reference_advantage() -> AdvantageConfig:
    return AdvantageConfig(shaping=True, batch_norm=True)  # docs/method.md sections 4 and 5


@dataclass(frozen=True)
class AlgorithmConfig:
    """The policy objective: loss variant, clipping, KL, structural anchor, PPO schedule."""

    advantage: AdvantageConfig = field(default_factory=_reference_advantage)
    # paravt.rl.losses.POLICY_LOSSES: ppo, decoupled_ppo, ppo_engine_is (engine correction).
    loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    iw_cap: float | None = 5.0  # decoupled_ppo's behaviour-weight cap
    aggregation: str = "token_mean"
    # Dr.GRPO's constant divisor (seq_mean_token_sum_norm); None: the maximum response length,
    # rollout.agent.max_new_tokens x (max_rounds + 1).
    norm_length: int | None = None
    kl_coef: float = 0.01
    kl_estimator: str = "k1"
    kl_in_reward: bool = True
    anchor_coef: float = 0.1
    anchor_tags: tuple[str, ...] = STRUCTURAL_TAGS
    ppo_epochs: int = 1
    ppo_mini_batches: int = 1  # optimiser steps per PPO epoch
    micro_batch_tokens: int = 16384  # padded tokens per gradient micro-batch (packed: tokens)
    # True: each micro-batch is one packed row, cut by its tokens in all, no padding
    # (paravt.modules.packed_forward); the loss and its gradient equal the padded path's.
    pack_update: bool = False
    max_grad_norm: float = 1.0
    train_subagents: bool = False
    # The rule of the behaviour weights (paravt.rl.mismatch.ALL_MODES): null, "token_truncate"
    # or "token_mask" (capped at `engine_is_cap`), or "tis" / "mis" (paravt.rl.importance:
    # verl's rollout correction at `engine_is_level` token | sequence).
    engine_is_correction: str | None = None
    engine_is_cap: float = 2.0
    engine_is_level: str = "token"
    # True: a trajectory cut by the token or turn limit leaves the loss (paravt.rl.truncation).
    mask_truncated: bool = False

    def __post_init__(self) -> None:
        get_kl_estimator(self.kl_estimator)
        if self.kl_coef > 0 and not self.kl_in_reward and self.kl_estimator == "k1":
            raise ValueError(
                "algorithm.kl_estimator=k1 with kl_in_reward=false: as a loss term k1 only adds "
                "noise (its expected gradient is zero); fix: algorithm.kl_estimator=k3 (or k2), "
                "or algorithm.kl_in_reward=true"
            )
        self.loss_settings(self.norm_length, self.anchor_coef)  # checks the loss's names

    def loss_settings(self, norm_length: int | None, anchor_coef: float) -> LossSettings:
        """The objective's knobs, with the divisor and anchor coefficient in force now."""
        return LossSettings(
            loss=self.loss,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            iw_cap=self.iw_cap,
            aggregation=self.aggregation,
            norm_length=norm_length,
            kl_estimator=self.kl_estimator,
            kl_coef=self.kl_coef,
            anchor_coef=anchor_coef,
            engine_is_correction=self.engine_is_correction,
            engine_is_cap=self.engine_is_cap,
            engine_is_level=self.engine_is_level,
        )
