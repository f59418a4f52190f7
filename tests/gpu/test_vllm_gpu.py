"""vLLM on a CUDA GPU: colocated sleep/wake around weight sync, and engine/trainer agreement.

Marked `gpu` and `vllm`: run by tests/gpu/run.sh on a machine with a GPU and vLLM installed
(`pip install -e '.[vllm]'`). Not run yet: they wait for a GPU
(docs/development.md, "What is verified where").
"""

from __future__ import annotations

import copy

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_sleep_mode_engine_syncs_and_matches_the_trainer(tool_caller, needle_samples, tmp_path):
    from paravt.agent.loop import AgentConfig, AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.models.forward import TokenIds, trajectory_logprobs
    from paravt.rollout import EngineConfig, SamplingParams, build_engine
    from paravt.video.reader import VideoReader

    model, processor = tool_caller
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    cfg = EngineConfig(
        name="vllm", max_model_len=4096, gpu_memory_utilization=0.3, enable_sleep_mode=True
    )
    engine = build_engine(cfg, model, processor, model_path=str(tmp_path))
    agent = AgentConfig(max_rounds=2, max_new_tokens=160)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), agent)
    params = SamplingParams(temperature=0.7, seed=0)
    loop.run(needle_samples[:2], [4, 4], 2, params)
    # sleeps once, after the step's last round, discarding the weights (level 2), as the
    # DataModule calls it when the next step reloads them (rollout.max_staleness=0)
    engine.end_step(reload_follows=True)
    policy = copy.deepcopy(model).cuda()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    engine.sync_weights(policy, 1)
    trajs = loop.run(needle_samples[:2], [4, 4], 2, params)
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    with torch.no_grad():
        logp, batch, _ = trajectory_logprobs(policy, trajs, ids, 0.7)
    mask = batch.loss_mask.to(logp.device)
    gap = (logp - batch.old_logp.to(logp.device)).abs()[mask].max().item()
    print(f"GPU vLLM (fp32, after sync) vs trainer: max |delta logprob| = {gap:.2e}")
    assert engine.weight_version == 1 and gap < 1e-3
