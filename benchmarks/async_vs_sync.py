"""Side-by-side: the demo's RL phase with `rollout.mode=sync` and `rollout.mode=async`.

One short cold start (shared: its weights are exported once), then the same RL steps and seeds
in both modes from those weights, in this process: sync (max_staleness 0) and async (a generator
process one step ahead, max_staleness 1, the decoupled loss in both). The modes alternate,
`--repeats` times each in the order sync, async, async, sync, ... (each pair mirrors the one
before), so a load that rises or falls steadily over the run weighs on both modes alike; the
figures are means over each mode's runs, and every run's own line is printed too.

Two figures per mode, side by side:
- steady state, steps/min: from the end of the first step to the end of the last, each taken
  before any other callback's batch-end hook runs: the generator's spawn, the first
  (unoverlapped) generation and the final held-out evaluation (`BenchmarkValidation`, in the
  last step's batch-end hook) are all outside it;
- end to end, fit wall s: the whole `trainer.fit`, spawn and final evaluation included (the
  final evaluation's seconds are printed on their own).
Also: engine and trainer busy time, the trainer's wait for rollouts, mean staleness and the
held-out accuracy at the end. On a CPU the two modes share the same cores (docs/performance.md
section 8).

    python benchmarks/async_vs_sync.py [--steps 6] [--cold-start-steps 60] [--eval 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ("reward", "logprobs", "update")


class StepClock(pl.Callback):
    """When each step's batch-end hooks reach this callback (its place in the callback list
    decides whether the other callbacks' work, such as an evaluation, is before or after)."""

    def __init__(self):
        self.ends: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ends.append(time.perf_counter())


def demo_cfg(run_dir: Path, *overrides: str):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", [f"run_dir={run_dir}", "export_hf=false", *overrides])


def cold_start(tmp: Path, steps: int) -> Path:
    from paravt.run.build import build_run, maybe_cold_start

    cfg = demo_cfg(tmp / "cold", f"cold_start.steps={steps}", "cold_start.eval_every=0")
    run = build_run(cfg)
    maybe_cold_start(cfg, run)
    run.module.export_hf(str(tmp / "hf"))
    return tmp / "hf"


def scalars(run_dir: Path) -> dict[str, list[float]]:
    """Every scalar of the run's TensorBoard events, in step order."""
    from paravt.run.curves import read_scalars

    return {tag: [v for _, v in points] for tag, points in read_scalars(run_dir).items()}


def rl(tmp: Path, model: Path, mode: str, steps: int, limit: int) -> dict[str, float]:
    from paravt.run.build import build_run

    run_dir = tmp / mode
    staleness = 1 if mode == "async" else 0
    cfg = demo_cfg(
        run_dir,
        "cold_start=null",
        f"model.path={model}",
        "model.build_tiny=null",
        f"trainer.max_steps={steps}",
        f"rollout.mode={mode}",
        f"rollout.max_staleness={staleness}",
        "algorithm.loss=decoupled_ppo",
        "callbacks.rollout_logger=null",
        "callbacks.benchmark_validation.at_start=false",
        f"callbacks.benchmark_validation.every_n_steps={steps}",
        f"callbacks.benchmark_validation.limit={limit}",
    )
    run = build_run(cfg)
    step_done, hooks_done = StepClock(), StepClock()  # before / after every other callback
    run.trainer.callbacks.insert(0, step_done)
    run.trainer.callbacks.append(hooks_done)
    t0 = time.perf_counter()
    run.trainer.fit(run.module, datamodule=run.datamodule)
    wall = time.perf_counter() - t0
    s = scalars(run_dir)
    acc = next((v for k, v in s.items() if k.startswith("val/") and k.endswith("/accuracy")), [])
    ends = step_done.ends
    return {
        "steps/min": 60 * (len(ends) - 1) / (ends[-1] - ends[0]),
        "fit wall s": wall,
        "final eval s": hooks_done.ends[-1] - ends[-1],
        "engine busy s": sum(s["time/rollout"]),
        "trainer busy s": sum(sum(s[f"time/{k}"]) for k in TRAINER),
        "trainer waited s": sum(s.get("time/rollout_wait", s["time/rollout"])),
        "mean staleness": sum(s["rollout/staleness"]) / len(s["rollout/staleness"]),
        "held-out accuracy": acc[-1] if acc else float("nan"),
    }


def schedule(repeats: int) -> list[str]:
    """The modes in run order: sync, async, async, sync, sync, async, ... (`repeats` each)."""
    pairs = [("sync", "async") if i % 2 == 0 else ("async", "sync") for i in range(repeats)]
    return [mode for pair in pairs for mode in pair]


def means(runs: list[tuple[str, dict[str, float]]], mode: str) -> dict[str, float]:
    rows = [row for m, row in runs if m == mode]
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def report(runs: list[tuple[str, dict[str, float]]]) -> str:
    """Every run's steady-state and end-to-end figures, the means per mode, the two ratios."""
    lines = [f"{'run':<5}{'mode':<7}{'steps/min (steady)':>20}{'fit wall s (end to end)':>26}"]
    for i, (mode, row) in enumerate(runs, 1):
        lines.append(f"{i:<5}{mode:<7}{row['steps/min']:>20.2f}{row['fit wall s']:>26.2f}")
    sync, asyn = means(runs, "sync"), means(runs, "async")
    lines.append(f"\nmeans over {len(runs) // 2} run(s) per mode")
    lines.append(f"{'':<20}{'sync':>12}{'async':>12}")
    lines += [f"{k:<20}{sync[k]:>12.2f}{asyn[k]:>12.2f}" for k in sync]
    steady = asyn["steps/min"] / sync["steps/min"]
    whole = sync["fit wall s"] / asyn["fit wall s"]
    lines.append(
        f"async/sync speed: steady state {steady:.2f}x (steps per minute), "
        f"end to end {whole:.2f}x (sync fit wall / async fit wall)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--cold-start-steps", type=int, default=60)
    p.add_argument("--eval", type=int, default=32, help="held-out prompts scored at the end")
    p.add_argument("--repeats", type=int, default=2, help="runs per mode, alternating")
    args = p.parse_args(argv)
    if args.steps < 2 or args.repeats < 1:
        p.error(f"--steps must be >= 2 (got {args.steps}) and --repeats >= 1 (got {args.repeats})")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        model = cold_start(Path(tmp), args.cold_start_steps)
        for i, mode in enumerate(schedule(args.repeats)):
            runs.append((mode, rl(Path(tmp) / f"run{i}", model, mode, args.steps, args.eval)))
    print(report(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
