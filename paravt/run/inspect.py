"""`paravt rollout`: run the agent on a few samples and print every trajectory for a person.

For each of `--num` samples x `--group` rollouts it prints, turn by turn, what the model wrote,
the calls parsed from it, what the tools returned (windows, frames and their timestamps, errors,
sub-agent summaries), the reward breakdown, the counters of the trajectory, and which tokens are
trained: the sequence as runs of equal loss mask (`--show-tokens` decodes each run).

The formatting is pure (`mask_runs`, `format_runs`, `format_trajectory`); `main` is thin glue
that loads a checkpoint on the CPU and drives `AgentLoop` once. This module deliberately does not
train, save trajectories or score benchmarks, and it adds no agent logic of its own: what it
shows is exactly what the training loop would see.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from paravt.agent.loop import MODES, AgentConfig
from paravt.agent.prompts import format_times
from paravt.agent.tools import CropConfig
from paravt.rewards.accuracy import extract_answer
from paravt.rl.tool_metrics import tool_metrics
from paravt.types import ParsedCall, RewardBreakdown, Sample, ToolResult, Trajectory, Turn

PROG = "paravt rollout"
# conf/rollout/default.yaml's `frame_budget` and `temperature` (RolloutConfig's defaults; its
# module imports Lightning, which this command does not need).
FRAME_BUDGET = 64
TEMPERATURE = 0.7
RENAMED_FLAG = "--budget"  # the frame budget's old flag name: named, not guessed by argparse
# Characters of a decoded run shown by --show-tokens before the middle is cut out.
_RUN_CHARS = 240
# A special token repeated back to back (the hundreds of <|video_pad|> of a clip) shows once.
_REPEAT_RE = re.compile(r"(<\|[a-z_]+\|>)\1+")
# Control characters (a random model samples them) would garble the terminal; newline and tab stay.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class _UsageError(Exception):
    """A problem the user can fix (bad path, empty data): printed as one line, exit code 2."""


# ---- pure formatting -------------------------------------------------------------------------
def mask_runs(loss_mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start, stop, mask) of every maximal run of equal mask values; `stop` is exclusive."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(loss_mask) + 1):
        if i == len(loss_mask) or loss_mask[i] != loss_mask[start]:
            runs.append((start, i, int(loss_mask[start])))
            start = i
    return runs


def run_label(start: int, mask: int, prompt_length: int) -> str:
    """What a run is: the model's own tokens, the prompt, or context appended after a turn."""
    if mask:
        return "assistant"
    return "prompt" if start < prompt_length else "tool"


def printable(text: str) -> str:
    """`text` with control characters other than newline and tab written as escapes."""
    return _CONTROL_RE.sub(lambda m: repr(m.group(0))[1:-1], text)


def _squeeze(text: str, limit: int = _RUN_CHARS) -> str:
    """One line: repeated special tokens counted, newlines escaped, the middle cut if long."""
    text = _REPEAT_RE.sub(lambda m: f"{m.group(1)}x{len(m.group(0)) // len(m.group(1))}", text)
    text = printable(text).replace("\n", "\\n")
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "…" + text[-half:]


def format_runs(traj: Trajectory, tokenizer=None, show_tokens: bool = False) -> str:
    """The loss-mask runs on one line; with `show_tokens`, one decoded line per run after it."""
    runs = mask_runs(traj.loss_mask)
    labels = [run_label(start, mask, traj.prompt_length) for start, _, mask in runs]
    line = " ".join(
        f"[{label} {stop - start} tok, mask {mask}]"
        for label, (start, stop, mask) in zip(labels, runs, strict=True)
    )
    lines = [
        f"tokens: {len(traj.token_ids)} total, {traj.num_trained_tokens} trained",
        "  " + line,
    ]
    if show_tokens:
        if tokenizer is None:
            raise ValueError("format_runs: show_tokens needs the tokenizer to decode the runs")
        for label, (start, stop, mask) in zip(labels, runs, strict=True):
            text = tokenizer.decode(list(traj.token_ids[start:stop]), skip_special_tokens=False)
            lines.append(f"  {label:<9} {start}:{stop} mask {mask}: {_squeeze(text)}")
    return "\n".join(lines)


def _window_text(arguments) -> str | None:
    start, end = arguments.get("start_time"), arguments.get("end_time")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return f"{float(start):.1f}s-{float(end):.1f}s"
    return None


