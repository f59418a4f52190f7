"""GRPOModule built in Python (no Hydra): it takes the Dr.GRPO divisor from the DataModule's
agent as train.py's module does, and refuses a checkpoint that lacks policy weights while
accepting one without the frozen reference (rebuilt from model.path)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import lightning.pytorch as pl
import pytest
import torch

from paravt.agent.loop import AgentConfig
from paravt.models.loading import PolicySpec
from paravt.modules.grpo import GRPOModule
from paravt.modules.rollout_datamodule import RolloutConfig, RolloutDataModule
from paravt.rewards.compose import RewardWeights
from paravt.rl.algorithm import AlgorithmConfig


def _module(tiny_dir, **algorithm) -> GRPOModule:
    return GRPOModule(
        model=PolicySpec(path=str(tiny_dir)),
        algorithm=AlgorithmConfig(**algorithm),
        reward=RewardWeights(),
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
    )


def _fit_setup(module, needle_dir) -> None:
    """Lightning's fit up to its hooks (setup, configure_model, optimisers), no step."""
    agent = AgentConfig(max_rounds=2, max_new_tokens=8, max_total_tokens=4096)
    dm = RolloutDataModule(
        str(needle_dir / "train.jsonl"), batch_size=1, rollout=RolloutConfig(agent=agent)
    )
    trainer = pl.Trainer(
        max_steps=0, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)


def test_the_dr_grpo_divisor_comes_from_the_datamodule_s_agent(tiny_qwen3_dir, needle_dir):
    module = _module(tiny_qwen3_dir, kl_coef=0.0, aggregation="seq_mean_token_sum_norm")
    assert module.loss_fn.config.norm_length is None
    _fit_setup(module, needle_dir)
    # max_new_tokens x (max_rounds + 1): 8 x 3, train.py's divisor for the same agent
    assert module.loss_fn.config == replace(module.algo, norm_length=24)
    configured = _module(tiny_qwen3_dir, kl_coef=0.0, norm_length=100)
    _fit_setup(configured, needle_dir)
    assert configured.loss_fn.config.norm_length == 100


def test_a_checkpoint_without_a_policy_key_fails_and_one_without_the_reference_loads(
    tiny_qwen3_dir, tmp_path
):
    trained = _module(tiny_qwen3_dir, kl_coef=0.1)  # with a frozen reference
    with torch.no_grad():
        trained.policy.lm_head.weight.add_(0.5)
    torch.save({"state_dict": trained.state_dict()}, tmp_path / "last.ckpt")
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"]
    assert not any(k.startswith("reference.") for k in state)  # rebuilt from model.path
    fresh = _module(tiny_qwen3_dir, kl_coef=0.1)
    fresh.load_state_dict(state)  # Lightning's call: strict (strict_loading is True)
    assert fresh.strict_loading
    assert torch.equal(fresh.policy.lm_head.weight, trained.policy.lm_head.weight)
    assert not fresh.reference_in_checkpoint
    del state["policy.lm_head.weight"]
    with pytest.raises(RuntimeError, match=r"1 key\(s\) missing.*policy\.lm_head\.weight"):
        _module(tiny_qwen3_dir, kl_coef=0.1).load_state_dict(state)
    state["policy.no_such.weight"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match=r"1 unexpected.*policy\.no_such\.weight"):
        _module(tiny_qwen3_dir, kl_coef=0.1).load_state_dict(state)
    _module(tiny_qwen3_dir, kl_coef=0.1).load_state_dict(state, strict=False)  # asked for


def test_reward_side_kl_reaches_its_own_rollout_when_packing_reorders(
    tiny_qwen3_dir, needle_samples
):
    """First-fit packing can put a later rollout in an earlier micro-batch ([[0, 2], [1]]): the
    sequence KL must still be subtracted from that rollout's reward, as without packing."""
    from paravt.agent.greedy import greedy_rollouts
    from paravt.agent.loop import AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout.factory import build_engine
    from paravt.video.reader import VideoReader

    module = _module(tiny_qwen3_dir, kl_coef=0.5)
    with torch.no_grad():  # the policy moves away from the reference: a KL to fold
        module.policy.lm_head.weight.add_(0.05 * torch.randn_like(module.policy.lm_head.weight))
    engine = build_engine("hf", module.policy, module.processor, share_weights=True)
    agent = AgentLoop(
        engine, ChatRenderer(module.processor), VideoReader(),
        AgentConfig(max_rounds=0, max_new_tokens=6, max_total_tokens=4096),
    )  # fmt: skip
    run = greedy_rollouts(agent, needle_samples[:3], [8, 8, 2], module.policy)
    trajs = list(run.trajectories)
    lengths = [len(t.token_ids) for t in trajs]
    assert lengths[2] < lengths[0] and lengths[2] < lengths[1]
    rewards = [module.score(t, s) for t, s in zip(trajs, needle_samples[:3], strict=True)]

    def folded(**algo):
        module.algo = replace(module.algo, **algo)
        with module._attention():
            return module._rewards_with_kl(trajs, rewards, 1.0)

    budget = max(lengths[0] + lengths[2], lengths[1])  # 0 and 1 do not fit together; 0 and 2 do
    padded = folded(pack_update=False, micro_batch_tokens=10**6)  # one micro-batch, in order
    packed = folded(pack_update=True, micro_batch_tokens=budget)
    assert module._chunks(trajs) == [[0, 2], [1]]
    totals = torch.tensor([r.total for r in rewards])
    assert (padded - totals).abs().min() > 1e-4  # every rollout has a KL term
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
