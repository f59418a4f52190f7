"""Run one benchmark through the agent under the evaluation protocol, resumably.

`run_benchmark` records items whose video is missing (scored wrong, reported), runs the agent on
the rest in batches, scores each item from the LAST turn's text (the forced-answer round comes
last), and appends one JSON line per item to `out_dir/predictions.jsonl` right after every batch
(`paravt.eval.results`). A killed evaluation resumes: ids already in the predictions file are not
run again, and a truncated last line (a kill mid-append) is dropped and its items re-run, so the
resumed metrics equal those of an uninterrupted run (greedy decoding). Resuming into an out_dir
written by another model, annotation file, engine, mode or protocol is refused.

A video that exists but cannot be decoded (truncated, zero-length, one frame, not a video) does
not stop a long evaluation: its batch is re-run item by item, the failing item is recorded with
its error, scored wrong and counted (`video_errors`); `fail_fast=True` raises instead. A progress
bar with ETA runs over the items; the problems are listed at the end and in metrics.json.

This module deliberately does not load models, parse benchmark schemas or score answers itself.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from paravt.agent.greedy import greedy_rollouts
from paravt.agent.loop import AgentLoop
from paravt.eval.adapters import BENCHMARKS, Benchmark, EvalItem
from paravt.eval.judging import judge_metrics, judge_report, score_batch
from paravt.eval.needle import needle
from paravt.eval.protocol import EvalConfig, agent_config, build_agent_loop
from paravt.eval.results import (
    METRICS,
    PREDICTIONS,
    RESULTS,
    RUN_CONFIG,
    append_predictions,
    check_run_identity,
    format_metrics,
    primary_scoring,
    problems,
    read_predictions,
    write_results,
)
from paravt.progress import track
from paravt.rewards.judge import LLMJudge
from paravt.rollout.engine import SamplingParams
from paravt.types import Trajectory
from paravt.video.reader import VideoError

__all__ = [
    "EVAL_BENCHMARKS",
    "METRICS",
    "PREDICTIONS",
    "RESULTS",
    "RUN_CONFIG",
    "EvalConfig",
    "agent_config",
    "build_agent_loop",
    "format_metrics",
    "make_benchmark",
    "read_predictions",
    "run_benchmark",
]

log = logging.getLogger(__name__)

# Every adapter by name, the synthetic needle split included.
EVAL_BENCHMARKS: dict[str, Callable[..., Benchmark]] = {**BENCHMARKS, "needle": needle}


def make_benchmark(name: str, unparseable: str | None = None, **options: Any) -> Benchmark:
    """The adapter `name` (any of `EVAL_BENCHMARKS`) built with its constructor `options`;
    `unparseable` picks a multiple-choice benchmark's unparseable-answer policy."""
    if name not in EVAL_BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of: {', '.join(EVAL_BENCHMARKS)}")
    make = EVAL_BENCHMARKS[name]
    try:
        inspect.signature(make).bind(**options)
    except TypeError as err:  # a misspelt or foreign option, named with the ones it takes
        takes = ", ".join(inspect.signature(make).parameters) or "none"
        raise ValueError(f"benchmark {name!r}: {err} (benchmark.options takes: {takes})") from None
    benchmark = make(**options)
    if unparseable is not None and unparseable != getattr(benchmark, "unparseable", "wrong"):
        if not hasattr(benchmark, "unparseable"):
            raise ValueError(f"benchmark {name!r} has no unparseable-answer policy to set")
        from dataclasses import replace

        benchmark = replace(benchmark, unparseable=unparseable)
    return benchmark


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
        "video": item.sample.video,
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
    benchmark: Benchmark,
    batch: Sequence[EvalItem],
    loop: AgentLoop,
    cfg: EvalConfig,
    fail_fast: bool = False,
    judge: LLMJudge | None = None,
) -> list[dict[str, Any]]:
    params = SamplingParams(greedy=True, max_new_tokens=cfg.agent.max_new_tokens, seed=cfg.seed)
    try:
        samples = [i.sample for i in batch]
        trajs = greedy_rollouts(loop, samples, [cfg.frame_budget] * len(batch), params=params)
    except VideoError as error:
        if fail_fast:
            raise
        if len(batch) > 1:  # find the bad video; the others still get their answers
            return [
                r for item in batch for r in _run_batch(benchmark, [item], loop, cfg, judge=judge)
            ]
        log.warning(
            "%s: %s (scored wrong; fail_fast=true stops here instead)", batch[0].sample.id, error
        )
        return [prediction_record(batch[0], benchmark.score(batch[0], ""), error=str(error))]
    texts = [t.turns[-1].text if t.turns else "" for t in trajs]
    scores = score_batch(benchmark, batch, texts, judge)
    return [
        prediction_record(item, score, t)
        for item, score, t in zip(batch, scores, trajs, strict=True)
    ]


