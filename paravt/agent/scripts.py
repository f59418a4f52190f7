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


def needle_teacher(samples: Sequence[Sample], strategy: str = "oracle"):
    """A responder that writes the scripted turns for whichever sample the context is about."""
    by_question = {s.question: s for s in samples}

    def respond(context: str) -> str:
        sample = next((s for q, s in by_question.items() if q in context), None)
        if sample is None:
            return "I cannot tell.</think>\n<answer>A</answer>"
        if "<tool_response>" not in context:
            calls = "\n".join(call_text(s, e) for s, e in search_windows(sample, strategy))
            return f"The frames are too sparse; crop the candidate windows.</think>\n{calls}"
        return f"The crops show the answer.</think>\n<answer>{sample.answer}</answer>"

    return respond
