"""The toolbox in the agent loop: the default renders the paper's tokens, another list its own
prompt, mixed results in one turn, and the built-in `zoom` tool on a real mp4."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import av
import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import AutoProcessor

from paravt.agent import prompts
from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.parsing import parse_tool_calls
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.agent.toolkit import build_toolbox, tool, toolbox_system
from paravt.agent.tools import CropConfig, CropVideoTool, ParallelToolExecutor
from paravt.agent.zoom import ZoomTool
from paravt.rollout.consistency import VisionSpec, check_trajectory
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader

ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(greedy=True, max_new_tokens=200)
# sha256[:16] of json.dumps(token ids) of `scripted_run` on main at 34298f4, before toolboxes
# existed (tiny Qwen3-VL vocabulary, needle train sample 0, budget 4): the default toolbox must
# render these tokens exactly, prompt, crops, error text and forced answer included.
BEFORE = {None: ("e1726fc383b0a698", 904), "compact": ("34caba6f24dcb830", 579)}
TURN = "look</think>\n" + call_text(4.0, 9.0) + call_text(2.0, 6.5)


@tool("duration", "The video's length in seconds.", {"type": "object", "properties": {}})
def duration(args, video):
    return f"{video.info().duration:.1f} s"


@pytest.fixture(scope="module")
def processor(tiny_qwen3_dir):
    return AutoProcessor.from_pretrained(tiny_qwen3_dir)


def scripted_run(processor, sample, turn, system=None, tools=None):
    def respond(context: str) -> str:
        return turn if "<tool_response>" not in context else "done</think>\n<answer>A</answer>"

    engine = ScriptedEngine(processor.tokenizer, respond)
    cfg = AgentConfig(system=system)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg, tools=tools)
    (traj,) = loop.run([sample], [4], 1, GREEDY)
    return traj


def digest(traj) -> tuple[str, int]:
    ids = list(traj.token_ids)
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16], len(ids)


@pytest.mark.parametrize("system", [None, "compact"])
def test_the_default_toolbox_renders_the_tokens_of_before(processor, needle_samples, system):
    node = OmegaConf.load(ROOT / "conf" / "rollout" / "default.yaml").toolbox
    configured = [instantiate(t) for t in node]
    assert [type(t) for t in configured] == [CropVideoTool]
    turn = TURN + '<tool_call>{"name": "zoom"}</tool_call>'  # unknown by default: an error
    traj = scripted_run(processor, needle_samples[0], turn, system, configured)
    assert digest(traj) == BEFORE[system]
    assert "known tools: crop_video" in traj.turns[0].results[2].error


def test_another_toolbox_lists_every_schema_as_the_chat_template_renders_tools():
    box = build_toolbox([CropVideoTool(), ZoomTool(), duration()])
    text = toolbox_system(None, box)
    assert text.startswith(prompts.TOOLS_INTRO + "\n\n# Tools\n\n")
    for item in box.values():
        assert "\n" + json.dumps(item.schema) + "\n" in text
    assert text.endswith('{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    compact = toolbox_system("compact", box)
    examples = [
        json.loads(b) for b in compact.split("<tool_call>")[1:] for b in [b[: b.index("<")]]
    ]
    assert [e["name"] for e in examples] == ["crop_video", "zoom", "duration"]
    assert examples[1]["arguments"]["bbox_2d"] == [0, 0, 1000, 1000]
    # the default list keeps `rollout.agent.system` as is (prompts.main_messages resolves it)
    assert toolbox_system("compact", build_toolbox([CropVideoTool()])) == "compact"


def test_one_turn_mixes_a_clip_a_zoom_and_a_text_and_renders_them(processor, needle_samples):
    zoom = '{"start_time": 4, "end_time": 6, "bbox_2d": [0, 0, 500, 500]}'
    turn = (
        "look</think>\n"
        + call_text(4.0, 9.0)
        + f'<tool_call>{{"name": "zoom", "arguments": {zoom}}}</tool_call>'
        + '<tool_call>{"name": "duration", "arguments": {}}</tool_call>'
    )
    tools = [CropVideoTool(), ZoomTool(max_pixels=4096), duration()]
    traj = scripted_run(processor, needle_samples[0], turn, tools=tools)
    crop, zoomed, text = traj.turns[0].results
    assert crop.ok and zoomed.ok and text.ok, traj.turns[0].results
    # zoom: 2 s at 1 fps -> 2 frames, a quarter of the frame filled up to <= 4096 px (64x64).
    assert zoomed.window == (4.0, 6.0) and zoomed.frames.pixels.shape == (2, 64, 64, 3)
    assert len(traj.visuals) == 3  # overview, crop, zoom; the text adds no clip
    rendered = processor.tokenizer.decode(list(traj.token_ids))
    # the needle video's 2 s window at 1 fps: the centres of two 1 s bins
    assert "zoom 4.0s-6.0s, frames at 4.5s, 5.5s:" in rendered
    assert "<tool_response>\n64.0 s\n</tool_response>" in rendered  # a 64 s needle video
    assert traj.num_tool_responses == 3
    # the rollout guard finds each clip (overview, crop, zoom) and skips the text result
    spec = VisionSpec.from_processor(processor)
    assert check_trajectory(traj, spec, decode=processor.tokenizer.decode) == []


def write_marked_video(path: Path) -> str:
    """4 s at 1 fps, 64x128 (h x w), black with a white 8x8 square at rows 8-15, cols 96-103."""
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=1)
        stream.width, stream.height, stream.pix_fmt = 128, 64, "yuv420p"
        stream.options = {"crf": "0", "preset": "ultrafast"}
        for _ in range(4):
            pixels = np.zeros((64, 128, 3), dtype=np.uint8)
            pixels[8:16, 96:104] = 255
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return str(path)


def zoom_results(video: str, tool: ZoomTool, *args: str):
    text = "".join(f'<tool_call>{{"name": "zoom", "arguments": {a}}}</tool_call>' for a in args)
    calls = parse_tool_calls(text, known_tools=["zoom"])
    with ParallelToolExecutor(build_toolbox([tool]), VideoReader(), CropConfig()) as ex:
        return ex.run_turn(calls, video)


def test_zoom_cuts_the_box_in_each_models_convention(tmp_path):
    video = write_marked_video(tmp_path / "mark.mp4")
    # The square spans x 96-104 of 128 (750-812 of 1000), y 8-16 of 64 (125-250 of 1000).
    relative = '{"start_time": 0, "end_time": 2, "bbox_2d": [750, 125, 812, 250]}'
    (res,) = zoom_results(video, ZoomTool(max_pixels=4096), relative)
    assert res.ok and res.frames.pixels.mean() > 200  # the square fills the zoomed frames
    # Absolute: the overview at 50176 px keeps 64x128 (under the cap, multiples of 32).
    absolute = '{"start_time": 0, "end_time": 2, "bbox_2d": [96, 8, 104, 16]}'
    (res,) = zoom_results(video, ZoomTool("absolute", max_pixels=4096), absolute)
    assert res.ok and res.frames.pixels.mean() > 200
    # an 8x8 box, upscaled on the 32 grid into [4096 / 2, 4096] px: 64x64
    assert res.frames.pixels.shape[1:3] == (64, 64)
    # A box elsewhere shows black; a box past the frame is clamped to it.
    (dark,) = zoom_results(
        video, ZoomTool(), '{"start_time": 0, "end_time": 2, "bbox_2d": [0, 500, 400, 1000]}'
    )
    assert dark.ok and dark.frames.pixels.mean() < 20


def test_zoom_refuses_an_empty_box_or_window_with_a_text(tmp_path):
    video = write_marked_video(tmp_path / "mark.mp4")
    empty, late, short, clamp = zoom_results(
        video,
        ZoomTool(),
        '{"start_time": 0, "end_time": 2, "bbox_2d": [500, 500, 500, 900]}',
        '{"start_time": 9, "end_time": 12, "bbox_2d": [0, 0, 10, 10]}',
        '{"start_time": 0, "end_time": 2, "bbox_2d": [1, 2, 3]}',
        '{"start_time": -3, "end_time": 99, "bbox_2d": [-50, 0, 2000, 1000]}',
    )
    assert (
        empty.error == "empty box [500, 500, 500, 900]: need x1 < x2 and y1 < y2 inside the frame"
    )
    assert late.error == "start_time 9 s is beyond the video's duration of 4 s"
    assert short.error == "bbox_2d must be 4 numbers [x1, y1, x2, y2], got [1, 2, 3]"
    # clamped to [0, 4] s and the whole frame: 4 frames at 1 fps, capped to zoom's max of 4
    assert clamp.ok and clamp.window == (0.0, 4.0) and len(clamp.frames.indices) == 4


def test_a_trained_toolbox_is_recorded_for_evaluate_and_names_its_out_dir():
    from evaluate import toolbox_identity
    from paravt.eval.trained_protocol import protocol_of_training

    rollout = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "rollout" / "default.yaml"))
    default = protocol_of_training({"rollout": rollout})["settings"]
    assert "rollout.toolbox" not in default  # the default's record is as before
    assert toolbox_identity(OmegaConf.create({"rollout": rollout})) == {}  # out_dirs resume
    zoomed = [*rollout["toolbox"], {"_target_": "paravt.agent.zoom.ZoomTool"}]
    rollout["toolbox"] = zoomed
    assert protocol_of_training({"rollout": rollout})["settings"]["rollout.toolbox"] == zoomed
    assert toolbox_identity(OmegaConf.create({"rollout": rollout})) == {"toolbox": zoomed}


def test_subagent_mode_summarises_every_tool_that_returns_frames(processor, needle_samples):
    zoom = '{"start_time": 4, "end_time": 6, "bbox_2d": [0, 0, 500, 500]}'
    turn = (
        "look</think>\n"
        + f'<tool_call>{{"name": "zoom", "arguments": {zoom}}}</tool_call>'
        + '<tool_call>{"name": "duration", "arguments": {}}</tool_call>'
    )

    def respond(context: str) -> str:
        if prompts.SUBAGENT_SYSTEM in context:
            return "a red square"
        return turn if "<tool_response>" not in context else "done</think>\n<answer>A</answer>"

    engine = ScriptedEngine(processor.tokenizer, respond)
    tools = [ZoomTool(max_pixels=4096), duration()]
    loop = AgentLoop(
        engine, ChatRenderer(processor), VideoReader(), AgentConfig(mode="subagent"), tools=tools
    )
    (traj,) = loop.run(needle_samples[:1], [4], 1, GREEDY)
    zoomed, text = traj.turns[0].results
    assert zoomed.summary == "a red square" and text.summary is None  # a text needs no summary
    assert len(traj.sub_trajectories) == 1 and len(traj.visuals) == 1  # the overview only
    rendered = processor.tokenizer.decode(list(traj.token_ids))
    assert "zoom 4.0s-6.0s: a red square" in rendered and "64.0 s" in rendered
