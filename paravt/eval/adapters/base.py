"""What every benchmark adapter shares: the item type, the protocol, and strict row reading.

An adapter turns one benchmark's official annotation file into `EvalItem`s (a `Sample` with the
full user text the model sees, plus breakdown labels) and scores final responses. Rows are read
strictly: a missing or mistyped field raises `AnnotationError` naming the file, the row and the
field, because docs/evaluation.md infers some fields and a silent default would corrupt a reported
number. A missing video is not an error: the item is kept, flagged, scored wrong and counted.

Every item is scored twice: by the benchmark's official rule (`paravt.eval.scoring`) and by
lmms-eval's (`paravt.eval.lmms_scoring`, its keys prefixed `LMMS`: "lmms_eval/correct"), so
predictions.jsonl keeps both and a report carries both figures ("accuracy", "lmms_eval/accuracy").

This module deliberately does not decode video, run a model or know any one benchmark's schema.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from paravt.data.datasets import DataFileError, load_rows
from paravt.eval import lmms_scoring, scoring
from paravt.eval.metrics import CategoryMean
from paravt.types import Sample

MCQ_FORCED_ANSWER = (
    "You have no tool calls left. Answer now with only the letter of the correct option, "
    "inside <answer> </answer>."
)
MCQ_INSTRUCTION = "Answer with the option letter only."


@dataclass(frozen=True)
class EvalItem:
    """One benchmark question: the sample, its breakdown labels, and whether its video is absent."""

    sample: Sample
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    video_missing: bool = False


class Benchmark(Protocol):
    name: str
    forced_answer: str

    def load(
        self, annotations: str, video_root: str, limit: int | None = None
    ) -> list[EvalItem]: ...

    def score(self, item: EvalItem, response: str) -> dict[str, float]: ...

    def report(
        self, items: Sequence[EvalItem], scores: Sequence[Mapping[str, float]]
    ) -> dict[str, float]: ...


class AnnotationError(ValueError):
    """A malformed annotation row (names the file, the row, the field and what was expected), or
    an annotation file that cannot be read at all (field `FILE`; names the file and the line)."""

    def __init__(self, path: str, row: int | str, field_name: str, reason: str) -> None:
        self.path, self.row, self.field = path, row, field_name
        if field_name == FILE:  # the whole file: `reason` already names it (and the line)
            super().__init__(reason)
        else:
            super().__init__(f"{path}: row {row}: field {field_name!r}: {reason}")

    @classmethod
    def unreadable(cls, path: str, error: DataFileError) -> AnnotationError:
        """A file `paravt.data.datasets` could not read (`error` names it, the line, the cause)."""
        return cls(path, "-", FILE, f"{error}; pass the benchmark's own annotation file")


FILE = "<file>"  # AnnotationError's field for a problem with the whole file


# ------------------------------------------------------------------ reading rows


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a .parquet, .json (a list of objects) or .jsonl annotation file, read by
    `paravt.data.datasets.load_rows`; a file it cannot read is one `AnnotationError`."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"annotation file not found: {path}; pass the downloaded file")
    try:
        return load_rows(path)
    except DataFileError as error:
        raise AnnotationError.unreadable(path, error) from error


_KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "list": (list, tuple),
    "dict": (dict,),
    "id": (str, int),  # an identifier: a string or an integer
}


def get_field(row: Mapping[str, Any], name: str, kind: str, path: str, index: int) -> Any:
    """`row[name]`, required to exist, be non-None and of `kind` ("str", "int", "float", "list",
    "dict", "id"); a string must be non-empty after stripping."""
    value = row.get(name)
    if value is None:
        raise AnnotationError(path, index, name, f"missing (row has: {', '.join(sorted(row))})")
    ok = isinstance(value, _KINDS[kind]) and not isinstance(value, bool)
    if not ok or (isinstance(value, str) and not value.strip()):
        raise AnnotationError(path, index, name, f"expected a non-empty {kind}, got {value!r}")
    return value


# Bad rows: strict by default (an adapter used on its own raises on the first bad row); inside
# `collect_row_errors()` (what the runner does unless fail_fast) a bad row is skipped and its
# error recorded, so one malformed row does not stop a 2,700-question evaluation.
_ROW_ERRORS: contextvars.ContextVar[list[AnnotationError] | None] = contextvars.ContextVar(
    "paravt_row_errors", default=None
)


@contextlib.contextmanager
def collect_row_errors() -> Iterator[list[AnnotationError]]:
    """Within the block, `build_items` skips bad rows and appends their errors to the list."""
    errors: list[AnnotationError] = []
    token = _ROW_ERRORS.set(errors)
    try:
        yield errors
    finally:
        _ROW_ERRORS.reset(token)


def build_items(
    rows: Iterable[tuple[int, dict[str, Any]]],  # (row number in the file, row)
    make: Callable[[dict[str, Any], int], EvalItem],
    path: str,
    layout: str,
) -> list[EvalItem]:
    """`make(row, index)` for each row; bad rows raise, or are skipped inside
    `collect_row_errors()`. When every row is bad the file is in the wrong layout: one error
    saying which layout was expected, whatever the mode."""
    items: list[EvalItem] = []
    errors: list[AnnotationError] = []
    collector = _ROW_ERRORS.get()
    rows = list(rows)
    for index, row in rows:
        try:
            items.append(make(row, index))
        except AnnotationError as error:
            errors.append(error)
    if rows and not items:
        raise AnnotationError(
            path,
            "all",
            "<layout>",
            f"no row fits the {layout} layout (first error: "
            f"{errors[0]}); pass the benchmark's own annotation file (see its docstring)",
        )
    if errors and collector is None:
        raise errors[0]
    if collector is not None:
        collector.extend(errors)
    return items


def take(rows: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The first `limit` rows (all when None); a negative limit is a user error."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    return rows if limit is None else rows[:limit]


def resolve_video(candidates: Sequence[str]) -> tuple[str, bool]:
    """The first existing path of `candidates` (absolute), else the first one and missing=True."""
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path), False
    return os.path.abspath(candidates[0]), True


def check_unique_ids(items: Sequence[EvalItem], path: str) -> list[EvalItem]:
    seen: set[str] = set()
    for index, item in enumerate(items):
        if item.sample.id in seen:
            raise AnnotationError(path, index, "id", f"duplicate id {item.sample.id!r}")
        seen.add(item.sample.id)
    return list(items)


# ------------------------------------------------------------------ multiple choice


def mcq_prompt(question: str, options: Sequence[str], prefix: str = "") -> str:
    """The MCQ user text: `prefix` + "Question: q\\nOptions:\\nA. x\\nB. y\\nAnswer with ..."."""
    letters = scoring.option_letters(len(options))
    lettered = "\n".join(f"{letter}. {text}" for letter, text in zip(letters, options, strict=True))
    return f"{prefix}Question: {question.strip()}\nOptions:\n{lettered}\n{MCQ_INSTRUCTION}"


def check_gold(gold: str, options: Sequence[str], path: str, index: int, name: str) -> str:
    """The gold letter, upper-cased, required to be one of the options' letters."""
    letter = gold.strip().upper()
    letters = scoring.option_letters(len(options))
    if len(letter) != 1 or letter not in letters:
        raise AnnotationError(path, index, name, f"gold {gold!r} is not one of {list(letters)}")
    return letter


