"""Tests of paravt.rl.advantages: hand-computed values, loop references, edge cases."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt.rl.advantages import (
    ADVANTAGES,
    batch_normalize,
    drgrpo_advantages,
    get_advantage_fn,
    grpo_advantages,
    shape_rewards,
    zero_variance_groups,
)

# ---- readable loop references ------------------------------------------------------------


def grpo_advantages_loop(
    rewards: list[list[float]], eps: float = 1e-6, unbiased: bool = True
) -> list[list[float]]:
    out = []
    for group in rewards:
        mean = sum(group) / len(group)
        dof = len(group) - 1 if unbiased and len(group) > 1 else len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / dof)
        if max(group) == min(group):
            out.append([0.0] * len(group))
        else:
            out.append([(r - mean) / (std + eps) for r in group])
    return out


def drgrpo_advantages_loop(rewards: list[list[float]]) -> list[list[float]]:
    return [[r - sum(g) / len(g) for r in g] for g in rewards]


def batch_normalize_loop(adv: list[float], keep: list[bool], eps: float = 1e-6) -> list[float]:
    kept = [a for a, k in zip(adv, keep, strict=True) if k]
    if not kept:
        return [0.0] * len(adv)
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((a - mean) ** 2 for a in kept) / len(kept))
    return [(a - mean) / (std + eps) if k else 0.0 for a, k in zip(adv, keep, strict=True)]


# ---- hand-computed values ----------------------------------------------------------------


def test_grpo_hand_computed() -> None:
    # group [1, 0, 0, 1]: mean 0.5, biased std sqrt(4 * 0.25 / 4) = 0.5 -> +-0.5 / 0.5 = +-1
    # group [3, 1, 2, 2]: mean 2, var (1 + 1 + 0 + 0) / 4 = 0.5, std 0.7071
    #   -> [1 / 0.7071, -1 / 0.7071, 0, 0] = [1.4142, -1.4142, 0, 0]
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    adv = grpo_advantages(r, eps=0.0, unbiased=False)
    expected = torch.tensor([[1.0, -1.0, -1.0, 1.0], [math.sqrt(2), -math.sqrt(2), 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_grpo_unbiased_std_scales_by_bessel() -> None:
    # [1, 0]: mean 0.5; biased std 0.5 -> +-1; unbiased std sqrt(0.5 / 1) = 0.7071 -> +-0.7071
    r = torch.tensor([[1.0, 0.0]])
    biased = grpo_advantages(r, eps=0.0, unbiased=False)
    torch.testing.assert_close(biased, torch.tensor([[1.0, -1.0]]))
    half = 1 / math.sqrt(2)
    # the default is the unbiased std (verl, TRL)
    torch.testing.assert_close(grpo_advantages(r, eps=0.0), torch.tensor([[half, -half]]))


def test_compute_advantages_defaults_to_the_unbiased_std_and_has_a_switch() -> None:
    from paravt.rl.objective import AdvantageConfig, compute_advantages

    # group [1, 0, 0, 0]: mean 0.25, squared deviations 0.5625 + 3 * 0.0625 = 0.75
    #   unbiased std sqrt(0.75 / 3) = 0.5       -> [1.5, -0.5, -0.5, -0.5]   (verl's value)
    #   biased std   sqrt(0.75 / 4) = 0.4330    -> [1.7321, -0.5774, ...]
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    raw = AdvantageConfig(shaping=False, batch_norm=False)  # group normalisation alone
    assert raw.unbiased_std
    got = compute_advantages(r, raw).values
    torch.testing.assert_close(got, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=0)
    biased = compute_advantages(r, replace(raw, unbiased_std=False)).values
    third = 1 / math.sqrt(3)
    expected = torch.tensor([3 * third, -third, -third, -third])
    torch.testing.assert_close(biased, expected, atol=1e-5, rtol=0)


def test_drgrpo_hand_computed() -> None:
    # [3, 1, 2, 2]: mean 2 -> [1, -1, 0, 0]; no division by the std
    r = torch.tensor([[3.0, 1.0, 2.0, 2.0]])
    torch.testing.assert_close(drgrpo_advantages(r), torch.tensor([[1.0, -1.0, 0.0, 0.0]]))


def test_all_equal_groups_are_zero_and_flagged() -> None:
    r = torch.tensor([[0.7, 0.7, 0.7], [1.0, 0.0, 1.0], [0.1, 0.1, 0.1]])
    assert zero_variance_groups(r).tolist() == [True, False, True]
    for fn in ADVANTAGES.values():
        adv = fn(r)
        assert torch.equal(adv[0], torch.zeros(3)) and torch.equal(adv[2], torch.zeros(3))


def test_group_of_one() -> None:
    r = torch.tensor([[0.3], [5.0]])
    assert zero_variance_groups(r).all()
    assert torch.equal(grpo_advantages(r, unbiased=True), torch.zeros(2, 1))
    assert torch.equal(drgrpo_advantages(r), torch.zeros(2, 1))


def test_a_flat_reward_vector_is_refused_naming_the_reshape() -> None:
    with pytest.raises(ValueError, match=r"\[B, G\].*view\(-1, group_size\)"):
        grpo_advantages(torch.arange(6.0))


def test_registry_error_lists_names() -> None:
    assert get_advantage_fn("grpo") is grpo_advantages
    with pytest.raises(ValueError, match=r"'ppo'.*\['drgrpo', 'grpo'\]"):
        get_advantage_fn("ppo")


def test_shape_rewards_hand_computed() -> None:
    # (1.0 - 0.2) * 10 = 8; (0.0 - 0.2) * 10 = -2; (3.0 - 0.2) * 10 = 28 -> clipped to 20;
    # (-5 - 0.2) * 10 = -52 -> -20
    r = torch.tensor([1.0, 0.0, 3.0, -5.0])
    torch.testing.assert_close(shape_rewards(r), torch.tensor([8.0, -2.0, 20.0, -20.0]))
    with pytest.raises(ValueError, match="clip must be >= 0"):
        shape_rewards(r, clip=-1.0)


def test_batch_normalize_hand_computed_with_mask() -> None:
    # kept [1, 3]: mean 2, biased std 1 -> [-1, 1]; the masked 100 is ignored and set to 0
    adv = torch.tensor([1.0, 3.0, 100.0])
    out = batch_normalize(adv, torch.tensor([1, 1, 0]), eps=0.0)
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0, 0.0]))


def test_batch_normalize_degenerate() -> None:
    assert torch.equal(batch_normalize(torch.tensor([5.0])), torch.tensor([0.0]))
    assert torch.equal(batch_normalize(torch.full((2, 3), 4.0)), torch.zeros(2, 3))
    assert torch.equal(batch_normalize(torch.ones(2, 2), torch.zeros(2, 2)), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="mask shape"):
        batch_normalize(torch.ones(3), torch.ones(2))


# ---- vectorised == loop on random groups ----------------------------------------------------


def test_vectorised_matches_loops_on_random_groups() -> None:
    torch.manual_seed(0)
    for trial in range(20):
        b, g = 1 + trial % 5, 1 + trial % 8
        r = torch.randint(0, 3, (b, g)).double() / 2  # ties and all-equal groups happen often
        loop = torch.tensor(grpo_advantages_loop(r.tolist()), dtype=torch.float64)
        torch.testing.assert_close(grpo_advantages(r), loop)
        dr = torch.tensor(drgrpo_advantages_loop(r.tolist()), dtype=torch.float64)
        torch.testing.assert_close(drgrpo_advantages(r), dr)
        flat = torch.randn(b * g, dtype=torch.float64)
        keep = torch.rand(b * g) > 0.3
        expected = torch.tensor(batch_normalize_loop(flat.tolist(), keep.tolist()))
        torch.testing.assert_close(batch_normalize(flat, keep), expected.double())


def test_zero_variance_matches_loop() -> None:
    torch.manual_seed(1)
    r = torch.randint(0, 2, (50, 3)).float()
    loop = [max(row) == min(row) for row in r.tolist()]
    assert zero_variance_groups(r).tolist() == loop


# ---- no NaN for any finite input -----------------------------------------------------------

finite = st.floats(-(2.0**100), 2.0**100, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.data())
def test_advantages_finite_for_finite_rewards(b: int, g: int, data: st.DataObject) -> None:
    values = data.draw(st.lists(finite, min_size=b * g, max_size=b * g))
    r = torch.tensor(values, dtype=torch.float32).reshape(b, g)
    for fn in ADVANTAGES.values():
        assert torch.isfinite(fn(r, unbiased=True)).all()
    adv = grpo_advantages(r, unbiased=False)
    # the biased std bounds a GRPO advantage by sqrt(G - 1)
    assert adv.abs().max() <= math.sqrt(max(g - 1, 0)) + 1e-3
    assert torch.isfinite(batch_normalize(adv.reshape(-1))).all()
    assert torch.isfinite(shape_rewards(r)).all()
