"""The gateway-vs-agent-loop check the engine tests share: an agent program (the mimic) played
through the gateway on an engine gives `AgentLoop`'s rollouts on that engine, token for token,
mask, vision inputs and log-probs, and the trainer's log-probs match them as the engine's do."""

from __future__ import annotations

import numpy as np
import torch

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.prompts import FORCED_THINK
from paravt.agent.render import ChatRenderer
from paravt.gateway.app import Gateway
from paravt.gateway.batcher import Batcher
from paravt.gateway.episode import EpisodeRenderer
from paravt.gateway.media import MediaConfig
from paravt.gateway.rollouts import GatewayRollouts
from paravt.rollout.engine import SamplingParams
from paravt.video.reader import VideoReader
from tests.gateway.mimic import http_program
from tests.logprob_gaps import logprob_gaps

MAX_NEW_TOKENS = 160


def both_ways(engine, processor, samples, budgets, group_size: int, params: SamplingParams):
    """(through the gateway, by `AgentLoop`): B x G rollouts of `samples` on `engine`."""
    cfg = AgentConfig(mode="frames", max_rounds=2, max_new_tokens=MAX_NEW_TOKENS)
    renderer = ChatRenderer(processor)
    theirs = AgentLoop(engine, renderer, VideoReader(), cfg).run(
        samples, budgets, group_size, params
    )
    media = MediaConfig(root="/", factor=renderer.frame_factor)
    episodes = EpisodeRenderer(renderer, VideoReader(), media, prefix=FORCED_THINK)
    gateway = Gateway(episodes, Batcher(engine), max_new_tokens=MAX_NEW_TOKENS)
    rollouts = GatewayRollouts(gateway, http_program, VideoReader(), workers=8)
    rollouts.max_new_tokens = MAX_NEW_TOKENS
    with rollouts:
        ours = rollouts.run(samples, budgets, group_size, params)
    assert not ours.video_errors and rollouts.forks == 0, (dict(ours.video_errors), rollouts.forks)
    return list(ours), list(theirs)


def assert_parity(ours, theirs, policy, processor, temperature: float) -> None:
    """Same tokens, masks, vision inputs and (within 1e-5) log-probs; the trainer's
    teacher-forced log-probs within 1e-4 of the gateway's rollouts' (as the engine tests ask)."""
    assert any(len(t.turns) >= 2 and len(t.turns[0].results) >= 2 for t in theirs)  # crops
    for a, b in zip(ours, theirs, strict=True):
        assert (a.sample_id, a.group_index) == (b.sample_id, b.group_index)
        assert a.token_ids == b.token_ids, f"{a.sample_id}#{a.group_index}: tokens differ"
        assert a.loss_mask == b.loss_mask and a.prompt_length == b.prompt_length
        assert np.allclose(a.logprobs, b.logprobs, atol=1e-5)
        assert len(a.visuals) == len(b.visuals) == 1 + b.num_tool_responses
        for x, y in zip(a.visuals, b.visuals, strict=True):
            assert torch.equal(x.pixel_values_videos, y.pixel_values_videos)
            assert torch.equal(x.video_grid_thw, y.video_grid_thw)
            assert x.frames.timestamps == y.frames.timestamps
    gap = max(logprob_gaps(policy, processor, ours, temperature))
    print(f"gateway rollouts vs teacher-forced at T={temperature}: max |delta| = {gap:.2e}")
    assert gap <= 1e-4
