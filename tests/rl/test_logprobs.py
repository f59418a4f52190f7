"""Tests of paravt.rl.logprobs: sampling-distribution mirroring, alignment, chunking."""

from __future__ import annotations

import math

import pytest
import torch

from paravt.rl.logprobs import causal_token_logprobs, shift_for_causal, token_logprobs


def causal_logprobs_loop(logits, ids, temperature=1.0, suppress=()) -> list[list[float]]:
    out = []
    for seq_logits, seq_ids in zip(logits, ids, strict=True):
        row = [0.0]
        for t in range(1, len(seq_ids)):
            z = [v / temperature for v in seq_logits[t - 1]]
            z = [float("-inf") if i in suppress else v for i, v in enumerate(z)]
            top = max(z)
            lse = top + math.log(sum(math.exp(v - top) for v in z))
            row.append(z[seq_ids[t]] - lse)
        out.append(row)
    return out


def test_hand_computed_with_temperature() -> None:
    # logits [0, ln 3]: p(1) = 3 / 4; at temperature 2: [0, ln 3 / 2] -> p(1) = sqrt3 / (1 + sqrt3)
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    target = torch.tensor([[1]])
    assert token_logprobs(logits, target).item() == pytest.approx(math.log(0.75))
    expected = math.log(math.sqrt(3) / (1 + math.sqrt(3)))
    assert token_logprobs(logits, target, temperature=2.0).item() == pytest.approx(expected)


def test_suppression_after_temperature() -> None:
    # logits [1, 2, 5], T = 0.5 -> [2, 4, 10]; suppress id 2 -> [2, 4, -inf]:
    # log p(1) = 4 - ln(e^2 + e^4) = -ln(1 + e^-2) = -0.126928
    logits = torch.tensor([[[1.0, 2.0, 5.0]]])
    got = token_logprobs(logits, torch.tensor([[1]]), temperature=0.5, suppress_ids=[2])
    assert got.item() == pytest.approx(-math.log(1 + math.exp(-2)), abs=1e-6)
    # without suppression the big logit takes the mass: 4 - ln(e^2 + e^4 + e^10) ~ -6.0025
    plain = token_logprobs(logits, torch.tensor([[1]]), temperature=0.5)
    assert plain.item() == pytest.approx(4 - math.log(math.exp(2) + math.exp(4) + math.exp(10)))
    # a suppressed target can never be sampled: -inf, and the caller's logits are untouched
    assert token_logprobs(logits, torch.tensor([[2]]), suppress_ids=[2]).item() == float("-inf")
    assert logits.tolist() == [[[1.0, 2.0, 5.0]]]


def test_matches_log_softmax_values_and_gradients() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11, requires_grad=True)
    targets = torch.randint(0, 9, (2, 6))  # ids 9 and 10 are suppressed, never targets here
    got = token_logprobs(logits, targets, temperature=0.7, suppress_ids=(9, 10), chunk_size=4)
    z = (logits / 0.7).clone()
    z[..., 9:] = float("-inf")
    expected = torch.log_softmax(z, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, expected)
    (g_got,) = torch.autograd.grad(got.sum(), logits)
    (g_exp,) = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(g_got, g_exp)
    assert torch.equal(g_got[..., 9:], torch.zeros(2, 6, 2))


def test_chunking_and_bf16() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 7, 13)
    targets = torch.randint(0, 13, (3, 7))
    full = token_logprobs(logits, targets, chunk_size=1024)
    torch.testing.assert_close(token_logprobs(logits, targets, chunk_size=1), full)
    torch.testing.assert_close(token_logprobs(logits, targets, chunk_size=3), full)
    half = token_logprobs(logits.bfloat16(), targets)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, full, atol=5e-2, rtol=0)


def test_causal_alignment_matches_loop() -> None:
    torch.manual_seed(2)
    logits = torch.randn(2, 5, 6)
    ids = torch.randint(0, 5, (2, 5))
    got = causal_token_logprobs(logits, ids, temperature=0.7, suppress_ids=[5])
    expected = causal_logprobs_loop(logits.tolist(), ids.tolist(), 0.7, {5})
    torch.testing.assert_close(got, torch.tensor(expected))
    assert torch.equal(got[:, 0], torch.zeros(2))


def test_shift_for_causal_and_single_token() -> None:
    logits = torch.arange(12.0).reshape(1, 3, 4)
    ids = torch.tensor([[7, 8, 9]])
    shifted, targets = shift_for_causal(logits, ids)
    # the prediction at position 0 scores token 1, position 1 scores token 2
    assert torch.equal(shifted, logits[:, :2]) and targets.tolist() == [[8, 9]]
    one = causal_token_logprobs(torch.randn(2, 1, 4), torch.tensor([[1], [2]]))
    assert one.tolist() == [[0.0], [0.0]]


def test_validation_errors() -> None:
    logits, targets = torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(logits, targets, temperature=0.0)
    with pytest.raises(ValueError, match=r"suppress_ids \[3\] are outside"):
        token_logprobs(logits, targets, suppress_ids=[0, 3])
    with pytest.raises(ValueError, match="expected logits"):
        token_logprobs(logits, torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(logits, targets, chunk_size=0)
