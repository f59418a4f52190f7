"""Step-level arithmetic: advantages from a reward batch, micro-batch and mini-batch splits."""

from __future__ import annotations

import pytest
import torch

from paravt.rl.microbatch import MicroWeights, split_even, token_budget_chunks
from paravt.rl.objective import (
    AdvantageConfig,
    LossSettings,
    MicroBatchTerms,
    compute_advantages,
    micro_objective,
)


def test_grpo_advantages_with_a_zero_variance_group_dropped():
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    adv = compute_advantages(rewards, AdvantageConfig(drop_zero_variance=True))
    # Group 0: mean 0.5, unbiased std sqrt(0.5) -> 0.5 / 0.7071 = +-0.7071. Group 1: zero variance.
    half = 0.5**0.5
    assert torch.allclose(adv.values, torch.tensor([half, -half, 0.0, 0.0]), atol=1e-5)
    assert adv.keep.tolist() == [True, True, False, False]
    assert adv.zero_variance.tolist() == [False, True]


def test_shaping_then_batch_norm():
    rewards = torch.tensor([[1.2, 0.2, 0.2, 0.2]])
    cfg = AdvantageConfig(estimator="drgrpo", shaping=True, batch_norm=True)
    adv = compute_advantages(rewards, cfg).values
    # Shaped: (R - 0.2) * 10 = [10, 0, 0, 0]; Dr.GRPO: minus the mean 2.5 -> [7.5, -2.5 x3];
    # batch norm: mean 0, biased std sqrt((56.25 + 3 * 6.25) / 4) = sqrt(18.75) = 4.33.
    expected = torch.tensor([7.5, -2.5, -2.5, -2.5]) / 18.75**0.5
    assert torch.allclose(adv, expected, atol=1e-4)


def test_token_budget_chunks_by_padded_cost():
    # Budget 10: [3, 4] pads to 2 x 4 = 8; adding 5 would cost 3 x 5 = 15 -> new chunk;
    # [5] then [5, 2] costs 2 x 5 = 10 <= 10; 12 alone exceeds the budget but gets its own chunk.
    assert token_budget_chunks([3, 4, 5, 2, 12], 10) == [[0, 1], [2, 3], [4]]
    assert token_budget_chunks([], 10) == []


def test_split_even():
    assert split_even(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_even([1], 4) == [[1]]
    assert split_even([], 3) == []


def _terms(**kw) -> MicroBatchTerms:
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    base = dict(
        logp=logp,
        proximal=logp.detach(),
        behaviour=logp.detach(),  # on-policy: every ratio is 1
        advantages=torch.tensor([2.0]),
        mask=torch.tensor([[True, True, False]]),
    )
    return MicroBatchTerms(**(base | kw))


def test_micro_objective_sums_the_three_weighted_terms():
    structural = torch.tensor([[True, False, False]])
    reference = torch.tensor([[-1.5, -2.0, -3.0]])
    settings = LossSettings(kl_coef=0.01, kl_estimator="k2", anchor_coef=0.1)
    weights = MicroWeights(policy=0.5, kl=2.0, anchor=1.0)
    total, metrics = micro_objective(
        _terms(structural=structural, reference=reference), settings, weights
    )
    # Policy (ratio 1, token mean): -mean(A) = -2. Anchor: -0.1 x mean(logp at struct) = 0.1.
    # KL k2 loss: 0.01 x mean(0.5 (logp - ref)^2 over trained) = 0.01 x (0.125 + 0) / 2
    # = 0.000625 (k1 is refused as a loss). Total: 0.5 x -2 + 0.1 + 2.0 x 0.000625 = -0.89875.
    assert abs(float(total) - (-0.89875)) < 1e-6
    assert abs(metrics["loss/anchor"] - 0.1) < 1e-6 and abs(metrics["loss/kl"] - 0.000625) < 1e-7
    with pytest.raises(ValueError, match="k1"):
        micro_objective(
            _terms(reference=reference), LossSettings(kl_coef=0.01, kl_estimator="k1"), weights
        )
    assert metrics["loss/logprob_gap"] == 0.0


def test_micro_objective_leaves_out_the_terms_it_is_not_given():
    weights = MicroWeights(policy=1.0, kl=1.0, anchor=1.0)
    total, metrics = micro_objective(_terms(), LossSettings(anchor_coef=0.1), weights)
    assert abs(float(total) - (-2.0)) < 1e-6
    assert "loss/anchor" not in metrics and "loss/kl" not in metrics
    structural = torch.tensor([[True, False, False]])
    _, metrics = micro_objective(_terms(structural=structural), LossSettings(), weights)
    assert "loss/anchor" not in metrics  # a zero coefficient: no anchor term
