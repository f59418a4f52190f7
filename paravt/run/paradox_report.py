"""`paravt paradox-report RUN_DIRS...`: the paper's Figure 4 and f_tau / kappa table, ours beside.

The table is the factorial of docs/paradox.md, one block per group (GROUPS): the vanilla prompt
with the anchor and the gate added one at a time and together, the prompt controls (PARA-GRPO's
forced `<think>` and answer-suffix credits on vanilla GRPO, together and apart), PARA-GRPO's
prompt with its ablations, and the weak prior; each row names the paper's ablation row whose
figures stand beside it.

Each run folder (`runs/demo_prior_<arm>_seed<N>`) holds the TensorBoard scalars its training
logged; the arm is the folder's (or its `.hydra/config.yaml` name's) text before `_seed<N>`.
"Ours f_tau" is `f_tau_ruler`, every arm read with one ruler (`paravt.rl.metrics.ruler_format`);
each arm's own R_fmt (`f_tau`, whose ceiling moves with the anchor weight) and the anchor term
(`f_tau_anchor`) get columns of their own; tag reversion is the share of tool turns written in
`<tool_code>`; accuracy is the training rollouts' mean R_acc. A run logged before a figure
existed shows n/a there. Per arm, every figure is averaged over the last `last` logged steps
of each seed, then reduced to mean +- standard error over seeds; "after cold start" pools every
run's first logged step (the rollouts of the cold-start policy). The figure draws f_tau and
kappa over steps, one line per arm with a band of +- one standard error over seeds. Pure
reductions (`arm_series`, `table_rows`) are kept apart from reading and drawing.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

# The paper's f_tau and kappa per ablation row: ParaVT paper, Qwen3-VL-8B (weak prior: Qwen2.5-VL)
PAPER: dict[str, tuple[float, float]] = {
    "after cold start": (0.13, 2.50),
    "vanilla GRPO": (0.13, 0.02),
    "PARA-GRPO": (0.41, 0.21),
    "anchoring only": (0.35, 0.19),
    "budget gating only": (0.10, 1.36),
    "PARA-GRPO without R_tool": (0.33, 0.04),
    "weak prior (Qwen2.5-VL)": (0.85, 0.0),
}
# The factorial (docs/paradox.md), one table per group: (title, ((arm, label, paper row), ...)).
# A row's paper figures are those of the paper's ablation with the same mechanisms; the paper
# has no prompt controls. Arms outside these groups come last, under their own names.
GROUPS: tuple[tuple[str, tuple[tuple[str, str, str | None], ...]], ...] = (
    (
        "vanilla prompt (no forced `<think>`, default format credits) and PARA-GRPO's mechanisms",
        (
            ("grpo", "vanilla GRPO", "vanilla GRPO"),
            ("grpo_anchor", "vanilla + structural anchor", "anchoring only"),
            ("grpo_gating", "vanilla + frame-budget gating", "budget gating only"),
            ("grpo_anchor_gating", "vanilla + anchor + gating", "PARA-GRPO"),
        ),
    ),
    (
        "prompt controls: vanilla GRPO (no anchor, no gating) with PARA-GRPO's prompt parts",
        (
            ("grpo_think_suffix", "vanilla + forced `<think>` + answer-suffix credits", None),
            ("grpo_think", "vanilla + forced `<think>` only", None),
            ("grpo_suffix", "vanilla + answer-suffix credits only", None),
        ),
    ),
    (
        "PARA-GRPO's prompt (forced `<think>`, answer-suffix credits) and its ablations",
        (
            ("paragrpo", "PARA-GRPO", "PARA-GRPO"),
            ("anchoring_only", "anchoring only", "anchoring only"),
            ("gating_only", "budget gating only", "budget gating only"),
            ("no_tool_reward", "PARA-GRPO without R_tool", "PARA-GRPO without R_tool"),
        ),
    ),
    ("prior strength", (("weak", "weak prior", "weak prior (Qwen2.5-VL)"),)),
)
TAGS = ("f_tau_ruler", "kappa", "tag_reversion", "f_tau", "f_tau_anchor", "drift/dropped_any")
TAGS += ("reward/accuracy",)  # mean R_acc of the training rollouts (sampled, T of the recipe)
FIGURE_TAGS = ("f_tau_ruler", "kappa")
_SEED_RE = re.compile(r"_seed(\d+|\$\{seed\})$")  # saved configs keep ${seed}
Points = Sequence[tuple[float, float]]


def arm_name(run_dir: str | Path) -> str:
    """`demo_prior_grpo_seed3` -> `grpo` (the config's `name` when the folder has one)."""
    path = Path(run_dir)
    name = path.name
    config = path / ".hydra" / "config.yaml"
    if config.exists():
        match = re.search(r"^name:\s*(\S+)", config.read_text(), re.MULTILINE)
        name = match.group(1) if match else name
    return _SEED_RE.sub("", name).removeprefix("demo_prior_")


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n); 0 for one value). Empty: (nan, nan)."""
    n = len(values)
    if not n:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def tail_mean(points: Points, last: int) -> float:
    """Mean value of the last `last` points (by step); nan when none were logged."""
    tail = sorted(points)[-last:]
    return sum(v for _, v in tail) / len(tail) if tail else math.nan


def arm_series(seeds: Sequence[Points]) -> list[tuple[float, float, float]]:
    """(step, mean, se) over the seeds that logged each step."""
    by_step: dict[float, list[float]] = {}
    for points in seeds:
        for step, value in points:
            by_step.setdefault(step, []).append(value)
    return [(step, *mean_se(vals)) for step, vals in sorted(by_step.items())]


Row = tuple[str, str | None, int, dict[str, tuple[float, float]]]


def _arm_stats(seeds: Sequence[Mapping[str, Points]], last: int) -> dict[str, tuple[float, float]]:
    """{tag: (mean, se)} over seeds of each seed's mean over its last `last` steps."""
    return {
        tag: mean_se([tail_mean(s.get(tag, []), last) for s in seeds if s.get(tag)]) for tag in TAGS
    }


