"""Tests of paravt.rl.kl: estimator values by hand, masking, reward-side folding."""

from __future__ import annotations

import math

import pytest
import torch

from paravt.rl.kl import (
    KL_ESTIMATORS,
    fold_kl_into_rewards,
    get_kl_estimator,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalty,
    sequence_kl,
)


def test_estimators_hand_computed() -> None:
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    # d = logp - ref = [0.5, 0]
    torch.testing.assert_close(kl_k1(logp, ref), torch.tensor([[0.5, 0.0]]))
    # k2 = 0.5 * 0.25 = 0.125
    torch.testing.assert_close(kl_k2(logp, ref), torch.tensor([[0.125, 0.0]]))
    # k3 = exp(-0.5) - (-0.5) - 1 = 0.60653 + 0.5 - 1 = 0.10653
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([[math.exp(-0.5) - 0.5, 0.0]]))


def test_k3_is_unbiased_estimate_of_true_kl() -> None:
    # p = [0.5, 0.5] (policy, samples drawn from it), q = [0.25, 0.75] (reference):
    # KL(p || q) = 0.5 ln 2 + 0.5 ln(2/3) = 0.5 * (0.69315 - 0.40547) = 0.14384
    p = torch.tensor([0.5, 0.5])
    q = torch.tensor([0.25, 0.75])
    logp, ref = p.log().unsqueeze(0), q.log().unsqueeze(0)
    true_kl = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    for name in ("k1", "k3"):
        expectation = (p * KL_ESTIMATORS[name](logp, ref)[0]).sum()
        assert expectation.item() == pytest.approx(true_kl, abs=1e-6)


def test_penalty_masks_and_survives_neg_inf() -> None:
    # position 1 is padding holding -inf in both; it must give 0, not NaN, in value and gradient
    logp = torch.tensor([[-0.5, float("-inf")]], requires_grad=True)
    ref = torch.tensor([[-1.0, float("-inf")]])
    mask = torch.tensor([[1, 0]])
    for name in KL_ESTIMATORS:
        kl = kl_penalty(logp, ref, name, mask)
        assert kl[0, 1].item() == 0.0 and torch.isfinite(kl).all()
        (grad,) = torch.autograd.grad(kl.sum(), logp)
        assert torch.isfinite(grad).all() and grad[0, 1].item() == 0.0
    # k1 gradient is 1 at the trained token: d(logp - ref)/dlogp
    (grad,) = torch.autograd.grad(kl_penalty(logp, ref, "k1", mask).sum(), logp)
    assert grad[0, 0].item() == 1.0


def test_penalty_without_mask_and_extreme_ratio() -> None:
    logp = torch.tensor([[0.0]])
    ref = torch.tensor([[-1000.0]])  # exp(1000) would overflow without the clamp
    assert torch.isfinite(kl_penalty(logp, ref, "k3")).all()
    # clamp at 20: k1 = 20, k3 = exp(-20) + 20 - 1 ~ 19
    assert kl_penalty(logp, ref, "k1").item() == 20.0
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(19.0, abs=1e-6)


def test_registry_and_shape_errors() -> None:
    assert get_kl_estimator("k2") is kl_k2
    with pytest.raises(ValueError, match=r"'k4'.*\['k1', 'k2', 'k3'\]"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    with pytest.raises(ValueError, match="must match"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3))


def test_fold_kl_into_rewards_hand_computed() -> None:
    rewards = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[2.0, 3.0, 100.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # row 0: sum of trained KL = 2 + 3 = 5 -> 1 - 0.01 * 5 = 0.95 (the masked 100 is ignored)
    # row 1: sum = -1 -> 0 - 0.01 * -1 = 0.01
    seq = sequence_kl(kl, mask)
    assert seq.tolist() == [5.0, -1.0]
    out = fold_kl_into_rewards(rewards, seq, coef=0.01)
    torch.testing.assert_close(out, torch.tensor([0.95, 0.01]))
    assert not out.requires_grad


def test_fold_kl_is_detached_and_empty_mask_is_identity() -> None:
    kl = torch.ones(2, 3, requires_grad=True)
    seq = sequence_kl(kl, torch.zeros(2, 3))
    out = fold_kl_into_rewards(torch.tensor([0.5, 0.25]), seq, coef=1.0)
    assert out.tolist() == [0.5, 0.25] and not out.requires_grad and not seq.requires_grad
    with pytest.raises(ValueError, match="expected rewards"):
        fold_kl_into_rewards(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="expected kl"):
        sequence_kl(torch.zeros(2, 3), torch.zeros(2, 4))
