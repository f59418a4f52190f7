"""PNG training curves of a run (reward, f_tau, kappa, held-out accuracy vs step).

Read back from the run's TensorBoard event files, so the curves show exactly what was logged, and
drawn with Pillow (a dependency already), so no plotting library is needed: `paravt.run.chart.
line_chart` is the pure drawing (ticked axes, legend beside the plot). Every chart of a run spans
the run's whole step range, also for a series logged on part of it (a gate ratio needs both tool
users and non-users in a group).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from paravt.run.chart import line_chart

__all__ = ["CURVES", "compare_runs", "line_chart", "read_scalars", "write_curves"]

# (file name, title, TensorBoard tags drawn in it; a tag ending in "*" stands for every logged
# tag with that prefix, e.g. one gate-ratio series per frame budget)
CURVES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward.png", "training reward (mean)", ("reward/mean",)),
    ("f_tau.png", "f_tau: format compliance", ("f_tau", "val/needle/f_tau")),
    ("kappa.png", "kappa: tool calls per rollout", ("kappa", "val/needle/kappa")),
    ("heldout_accuracy.png", "held-out accuracy (greedy)", ("val/needle/accuracy",)),
    (
        "gate_ratio.png",
        "gate ratio per frame budget (tool users out-score the rest)",
        ("gate_ratio/*",),
    ),
)


def _expand(tags: tuple[str, ...], logged: list[str]) -> list[str]:
    out: list[str] = []
    for tag in tags:
        if tag.endswith("*"):
            out += sorted(t for t in logged if t.startswith(tag[:-1]))
        else:
            out.append(tag)
    return out


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[float, float]]]:
    """Every scalar tag of the TensorBoard event files under `log_dir`: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[float, float]]] = {}
    for events in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(points) for tag, points in out.items()}


def write_curves(log_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw `CURVES` from the scalars logged under `log_dir` into `out_dir`; the PNG paths."""
    scalars = read_scalars(log_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = [x for points in scalars.values() for x, _ in points]
    x_range = (min(steps), max(steps)) if steps else None
    written = []
    for filename, title, tags in CURVES:
        names = _expand(tags, list(scalars))
        chart = line_chart({tag: scalars.get(tag, []) for tag in names}, title, x_range=x_range)
        chart.save(out / filename)
        written.append(out / filename)
    return written


def compare_runs(
    runs: Mapping[str, str | Path], tags: Sequence[str], out_dir: str | Path, prefix: str = ""
) -> list[Path]:
    """One PNG per tag with one series per run (name -> TensorBoard folder), e.g. PARA-GRPO vs
    plain GRPO from the same cold start; the paths written."""
    scalars = {name: read_scalars(tb) for name, tb in runs.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for tag in tags:
        chart = line_chart({name: s.get(tag, []) for name, s in scalars.items()}, tag)
        path = out / f"{prefix}{tag.replace('/', '_')}.png"
        chart.save(path)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m paravt.run.curves OUT_DIR PREFIX NAME=TB_DIR ... -- TAG ...`"""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args or len(args) < 5:
        print(main.__doc__)
        return 2
    split = args.index("--")
    out, prefix, pairs, tags = args[0], args[1], args[2:split], args[split + 1 :]
    runs = dict(pair.split("=", 1) for pair in pairs)
    for path in compare_runs(runs, tags, out, prefix):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
