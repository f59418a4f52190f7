"""Every greedy evaluation measures the policy's CURRENT weights, also with an engine that holds
weights of its own (vLLM, or the transformers copy kept for rollout.max_staleness > 0).

The hazard: the run's per-budget report ran `budget_eval` after the cold start but
before the engine was synced, so the "before" table measured the weights from before the cold
start, and the "after" table an engine one update behind. A transformers engine on a copy of
the policy (`share_weights=False`) has exactly vLLM's weight handling, so it shows it on a CPU.
"""

from __future__ import annotations

from functools import partial

import torch

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.models.loading import PolicySpec
from paravt.modules.grpo import GRPOModule
from paravt.rewards.compose import RewardWeights
from paravt.rl.algorithm import AlgorithmConfig
from paravt.rollout.factory import build_engine
from paravt.run.coldstart import ColdStartConfig, cold_start
from paravt.run.report import budget_eval
from paravt.video.reader import VideoReader


def _module_and_agent(tiny_dir):
    module = GRPOModule(
        model=PolicySpec(path=str(tiny_dir)),
        algorithm=AlgorithmConfig(kl_coef=0.0),  # no reference copy: only weights are compared
        reward=RewardWeights(),
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
    )
    # An engine with its own weights, moved only by sync_weights (as vLLM's are).
    engine = build_engine("hf", module.policy, module.processor, share_weights=False)
    cfg = AgentConfig(max_rounds=0, max_new_tokens=4, max_total_tokens=4096)
    agent = AgentLoop(engine, ChatRenderer(module.processor), VideoReader(), cfg)
    return module, agent


def _same_weights(engine, policy) -> bool:
    mine = engine.model.state_dict()
    return all(torch.equal(mine[k], v) for k, v in policy.state_dict().items())


def test_budget_eval_measures_the_current_weights_not_the_engine_s_older_ones(
    tiny_qwen3_dir, needle_samples
):
    module, agent = _module_and_agent(tiny_qwen3_dir)
    with torch.no_grad():  # an update the engine has not seen yet (the last step of training)
        module.policy.lm_head.weight.add_(0.5)
    module.policy_version = 1
    assert not _same_weights(agent.engine, module.policy)
    [result] = budget_eval(module, agent, needle_samples[:1], [2])
    assert result.samples == 1
    assert agent.engine.weight_version == 1
    assert _same_weights(agent.engine, module.policy)


def test_the_cold_start_report_measures_the_cold_started_weights(tiny_qwen3_dir, needle_samples):
    module, agent = _module_and_agent(tiny_qwen3_dir)
    before = module.policy.lm_head.weight.detach().clone()
    cfg = ColdStartConfig(
        steps=1, batch_size=2, frame_budgets=(4,), lr=1e-2, report_frame_budgets=(2,)
    )
    result = cold_start(module, needle_samples[:2], cfg, agent, held_out=needle_samples[2:3])
    assert not torch.equal(before, module.policy.lm_head.weight)  # the cold start trained
    # The "before" table was measured after the engine got the new weights (on the old code the
    # engine still held the pre-cold-start weights here, and was synced only afterwards).
    assert [r.budget for r in result.budget_before] == [2]
    assert _same_weights(agent.engine, module.policy)
    assert len(result.losses) == 1 and result.report_frame_budgets == (2,)
