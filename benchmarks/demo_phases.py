"""Where the demo's RL step spends its time: the `time/*` metrics of a run, as a table.

Runs the embedded demo (`python train.py`, shortened with the overrides below) in a scratch
run directory, then reads its TensorBoard events and prints, per phase, the mean seconds per
step and the share of the step. `time/sync|rollout|reward|logprobs|update` partition the step;
`time/rollout_*` (prompt rendering, engine generate, tool execution) partition the rollout.
Pass `--run DIR` to read an existing run directory instead of training.

    python benchmarks/demo_phases.py [--steps 4] [--cold-start-steps 120] [--run DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STEP_PHASES = ("sync", "rollout", "reward", "logprobs", "update")


def time_scalars(run: Path) -> dict[str, list[float]]:
    """Every `time/*` scalar of the run's TensorBoard events, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {}
    for events in sorted(run.rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if tag.startswith("time/"):
                out.setdefault(tag[5:], []).extend(e.value for e in acc.Scalars(tag))
    if not out:
        raise SystemExit(f"{run}: no time/* scalars found; is it a paravt training run directory?")
    return out


def train_demo(run: Path, steps: int, cold_steps: int, extra: tuple[str, ...] = ()) -> None:
    """`python train.py` for `steps` RL steps after `cold_steps` cold-start steps (0: none),
    with `extra` overrides, writing into `run`."""
    cmd = [
        sys.executable,
        "train.py",
        f"trainer.max_steps={steps}",
        f"cold_start.steps={cold_steps}" if cold_steps else "cold_start=null",
        *extra,
        "callbacks.benchmark_validation=null",
        "callbacks.rollout_logger=null",
        "export_hf=false",
        f"hydra.run.dir={run}",
        f"run_dir={run}",
    ]
    print("running:", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[1])


def print_table(scalars: dict[str, list[float]]) -> None:
    mean = {k: statistics.mean(v[1:] if len(v) > 1 else v) for k, v in scalars.items()}
    step = sum(mean.get(k, 0.0) for k in STEP_PHASES)
    rollout = mean.get("rollout", 0.0)
    steps = max(len(v) for v in scalars.values())
    print(f"{steps} steps (first step left out of the means when there are more)")
    print(f"{'phase':<22}{'s / step':>10}{'share':>8}")
    for k in STEP_PHASES:
        if k in mean:
            print(f"{k:<22}{mean[k]:>10.3f}{mean[k] / step:>7.0%}")
            if k == "rollout":
                for sub in sorted(s for s in mean if s.startswith("rollout_")):
                    share = mean[sub] / rollout if rollout else 0.0
                    print(f"  {sub[8:]:<20}{mean[sub]:>10.3f}{share:>7.0%} of rollout")
    print(f"{'step (sum)':<22}{step:>10.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--cold-start-steps", type=int, default=120)
    p.add_argument("--run", type=Path, default=None, help="read this run directory instead")
    args = p.parse_args(argv)
    if args.run is not None:
        print_table(time_scalars(args.run))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "demo"
        train_demo(run, args.steps, args.cold_start_steps)
        print_table(time_scalars(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
