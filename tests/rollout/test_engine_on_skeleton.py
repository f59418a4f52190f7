"""FSDP2 order: Lightning runs the DataModule's `setup` (which connects the engine) before the
module's `configure_model` fills the meta-device policy. With `rollout.max_staleness >= 1` the
transformers engine must still end up with the filled weights, and an engine left on the
skeleton must say so rather than copy into meta tensors or crash inside `generate`."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from paravt.agent.loop import AgentConfig
from paravt.models.loading import PolicySpec, load_policy
from paravt.modules.rollout_datamodule import RolloutConfig, RolloutDataModule
from paravt.parallel.fsdp import fp32_master, materialize_sharded, shard_policy
from paravt.rollout.engine import GenerationRequest, SamplingParams
from paravt.rollout.engines.hf import TransformersEngine

GREEDY = SamplingParams(max_new_tokens=4, greedy=True)


class Skeleton:
    """The `RolloutPolicy` Protocol over a meta-device policy, as `GRPOModule(init_on_meta=True)`
    holds it until `configure_model`."""

    def __init__(self, spec: PolicySpec):
        self.spec = spec
        self.policy, self.processor = load_policy(spec, on_meta=True)
        self.policy_version = 0
        self.model_path = spec.path

    def configure_model(self) -> None:
        """What `paravt.parallel.fsdp.configure_sharding` does, over a one-rank group."""
        shard_policy(fp32_master(self.policy))
        materialize_sharded(self.policy, self.spec, "cpu")


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _request(processor) -> GenerationRequest:
    return GenerationRequest(tuple(processor.tokenizer("Where is the needle?").input_ids))


def test_a_lagging_engine_connected_before_configure_model_gets_the_filled_weights(
    one_rank, tiny_qwen3_dir, needle_dir
):
    spec = PolicySpec(path=str(tiny_qwen3_dir))
    module = Skeleton(spec)
    agent = AgentConfig(max_rounds=1, max_new_tokens=4, max_total_tokens=4096)
    cfg = RolloutConfig(group_size=2, max_staleness=1, agent=agent)
    dm = RolloutDataModule(str(needle_dir / "train.jsonl"), batch_size=2, max_steps=1, rollout=cfg)
    dm.setup("fit")
    dm.connect(module)  # Lightning's setup: the policy is still a skeleton
    module.configure_model()
    dm.connect(module)  # what generation and held-out evaluation call first
    engine = dm.engine
    assert engine.model is not module.policy  # the lagging engine's own copy...
    reference, _ = load_policy(spec)
    for name, value in engine.model.state_dict().items():  # ...holding the checkpoint's weights
        assert torch.equal(value, reference.state_dict()[name]), name
    ((out,),) = engine.generate([_request(module.processor)], GREEDY)
    assert len(out.token_ids) >= 1 and all(lp <= 0 for lp in out.logprobs)


def test_an_engine_on_a_skeleton_refuses_to_sync_or_generate(tiny_qwen3_dir):
    skeleton, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir)), on_meta=True)
    policy, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    engine = TransformersEngine(skeleton, processor.tokenizer)
    with pytest.raises(RuntimeError, match="meta-device skeleton"):
        engine.sync_weights(policy, 1)
    with pytest.raises(RuntimeError, match="meta-device skeleton"):
        engine.generate([_request(processor)], GREEDY)