def table_rows(
    runs: Mapping[str, Sequence[Mapping[str, Points]]], last: int
) -> list[tuple[str, list[Row]]]:
    """(group title, rows) per group with an arm that ran, GROUPS' order; a row is (label,
    the paper's row or None, seeds, {tag: (mean, se)}). The first group is the cold start:
    every run's first logged step, pooled. `runs`: arm -> one {tag: points} per seed."""
    first = [
        {tag: sorted(scalars[tag])[0][1] for tag in TAGS if scalars.get(tag)}
        for seeds in runs.values()
        for scalars in seeds
    ]
    cold = {tag: mean_se([f[tag] for f in first if tag in f]) for tag in TAGS}
    cold_row: Row = ("after cold start", "after cold start", len(first), cold)
    groups: list[tuple[str, list[Row]]] = [("before RL", [cold_row])]
    known = {arm for _, arms in GROUPS for arm, *_ in arms}
    other = tuple((arm, arm, None) for arm in sorted(runs) if arm not in known)
    for title, arms in (*GROUPS, ("other runs", other)):
        rows = [
            (label, paper, len(runs[arm]), _arm_stats(runs[arm], last))
            for arm, label, paper in arms
            if arm in runs
        ]
        if rows:
            groups.append((title, rows))
    return groups


def _cell(stat: tuple[float, float]) -> str:
    mean, se = stat
    return "n/a" if math.isnan(mean) else f"{mean:.3f} +- {se:.3f}"


def format_table(groups: Sequence[tuple[str, Sequence[Row]]], last: int) -> str:
    """One Markdown table per group: the paper's f_tau / kappa (of the row named in "paper's
    row") beside ours (mean +- se over seeds); the paper's cells are empty where it has no row."""
    head = (
        "| run | paper's row | seeds | paper f_tau "
        f"| ours f_tau, one ruler (last {last} steps) | paper kappa "
        "| ours kappa | ours tag reversion | ours own R_fmt | ours anchor term "
        "| ours dropped closing tags | ours accuracy |"
    )
    blocks = []
    for title, rows in groups:
        lines = [f"**{title}**", "", head, "|" + "---|" * 12]
        for label, paper, n, stats in rows:
            pf, pk = (f"{v:.2f}" for v in PAPER[paper]) if paper else ("", "")
            ruler, kappa, *rest = (_cell(stats[t]) for t in TAGS)
            lines.append(
                f"| {label} | {paper or ''} | {n} | {pf} | {ruler} | {pk} | {kappa} | "
                + " | ".join(rest)
                + " |"
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


_COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14))
_COLOURS += ((140, 86, 75),)


