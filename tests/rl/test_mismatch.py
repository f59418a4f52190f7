"""Truncated importance weights between the trainer's and the engine's log-probs.

The engine's log-probs are the real tiny model's, perturbed as a bf16 engine would disagree
(seeded noise). The corrected loss (the registry's `ppo_engine_is`) must give the on-policy
gradient weighted per token by min(pi_trainer / pi_engine, cap); plain PPO against the perturbed
engine does not.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.rl.algorithm import AlgorithmConfig
from paravt.rl.losses import get_policy_loss
from paravt.rl.mismatch import mismatch_metrics, needs_trainer_logprobs
from paravt.types import Trajectory

CAP = 2.0


def policy_loss(rule: str, cap: float = CAP):
    """The registry's engine-corrected PPO with capping rule `rule` at `cap`."""
    return partial(get_policy_loss("ppo_engine_is"), iw_cap=cap, iw_cap_mode=rule)


@pytest.fixture(scope="module")
def tiny(tiny_qwen3_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    ids = TokenIds.from_tokenizer(AutoProcessor.from_pretrained(tiny_qwen3_dir).tokenizer)
    trajs = []
    for g in range(4):
        tokens = tuple(10 + (11 * g + 17 * i) % 400 for i in range(20))
        trajs.append(Trajectory("p", g, tokens, (0,) * 5 + (1,) * 15, (0.0,) * 20, (), 5))
    return model, ids, trajs


def _grads(model, loss_fn, trajs, ids, engine_logp, prox):
    model.zero_grad(set_to_none=True)
    logp, batch, _ = trajectory_logprobs(model, trajs, ids)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, metrics = loss_fn(logp, prox, engine_logp, adv, batch.loss_mask, 0.2, 0.2)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return grads, metrics


def _trainer_logp(model, trajs, ids):
    with torch.no_grad():
        logp, batch, _ = trajectory_logprobs(model, trajs, ids)
    return logp, batch.loss_mask


@pytest.mark.parametrize("seed", [0, 1])
def test_truncated_weights_give_the_weighted_on_policy_gradient(tiny, seed):
    model, ids, trajs = tiny
    old, mask = _trainer_logp(model, trajs, ids)
    noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(seed)) * 0.8
    engine = torch.where(mask, old + noise, 0.0)  # the engine's (perturbed) log-probs
    got, m = _grads(model, policy_loss("clamp"), trajs, ids, engine, old)
    # Reference: on-policy PPO (ratio 1, no clip) with per-token weights min(e^(old-engine), cap)
    w = torch.exp(old - engine).clamp(max=CAP)

    def weighted(logp, prox, behav, adv, mask, *_):
        per_token = -adv[:, None] * w * torch.exp(logp - prox.detach())
        return (per_token * mask).sum() / mask.sum(), None

    want, _ = _grads(model, weighted, trajs, ids, engine, old)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert m.iw_max > CAP and m.iw_capped_frac > 0  # some weights were truncated
    # Plain PPO anchors its ratio to the perturbed engine: a different (clipped) gradient.
    plain, _ = _grads(model, get_policy_loss("ppo"), trajs, ids, engine, engine)
    assert (plain - want).abs().max() > 1e-3 * want.abs().max()


def test_token_mask_drops_tokens_above_the_cap(tiny):
    model, ids, trajs = tiny
    old, mask = _trainer_logp(model, trajs, ids)
    engine = torch.where(mask, old - 1.0, 0.0)  # every weight e^1 > 2: all masked
    got, m = _grads(model, policy_loss("mask"), trajs, ids, engine, old)
    assert float(got.abs().max()) == 0.0 and m.iw_capped_frac == 1.0


def test_without_mismatch_the_correction_changes_nothing(tiny):
    model, ids, trajs = tiny
    old, mask = _trainer_logp(model, trajs, ids)
    got, _ = _grads(model, policy_loss("clamp"), trajs, ids, old, old)
    want, _ = _grads(model, get_policy_loss("ppo"), trajs, ids, old, old)
    torch.testing.assert_close(got, want)
    metrics = mismatch_metrics(old, old, mask, CAP)
    assert metrics["mismatch/k3_kl"] == 0.0 and metrics["mismatch/iw_above_cap"] == 0.0


def test_mismatch_metrics_measure_the_perturbation(tiny):
    model, ids, trajs = tiny
    old, mask = _trainer_logp(model, trajs, ids)
    engine = torch.where(mask, old + 0.3, 0.0)
    m = mismatch_metrics(old, engine, mask, CAP)
    assert m["mismatch/abs_logprob_diff"] == pytest.approx(0.3, abs=1e-5)
    k3 = (torch.exp(torch.tensor(-0.3)) - 1 + 0.3).item()
    assert m["mismatch/k3_kl"] == pytest.approx(k3, rel=1e-4)


def test_the_entry_uses_the_callers_cap(tiny):
    model, ids, trajs = tiny
    old, mask = _trainer_logp(model, trajs, ids)
    engine = torch.where(mask, old - 1.0, 0.0)  # every weight e^1 = 2.718
    at_two, _ = _grads(model, policy_loss("clamp", 2.0), trajs, ids, engine, old)
    at_three, m = _grads(model, policy_loss("clamp", 3.0), trajs, ids, engine, old)
    # Capped at 2 every weight is 2; at 3 none is capped: the gradient scales by e / 2.
    scale = float(at_two.abs().max())
    torch.testing.assert_close(at_three, at_two * torch.e / 2, rtol=1e-4, atol=1e-5 * scale)
    assert m.iw_capped_frac == 0.0


def test_config_errors_and_wiring():
    assert needs_trainer_logprobs("ppo_engine_is") and needs_trainer_logprobs("decoupled_ppo")
    assert needs_trainer_logprobs("tis") and needs_trainer_logprobs("mis")
    assert not needs_trainer_logprobs("ppo")
    with pytest.raises(ValueError, match="engine_is_correction must be null or one of"):
        AlgorithmConfig(loss="ppo_engine_is", engine_is_correction="sequence_truncate")
    with pytest.raises(ValueError, match="engine_is_cap must be >= 1"):
        AlgorithmConfig(loss="ppo_engine_is", engine_is_cap=0.5)
    # The correction beside plain PPO used to turn it silently into another loss.
    with pytest.raises(ValueError, match=r"fix: algorithm\.loss=ppo_engine_is"):
        AlgorithmConfig(loss="ppo", engine_is_correction="token_truncate")
