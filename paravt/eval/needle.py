"""The synthetic needle benchmark: paravt's own held-out needle split as a `Benchmark` adapter.

It lets the evaluation runner be exercised end to end on CPU (docs/evaluation.md, "Per benchmark").
Rows are paravt-layout prompt rows (`paravt.video.synthetic.generate` writes `eval.jsonl` /
`eval.parquet`); relative video paths resolve against `video_root`, or the annotation file's
folder when `video_root` is empty. Rows are read strictly: a malformed row raises, since a
skipped row would silently change the denominator of a reported number.

Scores: "accuracy" is the option-letter match for mcq items, the temporal IoU for tvg items and,
for open-ended (oe) rows, the training reward's open-ended score of the answer segment: 1 for an
exact match, else token F1, or, with a judge (`paravt.eval.judging`), the judge's 1 / 0.5 / 0
(token F1 when it fails): the same quantity as the training reward's R_acc. The forced answer
is the agent's generic one, since a needle split mixes letters and intervals. Report: accuracy
overall and by family and question type, plus missing_videos and num_samples; beside them
"lmms_eval/accuracy": lmms-eval's rules (`paravt.eval.lmms_scoring`; lmms-eval has no needle
task): its shared letter extractor on the item's letters for mcq rows, its Charades-STA parser
and IoU for tvg rows, with the needle's own interval form `[start, end]` (the form its gold
answers and prompt use, which that parser reads as two separate numbers) first rewritten as
Charades' `start - end`; oe rows have no lmms-eval rule and stay out of that figure.

This module deliberately does not generate needle data nor run a model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from paravt.agent.prompts import FORCED_ANSWER
from paravt.data.datasets import load_rows
from paravt.data.schemas import DataRowError, row_to_sample
from paravt.eval import lmms_scoring, scoring
from paravt.eval.adapters.base import (
    LMMS,
    AnnotationError,
    EvalItem,
    build_items,
    check_unique_ids,
    lmms_means,
    summarize,
    take,
)
from paravt.rewards.accuracy import accuracy_reward, exact_match, extract_answer

_BRACKETED = re.compile(r"\[\s*(\d+(?:\.\d+)?)\s*,\s*(\d+(?:\.\d+)?)\s*\]")


def charades_form(response: str) -> str:
    """`response` with every needle interval `[a, b]` written as Charades-STA's `a - b`."""
    return _BRACKETED.sub(r"\1 - \2", response)


def load_needle(annotations: str, video_root: str = "", limit: int | None = None) -> list[EvalItem]:
    """`EvalItem`s of a needle split; a video absent on disk is kept and flagged missing."""
    if not os.path.isfile(annotations):
        raise FileNotFoundError(
            f"needle annotations not found: {annotations}; pass benchmark.annotations=FILE "
            "(`make demo` writes artifacts/needle_demo/eval.jsonl, "
            "`paravt make-needle-data --out DIR` writes DIR/eval.jsonl)"
        )
    base_dir = video_root or os.path.dirname(os.path.abspath(annotations))

    def make(row: dict, index: int) -> EvalItem:
        try:
            sample = row_to_sample(row, base_dir=base_dir, row_index=index, layout="paravt")
        except DataRowError as error:
            raise AnnotationError(annotations, index, error.field, error.reason) from error
        labels = {"question_type": (sample.question_type,)}
        family = sample.extra.get("family")
        if family:
            labels["family"] = (str(family),)
        missing = not os.path.isfile(sample.video)
        return EvalItem(sample=sample, groups=labels, video_missing=missing)

    rows = take(load_rows(annotations), limit)
    return build_items(enumerate(rows), make, annotations, "paravt needle (eval.jsonl)")


@dataclass(frozen=True)
class NeedleBenchmark:
    """Multiple-choice and grounding needle questions, scored like the training accuracy."""

    name: str = "needle"
    forced_answer: str = FORCED_ANSWER
    open_ended_rule: str = "token F1"  # oe rows without a judge, or when the judge fails

    def load(
        self, annotations: str, video_root: str = "", limit: int | None = None
    ) -> list[EvalItem]:
        """The split's items; `video_root` is optional: the generator writes video paths
        relative to the annotation file's folder, which is the default."""
        return check_unique_ids(load_needle(annotations, video_root, limit), annotations)

    def score(self, item: EvalItem, response: str) -> dict[str, float]:
        sample = item.sample
        if item.video_missing:
            return (
                {"accuracy": 0.0}
                if sample.question_type == "oe"
                else {"accuracy": 0.0, LMMS_ACC: 0.0}
            )
        if sample.question_type == "tvg":
            gold = sample.windows[0] if sample.windows else (0.0, 0.0)
            return {
                "accuracy": scoring.score_grounding(response, gold)["iou"],
                LMMS_ACC: lmms_scoring.charades_iou(charades_form(response), gold),
            }
        if sample.question_type == "oe":
            return {"accuracy": accuracy_reward(extract_answer(response), sample.answer, "oe")}
        letters = scoring.option_letters(len(sample.options))
        return {
            "accuracy": scoring.score_choice(response, sample.answer, sample.options)["correct"],
            LMMS_ACC: float(lmms_scoring.mcq_correct(response, sample.answer, letters)),
        }

    def judge_query(self, item: EvalItem, response: str) -> tuple[str, str, str] | None:
        """(answer, gold, question) for the judge; None for an empty or exact answer (scored
        1 or 0 without asking, as in training's `paravt.rewards.judged.judge_items`)."""
        answer = extract_answer(response)
        if not answer.strip() or exact_match(answer, item.sample.answer):
            return None
        return answer, item.sample.answer, item.sample.question

    def from_verdict(self, item: EvalItem, verdict: float) -> dict[str, float]:
        return {"accuracy": verdict}

    def report(
        self, items: Sequence[EvalItem], scores: Sequence[Mapping[str, float]]
    ) -> dict[str, float]:
        metrics = summarize(items, scores, {"accuracy": "accuracy"})
        return {**metrics, **lmms_means(items, scores, LMMS_ACC, LMMS_ACC)}


LMMS_ACC = LMMS + "accuracy"


def needle() -> NeedleBenchmark:
    return NeedleBenchmark()
