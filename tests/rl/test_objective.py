"""Step-level arithmetic: advantages from a reward batch, micro-batch and mini-batch splits."""

from __future__ import annotations

import torch

from paravt.rl.microbatch import split_even, token_budget_chunks
from paravt.rl.objective import AdvantageConfig, compute_advantages


def test_grpo_advantages_with_a_zero_variance_group_dropped():
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    cfg = AdvantageConfig(shaping=False, batch_norm=False, drop_zero_variance=True)
    adv = compute_advantages(rewards, cfg)
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
