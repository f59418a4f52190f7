"""Run one benchmark through the agent under the paper's evaluation protocol, resumably.

`run_benchmark` skips items whose video is missing (scored wrong, reported), runs the agent on
the rest in batches, scores each item from the LAST turn's text (the forced-answer round comes
last), and appends one JSON line per item to `out_dir/predictions.jsonl` right after every batch.
A killed evaluation resumes: ids already in the predictions file are not run again, and a
truncated last line (a kill mid-write) is dropped with a warning. `metrics.json` is the
benchmark's report over ALL items plus the mean number of tool calls per item.

A video that exists but cannot be decoded does not stop a long evaluation: its batch is re-run
item by item and the failing item is recorded with its error, scored wrong and counted.

This module deliberately does not load models, parse benchmark schemas or score answers itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.tools import CropConfig
from paravt.eval.benchmarks import BENCHMARKS, Benchmark, EvalItem
from paravt.eval.needle import needle
from paravt.rollout.engine import SamplingParams
from paravt.types import Trajectory
from paravt.video.reader import VideoError

log = logging.getLogger(__name__)

PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"
RUN_CONFIG = "run_config.json"

# Every adapter by name, the synthetic needle split included.
EVAL_BENCHMARKS: dict[str, Callable[..., Benchmark]] = {**BENCHMARKS, "needle": needle}


@dataclass(frozen=True)
class EvalConfig:
    """The evaluation protocol (PARAVT.md section 6); `batch_size` items per agent call."""

    num_frames: int = 64
    max_new_tokens: int = 2048
    max_total_tokens: int = 65536
    max_rounds: int = 3
    max_calls_per_turn: int = 5
    mode: str = "frames"
    sequential: bool = False
    force_think: bool = True
    overview_max_pixels: int = 50176
    crop_fps: float = 1.0
    crop_min_frames: int = 2
    crop_max_frames: int = 16
    crop_min_pixels: int = 784
    crop_max_pixels: int = 50176
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_frames", "batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EvalConfig.{name} must be >= 1, got {getattr(self, name)}")


def make_benchmark(name: str, **options: Any) -> Benchmark:
    """The adapter `name` (any of `EVAL_BENCHMARKS`) built with its constructor `options`."""
    if name not in EVAL_BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of: {', '.join(EVAL_BENCHMARKS)}")
    return EVAL_BENCHMARKS[name](**options)


def agent_config(
    cfg: EvalConfig, forced_answer: str, forced_answer_max_tokens: int | None = None
) -> AgentConfig:
    return AgentConfig(
        max_rounds=cfg.max_rounds,
        mode=cfg.mode,
        sequential=cfg.sequential,
        force_think=cfg.force_think,
        max_new_tokens=cfg.max_new_tokens,
        max_total_tokens=cfg.max_total_tokens,
        overview_max_pixels=cfg.overview_max_pixels,
        forced_answer=forced_answer,
        forced_answer_max_tokens=forced_answer_max_tokens,
    )


def crop_config(cfg: EvalConfig, factor: int) -> CropConfig:
    return CropConfig(
        sample_fps=cfg.crop_fps,
        min_frames=cfg.crop_min_frames,
        max_frames=cfg.crop_max_frames,
        max_pixels=cfg.crop_max_pixels,
        min_pixels=cfg.crop_min_pixels,
        factor=factor,
        max_calls_per_turn=cfg.max_calls_per_turn,
    )


def build_agent_loop(
    engine,
    renderer,
    source,
    cfg: EvalConfig,
    forced_answer: str,
    forced_answer_max_tokens: int | None = None,
) -> AgentLoop:
    """An `AgentLoop` set up for the protocol `cfg` and a benchmark's forced-answer message."""
    crop = crop_config(cfg, renderer.frame_factor)
    return AgentLoop(
        engine, renderer, source, agent_config(cfg, forced_answer, forced_answer_max_tokens), crop
    )


# ------------------------------------------------------------------ predictions file


def read_predictions(path: str) -> dict[str, dict[str, Any]]:
    """Records by id; a truncated last line is cut from the file (with a warning) so appends
    stay valid; a broken line before the last one is an error naming the line."""
    if not os.path.isfile(path):
        return {}
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    records: dict[str, dict[str, Any]] = {}
    offset = 0
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)
        try:
            if line.strip():
                record = json.loads(line)
                records[str(record["id"])] = record
        except (ValueError, KeyError, TypeError) as error:
            if not (last or (number == len(lines) - 1 and not lines[-1])):
                raise ValueError(
                    f"{path}: line {number} is not a prediction record ({error}); "
                    "delete that line (or the file) and run again"
                ) from error
            log.warning("%s: ignoring a truncated last line (%d bytes)", path, len(line))
            with open(path, "r+b") as handle:
                handle.truncate(offset)
            break
        offset += len(line) + 1
    return records


def append_predictions(path: str, records: Sequence[Mapping[str, Any]]) -> None:
    """Append records as JSON lines and push them to disk, so a kill loses at most one batch."""
    if not records:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        handle.flush()
        os.fsync(handle.fileno())


