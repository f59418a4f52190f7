"""Cold start pieces: schedule, the SFT stage it trains through, per-budget table."""

from __future__ import annotations

import pytest
import torch

from paravt.run.coldstart import ColdStartConfig, cold_start, interleave, lr_factor
from paravt.run.report import BudgetResult, before_after_table, gain_line, pooled


def test_lr_factor_warms_up_then_decays_to_the_floor():
    cfg = ColdStartConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(99, cfg) == pytest.approx(0.1, abs=1e-3)
    assert lr_factor(55, cfg) < lr_factor(30, cfg)
    assert lr_factor(50, ColdStartConfig(steps=100)) == 1.0  # defaults: constant


def test_interleave_spreads_the_replayed_share_evenly():
    # a quarter of 8 items from the replay: 6 teacher items, 2 replayed, one per half
    assert interleave("abcdef", "XY", 0.25) == ["X", "a", "b", "c", "Y", "d", "e", "f"]
    # a half: 4 replayed among 4, alternating, the short replay cycled
    assert interleave("abcd", "X", 0.5) == ["X", "a", "X", "b", "X", "c", "X", "d"]
    assert interleave("abc", "XY", 0.0) == ["a", "b", "c"]


def test_prior_replay_needs_a_prior_and_a_share_below_one():
    with pytest.raises(ValueError, match=r"prior_replay must be in \[0, 1\)"):
        ColdStartConfig(prior_replay=1.0)
    cfg = ColdStartConfig(prior_replay=0.4)
    with pytest.raises(ValueError, match=r"cold_start\.prior_replay=0"):
        cold_start(None, [], cfg, None)


def test_before_after_table_pools_budgets_and_states_the_standard_error():
    before = [BudgetResult(4, 50, 0.4, 1.0, 2.0), BudgetResult(8, 50, 0.6, 1.0, 2.0)]
    after = [BudgetResult(4, 50, 0.8, 1.0, 2.0), BudgetResult(8, 50, 0.8, 0.9, 1.0)]
    assert pooled(before).accuracy == pytest.approx(0.5)
    assert pooled(before).stderr == pytest.approx((0.25 / 100) ** 0.5)
    lines = before_after_table({"before": before, "after": after})
    assert len(lines) == 4  # header, K=4, K=8, all
    assert lines[-1].split()[0] == "all"
    assert "0.500 (0.050, n=100)" in lines[-1] and "0.800 (0.040, n=100)" in lines[-1]
    # +30 points; se sqrt(0.05^2 + 0.04^2) = 0.064
    assert gain_line(before, after) == (
        "held-out accuracy, all budgets: 0.500 -> 0.800 (+30.0 points, se 6.4; n=100)"
    )


def test_train_vision_trains_a_frozen_tower_in_the_cold_start_only(tiny_qwen3_dir, needle_samples):
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.models.loading import PolicySpec, load_policy, vision_tower
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.run.coldstart import fit, sft_stage, sft_trainable, teacher_trajectories
    from paravt.video.reader import VideoReader

    model, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir), freeze_vision=True))
    engine = ScriptedEngine(processor.tokenizer, lambda context: "unused")
    agent = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=1))
    cfg = ColdStartConfig(steps=1, batch_size=2, frame_budgets=(4,), lr=1e-2)
    trajs = teacher_trajectories(agent, needle_samples[:2], cfg)
    tower = vision_tower(model)
    before = [p.detach().clone() for p in tower.parameters()]
    with sft_trainable(model, True):
        assert all(p.requires_grad for p in tower.parameters())
        fit(sft_stage(model, processor, cfg), trajs, cfg)
    assert not any(p.requires_grad for p in tower.parameters())  # frozen again for RL
    assert any(not torch.equal(a, p) for a, p in zip(before, tower.parameters(), strict=True))
    with sft_trainable(model, False):  # off: the flags are left alone
        assert not any(p.requires_grad for p in tower.parameters())


@pytest.mark.parametrize("full_weights", [True, False])
def test_a_lora_policy_cold_starts_with_full_weights_unless_told_otherwise(
    tiny_qwen3_dir, needle_samples, full_weights
):
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.models.loading import PolicySpec, load_policy
    from paravt.models.lora import lora_layers
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.run.coldstart import fit, sft_stage, sft_trainable, teacher_trajectories
    from paravt.video.reader import VideoReader

    spec = PolicySpec(path=str(tiny_qwen3_dir), freeze_vision=True, lora={"rank": 4})
    model, processor = load_policy(spec)
    engine = ScriptedEngine(processor.tokenizer, lambda context: "unused")
    agent = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=1))
    cfg = ColdStartConfig(
        steps=1, batch_size=2, frame_budgets=(4,), lr=1e-2, full_weights=full_weights
    )
    trajs = teacher_trajectories(agent, needle_samples[:2], cfg)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    for layer in lora_layers(model).values():  # B = 0 would give A no gradient
        torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.02)
    with sft_trainable(model, False, cfg.full_weights):
        fit(sft_stage(model, processor, cfg), trajs, cfg)
    changed = {n for n, p in model.named_parameters() if n in base and not torch.equal(base[n], p)}
    language = {n for n in changed if ".language_model." in n}
    assert bool(language) == full_weights  # the base language weights trained only when asked
    assert not {n for n in changed if ".visual." in n}  # the tower was not asked for
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags  # RL: adapters only
