"""Charades-STA (test, temporal grounding): annotations to `EvalItem`s, IoU scoring, mIoU/R@k.

Two layouts are read: the HF `lmms-lab/charades_sta` parquet (video: a file name, with extension
(inferred; `.mp4` is tried when absent), caption, timestamp: [start, end] seconds) and the
original text format, one `VID start end##sentence` per line (video `{video_root}/{VID}.mp4`).
Gold times are rounded to the text annotation's precision (`GOLD_DECIMALS`, one decimal): the
parquet's float16 columns hold 24.296875 for the annotation's 24.3 (errors up to 0.0125 s).
Items get id f"{video stem}-{row}", the grounding prompt as question, the gold as "[s, e]" and
as `Sample.windows`. Scores: IoU = intersection / (max end - min start); an unparseable answer or
a missing video scores IoU 0 and stays in the denominator. Report: miou, r@0.3, r@0.5, r@0.7,
and beside them lmms-eval's (`paravt.eval.lmms_scoring`: its parser, on the unrounded gold
times it reads, over distinct (video, caption, gold) keys): lmms_eval/miou, lmms_eval/r@0.3, ....

This module deliberately does not parse intervals itself (see `paravt.eval.scoring`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from paravt.data.datasets import DataFileError, read_text
from paravt.eval import lmms_scoring, scoring
from paravt.eval.adapters.base import (
    LMMS,
    AnnotationError,
    EvalItem,
    build_items,
    check_unique_ids,
    get_field,
    read_rows,
    resolve_video,
    summarize,
    take,
)
from paravt.eval.metrics import GroundingMetric
from paravt.types import Sample

ANSWER_FORM = "The event happens in the X.X - Y.Y seconds."
FORCED_ANSWER = f"You have no tool calls left. Answer now in exactly this form: {ANSWER_FORM}"
PROMPT = (
    'Find the start and end time of this event in the video: "{caption}"\n'
    'Answer in the form "The event happens in the start - end seconds."'
)
GOLD_DECIMALS = 1  # the original `VID start end##sentence` file writes one decimal
METRIC_NAMES = {"iou": "miou", **{f"r@{t}": f"r@{t}" for t in scoring.RECALL_THRESHOLDS}}


def grounding_prompt(caption: str) -> str:
    return PROMPT.format(caption=caption.strip())


def _interval(value: Any, path: str, index: int) -> tuple[float, float]:
    """A finite [start, end] pair with start <= end (a reversed pair is a malformed row)."""
    ok = isinstance(value, (list, tuple)) and len(value) == 2
    pair = tuple(float(v) for v in value) if ok and all(_is_number(v) for v in value) else None
    if pair is None or not all(math.isfinite(v) for v in pair) or pair[0] > pair[1]:
        raise AnnotationError(path, index, "timestamp", f"expected [start, end], got {value!r}")
    return pair


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


BAD_LINE = "<bad line>"  # parse_txt's key for a malformed line (no annotation field is named so)


def parse_txt(path: str) -> list[dict[str, Any]]:
    """Rows {video, caption, timestamp} from the original `VID start end##sentence` lines.

    A malformed line becomes a row {BAD_LINE: reason} that `_item` refuses, so it is skipped and
    reported like any bad row (or raised, outside `collect_row_errors`)."""
    rows: list[dict[str, Any]] = []
    try:
        text = read_text(Path(path))
    except DataFileError as error:
        raise AnnotationError.unreadable(path, error) from error
    for line in [line.strip() for line in text.splitlines() if line.strip()]:
        head, sep, caption = line.partition("##")
        parts = head.split()
        try:
            start, end = float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            start = end = math.nan
        if not sep or len(parts) != 3 or math.isnan(start + end):
            rows.append({BAD_LINE: f"expected 'VID start end##sentence', got {line!r}"})
        else:
            rows.append({"video": parts[0] + ".mp4", "caption": caption, "timestamp": [start, end]})
    return rows


def _item(
    row: dict[str, Any], index: int, path: str, root: str, decimals: int | None = GOLD_DECIMALS
) -> EvalItem:
    if BAD_LINE in row:
        raise AnnotationError(path, index, "line", row[BAD_LINE])
    name = get_field(row, "video", "str", path, index).strip()
    caption = get_field(row, "caption", "str", path, index)
    start, end = _interval(get_field(row, "timestamp", "list", path, index), path, index)
    raw = (start, end)  # what lmms-eval compares with
    if decimals is not None:  # float16 parquet columns: 24.296875 is the annotation's 24.3
        start, end = round(start, decimals), round(end, decimals)
    candidates = [os.path.join(root, name)]
    if not os.path.splitext(name)[1]:
        candidates.insert(0, os.path.join(root, name + ".mp4"))
    video, missing = resolve_video(candidates)
    stem = os.path.splitext(os.path.basename(name))[0]
    sample = Sample(
        id=f"{stem}-{index}",
        video=video,
        question=grounding_prompt(caption),
        answer=f"[{round(start, 2):g}, {round(end, 2):g}]",
        question_type="tvg",
        windows=((start, end),),
        data_source="charades",
        extra={"caption": caption.strip(), "timestamp": raw},
    )
    return EvalItem(sample=sample, groups={}, video_missing=missing)


def load_charades(
    annotations: str,
    video_root: str,
    limit: int | None = None,
    decimals: int | None = GOLD_DECIMALS,
) -> list[EvalItem]:
    is_txt = annotations.endswith(".txt")
    if is_txt and not os.path.isfile(annotations):
        raise FileNotFoundError(
            f"annotation file not found: {annotations}; pass the downloaded file"
        )
    rows = take(parse_txt(annotations) if is_txt else read_rows(annotations), limit)
    make = partial(_item, path=annotations, root=video_root, decimals=decimals)
    return build_items(enumerate(rows), make, annotations, "Charades-STA")


@dataclass(frozen=True)
class CharadesBenchmark:
    """Temporal grounding on Charades-STA."""

    name: str = "charades"
    forced_answer: str = FORCED_ANSWER
    forced_answer_max_tokens: int | None = 128  # docs/evaluation.md: an interval, <= 128 tokens

    def load(self, annotations: str, video_root: str, limit: int | None = None) -> list[EvalItem]:
        return check_unique_ids(load_charades(annotations, video_root, limit), annotations)

    def score(self, item: EvalItem, response: str) -> dict[str, float]:
        if item.video_missing:
            return {**scoring.grounding_scores(0.0), LMMS_IOU: 0.0}
        gold = item.sample.extra.get("timestamp", item.sample.windows[0])
        official = scoring.score_grounding(response, item.sample.windows[0])
        return {**official, LMMS_IOU: lmms_scoring.charades_iou(response, gold)}

    def report(
        self, items: Sequence[EvalItem], scores: Sequence[Mapping[str, float]]
    ) -> dict[str, float]:
        metric = GroundingMetric()
        metric.update(torch.tensor([float(s["iou"]) for s in scores], dtype=torch.float64))
        metrics = summarize(items, scores, {})
        metrics.update(metric.per_threshold())
        if all(LMMS_IOU in s for s in scores):  # absent from a predictions file from before
            keys = [lmms_key(item) for item in items]
            lmms = lmms_scoring.charades_summary(keys, [float(s[LMMS_IOU]) for s in scores])
            metrics.update({LMMS + k: v for k, v in lmms.items()})
        return metrics


LMMS_IOU = LMMS + "iou"


def lmms_key(item: EvalItem) -> tuple:
    """lmms-eval's per-item key: (video file, caption, gold); a repeated key counts once."""
    sample = item.sample
    gold = tuple(sample.extra.get("timestamp", sample.windows[0]))
    return (os.path.basename(sample.video), sample.extra.get("caption", ""), gold)


def charades() -> CharadesBenchmark:
    return CharadesBenchmark()
