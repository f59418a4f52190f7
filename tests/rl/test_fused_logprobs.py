"""The chunked lm_head log-prob/entropy Function equals the unchunked autograd path (values and
gradients of hidden states and weight), with and without entropy, temperature and suppression."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from paravt.rl.fused_logprobs import linear_logprobs
from paravt.rl.logprobs import token_logprobs
from paravt.rl.losses import entropy_from_logits


def _reference(hidden, weight, targets, temp, sup, bias=None):
    logits = F.linear(hidden, weight, bias)
    logp = token_logprobs(logits, targets, temp, sup)
    z = logits.float() / temp
    if sup:
        z = z.index_fill(-1, torch.tensor(sup), float("-inf"))
    return logp, entropy_from_logits(z)


def _leaves(seed, n=3, t=37, h=16, v=101, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, t, h, generator=g, dtype=torch.float64).float().requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n, t), generator=g)
    return hidden, weight, b, targets, g


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("seed,temp,chunk", [(0, 1.0, 5), (1, 0.7, 1), (2, 1.3, 1000)])
def test_values_and_gradients_equal_unchunked(seed, temp, chunk, with_entropy) -> None:
    hidden, weight, bias, targets, g = _leaves(seed, bias=seed == 1)
    sup = [3, 50, 99]
    targets[targets == 50] = 51  # no suppressed target here: their -inf is tested below
    mask = torch.rand(targets.shape, generator=g) > 0.3
    w_logp = torch.randn(targets.shape, generator=g)
    w_ent = torch.randn(targets.shape, generator=g)

    def objective(logp, ent):
        out = torch.where(mask, logp * w_logp, 0.0).sum()
        return out + (torch.where(mask, ent * w_ent, 0.0).sum() if with_entropy else 0.0)

    leaves = [x for x in (hidden, weight, bias) if x is not None]
    ref_logp, ref_ent = _reference(hidden, weight, targets, temp, sup, bias)
    ref_grads = torch.autograd.grad(objective(ref_logp, ref_ent), leaves)
    logp, ent = linear_logprobs(hidden, weight, targets, temp, sup, chunk, with_entropy, bias)
    assert (ent is not None) == with_entropy
    grads = torch.autograd.grad(objective(logp, ent), leaves)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    if with_entropy:
        torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert all(gr.abs().sum() > 0 for gr in grads)


def test_suppressed_target_is_minus_inf_and_gets_no_gradient() -> None:
    hidden, weight, _, targets, _ = _leaves(3, n=1, t=6)
    targets[0, 2] = 7
    logp, ent = linear_logprobs(hidden, weight, targets, 1.0, [7], 4, True)
    assert logp[0, 2] == float("-inf") and torch.isfinite(ent).all()
    mask = torch.ones_like(targets, dtype=torch.bool)
    mask[0, 2] = False
    torch.where(mask, logp, 0.0).sum().backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()
    assert weight.grad[7].abs().sum() == 0  # a suppressed row of the lm_head never learns


def test_bf16_hidden_matches_bf16_lm_head_then_float() -> None:
    hidden, weight, _, targets, _ = _leaves(5)
    hb, wb = hidden.detach().bfloat16(), weight.detach().bfloat16()
    logp, _ = linear_logprobs(hb, wb, targets, 1.0, (), 7)
    torch.testing.assert_close(logp, token_logprobs(F.linear(hb, wb), targets), rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": 0.0}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"suppress_ids": [101]}, "outside the vocabulary"),
    ],
)
def test_bad_arguments_are_named(kwargs, match) -> None:
    hidden, weight, _, targets, _ = _leaves(6, n=1, t=4)
    with pytest.raises(ValueError, match=match):
        linear_logprobs(hidden, weight, targets, **kwargs)
    with pytest.raises(ValueError, match="hidden size"):
        linear_logprobs(hidden, weight[:, :3], targets)