def check_run_config(out_dir: str, benchmark: str, cfg: EvalConfig) -> None:
    """Refuse to resume into an `out_dir` written under another benchmark or protocol."""
    settings = {"benchmark": benchmark, **dataclasses.asdict(cfg)}
    settings.pop("batch_size")  # batching does not change what is evaluated
    path = os.path.join(out_dir, RUN_CONFIG)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            before = json.load(handle)
        changed = sorted(
            k for k in settings.keys() | before.keys() if settings.get(k) != before.get(k)
        )
        if changed:
            raise ValueError(
                f"{out_dir} holds predictions made with other settings ({', '.join(changed)}); "
                "use a new out_dir or delete the old one"
            )
        return
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(settings, handle, indent=2)


# ------------------------------------------------------------------ running


def prediction_record(
    item: EvalItem,
    score: Mapping[str, float],
    trajectory: Trajectory | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """One line of predictions.jsonl: what was answered, how it scored, how the agent got there."""
    turns = trajectory.turns if trajectory is not None else ()
    return {
        "id": item.sample.id,
        "answer": turns[-1].text if turns else "",
        "response": trajectory.response_text if trajectory is not None else "",
        "gold": item.sample.answer,
        "score": dict(score),
        "num_calls": trajectory.num_calls if trajectory is not None else 0,
        "num_valid_calls": trajectory.num_valid_calls if trajectory is not None else 0,
        "rounds": trajectory.num_rounds if trajectory is not None else 0,
        "finish_reason": trajectory.finish_reason if trajectory is not None else "skipped",
        "groups": {k: list(v) for k, v in item.groups.items()},
        "video_missing": item.video_missing,
        "error": error,
    }


def _run_batch(
    benchmark: Benchmark, batch: Sequence[EvalItem], loop: AgentLoop, cfg: EvalConfig
) -> list[dict[str, Any]]:
    params = SamplingParams(greedy=True, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    try:
        trajs = loop.run([i.sample for i in batch], [cfg.num_frames] * len(batch), 1, params)
    except VideoError as error:
        if len(batch) > 1:  # find the bad video; the others still get their answers
            return [r for item in batch for r in _run_batch(benchmark, [item], loop, cfg)]
        log.warning("%s: %s", batch[0].sample.id, error)
        return [prediction_record(batch[0], benchmark.score(batch[0], ""), error=str(error))]
    return [
        prediction_record(item, benchmark.score(item, t.turns[-1].text if t.turns else ""), t)
        for item, t in zip(batch, trajs, strict=True)
    ]


def run_benchmark(
    benchmark: Benchmark,
    items: Sequence[EvalItem],
    agent_loop: AgentLoop,
    out_dir: str,
    cfg: EvalConfig = EvalConfig(),
) -> dict[str, float]:
    """Evaluate `items` (resuming from `out_dir/predictions.jsonl`); returns and writes metrics."""
    if agent_loop.cfg.forced_answer != benchmark.forced_answer:
        raise ValueError(
            f"the agent loop's forced-answer message is not benchmark {benchmark.name!r}'s; "
            "build the loop with build_agent_loop(..., forced_answer=benchmark.forced_answer)"
        )
    os.makedirs(out_dir, exist_ok=True)
    check_run_config(out_dir, benchmark.name, cfg)
    path = os.path.join(out_dir, PREDICTIONS)
    done = read_predictions(path)
    todo = [i for i in items if i.sample.id not in done]
    if done:
        log.info(
            "%s: resuming, %d of %d items already done", path, len(items) - len(todo), len(items)
        )
    missing = [prediction_record(i, benchmark.score(i, "")) for i in todo if i.video_missing]
    append_predictions(path, missing)
    done.update((r["id"], r) for r in missing)
    runnable = [i for i in todo if not i.video_missing]
    for start in range(0, len(runnable), cfg.batch_size):
        records = _run_batch(benchmark, runnable[start : start + cfg.batch_size], agent_loop, cfg)
        append_predictions(path, records)
        done.update((r["id"], r) for r in records)
        log.info("%s: %d / %d items", benchmark.name, len(done), len(items))
    return write_metrics(benchmark, items, done, out_dir)


def write_metrics(
    benchmark: Benchmark,
    items: Sequence[EvalItem],
    records: Mapping[str, Mapping[str, Any]],
    out_dir: str,
) -> dict[str, float]:
    """The benchmark's report over `items` from their records, plus tool-use and error counts."""
    chosen = [records[i.sample.id] for i in items]
    metrics = benchmark.report(list(items), [r["score"] for r in chosen])
    metrics["tool_calls_per_sample"] = sum(r["num_calls"] for r in chosen) / max(1, len(chosen))
    metrics["video_errors"] = float(sum(r.get("error") is not None for r in chosen))
    with open(os.path.join(out_dir, METRICS), "w", encoding="utf-8") as handle:
        json.dump(metrics, handle, indent=2, sort_keys=True)
    return metrics


def format_metrics(name: str, metrics: Mapping[str, float]) -> str:
    """A two-column plain-text table of `metrics`, fractions shown as percentages."""
    width = max([len(k) for k in metrics] + [6])
    lines = [f"== {name} ==", f"{'metric':<{width}}  value"]
    for key in sorted(metrics):
        value = metrics[key]
        counted = key in ("num_samples", "missing_videos", "video_errors")
        shown = f"{value:g}" if counted or key == "tool_calls_per_sample" else f"{100 * value:.1f}"
        lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)
