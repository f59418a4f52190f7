"""The cold start's teacher tracing shows counts and an ETA: one progress line
per traced batch when not on a terminal, on the real agent loop with real crops."""

from __future__ import annotations

import logging

from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.run import coldstart
from paravt.video.reader import VideoReader


def test_teacher_tracing_reports_progress_per_batch(
    tiny_qwen3_dir, needle_samples, monkeypatch, caplog
):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    idle = ScriptedEngine(processor.tokenizer, lambda context: "")  # the loop's own engine
    agent = AgentLoop(idle, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=2))
    monkeypatch.setattr(coldstart, "TRACE_BATCH", 2)  # 4 prompts -> 2 batches, 2 ticks
    with caplog.at_level(logging.INFO, logger="paravt.progress"):
        trajs = coldstart.teacher_trajectories(
            agent, needle_samples, coldstart.ColdStartConfig(frame_budgets=(4,))
        )
    assert [t.sample_id for t in trajs] == [s.id for s in needle_samples]
    assert all(t.num_valid_calls >= 1 for t in trajs)  # real teacher turns with real crops
    lines = [r.getMessage() for r in caplog.records if r.name == "paravt.progress"]
    desc = "cold start: teacher trajectories (train) for 4 prompts, batch"
    assert [line.split(" | ")[0] for line in lines] == [f"{desc} 1/2", f"{desc} 2/2"]
    assert all(("s/it" in line or "it/s" in line) and "ETA" in line for line in lines), lines
