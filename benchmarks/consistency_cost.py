"""What the rollout/trainer consistency check costs, as a share of the demo's RL step.

Runs the embedded demo (`python train.py`, shortened) with the default `rollout.consistency=warn`
and reads, from the same run's TensorBoard events, `time/consistency` (the check of every
trajectory: clips, placeholder runs, time labels, M-RoPE positions per turn) beside the step's
phases. Target: <= 5% of the step. Also prints the mismatches found (0 on a clean run).

    python benchmarks/consistency_cost.py [--steps 3] [--cold-start-steps 0] [--run DIR]

`--cold-start-steps 0` skips the cold start (fast; the random policy rarely calls the tool, so
fewer clips are checked); the demo's own cold start makes every step crop.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from demo_phases import STEP_PHASES, time_scalars, train_demo


def needle_overrides(run: Path) -> tuple[str, ...]:
    """A small needle set (16 train, 4 eval) written under `run`."""
    data = run / "needle"
    return (
        f"data.generate.out_dir={data}",
        "data.generate.num_train=16",
        "data.generate.num_eval=4",
        f"data.train_path={data / 'train.jsonl'}",
        f"data.eval_path={data / 'eval.jsonl'}",
    )


def scalar(run: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: list[float] = []
    for events in sorted(run.rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out += [e.value for e in acc.Scalars(tag)]
    return out


def report(run: Path) -> float:
    times = time_scalars(run)
    if "consistency" not in times:
        raise SystemExit(f"{run}: no time/consistency scalars (rollout.consistency=off?)")
    skip = 1 if len(times["consistency"]) > 1 else 0  # the first step warms caches up
    check = statistics.mean(times["consistency"][skip:])
    step = sum(
        statistics.mean(times[k][skip:]) for k in (*STEP_PHASES, "consistency") if k in times
    )
    ratio = check / step
    mismatches = sum(scalar(run, "consistency/mismatches"))
    print(f"steps: {len(times['consistency'])} (first left out of the means: {bool(skip)})")
    print(f"consistency check: {check * 1000:.1f} ms / step")
    print(f"step (phases + check): {step:.3f} s")
    print(f"check / step: {ratio:.2%} (target <= 5%); mismatches found: {mismatches:g}")
    return ratio


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--cold-start-steps", type=int, default=0)
    p.add_argument("--run", type=Path, default=None, help="read this run directory instead")
    args = p.parse_args(argv)
    if args.run is not None:
        report(args.run)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "demo"
        train_demo(run, args.steps, args.cold_start_steps, needle_overrides(run))
        report(run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
