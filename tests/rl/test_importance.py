"""TIS / MIS engine weights at token and sequence level, and the loss they give, by hand.

Row 0: trainer log-probs log .5 on 3 tokens, engine log .5, log .25, log .05, so the token
ratios rho = pi_trainer / pi_engine are 1, 2, 10 and their geometric mean 20^(1/3) = 2.714.
Row 1: on-policy (rho = 1) on 2 tokens. Advantage 1 everywhere and pi_theta = pi_old, so each
kept token's PPO term is -w and the token-mean loss is -(sum of w) / (kept tokens).
"""

from __future__ import annotations

import math

import pytest
import torch

from paravt.rl.algorithm import AlgorithmConfig
from paravt.rl.importance import engine_weights, gap_metrics, gap_sums
from paravt.rl.losses import tis_loss
from paravt.rl.paragrpo_loss import PARAGRPOLoss

L = math.log
TRAINER = torch.tensor([[L(0.5)] * 3, [L(0.3), L(0.3), 0.0]])
ENGINE = torch.tensor([[L(0.5), L(0.25), L(0.05)], [L(0.3), L(0.3), 0.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
ADV = torch.ones(2)
GEO = 20 ** (1 / 3)


def loss(mode: str, level: str, cap: float) -> tuple[float, float]:
    """The lifted loss as the recipe spells the correction, and as the registry entry `mode`."""
    knobs = {"engine_is_cap": cap, "engine_is_level": level}
    beside = PARAGRPOLoss(loss="ppo_engine_is", engine_is_correction=mode, **knobs)
    named = PARAGRPOLoss(loss=mode, **knobs)
    out = beside(TRAINER.clone(), TRAINER, ADV, MASK, behaviour_logprobs=ENGINE)
    assert float(named(TRAINER.clone(), TRAINER, ADV, MASK, behaviour_logprobs=ENGINE)) == float(
        out
    )
    return float(out), beside.metrics["loss/iw_capped_frac"]


@pytest.mark.parametrize(
    ("mode", "level", "cap", "expected", "frac"),
    [
        # w = 1, 2, min(10, 4) = 4 | 1, 1: -(1 + 2 + 4 + 1 + 1) / 5; 1 of 5 tokens clipped
        ("tis", "token", 4.0, -9 / 5, 1 / 5),
        # 10 is outside [1/4, 4]: masked, leaves the denominator: -(1 + 2 + 1 + 1) / 4
        ("mis", "token", 4.0, -5 / 4, 1 / 5),
        # one weight 2.714 for row 0's 3 tokens (below the cap): -(3 * 2.714 + 2) / 5
        ("tis", "sequence", 4.0, -(3 * GEO + 2) / 5, 0.0),
        # cap 2: min(2.714, 2) = 2 on row 0: -(3 * 2 + 2) / 5; 3 tokens clipped
        ("tis", "sequence", 2.0, -8 / 5, 3 / 5),
        # cap 2: row 0 (2.714 > 2) leaves the loss whole; row 1 alone: -(1 + 1) / 2
        ("mis", "sequence", 2.0, -1.0, 3 / 5),
        ("mis", "sequence", 4.0, -(3 * GEO + 2) / 5, 0.0),
    ],
)
def test_corrected_loss_matches_the_hand_computation(mode, level, cap, expected, frac):
    got, got_frac = loss(mode, level, cap)
    assert got == pytest.approx(expected, rel=1e-5)
    assert got_frac == pytest.approx(frac)


def test_mis_masks_ratios_below_the_lower_bound_too():
    # rho = 0.1 is below 1/c = 0.25: masked like 10 is above c.
    w = engine_weights(ENGINE, TRAINER, MASK, "mis", "token", 4.0)
    assert w.mask.tolist() == [[True, True, False], [True, True, False]]
    assert w.weights[0].tolist() == pytest.approx([1.0, 0.5, 0.0])


def test_the_loss_gradient_is_weighted_by_the_detached_weights():
    logp = TRAINER.clone().requires_grad_(True)
    out, _ = tis_loss(logp, TRAINER, ENGINE, ADV, MASK, iw_cap=4.0, level="token")
    out.backward()
    # d(-w r / 5)/d logp = -w / 5 at r = 1
    assert logp.grad[0].tolist() == pytest.approx([-0.2, -0.4, -0.8])


def test_gap_metrics_take_the_max_and_the_mean_k3():
    parts = [gap_sums(TRAINER, ENGINE, MASK)]
    # |log rho| = 0, log 2, log 10; k3 = rho - 1 - log rho = 0, 1 - log 2, 9 - log 10, 0, 0
    k3 = (1 - L(2) + 9 - L(10)) / 5
    assert gap_metrics(parts) == pytest.approx(
        {"mismatch/logprob_abs_max": L(10), "mismatch/k3": k3}
    )
    assert gap_metrics([]) == {}


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="engine_is_level"):
        AlgorithmConfig(
            loss="ppo_engine_is", engine_is_correction="mis", engine_is_level="geometric"
        )
    with pytest.raises(ValueError, match="engine_is_level"):
        AlgorithmConfig(loss="tis", engine_is_level="geometric")
    with pytest.raises(ValueError, match="engine_is_correction"):
        AlgorithmConfig(loss="ppo_engine_is", engine_is_correction="masked")


def test_an_engine_left_on_old_weights_shows_in_the_gap(tiny_qwen3_dir, needle_samples):
    # A transformers engine on its own copy of the policy samples; the trainer then takes an
    # update the engine never receives (a sync that did not reach it, as a stale cache would).
    import copy

    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.models.forward import TokenIds, trajectory_logprobs
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.hf import TransformersEngine
    from paravt.video.reader import VideoReader

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    trainer = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)
    engine = TransformersEngine(copy.deepcopy(trainer), processor.tokenizer)
    loop = AgentLoop(
        engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=0, max_new_tokens=6)
    )
    params = SamplingParams(temperature=1.0, seed=0, max_new_tokens=6)
    ids = TokenIds.from_tokenizer(processor.tokenizer)

    def gap():
        trajs = list(loop.run(needle_samples[:1], [4], 2, params))
        with torch.no_grad():
            logp, batch, _ = trajectory_logprobs(trainer, trajs, ids)
        return gap_metrics([gap_sums(logp, batch.old_logp, batch.loss_mask)])

    synced = gap()
    with torch.no_grad():
        trainer.lm_head.weight.mul_(1.5)  # the update
    stale = gap()
    engine.sync_weights(trainer, 1)
    resynced = gap()
    assert synced["mismatch/logprob_abs_max"] < 1e-4
    assert stale["mismatch/logprob_abs_max"] > 0.1 and stale["mismatch/k3"] > 1e-3
    assert resynced["mismatch/logprob_abs_max"] < 1e-4


