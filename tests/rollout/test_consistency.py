"""The rollout/trainer consistency check on real trajectories of the tiny Qwen3-VL.

A scripted assistant crops two windows of a real needle mp4 in parallel, then answers; the
trajectory's tokens and clips come from the real processor. Each test injects one mismatch the
trainer would otherwise score silently and reads the message; clean runs report none.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.data.packing import model_rope_index
from paravt.rollout.consistency import (
    ConsistencyError,
    VisionSpec,
    apply_policy,
    check_trajectory,
    placeholder_runs,
)
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.hf import TransformersEngine
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader

GREEDY = SamplingParams(greedy=True, max_new_tokens=200)
TURN = "look</think>\n" + call_text(2.0, 6.5) + call_text(20, 30)


@pytest.fixture(scope="module")
def tiny(tiny_qwen3_dir):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_dir)
    return model, processor


@pytest.fixture(scope="module")
def traj(tiny, needle_samples):
    _, processor = tiny

    def respond(context: str) -> str:
        return TURN if "<tool_response>" not in context else "done</think>\n<answer>A</answer>"

    engine = ScriptedEngine(processor.tokenizer, respond)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig())
    (out,) = loop.run(needle_samples[:1], [4], 1, GREEDY)
    # Overview + two crops: 2 s-6.5 s (4 frames) and 20 s-30 s (10 frames).
    assert len(out.visuals) == 3 and out.num_tool_responses == 2
    return out


def check(tiny, traj, **kwargs):
    model, processor = tiny
    spec = VisionSpec.from_processor(processor)
    decode = processor.tokenizer.decode
    return check_trajectory(traj, spec, model_rope_index(model), decode, **kwargs)


def test_a_clean_scripted_trajectory_has_no_mismatch(tiny, traj):
    assert check(tiny, traj) == []


def test_a_dropped_tool_image_names_its_turn_and_result(tiny, traj):
    dropped = replace(traj, visuals=traj.visuals[:1] + traj.visuals[2:])
    found = check(tiny, dropped)
    name = f"{traj.sample_id}#0"
    assert str(found[0]) == (
        f"trajectory {name}, turn 1, tool result 0: clips: no vision inputs "
        "(2 visual inputs for 3 clips)"
    )
    # The tokens of the dropped crop are left over: 2 runs of 4 placeholders.
    assert any(m.kind == "placeholders" and "8 video placeholder" in m.detail for m in found)


def test_an_extra_placeholder_token_names_the_clip_and_counts(tiny, traj):
    video = VisionSpec.from_processor(tiny[1]).video_id
    ids = torch.tensor(traj.token_ids)
    start, _ = placeholder_runs(ids, video)[4]  # first run of the second crop (turn 1, #1)
    at = start + 1
    grown = replace(
        traj,
        token_ids=(*traj.token_ids[:at], video, *traj.token_ids[at:]),
        loss_mask=(*traj.loss_mask[:at], 0, *traj.loss_mask[at:]),
        logprobs=(*traj.logprobs[:at], 0.0, *traj.logprobs[at:]),
    )
    (found,) = check(tiny, grown)
    assert (found.turn, found.result, found.kind) == (1, 1, "placeholders")
    # 10 frames -> 5 temporal patches of 4x4 / 2^2 = 4 tokens each; the first run has 5.
    assert "21 video placeholder tokens in 5 run(s) [5, 4, 4, 4, 4]" in found.detail
    assert "fill 20 in [4, 4, 4, 4, 4]" in found.detail


def test_a_shifted_position_id_of_the_engine_is_caught(tiny, traj):
    model, processor = tiny
    spec = VisionSpec.from_processor(processor)
    rope = model_rope_index(model)
    ids = torch.tensor([traj.token_ids])
    types = (ids == spec.video_id).long() * 2
    grid = torch.cat([v.video_grid_thw for v in traj.visuals])
    # The positions an engine would report for its context of assistant turn 2 (it ends where
    # the second sampled turn starts); one position id off by one, as after a bad truncation.
    second = next(i for i in range(len(traj.loss_mask) - 1, 0, -1) if traj.loss_mask[i - 1] == 0)
    first = traj.loss_mask.index(1)
    full = rope(ids, types, grid, None)[:, 0]
    engine = full[:, :second].clone()
    engine[:, 100] += 1
    (found,) = check(tiny, traj, engine_positions=[full[:, :first], engine])
    assert (found.turn, found.kind) == (0, "positions")
    assert "M-RoPE position of token 100" in found.detail
    assert "engine's context of assistant turn 2" in found.detail


def test_a_wrong_timestamp_label_is_caught(tiny, traj):
    tok = tiny[1].tokenizer
    right = tok("<21.0 seconds>", add_special_tokens=False)["input_ids"]
    wrong = tok("<41.0 seconds>", add_special_tokens=False)["input_ids"]
    assert len(right) == len(wrong)
    ids = list(traj.token_ids)
    at = next(i for i in range(len(ids)) if ids[i : i + len(right)] == right)
    ids[at : at + len(right)] = wrong
    (found,) = check(tiny, replace(traj, token_ids=tuple(ids)))
    assert (found.turn, found.result, found.kind) == (1, 1, "timestamps")
    assert found.detail == (
        "the model is told 41 s for frames at 21.00 s (patch 0), requested window 20-30 s"
    )


def test_crop_frames_outside_the_requested_window_are_caught(tiny, traj):
    first = traj.turns[0]
    moved = replace(first.results[1], window=(40.0, 50.0))
    turns = (replace(first, results=(first.results[0], moved)), *traj.turns[1:])
    (found,) = check(tiny, replace(traj, turns=turns))
    assert found.detail == "frames at 20.5-29.5 s are outside the requested window 40-50 s"


def test_error_raises_and_warn_drops_from_the_loss(tiny, traj):
    bad = replace(traj, visuals=traj.visuals[:2])
    found = [check(tiny, traj), check(tiny, bad)]
    with pytest.raises(ConsistencyError, match=r"turn 1, tool result 1: clips: no vision inputs"):
        apply_policy([traj, bad], found, "error", step=3)
    kept, counts = apply_policy([traj, bad], found, "warn", step=3)
    assert kept[0] is traj and sum(kept[1].loss_mask) == 0
    assert counts["consistency/dropped"] == 1.0


def test_transformers_engine_rollouts_report_no_mismatch(tiny, needle_samples):
    # The random tiny model samples its own turns (it rarely calls the tool; the scripted
    # trajectory above covers crops): overview clip, sampled tokens, positions per turn.
    model, processor = tiny
    engine = TransformersEngine(model, processor.tokenizer)
    cfg = AgentConfig(max_rounds=1, max_new_tokens=8)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)
    trajs = loop.run(needle_samples[:1], [4], 2, SamplingParams(temperature=0.7, seed=1))
    assert all(t.num_trained_tokens > 0 and len(t.visuals) >= 1 for t in trajs)
    assert [check(tiny, t) for t in trajs] == [[], []]


def scripted(processor, cfg: AgentConfig) -> AgentLoop:
    def respond(context: str) -> str:
        return TURN if "<tool_response>" not in context else "done</think>\n<answer>A</answer>"

    engine = ScriptedEngine(processor.tokenizer, respond)
    return AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)


def test_subagent_and_cut_trajectories_are_consistent(tiny, traj, needle_samples):
    _, processor = tiny
    # Sub-agent mode: the crops reach the main context as summaries, without clips.
    (sub,) = scripted(processor, AgentConfig(mode="subagent")).run(
        needle_samples[:1], [4], 1, GREEDY
    )
    assert len(sub.visuals) == 1 and all(r.summary for r in sub.turns[0].results)
    # The tool responses would pass max_total_tokens: the turn's crops ran, their clips were
    # never appended (the trajectory is cut there).
    turn_end = traj.loss_mask.index(0, traj.loss_mask.index(1))
    room = turn_end - traj.prompt_length + 1  # the first turn fits, its responses do not
    cut_cfg = AgentConfig(max_new_tokens=room, max_total_tokens=traj.prompt_length + room)
    (cut,) = scripted(processor, cut_cfg).run(needle_samples[:1], [4], 1, GREEDY)
    assert cut.truncated and len(cut.visuals) == 1 and cut.turns[0].results
    assert check(tiny, sub) == [] and check(tiny, cut) == []
