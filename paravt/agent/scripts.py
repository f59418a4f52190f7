"""Scripted agent behaviour on the synthetic needle task: the teacher for self-traced trajectories.

`needle_teacher` returns a responder for `paravt.rollout.engines.scripted.ScriptedEngine`. In its
first turn it thinks briefly and calls `crop_video` in parallel; after the tool responses it
answers. Strategies: "oracle" crops around the ground-truth windows; "search" covers the question's
hinted span with as many parallel crops as the crop cap requires (what a good policy should learn
to do); "unhinted" covers the rest of the video instead (a confused searcher); "direct" calls no
tool and answers from the overview at once. For a sample with a detail to zoom on
(`extra["zoom_box"]`, the `badge` family): "zoom" calls `zoom` alone on that box over the whole
video, "both" calls it beside the "search" crops in one turn, "oracle" beside its true windows.
"unhinted" and "direct" make an imperfect teacher: `teacher_plan` gives each sample one
strategy, in exact proportions, so a cold start can teach reading the answer off crops while
leaving the tool-use decision for RL.
It deliberately knows nothing of tokens or models: text in, text out.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence

from paravt.agent.prompts import FORCED_THINK
from paravt.types import Sample

STRATEGIES = ("oracle", "search", "unhinted", "direct", "zoom", "both")
# The first words differ, so the tool-use decision is the first token the policy writes.
TOOL_THOUGHT = "The frames are too sparse; crop the candidate windows."
DIRECT_THOUGHT = "Enough: the overview frames show the answer."


def call_text(start: float, end: float) -> str:
    args = {"video_path": "video.mp4", "start_time": round(start, 1), "end_time": round(end, 1)}
    return "<tool_call>" + json.dumps({"name": "crop_video", "arguments": args}) + "</tool_call>"


def zoom_text(sample: Sample) -> str:
    """A `zoom` call on the sample's `zoom_box` over its whole video."""
    box = sample.extra.get("zoom_box") if sample.extra else None
    if box is None:
        raise ValueError(f"sample {sample.id!r} has no zoom_box: strategies zoom/both need one")
    duration = float(sample.extra.get("duration", 64.0))
    args = {"video_path": "video.mp4", "start_time": 0.0, "end_time": round(duration, 1)}
    args["bbox_2d"] = list(box)
    return "<tool_call>" + json.dumps({"name": "zoom", "arguments": args}) + "</tool_call>"


def teacher_calls(sample: Sample, strategy: str) -> list[str]:
    """The calls the teacher makes for `sample`, in order: crops, then a zoom if any."""
    crops = [] if strategy == "zoom" else search_windows(sample, strategy)
    calls = [call_text(s, e) for s, e in crops]
    # the oracle shows all the answer needs: the true windows, and the detail where there is one
    detail = "zoom_box" in (sample.extra or {})
    zoom = strategy in ("zoom", "both") or (strategy == "oracle" and detail)
    return calls + ([zoom_text(sample)] if zoom else [])