Loader = Callable[..., list[EvalItem]]  # (annotations, video_root, limit) -> items
HeadlineFn = Callable[[Mapping[str, float]], dict[str, float]]


def _no_headline(_metrics: Mapping[str, float]) -> dict[str, float]:
    return {}


def category_labels(items: Sequence[EvalItem]) -> tuple[list[str], list[list[str]]]:
    """(all categories "key=label", sorted; each item's categories) from the items' groups."""
    per_item = [
        [f"{key}={label}" for key, labels in item.groups.items() for label in labels]
        for item in items
    ]
    return sorted({c for labels in per_item for c in labels}), per_item


def summarize(
    items: Sequence[EvalItem],
    scores: Sequence[Mapping[str, float]],
    names: Mapping[str, str],  # score key -> reported metric name, e.g. {"correct": "accuracy"}
) -> dict[str, float]:
    """Overall and per-group means of each score (through `CategoryMean`), plus the counts
    "missing_videos", "num_samples", "unparseable" (answers no rule could read) and "excluded"
    (items left out of the denominators under the "exclude" policy)."""
    if len(items) != len(scores):
        raise ValueError(f"{len(items)} items but {len(scores)} scores")
    categories, labels = category_labels(items)
    weights = torch.tensor([0.0 if s.get("excluded") else 1.0 for s in scores])
    metrics: dict[str, float] = {}
    for key, name in names.items():
        metric = CategoryMean(categories)
        values = torch.tensor([float(s[key]) for s in scores])
        metric.update(values, categories=labels if categories else None, weights=weights)
        result = metric.per_category()
        metrics[name] = result.pop("overall")
        metrics.update({f"{name}/{c}": v for c, v in result.items()})
    metrics["missing_videos"] = float(sum(item.video_missing for item in items))
    metrics["num_samples"] = float(len(items))
    metrics["unparseable"] = float(sum(s.get("parsed", 1.0) == 0.0 for s in scores))
    metrics["excluded"] = float(len(scores) - weights.sum().item())
    return metrics


# ------------------------------------------------------------------ lmms-eval's figures

