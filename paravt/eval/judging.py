"""Open-ended answers of an evaluation scored by an LLM judge, and what the results say about it.

A benchmark with open-ended items (the needle split's `oe` rows, MMVU's open-ended part) has
`judge_query(item, response)`: the (prediction, gold, question) the judge must see, or None when
its own rule decides without asking (an empty answer, an exact match, MMVU's rules finding it
right); `from_verdict(item, verdict)`: the score a verdict gives; and `open_ended_rule`: the name
of its no-judge scorer ("token F1", "MMVU's rules"). `score_batch` scores a batch: every item by
`benchmark.score` (the no-judge path, unchanged), then the items with a query are sent together
through `LLMJudge.prefetch` (its bounded pool, timeouts, retries) and rescored by the verdict. An
answer whose request still failed keeps `benchmark.score`'s value (it "fell back" to the rule).
Scores carry "judged": 1.0 or "judge_fallback": 1.0, so the counts come from predictions.jsonl
and a resumed run reports them over all its items.

`judge_report` summarises the records (answers judged, fallen back, their share, the endpoint
and last failure; or that no judge was configured) for metrics.json and the printed summary;
`check_fallbacks` is the optional failure (`judge_max_fallback_share`). This module deliberately
makes no request itself (`paravt.rewards.judge.LLMJudge` does) and reads no config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from paravt.eval.adapters.base import Benchmark, EvalItem
from paravt.rewards.judge import LLMJudge
from paravt.rewards.judge_guard import JudgeFailure

JUDGED, FALLBACK = "judged", "judge_fallback"  # score keys: 1.0 when it applies


@runtime_checkable
class OpenEnded(Protocol):
    """A benchmark whose open-ended items a judge can score."""

    open_ended_rule: str

    def judge_query(self, item: EvalItem, response: str) -> tuple[str, str, str] | None: ...

    def from_verdict(self, item: EvalItem, verdict: float) -> dict[str, float]: ...


def is_open_ended(item: EvalItem) -> bool:
    return item.sample.question_type == "oe"


def score_batch(
    benchmark: Benchmark,
    items: Sequence[EvalItem],  # [B]
    responses: Sequence[str],  # [B] the last turn's text of each item
    judge: LLMJudge | None = None,
) -> list[dict[str, float]]:
    """Each item's score: the benchmark's own, or the judge's verdict where it was asked."""
    scores = [benchmark.score(i, r) for i, r in zip(items, responses, strict=True)]
    if judge is None or not isinstance(benchmark, OpenEnded):
        return scores
    queries = [
        benchmark.judge_query(i, r) if is_open_ended(i) and not i.video_missing else None
        for i, r in zip(items, responses, strict=True)
    ]
    judge.prefetch([q for q in queries if q is not None])
    for k, (item, query) in enumerate(zip(items, queries, strict=True)):
        if query is None:
            continue
        verdict = judge.verdict(*query)
        if verdict is None:
            scores[k] = {**scores[k], FALLBACK: 1.0}
        else:
            scores[k] = {**benchmark.from_verdict(item, verdict), JUDGED: 1.0}
    return scores


def judge_report(
    benchmark: Benchmark,
    items: Sequence[EvalItem],
    scores: Sequence[Mapping[str, float]],
    judge: LLMJudge | None,
) -> dict[str, Any] | None:
    """metrics.json's "judge" entry; None for a benchmark without open-ended items and no judge
    (its results are exactly as before)."""
    open_ended = sum(is_open_ended(i) for i in items)
    if judge is None and not open_ended:
        return None
    scored = sum(s.get(JUDGED, 0.0) == 1.0 for s in scores)
    fell_back = sum(s.get(FALLBACK, 0.0) == 1.0 for s in scores)
    asked = scored + fell_back
    return {
        "endpoint": judge.endpoint if judge is not None else None,
        "model": judge.model if judge is not None else None,
        "open_ended": open_ended,
        "scored": scored,
        "fell_back": fell_back,
        "share": fell_back / asked if asked else 0.0,
        "fallback": getattr(benchmark, "open_ended_rule", "the benchmark's rule"),
        "last_failure": judge.last_error if judge is not None else None,
    }


def judge_metrics(report: Mapping[str, Any] | None) -> dict[str, float]:
    """The counts that join the metrics table (none when the report is None)."""
    if report is None:
        return {}
    out = {"open_ended": float(report["open_ended"])}
    if report["endpoint"] is not None:
        out |= {
            "judge_scored": float(report["scored"]),
            "judge_fallbacks": float(report["fell_back"]),
        }
    return out


def judge_line(report: Mapping[str, Any]) -> str:
    """The printed summary line about the judge."""
    if report["endpoint"] is None:
        return (
            f"judge: none configured; {report['open_ended']} open-ended answer(s) scored by "
            f"{report['fallback']}, not judged (judge=openai judges them)"
        )
    return (
        f"judge: {report['scored']} answers scored by the judge, {report['fell_back']} fell back "
        f"to {report['fallback']} (share {report['share']:.2f}; {report['open_ended']} "
        f"open-ended items, the others decided without asking; {report['endpoint']})"
    )


def _fallback_summary(report: Mapping[str, Any]) -> tuple[str, str]:
    """("LLM judge at E: M of N answers fell back to R (share s", the last failure)."""
    last = report["last_failure"] or "not seen by this process (an earlier, resumed run)"
    return (
        f"LLM judge at {report['endpoint']}: {report['fell_back']} of "
        f"{report['scored'] + report['fell_back']} answers fell back to {report['fallback']} "
        f"(share {report['share']:.2f}"
    ), last


def fallback_warning(report: Mapping[str, Any]) -> str | None:
    """A loud line when any judged answer fell back, naming the endpoint and the last failure."""
    if report["endpoint"] is None or not report["fell_back"]:
        return None
    head, last = _fallback_summary(report)
    return (
        f"{head}); last failure: {last}. Their scores are not the judge's: fix the judge server "
        "and evaluate again into a new out_dir (judge_max_fallback_share=0.0 makes this an error)"
    )


def check_max_share(max_share: float | None) -> None:
    if max_share is not None and not 0.0 <= max_share <= 1.0:
        raise ValueError(
            f"judge_max_fallback_share must be in [0, 1] or null, got {max_share}; e.g. "
            "judge_max_fallback_share=0.0 (any fallback fails) or null (warn only)"
        )


def check_fallbacks(report: Mapping[str, Any] | None, max_share: float | None) -> None:
    """JudgeFailure when the fallback share exceeds `max_share` (None: never)."""
    if max_share is None or report is None or report["endpoint"] is None:
        return
    check_max_share(max_share)
    if report["share"] > max_share:
        head, last = _fallback_summary(report)
        raise JudgeFailure(
            f"{head} > judge_max_fallback_share {max_share}); last failure: {last}. The results "
            "are written; fix the judge server and evaluate again into a new out_dir (or raise "
            "judge_max_fallback_share)"
        )
