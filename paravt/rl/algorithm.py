"""`AlgorithmConfig`: every knob of the PARA-GRPO objective and its update schedule, in one
frozen dataclass whose defaults are the reference recipe (conf/algorithm/paragrpo.yaml; a test
keeps the two equal). The one knob list: the loss (`paravt.rl.paragrpo_loss.PARAGRPOLoss`) is
built from it, in the trainer and for a user alike.

Checked on construction, so a config that cannot run fails before a model is loaded: the loss,
aggregation and engine correction are known names, and the KL estimator fits the side it is on
(k1 belongs in the reward; as a loss term it is refused). Pure: no framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paravt.errors import check_number
from paravt.rewards.compose import anchored
from paravt.rewards.structural import STRUCTURAL_TAGS
from paravt.rl import importance
from paravt.rl.kl import get_kl_estimator
from paravt.rl.losses import get_aggregation, get_policy_loss
from paravt.rl.mismatch import check_mode
from paravt.rl.objective import AdvantageConfig


@dataclass(frozen=True)
class AlgorithmConfig:
    """The policy objective: loss variant, clipping, KL, structural anchor, PPO schedule."""

    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    # paravt.rl.losses.POLICY_LOSSES: ppo, decoupled_ppo, ppo_engine_is (engine correction),
    # tis / mis (verl's rollout correction, as engine_is_correction=tis / mis beside them).
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
    # whose structural positions the anchor reads: "well_formed" rollouts or "all" (the
    # paper's formula; paravt.rewards.compose.anchored)
    anchor_rollouts: str = "well_formed"
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
        self._check_numbers()
        get_kl_estimator(self.kl_estimator)
        if self.kl_coef > 0 and not self.kl_in_reward and self.kl_estimator == "k1":
            raise ValueError(
                "algorithm.kl_estimator=k1 with kl_in_reward=false: as a loss term k1 only adds "
                "noise (its expected gradient is zero); fix: algorithm.kl_estimator=k3 (or k2), "
                "or algorithm.kl_in_reward=true"
            )
        get_policy_loss(self.loss)
        anchored([], self.anchor_rollouts)  # a known name
        get_aggregation(self.aggregation)
        check_mode(self.engine_is_correction)
        if self.engine_is_cap < 1.0:
            raise ValueError(f"algorithm.engine_is_cap must be >= 1, got {self.engine_is_cap}")
        self._check_correction()

    def _check_numbers(self) -> None:
        """The numbers the loss and the update use, checked here rather than at the first step
        (the losses check their clip range and cap again when called)."""
        if not 0 <= self.clip_low < 1:  # NaN fails too
            raise ValueError(f"algorithm.clip_low must be in [0, 1), got {self.clip_low!r}")
        check_number("algorithm.clip_high", self.clip_high, least=0)
        check_number("algorithm.iw_cap", self.iw_cap, least=1, optional=True)
        for name in ("kl_coef", "anchor_coef"):
            check_number(f"algorithm.{name}", getattr(self, name), least=0)
        for name in ("ppo_epochs", "ppo_mini_batches", "micro_batch_tokens"):
            check_number(f"algorithm.{name}", getattr(self, name), least=1, integer=True)
        check_number(
            "algorithm.norm_length", self.norm_length, least=1, integer=True, optional=True
        )
        check_number("algorithm.max_grad_norm", self.max_grad_norm, least=0, optional=True)

    def _check_correction(self) -> None:
        """The behaviour-weight rule must change the loss it is set beside: plain ppo applies no
        weight, and tis / mis named as the loss have their own."""
        correction = self.engine_is_correction
        if self.loss == "ppo" and correction is not None:
            raise ValueError(
                f"algorithm.engine_is_correction={correction} does nothing with "
                "loss=ppo: the engine-mismatch correction is its own loss; fix: "
                "algorithm.loss=ppo_engine_is (or engine_is_correction=null)"
            )
        if self.loss in importance.MODES and correction not in (None, self.loss):
            raise ValueError(
                f"algorithm.loss={self.loss} is its own correction, engine_is_correction="
                f"{correction} would contradict it; fix: engine_is_correction=null"
            )
        mode = self.loss if self.loss in importance.MODES else correction
        if mode in importance.MODES:
            importance.check(mode, self.engine_is_level, self.engine_is_cap)
