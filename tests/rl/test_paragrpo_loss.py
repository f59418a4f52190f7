"""PARAGRPOLoss, the objective as one object: hand-computed values, masks, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from paravt.rl.algorithm import AlgorithmConfig
from paravt.rl.losses import POLICY_LOSSES
from paravt.rl.objective import LossSettings
from paravt.rl.paragrpo_loss import PARAGRPOLoss

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
    behaviour = old - 0.1
    loss_fn = PARAGRPOLoss(loss=loss)
    kw = {"behaviour_logprobs": behaviour, "ref_logprobs": old - 0.5}
    a = loss_fn(logp, old, adv, torch.tensor([[1.0, 1.0, 0.0]]), **kw)
    b = loss_fn(logp, old, adv, torch.tensor([[True, True, False]]), **kw)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="must be bool or hold only 0 and 1"):
        loss_fn(logp, old, adv, torch.tensor([[0.5, 1.0, 0.0]]), **kw)


def test_refusals_name_the_fix():
    logp, old, adv = _inputs()
    with pytest.raises(ValueError, match="pass behaviour_logprobs"):
        PARAGRPOLoss(loss="ppo_engine_is")(logp, old, adv, torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"'grpo' is the advantage estimator.*'ppo'"):
        PARAGRPOLoss(loss="grpo")
    with pytest.raises(ValueError, match=r"k1.*only adds noise"):
        PARAGRPOLoss(kl_estimator="k1")
    with pytest.raises(ValueError, match=r"fix: algorithm\.kl_estimator=k3"):
        AlgorithmConfig(kl_in_reward=False, kl_estimator="k1")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        LossSettings(aggregation="mean")


def test_algorithm_config_defaults_are_the_reference_recipe():
    conf = OmegaConf.load(ROOT / "conf" / "algorithm" / "paragrpo.yaml")
    from_yaml = instantiate(conf, _convert_="all")
    assert type(from_yaml) is AlgorithmConfig
    plain = {k: getattr(from_yaml, k) for k in from_yaml.__dataclass_fields__}
    plain["anchor_tags"] = tuple(plain["anchor_tags"])
    assert plain == {k: getattr(AlgorithmConfig(), k) for k in plain}
