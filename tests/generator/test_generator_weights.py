"""Issue 50, finding 8: the async generator on rollout servers (experiment=paragrpo_1p7) keeps no
copy of the policy. Its policy is a skeleton over the shared host tensors the trainer publishes
into, and each server sync reads them in place with the lock held, so a publish cannot change
them half-way through. Real tiny Qwen3-VL, real `SharedWeights`, the generator's own `_build`
in this process, real rollout-server HTTP handlers on loopback whose vLLM is the recording
stand-in of tests/rollout/serving/test_server_nccl.py (a checkpoint sync needs no GPU)."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp

from paravt.agent.loop import AgentConfig
from paravt.agent.tools import CropConfig
from paravt.generator.worker import GeneratorSpec, _build
from paravt.models.loading import PolicySpec, load_policy
from paravt.rollout.engine import EngineConfig
from paravt.rollout.sync.shared_weights import SharedWeights
from paravt.rollout.sync.weight_sync import WeightSync
from tests.rollout.serving.test_server_nccl import _servers


def _spec(path, urls) -> GeneratorSpec:
    engine = EngineConfig(name="vllm_server", server_urls=tuple(urls), dtype="float32")
    # "cuda:0": rank 0's GPU as the trainer hands it over; no CUDA here, so any copy made
    # there (today's `.to(device)`) fails the build
    return GeneratorSpec(
        policy=PolicySpec(path=str(path)),
        engine=engine,
        agent=AgentConfig(),
        crop=CropConfig(),
        cores=(),
        threads=1,
        device="cuda:0",
    )


def _locked(lock) -> bool:
    if lock.acquire(block=False):
        lock.release()
        return False
    return True


def test_a_generator_on_rollout_servers_syncs_from_the_shared_tensors_without_a_copy(
    tiny_qwen3_dir,
):
    policy, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    weights = SharedWeights.create(policy, 0, mp.get_context("spawn"), torch.float32)
    with _servers(tiny_qwen3_dir, 1, mode="checkpoint") as (servers, services):
        llm = services[0].engine.llm
        held: list[bool] = []
        record = llm.collective_rpc

        def collective_rpc(method, kwargs=None):  # in the server's thread, mid-sync
            held.append(_locked(weights._lock))
            loaded = {n: t.clone() for n, t in kwargs["weights_iterator"]}
            record(method, kwargs | {"weights_iterator": loaded})

        llm.collective_rpc = collective_rpc
        model, engine, _ = _build(_spec(tiny_qwen3_dir, servers.urls), weights, "cuda:0")
        try:
            state, shared = model.state_dict(), weights.tensors
            assert state.keys() == shared.keys()
            # every tensor of the generator's policy is the shared one: no copy anywhere
            assert all(state[k].data_ptr() == shared[k].data_ptr() for k in shared)
            assert engine.weight_version == 0 and held == [True]  # the build's first sync

            with torch.no_grad():
                policy.lm_head.weight.add_(0.5)  # an update, published as version 1
            weights.publish(policy, 1)
            assert WeightSync.into_generator(engine, model, weights)
            assert engine.weight_version == 1 and held == [True, True]
            sent = llm.calls[-4][2]["weights_iterator"]  # reload_weights, then 3 resets
            assert torch.equal(sent["lm_head.weight"], policy.lm_head.weight)
            assert not _locked(weights._lock)  # released after the sync
        finally:
            engine.close()


def test_current_holds_the_lock_only_for_an_attached_policy(tiny_qwen3_dir):
    """A policy with weights of its own (the transformers engine's) is loaded and the lock
    released before the block; the attached one is read in place with the lock held."""
    policy, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    weights = SharedWeights.create(policy, 3, mp.get_context("spawn"), torch.float32)
    own, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    with weights.current(own) as version:
        assert version == 3 and not _locked(weights._lock)
    skeleton, _ = load_policy(PolicySpec(path=str(tiny_qwen3_dir)), on_meta=True)
    weights.attach(skeleton)
    with weights.current(skeleton) as version:
        assert version == 3 and _locked(weights._lock)
    assert not _locked(weights._lock)