def search_windows(
    sample: Sample, strategy: str, max_span: float = 16.0, margin: float = 1.0
) -> list[tuple[float, float]]:
    """The windows the teacher crops for `sample`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown teacher strategy {strategy!r}: choose one of {STRATEGIES}")
    if strategy in ("direct", "zoom"):
        return []
    strategy = "search" if strategy == "both" else strategy
    if strategy == "oracle" and sample.windows:
        return [(max(0.0, s - margin), e + margin) for s, e in sample.windows]
    duration = float(sample.extra.get("duration", 64.0))
    lo, hi = sample.extra.get("hint_window") or (0.0, duration)
    spans = [(lo, hi)]
    if strategy == "unhinted":
        spans = [(a, b) for a, b in ((0.0, lo), (hi, duration)) if b > a] or [(lo, hi)]
    return [w for a, b in spans for w in _cover(a, b, max_span)]


def _cover(lo: float, hi: float, max_span: float) -> list[tuple[float, float]]:
    """[lo, hi] in the fewest equal windows of at most `max_span` seconds."""
    pieces = max(1, math.ceil((hi - lo) / max_span))
    step = (hi - lo) / pieces
    return [(lo + i * step, lo + (i + 1) * step) for i in range(pieces)]


def teacher_plan(
    sample_ids: Sequence[str], mix: Mapping[str, float], seed: int = 0
) -> dict[str, str]:
    """A strategy for every sample id, in the exact proportions of `mix` (strategy -> weight).

    Samples are ranked by a hash of (seed, id), so the plan of one sample does not depend on
    which others are planned with it, and the shares are exact up to rounding (largest
    remainders): with mix {"search": 3, "direct": 1}, 8 samples get 6 searches and 2 directs.
    """
    bad = [k for k in mix if k not in STRATEGIES]
    if bad or not mix or min(mix.values()) < 0 or sum(mix.values()) <= 0:
        raise ValueError(
            f"teacher mix {dict(mix)!r}: give weights >= 0 (sum > 0) of strategies in {STRATEGIES}"
        )
    n, total = len(sample_ids), sum(mix.values())
    quotas = {k: n * w / total for k, w in mix.items()}
    counts = {k: int(q) for k, q in quotas.items()}
    for k in sorted(quotas, key=lambda k: counts[k] - quotas[k])[: n - sum(counts.values())]:
        counts[k] += 1
    ranked = sorted(sample_ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    labels = [k for k in mix for _ in range(counts[k])]
    return dict(zip(ranked, labels, strict=True))


def distinct_question_batches(samples: Sequence[Sample]) -> list[list[int]]:
    """Indices of `samples` split into batches in which no two samples share a question text.

    The teacher only sees the decoded context, so within one batch a sample is recognised by its
    question; samples that share a question (same family and hint, different videos) must go to
    different batches, or they would all get one sample's answer.
    """
    batches: list[list[int]] = []
    seen: list[set[str]] = []
    for i, s in enumerate(samples):
        slot = next((b for b, qs in enumerate(seen) if s.question not in qs), len(batches))
        if slot == len(batches):
            batches.append([])
            seen.append(set())
        batches[slot].append(i)
        seen[slot].add(s.question)
    return batches


def opened(respond: Callable[[str], str], force_think: bool) -> Callable[[str], str]:
    """`respond` for an agent whose prompt does or does not force the `<think>` prefix. The
    teacher's turns are written after the prefix the loop forces at every assistant turn;
    without it, each turn opens the thought itself, so that a model trained on the traces writes
    what the prefix would have supplied."""
    if force_think:
        return respond
    return lambda context: FORCED_THINK + respond(context)


def needle_teacher(
    samples: Sequence[Sample],
    strategy: str = "oracle",
    plan: Mapping[str, str] | None = None,
    calls_per_turn: int | None = None,
):
    """A responder that writes the scripted turns for whichever sample the context is about.

    Samples are keyed by id; a context is matched to the sample whose question it contains (the
    longest such question, so a question that is a prefix of another cannot steal its context).
    Samples sharing a question text are refused: split them with `distinct_question_batches`.
    `plan` (sample id -> strategy, see `teacher_plan`) overrides `strategy` per sample.
    `calls_per_turn`: None issues every window in the first turn (parallel dispatch); 1 issues
    them one per turn (sequential dispatch), the same crops over more rounds.
    """
    by_id = {s.id: s for s in samples}
    plan = dict(plan or {})
    for name in {strategy, *plan.values()}:
        if name not in STRATEGIES:
            raise ValueError(f"unknown teacher strategy {name!r}: choose one of {STRATEGIES}")
    questions: dict[str, str] = {}
    for s in by_id.values():
        other = questions.setdefault(s.question, s.id)
        if other != s.id:
            raise ValueError(
                f"samples {other!r} and {s.id!r} share a question, so the teacher cannot tell "
                "their contexts apart: run them in separate batches "
                "(paravt.agent.scripts.distinct_question_batches)"
            )
    ordered = sorted(questions.items(), key=lambda item: -len(item[0]))

    def respond(context: str) -> str:
        sample_id = next((i for q, i in ordered if q in context), None)
        if sample_id is None:
            return "I cannot tell.</think>\n<answer>A</answer>"
        sample = by_id[sample_id]
        planned = teacher_calls(sample, plan.get(sample_id, strategy))
        if not planned:
            return f"{DIRECT_THOUGHT}</think>\n<answer>{sample.answer}</answer>"
        answered = context.count("<tool_response>")
        # parallel: every call in the first turn; sequential: the next call per turn
        todo = planned[answered:] if calls_per_turn else ([] if answered else planned)
        if todo:
            calls = "\n".join(todo[: calls_per_turn or len(todo)])
            return f"{TOOL_THOUGHT}</think>\n{calls}"
        return f"The crops show the answer.</think>\n<answer>{sample.answer}</answer>"

    return respond
