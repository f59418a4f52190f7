"""Micro-batching never changes the gradient: every aggregation, every loss variant, any cut."""

from __future__ import annotations

import itertools

import pytest
import torch

from paravt.rewards.structural import structural_anchor_loss, structural_mask
from paravt.rl.losses import AGGREGATIONS, POLICY_LOSSES, get_policy_loss, kl_loss
from paravt.rl.microbatch import (
    max_response_tokens,
    micro_weights,
    split_weights,
    structural_count,
    term_sizes,
)

N, T, V = 6, 7, 11
STRUCT_IDS = (3, 5)
NORM_LENGTH = 16  # the constant Dr.GRPO divisor (a max response length), never T


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (N, T), generator=g)
    mask = (torch.rand(N, T, generator=g) > 0.4).int()
    mask[2] = 0  # an empty row: a rollout with no trained token
    lengths = torch.randint(3, T + 1, (N,), generator=g)
    mask *= (torch.arange(T)[None, :] < lengths[:, None]).int()  # ragged rows, right padding
    formed = torch.rand(N, generator=g) > 0.3
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64)
    behav = old - 0.3 * torch.rand(N, T, generator=g, dtype=torch.float64)
    ref = old - 0.2 * torch.rand(N, T, generator=g, dtype=torch.float64)
    rows = [(ids[i].tolist(), mask[i].tolist(), bool(formed[i])) for i in range(N)]
    return ids, mask, formed, adv, old, behav, ref, rows


def _objective(theta, idx, batch, loss_name, agg, weights=None):
    """The trainer's objective on rows `idx`: policy loss + structural anchor + KL loss, each
    term multiplied by its micro-batch weight (none: the whole batch in one piece)."""
    ids, mask, formed, adv, old, behav, ref, _ = batch
    logp = torch.log_softmax(theta, dim=-1)[idx].gather(-1, ids[idx, :, None])[..., 0]  # [n, T]
    m = mask[idx]
    policy, _ = get_policy_loss(loss_name)(
        logp, old[idx], behav[idx], adv[idx], m, agg=agg, norm_length=NORM_LENGTH
    )
    smask = structural_mask(ids[idx], m, STRUCT_IDS, formed[idx])
    anchor = structural_anchor_loss(logp, smask, coef=0.1)
    kl = kl_loss(logp, ref[idx], m, "k3", coef=0.05)
    if weights is None:
        return policy + anchor + kl
    return weights.policy * policy + weights.anchor * anchor + weights.kl * kl


def _grad(fn) -> torch.Tensor:
    theta = torch.zeros(N, T, V, dtype=torch.float64)
    torch.nn.init.normal_(theta, generator=torch.Generator().manual_seed(1))
    theta.requires_grad_(True)
    fn(theta).backward()
    return theta.grad


def _all_splits(n: int):
    # Every way to cut 0..n-1 into contiguous micro-batches (the trainer's chunks are contiguous).
    for cuts in itertools.product([False, True], repeat=n - 1):
        chunks, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                chunks.append(list(range(start, i)))
                start = i
        chunks.append(list(range(start, n)))
        yield chunks


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES))
def test_accumulated_gradient_equals_the_whole_batch_gradient(agg: str, loss_name: str) -> None:
    batch = _batch(seed=7)
    rows = batch[-1]
    whole = _grad(lambda th: _objective(th, list(range(N)), batch, loss_name, agg))
    for chunks in _all_splits(N):
        plan = split_weights(rows, chunks, STRUCT_IDS, agg)

        def accumulated(th, chunks=chunks, plan=plan):
            parts = [
                _objective(th, c, batch, loss_name, agg, w)
                for c, w in zip(chunks, plan, strict=True)
            ]
            return torch.stack(parts).sum()

        got = _grad(accumulated)
        assert torch.allclose(got, whole, atol=1e-6, rtol=0), (agg, loss_name, chunks)


def test_a_single_token_share_weight_is_wrong_for_sequence_means() -> None:
    # What the trainer did before: every term weighted by the micro-batch's token share. Exact
    # for token-mean, off for a sequence mean as soon as rows have different lengths.
    batch = _batch(seed=7)
    rows, chunks = batch[-1], [[0], [1, 2, 3, 4, 5]]
    agg = "seq_mean_token_mean"
    whole = _grad(lambda th: _objective(th, list(range(N)), batch, "ppo", agg))
    tokens = [sum(sum(rows[i][1]) for i in c) for c in chunks]
    share = [t / sum(tokens) for t in tokens]

    def token_share(th):
        return sum(
            s * _objective(th, c, batch, "ppo", agg) for c, s in zip(chunks, share, strict=True)
        )

    assert not torch.allclose(_grad(token_share), whole, atol=1e-6, rtol=0)


def test_sizes_and_weights_hand_computed() -> None:
    masks = [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    sizes = term_sizes(masks, [2, 0, 1])
    assert (sizes.tokens, sizes.rows, sizes.structural) == (3, 2, 3)
    part = term_sizes(masks[:2], [2, 0])
    # tokens 2/3, non-empty rows 1/2, structural 2/3
    w = micro_weights(part, sizes, "seq_mean_token_sum_norm")
    assert (w.policy, w.kl, w.anchor) == pytest.approx((0.5, 2 / 3, 2 / 3))
    assert micro_weights(part, sizes, "token_mean").policy == pytest.approx(2 / 3)
    none = term_sizes([[0, 0]], [0])
    assert micro_weights(none, none, "token_mean").policy == 0.0
    assert structural_count([3, 5, 4, 3], [1, 1, 1, 0], STRUCT_IDS, True) == 2
    assert structural_count([3, 5], [1, 1], STRUCT_IDS, False) == 0


def test_dr_grpo_divisor_is_the_max_response_length() -> None:
    # 3 tool rounds + the answer turn, 2,048 new tokens each
    assert max_response_tokens(2048, 3) == 8192
    with pytest.raises(ValueError, match="max_new_tokens >= 1"):
        max_response_tokens(0, 3)
