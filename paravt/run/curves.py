"""PNG training curves of a run (reward, f_tau, kappa, held-out accuracy vs step).

Read back from the run's TensorBoard event files, so the curves show exactly what was logged, and
drawn with Pillow (a dependency already), so no plotting library is needed. `line_chart` is pure
drawing: series of (x, y) points in, an image out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

Series = Sequence[tuple[float, float]]

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


_COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189))


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


def _bounds(series: Mapping[str, Series]) -> tuple[float, float, float, float]:
    xs = [x for s in series.values() for x, _ in s]
    ys = [y for s in series.values() for _, y in s]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    return x0, x1, y0, y1


def line_chart(series: Mapping[str, Series], title: str, size=(640, 400)):
    """A PIL image: one polyline (with point markers) per named series, axes with min/max."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    width, height = size
    left, right, top, bottom = 60, width - 20, 40, height - 40
    draw.text((left, 10), title, fill="black")
    draw.rectangle((left, top, right, bottom), outline="black")
    series = {name: s for name, s in series.items() if s}
    if not series:
        draw.text((left + 10, top + 10), "no data logged", fill="black")
        return img
    x0, x1, y0, y1 = _bounds(series)
    for value, y in ((y1, top), (y0, bottom)):
        draw.text((5, y - 6), f"{value:.3g}", fill="black")
    draw.text((left, bottom + 8), f"step {x0:g}", fill="black")
    draw.text((right - 70, bottom + 8), f"step {x1:g}", fill="black")

    def at(x: float, y: float) -> tuple[float, float]:
        return (
            left + (x - x0) / (x1 - x0) * (right - left),
            bottom - (y - y0) / (y1 - y0) * (bottom - top),
        )

    for i, (name, points) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        xy = [at(x, y) for x, y in points]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=2)
        for px, py in xy:
            draw.ellipse((px - 3, py - 3, px + 3, py + 3), fill=colour)
        draw.text((left + 10 + 200 * i, top + 6), name, fill=colour)
    return img


def write_curves(log_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw `CURVES` from the scalars logged under `log_dir` into `out_dir`; the PNG paths."""
    scalars = read_scalars(log_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, title, tags in CURVES:
        names = _expand(tags, list(scalars))
        chart = line_chart({tag: scalars.get(tag, []) for tag in names}, title)
        chart.save(out / filename)
        written.append(out / filename)
    return written


def compare_runs(
    runs: Mapping[str, str | Path], tags: Sequence[str], out_dir: str | Path, prefix: str = ""
) -> list[Path]:
    """One PNG per tag with one series per run (name -> TensorBoard folder), e.g. PARA-GRPO vs
    vanilla GRPO from the same cold start; the paths written."""
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
