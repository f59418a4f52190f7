"""The transformers engine's copy of the policy is built at the engine's dtype: a bf16 checkpoint
trained with FSDP2's fp32 master weights gets a bf16 copy (not a second fp32 model per rank)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from paravt.models.loading import PolicySpec, load_policy
from paravt.parallel.fsdp import fp32_master, shard_policy
from paravt.rollout.engine import EngineConfig
from paravt.rollout.factory import engine_copy, engine_dtype


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group: FSDP2 shards over it exactly as over W ranks."""
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def master(tiny_qwen3_dir):
    """The tiny checkpoint loaded in bf16 (model.dtype), then given fp32 master weights."""
    policy, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir), dtype="bfloat16"))
    return fp32_master(policy)


def _assert_bf16_copy_of(copy, reference: dict[str, torch.Tensor]) -> None:
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    # Rotary tables stay fp32, as transformers builds them for a bf16 load.
    assert {b.dtype for n, b in copy.named_buffers() if "inv_freq" in n} == {torch.float32}
    for name, value in copy.state_dict().items():
        assert torch.equal(value, reference[name].to(value.dtype)), name


def test_sharded_fp32_master_policy_gets_a_bf16_engine_copy(one_rank, master):
    want = {k: v.clone() for k, v in master.state_dict().items()}
    assert {p.dtype for p in master.parameters()} == {torch.float32}
    shard_policy(master)
    assert engine_dtype(EngineConfig(), master) == torch.bfloat16  # "auto": the config's dtype
    _assert_bf16_copy_of(engine_copy(master, EngineConfig(sync_bucket_mb=1)), want)


def test_unsharded_copy_follows_the_engine_dtype(master):
    want = {k: v.clone() for k, v in master.state_dict().items()}
    _assert_bf16_copy_of(engine_copy(master, EngineConfig()), want)
    same = engine_copy(master, EngineConfig(dtype="float32"))  # an explicit dtype wins
    assert {p.dtype for p in same.parameters()} == {torch.float32}
