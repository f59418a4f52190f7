"""Scripted agent behaviour on the synthetic needle task: the teacher for self-traced trajectories.

`needle_teacher` returns a responder for `paravt.rollout.scripted.ScriptedEngine`. In its first
turn it thinks briefly and calls `crop_video` in parallel; after the tool responses it answers.
Two search strategies: "oracle" crops around the ground-truth windows; "search" covers the
question's hinted span with as many parallel crops as the crop cap requires (what a good policy
should learn to do). It deliberately knows nothing of tokens or models: text in, text out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from paravt.types import Sample

STRATEGIES = ("oracle", "search")


def call_text(start: float, end: float) -> str:
    args = {"video_path": "video.mp4", "start_time": round(start, 1), "end_time": round(end, 1)}
    return "<tool_call>" + json.dumps({"name": "crop_video", "arguments": args}) + "</tool_call>"


def search_windows(
    sample: Sample, strategy: str, max_span: float = 16.0, margin: float = 1.0
) -> list[tuple[float, float]]:
    """The windows the teacher crops for `sample`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown teacher strategy {strategy!r}: choose one of {STRATEGIES}")
    if strategy == "oracle" and sample.windows:
        return [(max(0.0, s - margin), e + margin) for s, e in sample.windows]
    lo, hi = sample.extra.get("hint_window") or (0.0, float(sample.extra.get("duration", 64.0)))
    pieces = max(1, math.ceil((hi - lo) / max_span))
    step = (hi - lo) / pieces
    return [(lo + i * step, lo + (i + 1) * step) for i in range(pieces)]


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


def needle_teacher(samples: Sequence[Sample], strategy: str = "oracle"):
    """A responder that writes the scripted turns for whichever sample the context is about.

    Samples are keyed by id; a context is matched to the sample whose question it contains (the
    longest such question, so a question that is a prefix of another cannot steal its context).
    Samples sharing a question text are refused: split them with `distinct_question_batches`.
    """
    by_id = {s.id: s for s in samples}
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
        if "<tool_response>" not in context:
            calls = "\n".join(call_text(s, e) for s, e in search_windows(sample, strategy))
            return f"The frames are too sparse; crop the candidate windows.</think>\n{calls}"
        return f"The crops show the answer.</think>\n<answer>{sample.answer}</answer>"

    return respond