def format_call(call: ParsedCall) -> str:
    if not call.ok or call.call is None:
        return f"[{call.index}] error: {call.error}"
    window = _window_text(call.call.arguments)
    return f"[{call.index}] {call.call.name} {window or dict(call.call.arguments)}"


def format_result(result: ToolResult) -> str:
    if not result.ok:
        late = " (timed out)" if result.timed_out else ""
        return f"[{result.index}] error{late}: {result.error}"
    if result.frames is None:
        return f"[{result.index}] {result.name}: {_squeeze(result.text or '', 400)}"
    start, end = result.window or (0.0, 0.0)
    frames = result.frames
    line = (
        f"[{result.index}] {result.name} {start:.1f}s-{end:.1f}s: "
        f"{len(frames.indices)} frames at {format_times(frames.timestamps)}"
    )
    if result.summary is not None:
        line += f"\n    summary: {_squeeze(result.summary, 400)}"
    return line


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + line for line in (text.splitlines() or [""]))


def format_turn(number: int, turn: Turn) -> str:
    head = f"--- turn {number}" + (" (forced answer)" if turn.forced_answer else "") + " ---"
    lines = [head, "  assistant:", _indent(printable(turn.text))]
    if turn.calls:
        lines += ["  calls:"] + [_indent(format_call(c)) for c in turn.calls]
    if turn.results:
        lines += ["  tool results:"] + [_indent(format_result(r)) for r in turn.results]
    return "\n".join(lines)


def format_reward(reward: RewardBreakdown, answer: str) -> str:
    head = (
        f"reward: total {reward.total:.3f} | accuracy {reward.accuracy:.3f} | "
        f"format {reward.format:.3f} | tool {reward.tool:.3f}"
    )
    if reward.degenerate:
        head += " | degenerate completion: scored 0"
    terms = " ".join(
        f"{name.removeprefix('format/')} {value:.2f}"
        for name, value in reward.components.items()
        if name.startswith("format/")
    )
    return "\n".join([head, f"  format terms: {terms}", f"  extracted answer: {answer!r}"])


def format_counters(traj: Trajectory) -> str:
    line = (
        f"counters: calls {traj.num_calls} (valid {traj.num_valid_calls}), "
        f"tool responses {traj.num_tool_responses}, rounds {traj.num_rounds}, "
        f"truncated {'yes' if traj.truncated else 'no'}, finish {traj.finish_reason}"
    )
    per_tool = tool_metrics([traj])
    names = sorted(k.removeprefix("kappa/") for k in per_tool if k.startswith("kappa/"))
    if len(names) > 1:  # one line per tool once several were called
        line += "".join(
            f"\n  {n}: {per_tool[f'kappa/{n}']:g} calls, errors "
            f"{per_tool[f'tool/{n}/errors']:.0%}, {per_tool[f'tool/{n}/latency_s']:.2f} s each"
            for n in names
        )
    if traj.sub_trajectories:
        trained = sum(s.num_trained_tokens for s in traj.sub_trajectories)
        line += f"\n  sub-agents: {len(traj.sub_trajectories)} runs, {trained} trained tokens"
    return line


def format_trajectory(
    traj: Trajectory,
    sample: Sample,
    reward: RewardBreakdown,
    tokenizer=None,
    show_tokens: bool = False,
) -> str:
    """Everything about one rollout, readable by a person (see the module docstring)."""
    header = (
        f"=== sample {traj.sample_id} | rollout {traj.group_index} | "
        f"frame budget {traj.frame_budget} ==="
    )
    parts = [
        header,
        "question:",
        _indent(sample.question),
        f"gold answer: {sample.answer} ({sample.question_type})",
        *(format_turn(i, t) for i, t in enumerate(traj.turns, start=1)),
        format_reward(reward, extract_answer(traj.response_text)),
        format_counters(traj),
        format_runs(traj, tokenizer, show_tokens),
    ]
    return "\n".join(parts)


