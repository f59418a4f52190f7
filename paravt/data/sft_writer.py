"""Write agent-loop trajectories as SFT rows (`paravt make-sft-data`): teacher data for cold starts.

`trajectory_row` turns one trajectory of the main agent into the ParaVT SFT schema: the system
prompt, the user turn with the overview clip (its exact source frames stored as
`frame_indices`), and for every round the assistant's own text, the tool responses in call order
(crops as `video_url` parts with their frames, errors and sub-agent summaries as text) and the
forced-answer message. `paravt.data.sft_encode` encodes such a row back to the loop's exact
tokens. `main` drives the real agent loop with the scripted needle teacher over needle data.
It deliberately writes no model weights and runs no training.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paravt.agent import prompts
from paravt.agent.loop import AgentConfig
from paravt.agent.tools import CropConfig
from paravt.types import Sample, ToolResult, Trajectory
from paravt.video.sampling import overview_indices, timestamps


def _video_part(video: str, indices, max_pixels: int, min_pixels: int, window=None) -> dict:
    part: dict[str, Any] = {
        "type": "video_url",
        "video_url": {"url": video},
        "frame_indices": [int(i) for i in indices],
        "max_pixels": max_pixels,
        "min_pixels": min_pixels,
    }
    if window is not None:
        part["video_start"], part["video_end"] = float(window[0]), float(window[1])
    return part


def _tool_message(result: ToolResult, video: str, mode: str, crop: CropConfig) -> dict:
    msg = prompts.tool_message(result, mode)
    if isinstance(msg["content"], str):
        return msg
    frames = result.frames
    parts = [
        p
        if p["type"] == "text"
        else _video_part(video, frames.indices, crop.max_pixels, crop.min_pixels, result.window)
        for p in msg["content"]
    ]
    return {"role": "tool", "content": parts}


def trajectory_row(
    sample: Sample,
    traj: Trajectory,
    source,
    agent: AgentConfig,
    crop: CropConfig,
) -> dict[str, Any]:
    """The SFT row of `traj` (a main-agent trajectory of `sample` from `AgentLoop.run`)."""
    info = source.info(sample.video)
    indices = overview_indices(info.num_frames, traj.frame_budget)  # as the agent loop shows
    user = prompts.user_text(sample, timestamps(indices, info.fps), info.duration)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": prompts.system_prompt()},
        {
            "role": "user",
            "content": [
                _video_part(sample.video, indices, agent.overview_max_pixels, 0),
                {"type": "text", "text": user},
            ],
        },
    ]
    for k, turn in enumerate(traj.turns):
        messages.append({"role": "assistant", "content": turn.text})
        if k + 1 == len(traj.turns):
            break
        messages += [_tool_message(r, sample.video, agent.mode, crop) for r in turn.results]
        if traj.turns[k + 1].forced_answer:
            messages.append(prompts.forced_answer_message(agent.forced_answer))
    return {
        "id": f"{sample.id}-{traj.group_index}",
        "answer": sample.answer,
        "question_type": sample.question_type,
        "messages": messages,
    }


def write_rows(rows: Sequence[dict[str, Any]], out: str | Path) -> Path:
    """jsonl, or parquet with `messages` as a JSON string column."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = [{**r, "messages": json.dumps(r["messages"])} for r in rows]
        pq.write_table(pa.Table.from_pylist(flat), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def teacher_rows(
    samples: Sequence[Sample],
    processor,
    agent: AgentConfig,
    strategy: str = "search",
    budgets: Sequence[int] = (4, 8),
) -> list[dict[str, Any]]:
    """Rows of the scripted needle teacher driving the real agent loop (real crops), in sample
    order. Samples that share a question text are traced in separate batches
    (`distinct_question_batches`): the teacher recognises a context by its question."""
    from paravt.agent.loop import AgentLoop
    from paravt.agent.render import ChatRenderer
    from paravt.agent.scripts import distinct_question_batches, needle_teacher, opened
    from paravt.rollout.engine import SamplingParams
    from paravt.rollout.engines.scripted import ScriptedEngine
    from paravt.video.reader import VideoReader

    renderer = ChatRenderer(processor)
    source = VideoReader()
    crop = CropConfig()  # AgentLoop takes the factor from the processor
    ks = [budgets[i % len(budgets)] for i in range(len(samples))]
    trajs: list[Trajectory | None] = [None] * len(samples)
    for batch in distinct_question_batches(samples):
        part = [samples[i] for i in batch]
        respond = opened(needle_teacher(part, strategy), agent.force_think)
        engine = ScriptedEngine(processor.tokenizer, respond)
        loop = AgentLoop(engine, renderer, source, agent, crop)
        traced = loop.run(part, [ks[i] for i in batch], 1, SamplingParams(greedy=True))
        for i, traj in zip(batch, traced, strict=True):
            trajs[i] = traj
    return [
        trajectory_row(s, t, source, agent, loop.crop)
        for s, t in zip(samples, trajs, strict=True)
        if t is not None and t.finish_reason == "stop" and not t.truncated
    ]


def write_needle_sft(
    needle_path: str, model_path: str, out: str, agent: AgentConfig, strategy: str, budgets
) -> Path:
    from transformers import AutoProcessor

    from paravt.data.datasets import load_samples

    samples, _ = load_samples(needle_path)
    processor = AutoProcessor.from_pretrained(model_path)
    return write_rows(teacher_rows(samples, processor, agent, strategy, budgets), out)


def write_needle_sft_from_config(out: str, model_path: str, generate: Mapping[str, Any]) -> Path:
    """`SFTDataModule.generate`: needle RL data (made when missing), then its teacher rows."""
    opts = dict(generate)
    if "budgets" in opts:  # the former name, refused before any data is generated
        raise ValueError("data.generate.budgets is now data.generate.frame_budgets: rename it")
    needle_dir = Path(opts.pop("needle_dir", Path(out).parent / "needle"))
    needle_cfg = dict(opts.pop("needle", {}))
    if not (needle_dir / "train.jsonl").exists():
        from paravt.video.synthetic import NeedleConfig
        from paravt.video.synthetic import generate as make_needle

        make_needle(NeedleConfig(**needle_cfg), needle_dir)
    agent = AgentConfig(max_rounds=opts.pop("max_rounds", 2), mode=opts.pop("mode", "frames"))
    strategy = opts.pop("strategy", "search")
    budgets = tuple(opts.pop("frame_budgets", (4, 8)))
    if opts:
        raise ValueError(f"data.generate has unknown keys {sorted(opts)}")
    return write_needle_sft(
        str(needle_dir / "train.jsonl"), model_path, out, agent, strategy, budgets
    )


def _budgets(text: str) -> list[int]:
    """ "4,8" -> [4, 8]: frame budgets, each an integer >= 1."""
    try:
        budgets = [int(b) for b in text.split(",")]
    except ValueError:
        budgets = []
    if not budgets or min(budgets) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1 such as 4,8 (got {text!r})")
    return budgets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="paravt make-sft-data",
        description="Write scripted-teacher trajectories on needle data in the ParaVT SFT schema.",
    )
    parser.add_argument("--needle", required=True, help="needle RL rows (.jsonl or .parquet)")
    parser.add_argument("--model", required=True, help="local HF dir whose processor renders")
    parser.add_argument("--out", required=True, help="output .jsonl or .parquet")
    parser.add_argument("--mode", default="frames", choices=("frames", "subagent"))
    parser.add_argument("--strategy", default="search", choices=("search", "oracle"))
    parser.add_argument(
        "--frame-budgets", default="4,8", type=_budgets, help="overview frame budgets, cycled"
    )
    parser.add_argument("--max-rounds", type=int, default=2)
    if any(a.split("=")[0] == "--budgets" for a in (sys.argv[1:] if argv is None else argv)):
        parser.error("--budgets is now --frame-budgets")
    args = parser.parse_args(argv)
    if not Path(args.needle).is_file():
        parser.error(f"--needle {args.needle}: no such file")
    if not Path(args.model).is_dir():
        parser.error(f"--model {args.model}: no such folder (a saved checkpoint directory)")
    if args.max_rounds < 0:
        parser.error(f"--max-rounds must be >= 0 (got {args.max_rounds})")
    agent = AgentConfig(max_rounds=args.max_rounds, mode=args.mode)
    path = write_needle_sft(
        args.needle, args.model, args.out, agent, args.strategy, args.frame_budgets
    )
    print(f"wrote {path}")
    return 0