def two_version_trajectory():
    """Prompt (2 tokens), a turn sampled under version 0 (log-probs log .5, log .25), a tool
    response (1 token), a turn resumed under version 1 after a weight sync (log .4, log .8)."""
    from paravt.types import Trajectory

    return Trajectory(
        sample_id="s",
        group_index=0,
        token_ids=(1, 2, 3, 4, 5, 6, 7),
        loss_mask=(0, 0, 1, 1, 0, 1, 1),
        logprobs=(0.0, 0.0, L(0.5), L(0.25), 0.0, L(0.4), L(0.8)),
        visuals=(),
        prompt_length=2,
        versions=(0, 0, 0, 0, 1, 1, 1),
    )


def test_a_trajectory_sampled_under_two_versions_is_corrected_segment_by_segment():
    from paravt.models.forward import pad_trajectories
    from paravt.rl.losses import decoupled_ppo_loss

    batch = pad_trajectories([two_version_trajectory()], pad_id=0)
    # The trainer (version 2) gives the sampled tokens .5, .5 | .4, .4 (by hand).
    prox = torch.tensor([[0.0, 0.0, L(0.5), L(0.5), 0.0, L(0.4), L(0.4)]])
    # Behaviour weights pi_prox / pi_behav, each token against the version that sampled it:
    # segment 0: .5/.5 = 1, .5/.25 = 2; segment 1: .4/.4 = 1, .4/.8 = .5.
    # pi_theta = pi_prox and A = 1: token-mean loss -(1 + 2 + 1 + .5) / 4 = -1.125.
    got, metrics = decoupled_ppo_loss(prox.clone(), prox, batch.old_logp, ADV[:1], batch.loss_mask)
    assert float(got) == pytest.approx(-1.125, rel=1e-6)
    assert (metrics.iw_min, metrics.iw_max) == pytest.approx((0.5, 2.0))
    # Engine-IS at token level weighs the same tokens the same way (cap 4: nothing clipped).
    w = engine_weights(prox, batch.old_logp, batch.loss_mask, "tis", "token", 4.0)
    assert w.weights[0, [2, 3, 5, 6]].tolist() == pytest.approx([1.0, 2.0, 1.0, 0.5])


def test_partial_rollouts_refuse_a_whole_trajectory_ratio():
    from paravt.generator.async_rollouts import check_partial

    check_partial(
        AlgorithmConfig(loss="ppo_engine_is", engine_is_correction="tis", engine_is_level="token")
    )
    with pytest.raises(ValueError, match="engine_is_level=token"):
        check_partial(
            AlgorithmConfig(
                loss="ppo_engine_is", engine_is_correction="mis", engine_is_level="sequence"
            )
        )
    with pytest.raises(ValueError, match="engine_is_level=token"):  # tis named as the loss
        check_partial(AlgorithmConfig(loss="tis", engine_is_level="sequence"))