LMMS = "lmms_eval/"  # the prefix of lmms-eval's per-item scores and reported figures
LMMS_CORRECT = LMMS + "correct"
LMMS_RULES = ("mcq", "longvideobench", "mmvu")  # paravt.eval.lmms_scoring's multiple-choice rules
LmmsSummary = Callable[[Sequence[EvalItem], Sequence[float]], dict[str, float]]


def lmms_choice_score(rule: str, sample: Sample, response: str) -> dict[str, float]:
    """lmms-eval's per-item result under `rule` (one of `LMMS_RULES`): {"lmms_eval/correct"}, and
    for LongVideoBench whether the letter was a random guess ("lmms_eval/guessed")."""
    if rule == "longvideobench":
        letter, guessed = lmms_scoring.longvideobench_letter(
            response, len(sample.options), key=sample.id
        )
        return {LMMS_CORRECT: float(letter == sample.answer), LMMS + "guessed": float(guessed)}
    if rule == "mmvu":
        choices = dict(zip(scoring.LETTERS, sample.options, strict=False))
        return {LMMS_CORRECT: float(lmms_scoring.mmvu_correct(response, sample.answer, choices))}
    return {LMMS_CORRECT: float(lmms_scoring.mcq_correct(response, sample.answer))}


def lmms_means(
    items: Sequence[EvalItem], scores: Sequence[Mapping[str, float]], key: str, name: str
) -> dict[str, float]:
    """`name` and `name/<group>=<label>`: plain means of `score[key]` over the items that have it
    (no exclusion policy: lmms-eval has none); {} when none has it (an older predictions file)."""
    pairs = [(item, float(s[key])) for item, s in zip(items, scores, strict=True) if key in s]
    if not pairs:
        return {}
    categories, labels = category_labels([item for item, _ in pairs])
    metric = CategoryMean(categories)
    metric.update(torch.tensor([v for _, v in pairs]), categories=labels if categories else None)
    result = metric.per_category()
    return {name: result.pop("overall"), **{f"{name}/{c}": v for c, v in result.items()}}


def lmms_accuracy(items: Sequence[EvalItem], correct: Sequence[float]) -> dict[str, float]:
    """Video-MME's and LVBench's lmms-eval figure: the plain accuracy."""
    return {LMMS + "accuracy": lmms_scoring.accuracy(correct)}


@dataclass(frozen=True)
class MultipleChoiceBenchmark:
    """A multiple-choice benchmark: `loader` reads its schema, scoring is shared."""

    name: str
    loader: Loader
    forced_answer: str = MCQ_FORCED_ANSWER
    headline: HeadlineFn = _no_headline
    forced_answer_max_tokens: int | None = 64  # docs/evaluation.md: a letter, <= 64 tokens
    unparseable: str = "wrong"  # scoring.UNPARSEABLE_POLICIES: wrong | exclude | random
    lmms_rule: str = "mcq"  # LMMS_RULES: lmms-eval's per-item rule for this benchmark
    lmms_summary: LmmsSummary = lmms_accuracy  # lmms-eval's aggregation of its per-item results

    def __post_init__(self) -> None:
        if self.unparseable not in scoring.UNPARSEABLE_POLICIES:
            raise ValueError(
                f"benchmark {self.name!r}: unparseable={self.unparseable!r}; choose one of "
                f"{scoring.UNPARSEABLE_POLICIES}"
            )
        if self.lmms_rule not in LMMS_RULES:
            raise ValueError(f"benchmark {self.name!r}: lmms_rule={self.lmms_rule!r}: {LMMS_RULES}")

    def load(self, annotations: str, video_root: str, limit: int | None = None) -> list[EvalItem]:
        return check_unique_ids(self.loader(annotations, video_root, limit), annotations)

    def score(self, item: EvalItem, response: str) -> dict[str, float]:
        if item.video_missing:
            return {"correct": 0.0, LMMS_CORRECT: 0.0}
        sample = item.sample
        official = scoring.choice_score(
            response, sample.answer, sample.options, self.unparseable, key=sample.id
        )
        return {**official, **lmms_choice_score(self.lmms_rule, sample, response)}

    def report(
        self, items: Sequence[EvalItem], scores: Sequence[Mapping[str, float]]
    ) -> dict[str, float]:
        metrics = summarize(items, scores, {"correct": "accuracy"})
        metrics.update(self.headline(metrics))
        if not all(LMMS_CORRECT in s for s in scores):  # a predictions file from before
            return metrics
        metrics.update(lmms_means(items, scores, LMMS_CORRECT, LMMS + "accuracy"))
        metrics.update(self.lmms_summary(items, [float(s[LMMS_CORRECT]) for s in scores]))
        return metrics
