"""One table comparing evaluation runs (modes, models), in the layout of the paper's tables.

`comparison_table(rows)` is pure: one row per run (its label: the mode, then every override that
differs between the runs, e.g. `parallel protocol.frame_budget=2`; `job_labels`), one column
per benchmark metric (the headline first: accuracy / m_avg / miou, R@k, then the breakdowns),
and the mean tool calls per sample last, fractions as percentages. `ComparisonTable` is the Hydra
callback that collects each job's metrics in a multirun
(`python evaluate.py -m benchmark=needle mode=parallel,sequential,no_tool`) and prints the table
at the end (and writes it as comparison.md in the sweep folder).

This module deliberately does not run evaluations.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.experimental.callback import Callback

from paravt.eval.results import COUNTS, format_value

HEADLINES = ("accuracy", "m_avg", "miou", "r@0.3", "r@0.5", "r@0.7")
CALLS = "tool_calls_per_sample"


def _columns(benchmark: str, metrics: Mapping[str, float]) -> list[tuple[str, str]]:
    """(metric key, column title) of one benchmark, headline first."""
    keys = [k for k in HEADLINES if k in metrics]
    keys += sorted(k for k in metrics if "/" in k and k.rsplit("/", 1)[-1] not in COUNTS)
    return [(k, f"{benchmark} {k}".replace("accuracy/", "")) for k in keys]


def comparison_table(rows: Sequence[tuple[str, str, Mapping[str, float]]]) -> str:
    """Markdown table of (label, benchmark, metrics) rows; a metric absent in a row shows "-"."""
    columns: list[tuple[str, str, str]] = []  # (benchmark, key, title)
    for _, benchmark, metrics in rows:
        for key, title in _columns(benchmark, metrics):
            if (benchmark, key, title) not in columns:
                columns.append((benchmark, key, title))
    titles = ["Mode", *[t for _, _, t in columns], "calls/sample"]
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    by_label: dict[str, dict[str, Mapping[str, float]]] = {}
    for label, benchmark, metrics in rows:
        by_label.setdefault(label, {})[benchmark] = metrics
    for label, per_bench in by_label.items():
        cells = [label]
        for benchmark, key, _ in columns:
            value = per_bench.get(benchmark, {}).get(key)
            cells.append("-" if value is None else format_value(key, value))
        calls = [m[CALLS] for m in per_bench.values() if CALLS in m]
        cells.append(f"{sum(calls) / len(calls):.2f}" if calls else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def job_labels(jobs: Sequence[tuple[str, Mapping[str, str]]]) -> list[str]:
    """One row label per (mode, overrides) job: the mode, then `key=value` for every override
    whose value differs between the jobs (benchmark and mode are the table's own axes), so a
    sweep over modes x frame budgets (or models) gives one row per combination."""
    keys = sorted({k for _, overrides in jobs for k in overrides} - {"benchmark", "mode"})
    varying = [k for k in keys if len({overrides.get(k) for _, overrides in jobs}) > 1]
    return [
        " ".join([mode, *(f"{k}={overrides[k]}" for k in varying if k in overrides)])
        for mode, overrides in jobs
    ]


def _overrides(task: Sequence[str]) -> dict[str, str]:
    """`key=value` command-line overrides as a dict (`+key` / `~key` prefixes dropped)."""
    pairs = (item.split("=", 1) for item in task if "=" in item)
    return {key.lstrip("+~"): value for key, value in pairs}


class ComparisonTable(Callback):
    """Collects each multirun job's metrics; prints one comparison table at the end."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, dict[str, str], str, Mapping[str, float]]] = []
        self.folder = ""

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        value = getattr(job_return, "_return_value", None)
        from hydra.core.hydra_config import HydraConfig

        overrides: dict[str, str] = {}
        if HydraConfig.initialized():  # the job's folder is <sweep dir>/<job number>
            hydra_cfg = HydraConfig.get()
            self.folder = os.path.dirname(str(hydra_cfg.runtime.output_dir))
            overrides = _overrides(list(hydra_cfg.overrides.task))
        if isinstance(value, Mapping):
            mode, benchmark = str(config.mode.name), str(config.benchmark.name)
            self.jobs.append((mode, overrides, benchmark, value))

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if not self.jobs:
            return
        labels = job_labels([(mode, overrides) for mode, overrides, _, _ in self.jobs])
        rows = [(label, job[2], job[3]) for label, job in zip(labels, self.jobs, strict=True)]
        table = comparison_table(rows)
        print("\n== comparison ==\n" + table)
        folder = self.folder or "."
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "comparison.md"), "w", encoding="utf-8") as handle:
            handle.write(table + "\n")
        print(f"comparison table: {os.path.join(folder, 'comparison.md')}")
