"""The RolloutDataModule generates: PromptBatch -> RolloutBatch with the module's weights."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.agent.loop import AgentConfig
from paravt.data.prompt_datamodule import PromptBatch
from paravt.modules.rollout_datamodule import RolloutConfig, RolloutDataModule
from paravt.rollout import EngineConfig, build_engine
from paravt.rollout.engines.hf import TransformersEngine
from paravt.rollout.records import RolloutBatch


class Policy:
    """The `RolloutPolicy` Protocol, without Lightning."""

    def __init__(self, path):
        self.policy = AutoModelForImageTextToText.from_pretrained(path)
        self.processor = AutoProcessor.from_pretrained(path)
        self.policy_version = 0
        self.model_path = str(path)


@pytest.fixture(scope="module")
def policy(tiny_qwen3_dir):
    return Policy(tiny_qwen3_dir)


def _datamodule(needle_dir, **rollout) -> RolloutDataModule:
    agent = AgentConfig(max_rounds=1, max_new_tokens=8, max_total_tokens=4096)
    cfg = RolloutConfig(group_size=2, frame_budget=4, agent=agent, **rollout)
    dm = RolloutDataModule(str(needle_dir / "train.jsonl"), batch_size=2, max_steps=2, rollout=cfg)
    dm.setup("fit")
    return dm


def test_a_prompt_batch_becomes_grouped_rollouts(policy, needle_dir):
    dm = _datamodule(needle_dir)
    dm.set_budget_sampler(lambda prompt_id, epoch: 8 if prompt_id.endswith("0") else 4)
    prompts = next(iter(dm.train_dataloader()))
    assert isinstance(prompts, PromptBatch)
    batch = dm.generate_rollouts(prompts, policy)
    assert isinstance(batch, RolloutBatch) and len(batch.trajectories) == 4  # B x G
    assert [t.sample_id for t in batch.trajectories] == [s.id for s in batch.repeated_samples()]
    assert batch.budgets == tuple(8 if s.id.endswith("0") else 4 for s in prompts.samples)
    assert [t.frame_budget for t in batch.trajectories[::2]] == list(batch.budgets)
    assert (batch.weight_version, batch.staleness, batch.temperature) == (0, 0, 0.7)
    assert dm.consumed == 1 and batch.step == 0
    assert {"sync", "rollout", "rollout_generate"} <= set(batch.timings)
    # Staleness 0 with the transformers engine: it samples with the policy module itself.
    assert isinstance(dm.engine, TransformersEngine) and dm.engine.model is policy.policy


def test_the_engine_is_synced_only_past_max_staleness(policy, needle_dir):
    policy = copy.copy(policy)  # its own policy_version; the shared fixture stays at 0
    dm = _datamodule(needle_dir, max_staleness=1)
    dm.connect(policy)
    assert dm.engine.model is not policy.policy  # its own copy, moved only by sync_weights
    name, engine_param = next(iter(dm.engine.model.named_parameters()))
    with torch.no_grad():
        engine_param.zero_()  # a marker only a real weight sync overwrites
    policy_param = dict(policy.policy.named_parameters())[name]
    assert policy_param.abs().sum() > 0
    policy.policy_version = 1
    assert isinstance(dm.sync(policy, 1), float)  # lag 1 = max_staleness: no sync
    assert dm.engine.weight_version == 0 and engine_param.abs().sum() == 0
    policy.policy_version = 2
    dm.sync(policy, 1)
    synced = dict(dm.engine.model.named_parameters())[name]
    assert dm.engine.weight_version == 2 and torch.equal(synced, policy_param)


def test_a_module_without_the_policy_protocol_is_named(needle_dir):
    with pytest.raises(TypeError, match="object lacks policy / processor / policy_version"):
        _datamodule(needle_dir).connect(object())


def test_an_unknown_engine_is_named(policy):
    with pytest.raises(
        ValueError, match=r"'sglang' is unknown: choose one of \['hf', 'vllm', 'vllm_server'\]"
    ):
        build_engine(EngineConfig(name="sglang"), policy.policy, policy.processor)
    with pytest.raises(ValueError, match=r"'sglang' is unknown"):
        RolloutConfig(engine=EngineConfig(name="sglang"))  # at config time, before any engine
    assert isinstance(build_engine("hf", policy.policy, policy.processor), TransformersEngine)


def test_partial_rollouts_are_refused_outside_async_mode():
    with pytest.raises(ValueError, match=r"set rollout\.mode=async"):
        RolloutConfig(partial=True)
    assert RolloutConfig(mode="async", max_staleness=1, partial=True).partial


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"partial": True}, r"mode='stream', which resumes them by itself"),
        ({"max_concurrent": 4}, r"max_concurrent=4 cannot hold one group of .*group_size=8"),
        ({"on_sync": "wait"}, r"rollout\.on_sync must be one of \('continue', 'drain'\)"),
        ({"agent_program": "m:f"}, r"each episode whole: set rollout\.mode=async or sync"),
    ],
)
def test_stream_mode_refuses_what_cannot_work_at_config_time(keys, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(mode="stream", **keys)
    assert RolloutConfig(mode="stream", max_staleness=2).max_concurrent == 64
