"""Train/serve consistency: an SFT row written from an agent-loop trajectory encodes to the
loop's exact token ids, loss mask and clips, in both tool-response modes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig
from paravt.agent.render import ChatRenderer
from paravt.agent.tools import CropConfig
from paravt.data.sft_encode import SFTEncoder
from paravt.data.sft_schema import parse_row
from paravt.data.sft_writer import teacher_rows, trajectory_row
from paravt.video.reader import VideoReader


@pytest.fixture(scope="module")
def processor(tiny_qwen3_dir):
    return AutoProcessor.from_pretrained(tiny_qwen3_dir)


def _loop_trajectories(processor, samples, mode):
    from paravt.agent.loop import AgentLoop
    from paravt.agent.scripts import needle_teacher
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine

    renderer = ChatRenderer(processor)
    crop = CropConfig(factor=renderer.frame_factor)
    agent = AgentConfig(max_rounds=2, mode=mode)
    engine = ScriptedEngine(processor.tokenizer, needle_teacher(samples, "search"))
    loop = AgentLoop(engine, renderer, VideoReader(), agent, crop)
    trajs = loop.run(samples, [4, 8][: len(samples)], 1, SamplingParams(greedy=True))
    return renderer, agent, crop, trajs


@pytest.mark.parametrize("mode", ["frames", "subagent"])
def test_sft_row_encodes_to_the_loop_trajectory(processor, needle_samples, mode):
    samples = needle_samples[:2]
    renderer, agent, crop, trajs = _loop_trajectories(processor, samples, mode)
    source = VideoReader()
    encoder = SFTEncoder(renderer, source)
    for sample, traj in zip(samples, trajs, strict=True):
        assert traj.num_valid_calls >= 1 and traj.num_tool_responses >= 1
        row = trajectory_row(sample, traj, source, agent, crop)
        example = encoder.encode(parse_row(row))
        got = example.trajectory
        assert got.token_ids == traj.token_ids
        assert got.loss_mask == traj.loss_mask
        assert got.prompt_length == traj.prompt_length
        assert len(got.visuals) == len(traj.visuals)
        for a, b in zip(got.visuals, traj.visuals, strict=True):
            assert torch.equal(a.video_grid_thw, b.video_grid_thw)
            assert torch.equal(a.pixel_values_videos, b.pixel_values_videos)
        # The answer tokens are trained tokens holding exactly the answer's text.
        flagged = [t for t, f in zip(got.token_ids, example.answer_mask, strict=True) if f]
        assert flagged and all(
            m for m, f in zip(got.loss_mask, example.answer_mask, strict=True) if f
        )
        assert processor.tokenizer.decode(flagged) == sample.answer


def test_frames_mode_rows_carry_crops_as_video_parts(processor, needle_samples):
    rows = teacher_rows(needle_samples[:1], processor, AgentConfig(max_rounds=2))
    tools = [m for m in rows[0]["messages"] if m["role"] == "tool"]
    assert tools and all(
        any(p["type"] == "video_url" and p["frame_indices"] for p in m["content"]) for m in tools
    )