# ---- glue ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory (config + processor)")
    p.add_argument("--data", required=True, help="RL prompt file (.parquet, .jsonl, .json)")
    p.add_argument("--num", type=int, default=2, help="samples to run (default 2)")
    p.add_argument("--group", type=int, default=2, help="rollouts per sample, G (default 2)")
    # The agent protocol's defaults are training's (conf/rollout/default.yaml = the dataclasses).
    agent, crop = AgentConfig(), CropConfig()
    p.add_argument(
        "--frame-budget",
        type=int,
        default=FRAME_BUDGET,
        help="overview frames K (default %(default)s)",
    )
    p.add_argument(
        "--rounds", type=int, default=agent.max_rounds, help="max tool rounds (default %(default)s)"
    )
    p.add_argument("--mode", choices=MODES, default=agent.mode)
    p.add_argument(
        "--max-calls-per-turn",
        type=int,
        default=crop.max_calls_per_turn,
        help="calls kept per turn, 1: sequential dispatch (default %(default)s)",
    )
    p.add_argument("--temperature", type=float, default=TEMPERATURE)
    p.add_argument("--greedy", action="store_true", help="greedy decoding")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=agent.max_new_tokens,
        help="per turn (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="rollout engine")
    p.add_argument("--show-tokens", action="store_true", help="decode every mask run")
    return p


def _check_counts(args: argparse.Namespace) -> None:
    for name in ("num", "group", "frame_budget", "max_new_tokens", "max_calls_per_turn"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise _UsageError(f"{flag} must be >= 1 (got {getattr(args, name)})")
    if args.rounds < 0:
        raise _UsageError(f"--rounds must be >= 0 (got {args.rounds})")


def _load_data(path: str, num: int) -> list[Sample]:
    from paravt.data.datasets import DataFileError, load_samples

    if not Path(path).is_file():
        raise _UsageError(f"data file not found: {path}; pass --data FILE (.parquet or .jsonl)")
    try:
        samples, report = load_samples(path, limit=num)
    except DataFileError as err:
        raise _UsageError(str(err)) from err
    if not samples:
        why = f" (first problem: {report.skipped[0][1]})" if report.skipped else ""
        raise _UsageError(f"no usable samples in {path}{why}")
    return samples


def _load_model(path: str):
    """(model, processor) from a checkpoint directory, on the CPU."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if not Path(path).is_dir():
        raise _UsageError(
            f"model directory not found: {path}; pass --model DIR of a saved checkpoint "
            "(`paravt make-tiny-model` builds one)"
        )
    try:
        processor = AutoProcessor.from_pretrained(path)
        model = AutoModelForImageTextToText.from_pretrained(path)
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise _UsageError(f"cannot load a checkpoint from {path}: {first}") from err
    return model.eval(), processor


def _run(args: argparse.Namespace) -> list[str]:
    """Load, roll out once for all num x group trajectories, format each one."""
    from paravt.agent.loop import AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.rewards.compose import trajectory_reward
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.factory import build_engine
    from paravt.video.reader import VideoError, VideoReader

    _check_counts(args)
    samples = _load_data(args.data, args.num)
    try:
        params = SamplingParams(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            greedy=args.greedy,
            seed=args.seed,
        )
    except ValueError as err:
        raise _UsageError(str(err)) from err
    model, processor = _load_model(args.model)
    cfg = AgentConfig(max_rounds=args.rounds, mode=args.mode, max_new_tokens=args.max_new_tokens)
    crop = CropConfig(max_calls_per_turn=args.max_calls_per_turn)
    engine = build_engine(args.engine, model, processor, model_path=args.model)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg, crop)
    try:
        trajs = loop.run(samples, [args.frame_budget] * len(samples), args.group, params)
    except VideoError as err:
        raise _UsageError(str(err)) from err
    by_id = {s.id: s for s in samples}
    blocks = []
    for traj in trajs:
        sample = by_id[traj.sample_id]
        reward = trajectory_reward(traj, sample)
        blocks.append(
            format_trajectory(traj, sample, reward, processor.tokenizer, args.show_tokens)
        )
    return blocks


def main(argv: list[str] | None = None) -> int:
    """`paravt rollout --model DIR --data FILE [--num 2 --group 2 --frame-budget 8 ...]`."""
    argv = sys.argv[1:] if argv is None else argv
    if RENAMED_FLAG in argv:
        print(f"{PROG}: {RENAMED_FLAG} is now --frame-budget", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse has already printed its usage message
        return int(exit_.code or 0)
    try:
        blocks = _run(args)
    except _UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    print("\n\n".join(blocks))
    return 0
