"""PARAGRPOLoss, the objective as one object: hand-computed values, masks, refusals, and its
knobs: AlgorithmConfig's, with the recipe's defaults."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from paravt.rl.algorithm import AlgorithmConfig
from paravt.rl.losses import NEEDS_PROXIMAL, POLICY_LOSSES
from paravt.rl.microbatch import MicroWeights
from paravt.rl.objective import AdvantageConfig
from paravt.rl.paragrpo_loss import LOSS_KNOBS, PARAGRPOLoss, policy_loss_entry

ROOT = Path(__file__).resolve().parents[2]


def _inputs():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    return logp, logp.detach().clone(), torch.tensor([2.0])


def test_the_loss_is_the_clipped_surrogate_plus_the_anchor_by_hand():
    logp, old, adv = _inputs()
    loss_fn = PARAGRPOLoss()
    # On-policy (ratio 1), token mean over the two trained tokens: -mean(A) = -2.
    loss = loss_fn(logp, old, adv, torch.tensor([[1, 1, 0]]))
    assert float(loss.detach()) == pytest.approx(-2.0)
    assert loss_fn.metrics["loss/num_tokens"] == 2.0 and "loss/anchor" not in loss_fn.metrics
    # Anchor at position 0: -0.1 x logp = +0.1; a per-call coefficient replaces it.
    struct = torch.tensor([[True, False, False]])
    anchored = loss_fn(logp, old, adv, torch.tensor([[1, 1, 0]]), structural_mask=struct)
    assert float(anchored.detach()) == pytest.approx(-1.9)
    half = loss_fn(
        logp, old, adv, torch.tensor([[1, 1, 0]]), structural_mask=struct, anchor_coef=0.5
    )
    assert float(half.detach()) == pytest.approx(-1.5) and loss_fn.metrics[
        "loss/anchor"
    ] == pytest.approx(0.5)
    half.backward()
    # d/dlogp: -A x ratio / 2 tokens = -1 at the trained ones, -0.5 more from the anchor.
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.5, -1.0, 0.0]]))


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
def test_a_float_01_mask_equals_a_bool_mask_in_every_loss(loss):
    logp, old, adv = _inputs()
    loss_fn = PARAGRPOLoss(loss=loss, kl_in_reward=False, kl_estimator="k3")
    kw = {"ref_logprobs": old - 0.5}
    if loss in NEEDS_PROXIMAL:
        kw["behaviour_logprobs"] = old - 0.1
    a = loss_fn(logp, old, adv, torch.tensor([[1.0, 1.0, 0.0]]), **kw)
    b = loss_fn(logp, old, adv, torch.tensor([[True, True, False]]), **kw)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="must be bool or hold only 0 and 1"):
        loss_fn(logp, old, adv, torch.tensor([[0.5, 1.0, 0.0]]), **kw)


def test_the_three_terms_are_summed_at_the_micro_batch_weights():
    logp, old, adv = _inputs()
    mask = torch.tensor([[True, True, False]])
    structural = torch.tensor([[True, False, False]])
    reference = torch.tensor([[-1.5, -2.0, -3.0]])
    loss_fn = PARAGRPOLoss(kl_coef=0.01, kl_estimator="k2", kl_in_reward=False, anchor_coef=0.1)
    weights = MicroWeights(policy=0.5, kl=2.0, anchor=1.0)
    total = loss_fn(
        logp, old, adv, mask, structural_mask=structural, ref_logprobs=reference, weights=weights
    )
    # Policy (ratio 1, token mean): -mean(A) = -2. Anchor: -0.1 x mean(logp at struct) = 0.1.
    # KL k2 loss: 0.01 x mean(0.5 (logp - ref)^2 over trained) = 0.01 x (0.125 + 0) / 2
    # = 0.000625. Total: 0.5 x -2 + 0.1 + 2.0 x 0.000625 = -0.89875.
    assert float(total.detach()) == pytest.approx(-0.89875, abs=1e-6)
    metrics = loss_fn.metrics
    assert metrics["loss/anchor"] == pytest.approx(0.1, abs=1e-6)
    assert metrics["loss/kl"] == pytest.approx(0.000625, abs=1e-7)
    assert metrics["loss/logprob_gap"] == 0.0
    # Without a structural mask or a reference, those terms are left out; a zero coefficient
    # leaves the anchor out too.
    assert float(loss_fn(logp, old, adv, mask).detach()) == pytest.approx(-2.0)
    assert "loss/anchor" not in loss_fn.metrics and "loss/kl" not in loss_fn.metrics
    loss_fn(logp, old, adv, mask, structural_mask=structural, anchor_coef=0.0)
    assert "loss/anchor" not in loss_fn.metrics


def test_refusals_name_the_fix():
    logp, old, adv = _inputs()
    mask = torch.ones(1, 3)
    with pytest.raises(ValueError, match="pass behaviour_logprobs"):
        PARAGRPOLoss(loss="ppo_engine_is")(logp, old, adv, mask)
    # Plain PPO used to take behaviour_logprobs and ignore them.
    with pytest.raises(ValueError, match=r"behaviour_logprobs would be ignored.*decoupled_ppo"):
        PARAGRPOLoss(loss="ppo")(logp, old, adv, mask, behaviour_logprobs=old - 1.0)
    # The recipe folds the KL into the reward: a reference here would be a second KL.
    with pytest.raises(ValueError, match=r"kl_in_reward=True.*kl_in_reward=False"):
        PARAGRPOLoss()(logp, old, adv, mask, ref_logprobs=old)
    with pytest.raises(ValueError, match=r"'grpo' is the advantage estimator.*'ppo'"):
        PARAGRPOLoss(loss="grpo")
    with pytest.raises(ValueError, match=r"k1.*only adds noise.*fix: algorithm\.kl_estimator=k3"):
        PARAGRPOLoss(kl_estimator="k1", kl_in_reward=False)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        PARAGRPOLoss(aggregation="mean")
    with pytest.raises(TypeError, match=r"unknown knob\(s\) \['ppo_epochs'\]"):
        PARAGRPOLoss(ppo_epochs=2)  # the trainer's schedule, not the loss's
    with pytest.raises(TypeError, match=r"by keyword: PARAGRPOLoss\(loss='ppo'\)"):
        PARAGRPOLoss("decoupled_ppo")
    with pytest.raises(ValueError, match=r"loss=tis is its own correction"):
        PARAGRPOLoss(loss="tis", engine_is_correction="mis")


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"clip_low": 1.0}, r"algorithm\.clip_low must be in \[0, 1\), got 1\.0"),
        ({"clip_low": float("nan")}, r"algorithm\.clip_low"),
        ({"clip_high": -0.1}, r"algorithm\.clip_high must be a finite number >= 0"),
        ({"iw_cap": 0.5}, r"algorithm\.iw_cap must be a finite number >= 1 or null"),
        ({"kl_coef": -0.01}, r"algorithm\.kl_coef"),
        ({"anchor_coef": float("inf")}, r"algorithm\.anchor_coef"),
        ({"ppo_epochs": 0}, r"algorithm\.ppo_epochs must be an integer >= 1"),
        ({"micro_batch_tokens": 0}, r"algorithm\.micro_batch_tokens"),
        ({"norm_length": 0}, r"algorithm\.norm_length"),
        ({"max_grad_norm": -1.0}, r"algorithm\.max_grad_norm"),
    ],
)
def test_numbers_no_update_can_use_are_refused_on_construction(knobs, named):
    """Before, a clip range or cap was refused at the first step's loss, and a negative KL or
    anchor coefficient, or zero PPO epochs, was never refused."""
    with pytest.raises(ValueError, match=named):
        AlgorithmConfig(**knobs)
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'"):
        AdvantageConfig(estimator="ppo")  # before, at the first step's advantages


def test_the_knobs_and_their_defaults_are_the_reference_recipe():
    conf = OmegaConf.load(ROOT / "conf" / "algorithm" / "paragrpo.yaml")
    from_yaml = instantiate(conf, _convert_="all")
    assert type(from_yaml) is AlgorithmConfig
    plain = {k: getattr(from_yaml, k) for k in from_yaml.__dataclass_fields__}
    plain["anchor_tags"] = tuple(plain["anchor_tags"])
    assert plain == {k: getattr(AlgorithmConfig(), k) for k in plain}
    # One set of defaults: the lifted loss and the advantages default to the recipe too.
    assert PARAGRPOLoss().config == AlgorithmConfig()
    assert AdvantageConfig() == AlgorithmConfig().advantage == from_yaml.advantage
    assert set(LOSS_KNOBS) < set(AlgorithmConfig.__dataclass_fields__)
    lifted = PARAGRPOLoss(from_yaml, clip_high=0.28)  # a config, with knobs changed
    assert lifted.config == replace(from_yaml, clip_high=0.28)


def test_each_config_runs_its_registry_entry_with_its_own_weights():
    def entry(**knobs):
        return policy_loss_entry(AlgorithmConfig(**knobs))

    # Each loss reads its own cap; the rule defaults to the loss's own.
    assert entry() == ("ppo", {})
    assert entry(loss="ppo_engine_is") == ("ppo_engine_is", {"iw_cap": 2.0, "iw_cap_mode": "clamp"})
    rule = entry(loss="ppo_engine_is", engine_is_correction="token_mask")
    assert rule == ("ppo_engine_is", {"iw_cap": 2.0, "iw_cap_mode": "mask"})
    assert entry(loss="decoupled_ppo") == ("decoupled_ppo", {"iw_cap": 5.0, "iw_cap_mode": "mask"})
    # tis / mis are registry entries, named as the loss or as the correction beside one.
    seq = {"iw_cap": 3.0, "level": "sequence"}
    knobs = {"engine_is_cap": 3.0, "engine_is_level": "sequence"}
    assert entry(loss="mis", **knobs) == ("mis", seq)
    assert entry(loss="ppo_engine_is", engine_is_correction="mis", **knobs) == ("mis", seq)
    assert entry(loss="decoupled_ppo", engine_is_correction="tis", **knobs) == ("tis", seq)
    assert PARAGRPOLoss(loss="tis").policy_loss is POLICY_LOSSES["tis"]