def default_identity(benchmark: Benchmark, cfg: EvalConfig) -> dict[str, Any]:
    return {"benchmark": benchmark.name, "protocol": cfg.identity()}


def run_benchmark(
    benchmark: Benchmark,
    items: Sequence[EvalItem],
    agent_loop: AgentLoop,
    out_dir: str,
    cfg: EvalConfig | None = None,
    identity: Mapping[str, Any] | None = None,
    bad_rows: Sequence[str] = (),
    fail_fast: bool = False,
    judge: LLMJudge | None = None,
    scoring: str = "official",
) -> dict[str, float]:
    """Evaluate `items` (resuming from `out_dir/predictions.jsonl`); returns and writes metrics.
    `identity` (model, annotations, engine, mode) is merged with the benchmark and protocol;
    `judge` scores open-ended answers (`paravt.eval.judging`); `scoring` names whose figures
    take the plain metric names (`paravt.eval.results.primary_scoring`; both are reported)."""
    primary_scoring({}, scoring)  # a bad name fails before the model runs
    if agent_loop.cfg.forced_answer != benchmark.forced_answer:
        raise ValueError(
            f"the agent loop's forced-answer message is not benchmark {benchmark.name!r}'s; "
            "build the loop with build_agent_loop(..., forced_answer=benchmark.forced_answer)"
        )
    cfg = cfg if cfg is not None else EvalConfig()
    run_id = {**default_identity(benchmark, cfg), **dict(identity or {})}
    os.makedirs(out_dir, exist_ok=True)
    check_run_identity(out_dir, run_id)
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
    # A bar on a terminal, one log line every few batches in a file (no `\r` in logs).
    desc = f"{benchmark.name}: {len(runnable)} items in batches of {cfg.batch_size}, batch"
    for start in track(range(0, len(runnable), cfg.batch_size), desc=desc):
        batch = runnable[start : start + cfg.batch_size]
        records = _run_batch(benchmark, batch, agent_loop, cfg, fail_fast, judge)
        append_predictions(path, records)
        done.update((r["id"], r) for r in records)
    return write_metrics(benchmark, items, done, out_dir, run_id, bad_rows, judge, scoring)


def write_metrics(
    benchmark: Benchmark,
    items: Sequence[EvalItem],
    records: Mapping[str, Mapping[str, Any]],
    out_dir: str,
    identity: Mapping[str, Any] | None = None,
    bad_rows: Sequence[str] = (),
    judge: LLMJudge | None = None,
    scoring: str = "official",
) -> dict[str, float]:
    """The benchmark's report over `items` from their records, plus tool-use and error counts
    and, with open-ended items or a judge, the judge's counts (metrics.json's "judge" entry),
    `scoring`'s figures under the plain names; metrics.json and results.md are written, the
    problems logged."""
    chosen = [records[i.sample.id] for i in items]
    metrics = benchmark.report(list(items), [r["score"] for r in chosen])
    metrics["tool_calls_per_sample"] = sum(r["num_calls"] for r in chosen) / max(1, len(chosen))
    metrics["video_errors"] = float(sum(r.get("error") is not None for r in chosen))
    metrics["bad_rows"] = float(len(bad_rows))
    judged = judge_report(benchmark, items, [r["score"] for r in chosen], judge)
    metrics.update(judge_metrics(judged))
    if scoring != "official" and not any(k.startswith("lmms_eval/") for k in metrics):
        log.warning("%s has no lmms-eval scorer: its figures are the official ones", benchmark.name)
    metrics = primary_scoring(metrics, scoring)
    issues = problems(chosen, bad_rows)
    for line in issues[:20]:
        log.warning("%s", line)
    if len(issues) > 20:
        log.warning(
            "... %d problems in all, listed in %s", len(issues), os.path.join(out_dir, RESULTS)
        )
    write_results(out_dir, identity or {"benchmark": benchmark.name}, metrics, issues, judged)
    return metrics
