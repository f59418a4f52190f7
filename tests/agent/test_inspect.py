"""`paravt rollout`: mask runs, the trajectory printout, and the command end to end."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from transformers import AutoProcessor

from paravt.cli import main
from paravt.run.inspect import format_runs, format_trajectory, mask_runs, printable
from paravt.types import (
    Frames,
    ParsedCall,
    RewardBreakdown,
    Sample,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
)

# The overfitted checkpoint was trained with 4 overview frames and 2 tool rounds.
FAST = ["--num", "2", "--group", "2", "--frame-budget", "4", "--rounds", "2"]
FAST += ["--max-new-tokens", "160"]
WINDOW_RESULT = re.compile(r"\] crop_video \d+\.\ds-\d+\.\ds: \d+ frames at \d+\.\ds")


# ---- mask_runs -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mask", "runs"),
    [
        ([], []),
        ([1], [(0, 1, 1)]),
        ([0, 0, 0], [(0, 3, 0)]),
        # 2 zeros, 3 ones, 1 zero: stops at 2, 2 + 3 = 5, 5 + 1 = 6.
        ([0, 0, 1, 1, 1, 0], [(0, 2, 0), (2, 5, 1), (5, 6, 0)]),
        ([0, 1, 0, 1], [(0, 1, 0), (1, 2, 1), (2, 3, 0), (3, 4, 1)]),
        ((1, 1, 0), [(0, 2, 1), (2, 3, 0)]),
    ],
)
def test_mask_runs_groups_consecutive_equal_values(mask, runs):
    assert mask_runs(mask) == runs


def test_mask_runs_cover_the_sequence_without_gaps():
    mask = [0] * 7 + [1] * 4 + [0] * 9 + [1] * 2
    runs = mask_runs(mask)
    assert [stop - start for start, stop, _ in runs] == [7, 4, 9, 2]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))
    assert [m for _, _, m in runs] == [0, 1, 0, 1]


# ---- pure formatting on a hand-built trajectory -----------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir):
    return AutoProcessor.from_pretrained(tiny_qwen3_dir).tokenizer


SAMPLE = Sample(id="s-1", video="v.mp4", question="What colour?\nA. red\nB. blue", answer="B")


def _frames(times: tuple[float, ...]) -> Frames:
    pixels = np.zeros((len(times), 32, 32, 3), dtype=np.uint8)
    return Frames(pixels, tuple(int(t) for t in times), times, fps=1.0, duration=64.0)


def _trajectory(token_ids: tuple[int, ...], loss_mask: tuple[int, ...], prompt: int) -> Trajectory:
    good = ToolCall("crop_video", {"video_path": "x.mp4", "start_time": 40.0, "end_time": 43.0})
    calls = (
        ParsedCall(0, "<tool_call>...", call=good),
        ParsedCall(1, "<tool_call>{bad", error="invalid JSON in tool call 2"),
    )
    results = (
        ToolResult(0, "crop_video", frames=_frames((40.0, 41.0, 42.0)), window=(40.0, 43.0)),
        ToolResult(1, "crop_video", error="invalid JSON in tool call 2"),
    )
    turns = (
        Turn("<think>\nlook</think>\n<tool_call>...", calls=calls, results=results),
        Turn("<think>\nseen</think>\n<answer>B</answer>", forced_answer=True),
    )
    return Trajectory(
        sample_id="s-1",
        group_index=3,
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=(0.0,) * len(token_ids),
        visuals=(),
        prompt_length=prompt,
        turns=turns,
        num_calls=2,
        num_valid_calls=1,
        num_tool_responses=1,
        num_rounds=1,
        frame_budget=4,
    )


REWARD = RewardBreakdown(
    total=2.25,
    accuracy=1.0,
    format=0.45,
    tool=0.8,
    components={"accuracy": 1.0, "format/think": 1.0, "format/total": 0.45, "tool": 0.8},
)


def test_format_runs_labels_prompt_assistant_and_tool_context():
    # prompt 3 (mask 0), assistant 2 (mask 1), tool 2 (mask 0), assistant 1 (mask 1): 8 tokens,
    # 2 + 1 = 3 trained.
    traj = _trajectory(tuple(range(8)), (0, 0, 0, 1, 1, 0, 0, 1), prompt=3)
    text = format_runs(traj)
    assert text.splitlines() == [
        "tokens: 8 total, 3 trained",
        "  [prompt 3 tok, mask 0] [assistant 2 tok, mask 1] [tool 2 tok, mask 0] "
        "[assistant 1 tok, mask 1]",
    ]


def test_format_trajectory_shows_turns_calls_results_reward_and_counters():
    traj = _trajectory(tuple(range(8)), (0, 0, 0, 1, 1, 0, 0, 1), prompt=3)
    text = format_trajectory(traj, SAMPLE, REWARD, None)
    lines = text.splitlines()
    assert lines[0] == "=== sample s-1 | rollout 3 | frame budget 4 ==="
    assert "    A. red" in lines and "gold answer: B (mcq)" in lines
    assert "--- turn 1 ---" in lines and "--- turn 2 (forced answer) ---" in lines
    assert "    [0] crop_video 40.0s-43.0s" in lines
    assert "    [1] error: invalid JSON in tool call 2" in lines
    assert "    [0] crop_video 40.0s-43.0s: 3 frames at 40.0s, 41.0s, 42.0s" in lines
    assert "reward: total 2.250 | accuracy 1.000 | format 0.450 | tool 0.800" in lines
    assert "  format terms: think 1.00 total 0.45" in lines
    assert "  extracted answer: 'B'" in lines
    assert (
        "counters: calls 2 (valid 1), tool responses 1, rounds 1, truncated no, finish stop"
        in lines
    )
    assert text.index("--- turn 1") < text.index("--- turn 2") < text.index("reward:")


def test_subagent_summaries_and_degenerate_rewards_are_shown():
    traj = _trajectory((1, 2), (0, 1), prompt=1)
    summary = ToolResult(
        0, "crop_video", frames=_frames((1.0, 2.0)), window=(1.0, 3.0), summary="a red square"
    )
    turn = Turn("x", calls=traj.turns[0].calls[:1], results=(summary,))
    sub = Trajectory("s-1", 3, (5, 6, 7), (0, 1, 1), (0.0,) * 3, (), 1)
    traj = Trajectory(**{**traj.__dict__, "turns": (turn,), "sub_trajectories": (sub,)})
    bad = RewardBreakdown(total=0.0, degenerate=True)
    text = format_trajectory(traj, SAMPLE, bad, None)
    assert "        summary: a red square" in text.splitlines()
    assert "degenerate completion: scored 0" in text
    assert "  sub-agents: 1 runs, 2 trained tokens" in text.splitlines()


def test_show_tokens_decodes_each_run_and_squeezes_long_ones(tokenizer):
    pad = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    head = tokenizer("<|im_start|>user\n", add_special_tokens=False)["input_ids"]
    words = tokenizer(" the video" * 60, add_special_tokens=False)["input_ids"]
    answer = tokenizer("<answer>B</answer>", add_special_tokens=False)["input_ids"]
    ids = tuple(head + [pad] * 50 + answer + words)
    mask = (0,) * (len(head) + 50) + (1,) * len(answer) + (0,) * len(words)
    traj = _trajectory(ids, mask, prompt=len(head) + 50)
    lines = format_runs(traj, tokenizer, show_tokens=True).splitlines()
    assert len(lines) == 2 + 3  # summary, runs, then one decoded line per run
    # 50 back-to-back pads show once, with their count; newlines are escaped.
    assert lines[2].endswith("mask 0: <|im_start|>user\\n<|video_pad|>x50")
    assert lines[3] == f"  assistant {len(head) + 50}:{len(head) + 50 + len(answer)} mask 1: " + (
        "<answer>B</answer>"
    )
    # " the video" x 60 is 600 characters: cut to 120 + "…" + 120.
    body = lines[4].split("mask 0: ", 1)[1]
    assert "…" in body and len(body) == 241


def test_show_tokens_without_a_tokenizer_says_so():
    traj = _trajectory((1, 2), (0, 1), prompt=1)
    with pytest.raises(ValueError, match="tokenizer"):
        format_runs(traj, None, show_tokens=True)


def test_printable_escapes_control_characters_but_keeps_newlines():
    assert printable("a\x14b\nc\td\r") == "a\\x14b\nc\td\\r"


# ---- the command end to end ------------------------------------------------------------------
@pytest.fixture(scope="module")
def caller_dir(tool_caller, tmp_path_factory):
    model, processor = tool_caller
    out = tmp_path_factory.mktemp("tool_caller")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def test_rollout_prints_parallel_calls_tool_windows_and_mask_runs(caller_dir, needle_dir, capsys):
    data = str(needle_dir / "train.jsonl")
    rc = main(["rollout", "--model", str(caller_dir), "--data", data, *FAST, "--greedy"])
    out = capsys.readouterr().out
    assert rc == 0
    # 2 samples x 2 rollouts, group-major.
    headers = re.findall(r"=== sample (\S+) \| rollout (\d) \| frame budget 4 ===", out)
    assert [g for _, g in headers] == ["0", "1", "0", "1"]
    assert headers[0][0] == headers[1][0] != headers[2][0] == headers[3][0]
    assert re.search(r"    \[1\] crop_video \d+\.\ds-\d+\.\ds", out), "no second parallel call"
    assert WINDOW_RESULT.search(out)
    assert out.count("reward: total") == 4 and out.count("counters: calls") == 4
    runs = re.findall(r"^  (\[prompt \d+ tok, mask 0\] \[assistant .*)$", out, re.MULTILINE)
    assert len(runs) == 4 and all("[tool " in r and "mask 1]" in r for r in runs)


def test_rollout_sampled_with_show_tokens(caller_dir, needle_dir, capsys):
    data = str(needle_dir / "train.jsonl")
    argv = ["rollout", "--model", str(caller_dir), "--data", data, *FAST]
    rc = main([*argv, "--num", "1", "--seed", "3", "--show-tokens"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("=== sample") == 2  # --num 1 (the later flag wins) x --group 2
    assert re.search(r"^  prompt +0:\d+ mask 0: <\|im_start\|>system", out, re.MULTILINE)
    assert re.search(r"^  assistant +\d+:\d+ mask 1: ", out, re.MULTILINE)
    assert "<|video_pad|>x" in out and "…" in out


def test_rollout_subagent_mode_prints_summaries(caller_dir, needle_dir, capsys):
    data = str(needle_dir / "train.jsonl")
    argv = ["rollout", "--model", str(caller_dir), "--data", data, *FAST, "--greedy"]
    rc = main([*argv, "--num", "1", "--group", "1", "--mode", "subagent"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "        summary: " in out and "sub-agents: " in out


# ---- errors a user can cause -----------------------------------------------------------------
def _error(capsys, argv: list[str]) -> str:
    rc = main(["rollout", *argv])
    captured = capsys.readouterr()
    assert rc == 2
    assert "Traceback" not in captured.err and not captured.out
    lines = [line for line in captured.err.splitlines() if line.startswith("paravt rollout:")]
    assert len(lines) == 1, captured.err
    return lines[0]


def test_the_former_budget_flag_is_named_with_its_new_name(tmp_path, capsys):
    line = _error(capsys, ["--model", str(tmp_path), "--data", "d.jsonl", "--budget", "4"])
    assert line == "paravt rollout: --budget is now --frame-budget"


def test_missing_model_dir(tmp_path, needle_dir, capsys):
    missing = tmp_path / "no_model"
    line = _error(capsys, ["--model", str(missing), "--data", str(needle_dir / "train.jsonl")])
    assert str(missing) in line and "model directory not found" in line


def test_model_dir_without_a_checkpoint(tmp_path, needle_dir, capsys):
    line = _error(capsys, ["--model", str(tmp_path), "--data", str(needle_dir / "train.jsonl")])
    assert str(tmp_path) in line and "cannot load" in line


def test_missing_data_file(tmp_path, tiny_qwen3_dir, capsys):
    missing = tmp_path / "none.jsonl"
    line = _error(capsys, ["--model", str(tiny_qwen3_dir), "--data", str(missing)])
    assert str(missing) in line and "data file not found" in line


def test_empty_data_file(tmp_path, tiny_qwen3_dir, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = _error(capsys, ["--model", str(tiny_qwen3_dir), "--data", str(empty)])
    assert str(empty) in line and "no usable samples" in line


def test_data_whose_rows_are_all_skipped_names_the_first_reason(tmp_path, tiny_qwen3_dir, capsys):
    data = tmp_path / "rows.jsonl"
    row = '{"id": "a", "prompt": [{"role": "user", "content": "<video>Q"}], '
    row += (
        '"videos": [{"video": "gone.mp4"}], "extra_info": {"answer": "A", "question_type": "mcq"}}'
    )
    data.write_text(row + "\n")
    line = _error(capsys, ["--model", str(tiny_qwen3_dir), "--data", str(data)])
    assert str(data) in line and "gone.mp4" in line


def test_unknown_data_extension(tmp_path, tiny_qwen3_dir, capsys):
    data = tmp_path / "rows.csv"
    data.write_text("id\n")
    line = _error(capsys, ["--model", str(tiny_qwen3_dir), "--data", str(data)])
    assert str(data) in line and ".csv" in line


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--group", "0"], "--group must be >= 1"),
        (["--frame-budget", "0"], "--frame-budget must be >= 1"),
        (["--temperature", "0"], "temperature"),
    ],
)
def test_bad_numbers(flags, message, tiny_qwen3_dir, needle_dir, capsys):
    argv = ["--model", str(tiny_qwen3_dir), "--data", str(needle_dir / "train.jsonl"), *flags]
    assert message in _error(capsys, argv)
