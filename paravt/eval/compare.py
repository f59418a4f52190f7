"""One table comparing evaluation runs (modes, models), in the layout of the paper's tables.

`comparison_table(rows)` is pure: one row per run (its label, e.g. the dispatch mode), one column
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


class ComparisonTable(Callback):
    """Collects each multirun job's metrics; prints one comparison table at the end."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, Mapping[str, float]]] = []
        self.folder = ""

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        value = getattr(job_return, "_return_value", None)
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():  # the job's folder is <sweep dir>/<job number>
            self.folder = os.path.dirname(str(HydraConfig.get().runtime.output_dir))
        if isinstance(value, Mapping):
            self.rows.append((str(config.mode.name), str(config.benchmark.name), value))

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if not self.rows:
            return
        table = comparison_table(self.rows)
        print("\n== comparison ==\n" + table)
        folder = self.folder or "."
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "comparison.md"), "w", encoding="utf-8") as handle:
            handle.write(table + "\n")
        print(f"comparison table: {os.path.join(folder, 'comparison.md')}")
