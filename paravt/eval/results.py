"""What an evaluation run writes: the predictions file, the run identity, the results files.

- `predictions.jsonl`: one JSON line per item, appended and fsync'ed after every batch. A kill
  mid-append leaves a truncated last line: `read_predictions` cuts it (with a warning) so the
  resumed run re-runs that item; a line id seen twice keeps the first (never double-counted).
- `run_config.json`: the run identity (benchmark, model path, annotation file, engine, mode,
  protocol). Resuming into an out_dir written under another identity is refused with a message
  naming what changed, so a second model never inherits the first one's predictions.
- Two scorers' figures: the official rule's under plain names ("accuracy", "miou") and lmms-eval's
  beside them ("lmms_eval/accuracy"); `primary_scoring(metrics, "lmms_eval")` swaps them (the
  official ones then under "official/..."). The tables show the pairs side by side, the chosen
  scorer first.
- `metrics.json` ({"run": identity, "metrics": {...}, "problems": [...]}, plus "judge": the LLM
  judge's counts when the benchmark has open-ended items or a judge was configured) and
  `results.md` (the same header and judge line, the metrics table and the list of missing /
  undecodable videos and bad rows).

This module deliberately does not run a model or score answers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from paravt.eval.judging import judge_line
from paravt.eval.lmms_scoring import LMMS_EVAL_VERSION

log = logging.getLogger(__name__)

PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"
RESULTS = "results.md"
RUN_CONFIG = "run_config.json"
COUNTS = (
    "num_samples",
    "missing_videos",
    "video_errors",
    "bad_rows",
    "unparseable",
    "excluded",
    "open_ended",
    "judge_scored",
    "judge_fallbacks",
)


SCORINGS = ("official", "lmms_eval")  # benchmark.scoring: whose figures take the plain names
_PREFIX = {"official": "official/", "lmms_eval": "lmms_eval/"}
_TITLE = {"official": "official", "lmms_eval": f"lmms-eval {LMMS_EVAL_VERSION}"}


def primary_scoring(metrics: Mapping[str, float], scoring: str) -> dict[str, float]:
    """`metrics` (official figures plain, lmms-eval's under "lmms_eval/") with `scoring`'s
    figures under the plain names and the other scorer's under its prefix."""
    if scoring not in SCORINGS:
        raise ValueError(f"benchmark.scoring={scoring!r}: choose one of {', '.join(SCORINGS)}")
    if scoring == "official":
        return dict(metrics)
    lmms = _PREFIX["lmms_eval"]
    out = {}
    for key, value in metrics.items():
        if key.startswith(lmms):
            out[key[len(lmms) :]] = value
            if key[len(lmms) :] in metrics:
                out[_PREFIX["official"] + key[len(lmms) :]] = metrics[key[len(lmms) :]]
        elif lmms + key not in metrics:
            out[key] = value
    return out


def scorer_columns(metrics: Mapping[str, float]) -> list[tuple[str, str]]:
    """(title, key prefix) of the value columns: the plain names' scorer first, then the other
    one's when `metrics` has its figures ([("value", "")] for one scorer)."""
    for other in SCORINGS:
        if any(k.startswith(_PREFIX[other]) for k in metrics):
            first = next(s for s in SCORINGS if s != other)
            return [(_TITLE[first], ""), (_TITLE[other], _PREFIX[other])]
    return [("value", "")]


def metric_rows(metrics: Mapping[str, float]) -> tuple[list[str], list[list[str]]]:
    """(titles, rows) of the metrics table: one row per metric name, one column per scorer."""
    columns = scorer_columns(metrics)
    prefixes = [p for _, p in columns if p]
    names = sorted({next((k[len(p) :] for p in prefixes if k.startswith(p)), k) for k in metrics})
    rows = []
    for name in names:
        cells = [metrics.get(prefix + name) for _, prefix in columns]
        rows.append([name] + ["" if v is None else format_value(name, v) for v in cells])
    return ["metric"] + [title for title, _ in columns], rows


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
                records.setdefault(str(record["id"]), record)
        except (ValueError, KeyError, TypeError) as error:
            if not (last or (number == len(lines) - 1 and not lines[-1])):
                raise ValueError(
                    f"{path}: line {number} is not a prediction record ({error}); "
                    "delete that line (or the file) and run again"
                ) from error
            log.warning("%s: ignoring a truncated last line (%d bytes)", path, len(line))
            with open(path, "r+b") as handle:
                handle.truncate(offset)
            return records
        offset += len(line) + 1
    if lines[-1].strip():  # a complete last record whose newline was not written yet
        with open(path, "ab") as handle:
            handle.write(b"\n")
    return records


def append_predictions(path: str, records: Sequence[Mapping[str, Any]]) -> None:
    """Append records as JSON lines in one write and push them to disk."""
    if not records:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        handle.flush()
        os.fsync(handle.fileno())


def check_run_identity(out_dir: str, identity: Mapping[str, Any]) -> None:
    """Record `identity` in out_dir, or refuse when out_dir was written under another one."""
    path = os.path.join(out_dir, RUN_CONFIG)
    if not os.path.isfile(path):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(dict(identity), handle, indent=2, sort_keys=True)
        return
    with open(path, encoding="utf-8") as handle:
        before = json.load(handle)
    changed = [_change(k, before.get(k), identity.get(k)) for k in sorted(before | identity)]
    changed = [c for c in changed if c]
    if changed:
        raise ValueError(
            f"{out_dir} holds predictions of another run ({'; '.join(changed)}); resuming would "
            "mix them: use a new out_dir (or leave out_dir unset) or delete the old one"
        )


def _change(key: str, old: Any, new: Any) -> str:
    if old == new:
        return ""
    if isinstance(old, dict) and isinstance(new, dict):
        inner = [_change(f"{key}.{k}", old.get(k), new.get(k)) for k in sorted(old | new)]
        return "; ".join(c for c in inner if c)
    return f"{key}: {old!r} then, {new!r} now"


def problems(records: Sequence[Mapping[str, Any]], bad_rows: Sequence[str]) -> list[str]:
    """One line per missing video, undecodable video and skipped annotation row."""
    out = [f"bad row: {reason}" for reason in bad_rows]
    for r in records:
        if r.get("video_missing"):
            out.append(f"missing video: {r['id']}: {r.get('video', '')}")
        elif r.get("error"):
            out.append(f"undecodable video: {r['id']}: {r['error']}")
    return out


def format_value(key: str, value: float) -> str:
    """Fractions as percentages with one decimal; counts and call rates as plain numbers."""
    if key.rsplit("/", 1)[-1] in COUNTS or key.endswith("tool_calls_per_sample"):
        return f"{value:g}"
    return f"{100 * value:.1f}"


def format_metrics(name: str, metrics: Mapping[str, float]) -> str:
    """A plain-text table of `metrics`, fractions shown as percentages: one value column, or one
    per scorer (`metric_rows`)."""
    titles, rows = metric_rows(metrics)
    widths = [max(len(r[i]) for r in [titles, *rows]) for i in range(len(titles))]
    widths[0] = max(widths[0], 6)
    lines = [f"== {name} =="]
    for row in [titles, *rows]:
        cells = [f"{c:<{w}}" for c, w in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def markdown_header(identity: Mapping[str, Any]) -> list[str]:
    protocol = json.dumps(identity.get("protocol", {}), sort_keys=True)
    keys = ("benchmark", "model", "annotations", "engine", "mode")
    return [f"- {k}: `{identity.get(k, '')}`" for k in keys] + [f"- protocol: `{protocol}`"]


def write_results(
    out_dir: str,
    identity: Mapping[str, Any],
    metrics: Mapping[str, float],
    issues: Sequence[str],
    judge: Mapping[str, Any] | None = None,
) -> None:
    """metrics.json and results.md: header (identity), metrics, problems; and the judge's
    report (`paravt.eval.judging.judge_report`) when the run has one."""
    payload = {"run": dict(identity), "metrics": dict(metrics), "problems": list(issues)}
    if judge is not None:
        payload["judge"] = dict(judge)
    with open(os.path.join(out_dir, METRICS), "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
    lines = [f"# {identity.get('benchmark', '')} ({identity.get('mode', '')})", ""]
    lines += markdown_header(identity)
    if judge is not None:
        lines.append(f"- {judge_line(judge)}")
    titles, rows = metric_rows(metrics)
    lines += ["", "| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if issues:
        lines += ["", f"## Problems ({len(issues)})", ""] + [f"- {p}" for p in issues]
    with open(os.path.join(out_dir, RESULTS), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def load_metrics(out_dir: str) -> dict[str, Any]:
    with open(os.path.join(out_dir, METRICS), encoding="utf-8") as handle:
        return json.load(handle)
