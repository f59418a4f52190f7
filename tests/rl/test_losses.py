"""Tests of paravt.rl.losses: PPO / decoupled PPO by hand, clip-higher, aggregation, NaN guards."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt.rl.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    decoupled_ppo_loss,
    entropy_from_logits,
    get_aggregation,
    get_policy_loss,
    kl_loss,
    masked_mean,
    ppo_clip_loss,
    seq_mean_token_mean,
    seq_mean_token_sum_norm,
    token_mean,
)

# ---- readable loop references ------------------------------------------------------------


def ppo_token_loss_loop(ratio: float, adv: float, low: float, high: float) -> float:
    clipped = min(max(ratio, 1 - low), 1 + high)
    return -min(ratio * adv, clipped * adv)


def ppo_loss_loop(logp, old, adv, mask, low=0.2, high=0.2) -> float:
    total, count = 0.0, 0
    for n in range(len(mask)):
        for t in range(len(mask[n])):
            if mask[n][t]:
                ratio = math.exp(logp[n][t] - old[n][t])
                total += ppo_token_loss_loop(ratio, adv[n], low, high)
                count += 1
    return total / count if count else 0.0


def seq_mean_token_mean_loop(x, mask) -> float:
    means = []
    for row, m in zip(x, mask, strict=True):
        kept = [v for v, k in zip(row, m, strict=True) if k]
        if kept:
            means.append(sum(kept) / len(kept))
    return sum(means) / len(means) if means else 0.0


def entropy_loop(logits: list[float]) -> float:
    finite = [z for z in logits if z != float("-inf")]
    top = max(finite)
    norm = sum(math.exp(z - top) for z in finite)
    probs = [math.exp(z - top) / norm for z in finite]
    return -sum(p * math.log(p) for p in probs if p > 0)


# ---- aggregation -----------------------------------------------------------------------------

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
M = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


def test_aggregations_hand_computed() -> None:
    # token mean: (1 + 2 + 3 + 4) / 4 = 2.5 (row 2 is fully masked)
    assert token_mean(X, M).item() == pytest.approx(2.5)
    # sequence means over non-empty rows: (6/3 + 4/1) / 2 = 3
    assert seq_mean_token_mean(X, M).item() == pytest.approx(3.0)
    # Dr.GRPO with L = T = 3, mean over the 2 NON-EMPTY rows (as the other modes and verl):
    # (6/3 + 4/3) / 2 = 5/3
    assert seq_mean_token_sum_norm(X, M).item() == pytest.approx(5 / 3)
    # with L = 10: (0.6 + 0.4) / 2 = 1/2
    assert seq_mean_token_sum_norm(X, M, 10).item() == pytest.approx(1 / 2)
    assert masked_mean(X, M, dim=-1).tolist() == [2.0, 4.0, 0.0]


def test_an_empty_row_changes_no_aggregation() -> None:
    # Appending a fully masked row (a rollout with no trained token) must not change any mode.
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    x_empty = torch.cat([x, torch.full((1, 3), 7.0)])
    m_empty = torch.cat([m, torch.zeros(1, 3, dtype=m.dtype)])
    for name, fn in AGGREGATIONS.items():
        assert fn(x_empty, m_empty, 3).item() == pytest.approx(fn(x, m, 3).item()), name


def test_aggregation_loops_on_random_input() -> None:
    torch.manual_seed(0)
    for _ in range(10):
        x = torch.randn(4, 5, dtype=torch.float64)
        m = (torch.rand(4, 5) > 0.5).int()
        got = seq_mean_token_mean(x, m).item()
        assert got == pytest.approx(seq_mean_token_mean_loop(x.tolist(), m.tolist()))


def test_aggregations_empty_mask_and_errors() -> None:
    for name, fn in AGGREGATIONS.items():
        assert fn(X, torch.zeros_like(M), None).item() == 0.0, name
    with pytest.raises(ValueError, match=r"'sum'.*valid names"):
        get_aggregation("sum")
    with pytest.raises(ValueError, match="norm_length must be >= 1"):
        seq_mean_token_sum_norm(X, M, 0)


# ---- PPO ---------------------------------------------------------------------------------------


def _one_token(ratio: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    return logp, torch.zeros(1, 1), torch.ones(1, 1)


def test_ppo_on_policy_hand_computed() -> None:
    # ratio 1 everywhere: loss = -token_mean(A) = -(2 + 2 - 1) / 3 = -1
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], requires_grad=True)
    loss, metrics = ppo_clip_loss(logp, logp.detach(), torch.tensor([2.0, -1.0]), M[:2, :2])
    assert loss.item() == pytest.approx(-1.0)
    assert metrics.ratio_mean == 1.0 and metrics.approx_kl == 0.0 and metrics.num_tokens == 3
    assert metrics.clip_frac_low == 0.0 and metrics.clip_frac_high == 0.0
    assert metrics.iw_mean is None and "iw_mean" not in metrics.as_dict()
    # d loss / d logp at a trained token = -A * ratio / 3
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))


def test_clip_higher_asymmetry() -> None:
    # ratio 1.25, A = +1: clip_high 0.2 caps the ratio at 1.2 -> loss -1.2, no gradient
    logp, old, mask = _one_token(1.25)
    loss, m = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(-1.2)
    assert m.clip_frac_high == 1.0 and m.clip_frac_low == 0.0
    assert torch.autograd.grad(loss, logp)[0].item() == 0.0
    # clip_high 0.28 admits 1.25 -> loss -1.25, gradient -r * A = -1.25
    loss, m = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25)
    assert m.clip_frac_high == 0.0
    assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(-1.25)
    # approx KL k3 = (1.25 - 1) - ln 1.25 = 0.25 - 0.22314 = 0.02686
    assert m.approx_kl == pytest.approx(0.25 - math.log(1.25), abs=1e-6)


def test_clip_low_side() -> None:
    # ratio 0.75, A = -1: min(-0.75, -0.8) = -0.8 -> loss 0.8, clipped (below 1 - 0.2), no grad
    logp, old, mask = _one_token(0.75)
    loss, m = ppo_clip_loss(logp, old, torch.tensor([-1.0]), mask, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(0.8)
    assert m.clip_frac_low == 1.0 and m.clip_frac_high == 0.0
    assert torch.autograd.grad(loss, logp)[0].item() == 0.0
    # same ratio, A = +1: min(0.75, 0.8) = 0.75 -> not clipped, loss -0.75
    loss, m = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask)
    assert loss.item() == pytest.approx(-0.75) and m.clip_frac_low == 0.0


def test_ppo_matches_loop_on_random_input() -> None:
    torch.manual_seed(0)
    for _ in range(10):
        logp, old = -torch.rand(3, 6).double() * 3, -torch.rand(3, 6).double() * 3
        adv, mask = torch.randn(3).double(), (torch.rand(3, 6) > 0.4).int()
        loss, _ = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
        expected = ppo_loss_loop(
            logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28
        )
        assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_token_level_advantages_and_metrics() -> None:
    # per-token A [[1, -1]], ratios [2, 1] with clip 0.2: token 0 -> -min(2, 1.2) = -1.2,
    # token 1 -> -min(-1, -1) = 1 -> mean (-1.2 + 1) / 2 = -0.1
    logp = torch.tensor([[math.log(2.0), 0.0]])
    entropy = torch.tensor([[0.5, 1.5]])
    loss, m = ppo_clip_loss(
        logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), entropy=entropy
    )
    assert loss.item() == pytest.approx(-0.1)
    assert (m.ratio_mean, m.ratio_min, m.ratio_max) == pytest.approx((1.5, 1.0, 2.0))
    assert m.clip_frac_high == 0.5 and m.entropy == pytest.approx(1.0)


def test_invalid_clip_and_shapes() -> None:
    logp, old, mask = _one_token(1.0)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_clip_loss(logp, old, torch.ones(1), mask, clip_low=1.0)
    with pytest.raises(ValueError, match="adv must be"):
        ppo_clip_loss(logp, old, torch.ones(2), mask)


# ---- decoupled PPO -----------------------------------------------------------------------------


def test_decoupled_importance_weight_hand_computed() -> None:
    # logp = prox (ratio 1), prox - behav = ln 2 -> w = 2; A = 1 -> per-token loss -1 * 2 = -2
    prox = torch.tensor([[-1.0, -1.0]])
    behav = prox - math.log(2.0)
    logp = prox.clone().requires_grad_(True)
    loss, m = decoupled_ppo_loss(logp, prox, behav, torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-2.0)
    assert (m.iw_mean, m.iw_min, m.iw_max, m.iw_capped_frac) == pytest.approx((2, 2, 2, 0))


def test_decoupled_cap_modes() -> None:
    # weights [6, 1]: 6 > cap 5. mask mode: token 0 dropped -> (0 + -1) / 2 = -0.5;
    # clamp mode: w = 5 -> (-5 + -1) / 2 = -3
    prox = torch.zeros(1, 2)
    behav = torch.tensor([[-math.log(6.0), 0.0]])
    args = (prox, prox, behav, torch.tensor([1.0]), torch.ones(1, 2))
    loss, m = decoupled_ppo_loss(*args, iw_cap=5.0, iw_cap_mode="mask")
    assert loss.item() == pytest.approx(-0.5) and m.iw_capped_frac == 0.5
    assert m.iw_max == pytest.approx(6.0)  # metrics report the raw weight
    loss, _ = decoupled_ppo_loss(*args, iw_cap=5.0, iw_cap_mode="clamp")
    assert loss.item() == pytest.approx(-3.0)
    loss, _ = decoupled_ppo_loss(*args, iw_cap=None)
    assert loss.item() == pytest.approx(-3.5)  # (-6 + -1) / 2
    with pytest.raises(ValueError, match="iw_cap must be >= 1"):
        decoupled_ppo_loss(*args, iw_cap=0.5)
    with pytest.raises(ValueError, match="iw_cap_mode"):
        decoupled_ppo_loss(*args, iw_cap_mode="drop")


def test_decoupled_clips_against_proximal_and_detaches() -> None:
    # logp = prox, behaviour far off (w = e^1): ratio 1 -> nothing clipped
    prox = torch.tensor([[-1.0]], requires_grad=True)
    behav = torch.tensor([[-2.0]], requires_grad=True)
    logp = torch.tensor([[-1.0]], requires_grad=True)
    loss, m = decoupled_ppo_loss(logp, prox, behav, torch.tensor([1.0]), torch.ones(1, 1))
    assert m.clip_frac_high == 0.0 and m.ratio_mean == 1.0
    g_logp, g_prox, g_behav = torch.autograd.grad(loss, [logp, prox, behav], allow_unused=True)
    # d/dlogp of -w * r * A = -e * 1 * 1; no gradient reaches the weight's inputs
    assert g_logp.item() == pytest.approx(-math.e)
    assert g_prox is None and g_behav is None


def test_decoupled_equals_ppo_when_on_policy() -> None:
    torch.manual_seed(3)
    logp = (-torch.rand(2, 4)).requires_grad_(True)
    prox, adv, mask = -torch.rand(2, 4), torch.randn(2), (torch.rand(2, 4) > 0.3).int()
    a, _ = decoupled_ppo_loss(logp, prox, prox, adv, mask, clip_high=0.28)
    b, _ = ppo_clip_loss(logp, prox, adv, mask, clip_high=0.28)
    torch.testing.assert_close(a, b)
    for name, fn in POLICY_LOSSES.items():
        c, _ = fn(logp, prox, prox, adv, mask, clip_high=0.28)
        torch.testing.assert_close(c, b, msg=name)
    with pytest.raises(
        ValueError, match=r"'grpo'.*\['decoupled_ppo', 'mis', 'ppo', 'ppo_engine_is', 'tis'\]"
    ):
        get_policy_loss("grpo")


# ---- empty masks, single tokens, NaN guards ---------------------------------------------------


def _all_losses(logp, old, adv, mask, agg="token_mean"):
    yield ppo_clip_loss(logp, old, adv, mask, agg=agg)
    yield decoupled_ppo_loss(logp, old, old - 0.1, adv, mask, agg=agg)


def test_all_zero_mask_gives_zero_loss_and_zero_metrics() -> None:
    logp = torch.full((2, 3), float("-inf")).requires_grad_(True)  # garbage where untrained
    adv = torch.tensor([float("nan"), 1.0])
    for agg in AGGREGATIONS:
        for loss, m in _all_losses(logp, torch.zeros(2, 3), adv, torch.zeros(2, 3), agg):
            assert loss.item() == 0.0 and m.num_tokens == 0
            assert all(math.isfinite(v) for v in m.as_dict().values())
            (grad,) = torch.autograd.grad(loss, logp)
            assert torch.equal(grad, torch.zeros(2, 3))
    assert kl_loss(logp, torch.zeros(2, 3), torch.zeros(2, 3)).item() == 0.0


def test_single_token_responses() -> None:
    # T = 1, ratio 1, A = [1, -3]: token mean -(1 - 3) / 2 = 1
    logp = torch.zeros(2, 1, requires_grad=True)
    for loss, _ in _all_losses(
        logp, torch.zeros(2, 1), torch.tensor([1.0, -3.0]), torch.ones(2, 1)
    ):
        assert torch.isfinite(loss)
    loss, _ = ppo_clip_loss(logp, torch.zeros(2, 1), torch.tensor([1.0, -3.0]), torch.ones(2, 1))
    assert loss.item() == pytest.approx(1.0)


logprob = st.floats(-50.0, 0.0, allow_nan=False, width=32)
advantage = st.floats(-1e4, 1e4, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.data())
def test_losses_finite_for_finite_inputs(n: int, t: int, data: st.DataObject) -> None:
    def tensor(strategy, shape):
        return torch.tensor(data.draw(st.lists(strategy, min_size=n * t, max_size=n * t))).reshape(
            shape
        )

    logp = tensor(logprob, (n, t)).requires_grad_(True)
    old, behav = tensor(logprob, (n, t)), tensor(logprob, (n, t))
    adv = tensor(advantage, (n, t))
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n * t, max_size=n * t)))
    mask = mask.reshape(n, t)
    for agg in AGGREGATIONS:
        for loss, m in (
            ppo_clip_loss(logp, old, adv, mask, agg=agg),
            decoupled_ppo_loss(logp, old, behav, adv, mask, agg=agg),
        ):
            (grad,) = torch.autograd.grad(loss, logp)
            assert torch.isfinite(loss) and torch.isfinite(grad).all()
            assert all(math.isfinite(v) for v in m.as_dict().values())
    assert torch.isfinite(kl_loss(logp, old, mask))


# ---- KL loss and entropy ---------------------------------------------------------------------


def test_kl_loss_hand_computed() -> None:
    # d = logp - ref = 0.5 on both tokens: k3 = exp(-0.5) + 0.5 - 1 = 0.106531
    # coef 0.1 -> 0.0106531
    logp = torch.tensor([[-0.5, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    loss = kl_loss(logp, ref, torch.ones(1, 2), estimator="k3", coef=0.1)
    assert loss.item() == pytest.approx(0.1 * (math.exp(-0.5) - 0.5))
    g_logp, g_ref = torch.autograd.grad(loss, [logp, ref], allow_unused=True)
    # d k3 / d logp = 1 - exp(-d) = 1 - 0.60653 = 0.39347; times coef / 2 tokens
    assert g_logp[0, 0].item() == pytest.approx(0.1 * (1 - math.exp(-0.5)) / 2)
    assert g_ref is None


def test_entropy_from_logits_hand_computed() -> None:
    # uniform over 4 -> ln 4; two finite of four (rest suppressed to -inf) -> ln 2
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [3.0, 3.0, float("-inf"), float("-inf")]]])
    logits.requires_grad_(True)
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent, torch.tensor([[math.log(4), math.log(2)]]))
    (grad,) = torch.autograd.grad(ent.sum(), logits)
    assert torch.isfinite(grad).all()


def test_entropy_matches_loop_and_chunking() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7) * 4
    ent = entropy_from_logits(logits)
    expected = torch.tensor([[entropy_loop(row) for row in seq] for seq in logits.tolist()])
    torch.testing.assert_close(ent, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=2), ent)


def test_neg_inf_logp_at_trained_token_is_clamped_but_nan_propagates() -> None:
    # logp = -inf at a trained token: log-ratio clamped to -20, ratio e^-20, A = 1 ->
    # loss -min(e^-20, 0.8) = -2.06e-9, finite, with zero gradient through the clamp
    logp = torch.tensor([[float("-inf")]], requires_grad=True)
    loss, m = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-math.exp(-20)) and m.ratio_min < 1e-8
    assert torch.isfinite(torch.autograd.grad(loss, logp)[0]).all()
    # a NaN where the policy is trained signals an upstream bug: it must not be hidden
    nan_logp = torch.tensor([[float("nan")]])
    loss, _ = ppo_clip_loss(nan_logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    assert math.isnan(loss.item())


def test_decoupled_weights_and_gradient_when_behaviour_differs_from_proximal() -> None:
    # Two tokens, A = 1, clip 0.2, token mean. Token 0: w = pi_prox/pi_behav = 3, ratio
    # pi/pi_prox = 1.1 (inside the clip): term -3 * 1.1, d/dlogp = -3 * 1.1 / 2 = -1.65.
    # Token 1: w = 2, ratio 1.5 > 1.2: clipped, term -2 * 1.2, no gradient.
    # loss = (-3.3 - 2.4) / 2 = -2.85
    prox = torch.tensor([[-1.0, -2.0]])
    behav = prox - torch.tensor([[math.log(3.0), math.log(2.0)]])
    logp = (prox + torch.tensor([[math.log(1.1), math.log(1.5)]])).requires_grad_(True)
    loss, m = decoupled_ppo_loss(logp, prox, behav, torch.tensor([1.0]), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(-2.85)
    assert logp.grad[0].tolist() == pytest.approx([-1.65, 0.0])
    assert (m.iw_min, m.iw_max, m.clip_frac_high) == pytest.approx((2.0, 3.0, 0.5))
