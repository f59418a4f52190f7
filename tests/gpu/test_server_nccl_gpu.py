"""A rollout server synced over NCCL (`rollout.engine.weight_transfer: nccl`) on a CUDA GPU.

Marked `gpu` and `vllm`: it needs two GPUs and vLLM in the trainer's environment (the server
runs from the same interpreter), which tests/gpu/run.sh's machine lacks (it runs
`gpu and not vllm`); run it on a GPU machine with vLLM:
    pytest -m 'gpu and vllm' tests/gpu/test_server_nccl_gpu.py
Not run yet: it waits for such a machine (docs/development.md, "What is verified where").
One server on GPU 1; the trainer's policy on GPU 0 broadcasts to it (an NCCL group of 2).
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from tests.logprob_gaps import logprob_gaps

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    # NCCL puts no two ranks on one device: the trainer on GPU 0, the server on GPU 1
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]


def test_an_nccl_sync_loads_the_policy_by_the_plan_and_its_logprobs_match(
    tool_caller, needle_samples, tmp_path
):
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rollout import EngineConfig, SamplingParams
    from paravt.rollout.serving.checkpoint import model_manifest
    from paravt.rollout.serving.client import ServerEngine, http_json
    from paravt.rollout.serving.launch import start_server
    from paravt.video.reader import VideoReader

    model, processor = tool_caller
    model.save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    cfg = EngineConfig(
        name="vllm_server",
        dtype="float32",
        max_model_len=4096,
        max_num_seqs=16,
        gpu_memory_utilization=0.3,
        weight_transfer="nccl",
        devices=(1,),
    )
    path, log_dir = str(tmp_path / "model"), str(tmp_path)
    server = start_server(path, cfg, sys.executable, log_dir, devices=cfg.server_gpus(0))
    engine = ServerEngine([server.url], cfg, [server], manifest=model_manifest(model))
    try:
        policy = copy.deepcopy(model).cuda().eval()
        norm = next(
            p for n, p in policy.named_parameters() if n.endswith("language_model.norm.weight")
        )
        with torch.no_grad():
            norm.mul_(1.05)  # every log-prob moves
        engine.sync_weights(policy, version=1)
        assert engine.weight_version == 1 and 0 < engine.last_sync_s < 60
        assert http_json(f"{server.url}/version")[1]["version"] == 1
        loop = AgentLoop(
            engine,
            ChatRenderer(processor),
            VideoReader(),
            AgentConfig(mode="frames", max_rounds=2, max_new_tokens=160),
        )
        params = SamplingParams(temperature=0.7, seed=5)
        trajs = loop.run(needle_samples[:2], [4, 4], 2, params)
        # the new weights explain them, the old ones do not
        assert max(logprob_gaps(policy, processor, trajs, 0.7)) <= 1e-3
        assert max(logprob_gaps(model.cuda(), processor, trajs, 0.7)) > 1e-3
        engine.sync_weights(model, version=2)  # the group is reused: no second rendezvous
        assert http_json(f"{server.url}/version")[1]["version"] == 2
    finally:
        engine.close()