def band_panel(series: Mapping[str, Sequence[tuple[float, float, float]]], title: str, size):
    """A PIL image: one line per arm over steps, a lighter band of +- se around it."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img, "RGBA")
    width, height = size
    left, right, top, bottom = 60, width - 20, 40, height - 40
    draw.text((left, 10), title, fill="black")
    draw.rectangle((left, top, right, bottom), outline="black")
    pts = [p for s in series.values() for p in s]
    if not pts:
        draw.text((left + 10, top + 10), "no data logged", fill="black")
        return img
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] - p[2] for p in pts), max(p[1] + p[2] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    for value, y in ((y1, top), (y0, bottom)):
        # Rounded first: a band's edge computed as 0.3 - 0.3 prints as 0, not -2.22e-16.
        draw.text((5, y - 6), f"{round(value, 6) + 0.0:.3g}", fill="black")
    draw.text((left, bottom + 8), f"step {x0:g}", fill="black")
    draw.text((right - 70, bottom + 8), f"step {x1:g}", fill="black")

    def at(x: float, y: float) -> tuple[float, float]:
        return (
            left + (x - x0) / (x1 - x0) * (right - left),
            bottom - (y - y0) / (y1 - y0) * (bottom - top),
        )

    for i, (name, s) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        upper = [at(x, m + e) for x, m, e in s]
        lower = [at(x, m - e) for x, m, e in reversed(s)]
        if len(s) > 1:
            draw.polygon(upper + lower, fill=(*colour, 50))
            draw.line([at(x, m) for x, m, _ in s], fill=colour, width=2)
        draw.text((left + 10 + 110 * i, top + 6), name, fill=colour)
    return img


def figure(runs: Mapping[str, Sequence[Mapping[str, Points]]], out: str | Path) -> Path:
    """Figure 4: f_tau (one ruler) and kappa over steps side by side, one line (and seed band)
    per arm."""
    from PIL import Image

    size = (max(640, 120 * len(runs) + 80), 400)
    panels = [
        band_panel(
            {arm: arm_series([s.get(tag, []) for s in seeds]) for arm, seeds in runs.items()},
            f"{tag} over RL steps (mean +- se over seeds)",
            size,
        )
        for tag in FIGURE_TAGS
    ]
    img = Image.new("RGB", (size[0] * 2, size[1]), "white")
    for i, panel in enumerate(panels):
        img.paste(panel, (i * size[0], 0))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def load_runs(run_dirs: Sequence[str | Path]) -> dict[str, list[dict[str, Points]]]:
    """arm -> one {tag: points} per run folder (read from its TensorBoard event files)."""
    from paravt.run.curves import read_scalars

    runs: dict[str, list[dict[str, Points]]] = {}
    for run in run_dirs:
        if not Path(run).is_dir():
            raise SystemExit(f"paradox-report: {run} is not a run folder (runs/demo_prior_*)")
        scalars = read_scalars(run)
        if not scalars.get("f_tau"):
            raise SystemExit(f"paradox-report: {run} logged no f_tau (did its training run?)")
        runs.setdefault(arm_name(run), []).append(scalars)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="paravt paradox-report", description=__doc__)
    parser.add_argument("runs", nargs="+", help="run folders, e.g. runs/demo_prior_*_seed*")
    parser.add_argument("--out", default="paradox_figure4.png", help="the figure's PNG path")
    parser.add_argument("--last", type=int, default=10, help="steps averaged per seed")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs)
    print(format_table(table_rows(runs, args.last), args.last))
    print(f"figure: {figure(runs, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
