"""docs/reuse.md's own tool, defined outside paravt, runs as written: in the agent loop on a real
mp4 (its text result worked out by hand), and in `train.py` from the doc's YAML file."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader

ROOT = Path(__file__).resolve().parents[2]


def block(marker: str) -> str:
    text = (ROOT / "docs" / "reuse.md").read_text()
    start = text.index("\n", text.index("```", text.index(f"<!-- {marker} -->"))) + 1
    return text[start : text.index("```", start)]


@pytest.fixture
def user_folder(tmp_path, monkeypatch) -> Path:
    """The doc's my_tools.py and my_conf/tools/brightness.yaml in a folder outside the repo."""
    code = block("toolbox-example")
    assert 25 <= len(code.splitlines()) <= 40  # "a complete tool of about 30 lines"
    (tmp_path / "my_tools.py").write_text(code)
    (tmp_path / "my_conf" / "tools").mkdir(parents=True)
    (tmp_path / "my_conf" / "tools" / "brightness.yaml").write_text(block("toolbox-yaml"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_tools", None)


def test_the_doc_tool_runs_in_the_agent_loop(
    user_folder, tiny_qwen3_dir, needle_samples, grey_video
):
    node = OmegaConf.load(user_folder / "my_conf" / "tools" / "brightness.yaml")
    tools = [instantiate(t) for t in node.rollout.toolbox]
    call = '<tool_call>{"name": "brightness", "arguments": %s}</tool_call>'
    calls = "".join(
        call % args
        for args in (
            '{"start_time": 1}',
            '{"start_time": 0, "end_time": 3}',
            '{"start_time": 5, "end_time": 2}',
            '{"start_time": 0, "end_time": 1}',
        )
    )

    def respond(context: str) -> str:
        return "x</think>\n" + calls if "<tool_response>" not in context else "<answer>A</answer>"

    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    engine = ScriptedEngine(processor.tokenizer, respond)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(), tools=tools)
    sample = replace(needle_samples[0], video=grey_video)
    (traj,) = loop.run([sample], [4], 1, SamplingParams(greedy=True, max_new_tokens=64))
    missing, ok, empty, capped = traj.turns[0].results
    assert missing.error == "tool call 1: brightness: missing required argument 'end_time'"
    # grey video: 2 fps, frame i grey 5*i; seconds 0, 1, 2 -> frames 0, 2, 4 -> 0, 10, 20
    # (the mp4's YUV round trip reads 10 and 20 as 9 and 18)
    values = [int(part.split(": ")[1]) for part in ok.text.split(", ")]
    assert ok.text.startswith("0s: ") and values == pytest.approx([0, 10, 20], abs=2)
    assert empty.error == "empty window [5, 2] in a 20 s video"  # its ToolError, as written
    # two calls were admitted (a call refused by the schema is not counted): the cap of 2
    assert capped.error == (
        "tool call 4: brightness call ignored: at most 2 brightness calls per turn"
    )
    assert '"name": "brightness"' in processor.tokenizer.decode(list(traj.token_ids))


@pytest.mark.slow
def test_train_and_evaluate_use_the_doc_tool_from_the_yaml_file(
    user_folder, train_py, tiny_run_overrides, tiny_qwen3_dir, needle_dir
):
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{user_folder}"}
    out = train_py(
        "--config-dir",
        str(user_folder / "my_conf"),
        "+tools=brightness",
        *tiny_run_overrides,
        "trainer.max_steps=1",
        "cold_start=null",
        "rollout.agent.max_new_tokens=8",
        "rollout.agent.max_rounds=1",
        "callbacks.benchmark_validation=null",
        f"hydra.run.dir={user_folder / 'run'}",
        cwd=user_folder,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "agent tools: crop_video, brightness" in out.stdout + out.stderr
    evaluated = train_py(
        "--config-dir",
        str(user_folder / "my_conf"),
        "+tools=brightness",
        f"model.path={tiny_qwen3_dir}",
        "model.build_tiny=null",
        f"benchmark.annotations={needle_dir / 'eval.jsonl'}",
        f"out_dir={user_folder / 'eval'}",
        f"hydra.run.dir={user_folder / 'eval_hydra'}",
        "device=cpu",
        "limit=1",
        "protocol.frame_budget=4",
        "rollout.agent.max_rounds=1",
        "rollout.agent.max_new_tokens=8",
        script="evaluate.py",
        cwd=user_folder,
        env=env,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "agent tools: crop_video, brightness" in evaluated.stdout + evaluated.stderr
