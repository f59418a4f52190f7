"""What computing each video once saves in the demo: the vision cache off vs on, at G=4 and G=8.

One cold start of the demo (its own, `--cold-start-steps`, 250 by default) is computed once and
saved in a Hydra sweep folder (paravt.run.coldstart_cache); every measured run is a one-job
sweep in that folder, so it loads those weights and RNG states and starts from the same state
with the same seed. A cold-started policy crops, so the crop cache is asked too. The runs are
interleaved to cancel changes of the machine's load: per repeat and group size G, the cache off
and on back to back, the order swapped every repeat (off, on; on, off; ...). Each run is
`python train.py` for `--steps` RL steps; the first step is left out of every mean. It prints:

1. per G, the cache-off share of a step spent decoding video (`time/rollout_decode`) and in the
   vision tower, by phase: rollout (`time/rollout_vision`), old/reference log-probs
   (`time/logprobs_vision`) and update (`time/update_vision`);
2. per G, the step time off / on, the feature and crop cache hit rates, the clips the tower
   encoded per step, and the saving three ways, all as a share of the cache-off step:
   ideal = (decode + vision share) x (1 - 1/G); measured on the phase timers = (decode + vision
   seconds off - on) / step off; measured on the wall clock = 1 - step on / step off (mean and
   standard error of the paired repeats). The goal is measured >= 80 % of ideal.

The step is the sum of `time/sync|rollout|reward|logprobs|update`, as in demo_phases.py.

    python benchmarks/vision_cache.py [--steps 3] [--repeats 2] [--groups 4 8]
                                      [--cold-start-steps 250] [--work DIR]

`--work DIR` keeps the sweep folder (and its saved cold start) for a later invocation with the
same cold start, which replaces the runs; by default a temporary folder is used and removed.
`--read DIR` prints the report of the finished runs kept in such a folder, without training.
On this project's 2-core machine under other jobs' load (load average 10-15) the cold start took
25 min once and the eight runs of the defaults 27 min; run it with `nice` on a shared machine.
"""

from __future__ import annotations

import argparse
import math
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from demo_phases import STEP_PHASES

VISION = ("rollout_vision", "logprobs_vision", "update_vision")
READ = (
    *(f"time/{k}" for k in (*STEP_PHASES, *VISION, "rollout_decode")),
    *(
        f"vision_cache/{k}"
        for k in ("crop_hits", "crop_lookups", "feature_hit_rate", "tower_clips")
    ),
)
GOAL = 0.8  # the measured saving should be at least this share of the ideal one
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Saving:
    """A saving as a share of the cache-off step. `ideal`: the decode + vision share of that step
    times (1 - 1/G), what computing each input once instead of G times removes; `timers`: the
    decode + vision seconds the cache removed; `wall`: 1 - on / off of the step time."""

    ideal: float
    timers: float
    wall: float


def saving(group: int, step_off: float, step_on: float, work_off: float, work_on: float) -> Saving:
    """The ideal and the two measured savings from one pair of runs (seconds per step; `work`:
    decode + vision seconds per step)."""
    if group < 1 or step_off <= 0 or step_on <= 0:
        raise ValueError(f"need G >= 1 and positive step times, got {group}, {step_off}, {step_on}")
    return Saving(
        ideal=work_off / step_off * (1 - 1 / group),
        timers=(work_off - work_on) / step_off,
        wall=1 - step_on / step_off,
    )


def cpu_seconds() -> float:
    """User + system CPU seconds of the finished child processes so far (the training runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train_job(sweep: Path, name: str, steps: int, cold_steps: int, extra: tuple[str, ...]) -> Path:
    """`python train.py -m` (a one-job sweep in `sweep`, so the cold start saved there is loaded
    instead of recomputed) for `steps` RL steps with `extra` overrides; its run directory. The
    run is stopped once its events hold every step: what follows is its closing report, a greedy
    held-out evaluation of minutes on a loaded CPU that this benchmark does not read."""
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        f"trainer.max_steps={steps}",
        f"cold_start.steps={cold_steps}" if cold_steps else "cold_start=null",
        *extra,
        "callbacks.benchmark_validation=null",
        "callbacks.rollout_logger=null",
        "export_hf=false",
        f"hydra.sweep.dir={sweep}",
        f"hydra.sweep.subdir={name}",
    ]
    print("running:", " ".join(cmd[1:]), flush=True)
    shutil.rmtree(sweep / name, ignore_errors=True)  # a rerun's events would mix with these
    child = subprocess.Popen(cmd, cwd=ROOT)
    while child.poll() is None:
        time.sleep(5)
        if all_steps_logged(sweep / name, steps):
            child.kill()
            child.wait()
            return sweep / name
    if child.returncode != 0:
        raise SystemExit(f"{name}: train.py exited with {child.returncode}")
    return sweep / name


def all_steps_logged(run: Path, steps: int) -> bool:
    """Whether the run's events on disk hold `steps` values of every scalar this benchmark reads
    (a run that never logs one of them is left to finish)."""
    if not any(run.rglob("events.out.tfevents*")):
        return False
    try:
        found = scalars(run)
    except SystemExit:  # no step logged yet
        return False
    return all(len(found.get(tag, ())) == steps for tag in READ)


def scalars(run: Path, prefixes: tuple[str, ...] = ("time/", "vision_cache/")) -> dict:
    """Every scalar of the run's TensorBoard events under `prefixes`, in step order."""
    from paravt.run.curves import read_scalars

    found = read_scalars(run).items()
    out = {tag: [v for _, v in points] for tag, points in found if tag.startswith(prefixes)}
    if "time/update" not in out:
        raise SystemExit(f"{run}: no time/update scalars; did the training run finish a step?")
    return out


def after_first(values: list[float]) -> list[float]:
    """The steps after the first (its one-off costs left out); the first alone if it is all."""
    return values[1:] if len(values) > 1 else values


def summary(found: dict[str, list[float]]) -> dict[str, float]:
    """One run's per-step means of the figures this benchmark reports, and its crop counts."""
    mean = {k[5:]: statistics.mean(after_first(v)) for k, v in found.items() if k[:5] == "time/"}
    out = {k: mean.get(k, 0.0) for k in (*STEP_PHASES, *VISION, "rollout_decode")}
    out["step"] = sum(out[k] for k in STEP_PHASES)
    out["work"] = sum(out[k] for k in (*VISION, "rollout_decode"))
    total = {k: sum(after_first(v)) for k, v in found.items()}
    out["crop_hits"] = total.get("vision_cache/crop_hits", 0.0)
    out["crop_lookups"] = total.get("vision_cache/crop_lookups", 0.0)
    out["steps"] = float(len(after_first(found["time/update"])))
    for key in ("feature_hit_rate", "tower_clips"):
        out[key] = statistics.mean(after_first(found.get(f"vision_cache/{key}", [0.0])))
    return out


def pooled(runs: list[dict[str, float]]) -> dict[str, float]:
    """The mean of the repeats' per-run means; crop counts summed."""
    out = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
    for k in ("crop_hits", "crop_lookups", "steps"):
        out[k] = sum(r[k] for r in runs)
    return out


def print_shares(group: int, off: dict[str, float]) -> None:
    step = off["step"]
    print(f"\nG={group}, cache off: {step:.2f} s / step; share of the step")
    print(f"{'phase':<24}{'s / step':>10}{'decode':>9}{'vision':>9}")
    rows = (
        ("rollout", off["rollout"], off["rollout_decode"], off["rollout_vision"]),
        ("old/ref log-probs", off["logprobs"], 0.0, off["logprobs_vision"]),
        ("update", off["update"], 0.0, off["update_vision"]),
    )
    for name, phase, decode, vision in rows:
        print(f"{name:<24}{phase:>10.2f}{decode / step:>9.2%}{vision / step:>9.2%}")
    print(f"{'decode + vision':<24}{off['work']:>10.3f}{off['work'] / step:>18.2%}")


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (0 for one value)."""
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.mean(values), se


def verdict(measured: float, ideal: float, noise: float | None = 0.0) -> str:
    """Whether `measured` is >= GOAL x `ideal`; undecided when its standard error `noise` is
    larger than the ideal, or unknown (None: one pair)."""
    if noise is None:
        return "one pair, no standard error: not conclusive"
    if noise > ideal:
        return "not resolvable (standard error > ideal)"
    ratio = measured / ideal if ideal else float("nan")
    return f"{ratio:.0%} of ideal: goal {'met' if ratio >= GOAL else 'NOT met'}"


def wall_note(wall: float, se: float, timers: float) -> str:
    """The cache saves only decode + vision seconds: a wall-clock saving above those (by more
    than 2 standard errors) is the machine's load, not the cache."""
    return "; above the seconds the cache removed, so load" if wall - 2 * se > timers else ""


def print_comparison(group: int, offs: list[dict], ons: list[dict]) -> None:
    off, on = pooled(offs), pooled(ons)
    total = saving(group, off["step"], on["step"], off["work"], on["work"])
    paired = [
        saving(group, a["step"], b["step"], 0.0, 0.0).wall for a, b in zip(offs, ons, strict=True)
    ]
    wall, wall_se = mean_se(paired)
    noise = wall_se if len(paired) > 1 else None
    crop = f"{on['crop_hits'] / on['crop_lookups']:.0%}" if on["crop_lookups"] else "n/a"
    print(f"\nG={group}: {len(offs)} repeats x {off['steps'] / len(offs):.0f} measured steps")
    print(f"  step s off / on        {off['step']:.3f} / {on['step']:.3f}  "
          f"(off/on {off['step'] / on['step']:.3f})")  # fmt: skip
    print(f"  decode+vision s off/on {off['work']:.4f} / {on['work']:.4f}")
    print(f"  feature hit rate (on)  {on['feature_hit_rate']:.0%}")
    print(f"  crop hit rate (on)     {crop} of {on['crop_lookups'] / on['steps']:.1f} lookups/step")
    fewer = 1 - on["tower_clips"] / off["tower_clips"] if off["tower_clips"] else 0.0
    print(
        f"  tower clips / step     {off['tower_clips']:.1f} -> {on['tower_clips']:.1f} "
        f"({fewer:.0%} fewer; computing each input once instead of G times: {1 - 1 / group:.0%})"
    )
    print(f"  ideal saving           {total.ideal:.2%} of the step")
    pairs = [
        saving(group, a["step"], b["step"], a["work"], b["work"])
        for a, b in zip(offs, ons, strict=True)
    ]
    print(
        f"  measured, phase timers {total.timers:.2%}: {verdict(total.timers, total.ideal)} "
        f"(per pair, of its own ideal: {', '.join(f'{p.timers / p.ideal:.0%}' for p in pairs)})"
    )
    print(
        f"  measured, wall clock   {wall:.2%} +- {wall_se:.2%} (paired repeats: "
        f"{', '.join(f'{w:+.1%}' for w in paired)}): {verdict(wall, total.ideal, noise)}"
        f"{wall_note(wall, wall_se, total.timers)}"
    )


def plan(groups: list[int], repeats: int) -> list[tuple[int, int, bool]]:
    """(repeat, G, cache on) in run order: off and on back to back, swapped every repeat."""
    order = []
    for r in range(repeats):
        for group in groups:
            for enabled in (False, True) if r % 2 == 0 else (True, False):
                order.append((r, group, enabled))
    return order


def run(args: argparse.Namespace, work: Path) -> int:
    sweep = work / "sweep"
    common = (f"data.batch_size={args.batch_size}",)
    train_job(sweep, "cold_start", 1, args.cold_start_steps, common)  # saved once, loaded below
    runs: dict[tuple[int, bool], list[dict[str, float]]] = {}
    cpu: dict[tuple[int, bool], float] = {}
    for r, group, enabled in plan(args.groups, args.repeats):
        extra = (
            *common,
            f"rollout.group_size={group}",
            f"rollout.vision_cache.enabled={str(enabled).lower()}",
        )
        before = cpu_seconds()
        found = scalars(train_job(sweep, run_name(r, group, enabled), args.steps,
                                  args.cold_start_steps, extra))  # fmt: skip
        cpu[(group, enabled)] = cpu.get((group, enabled), 0.0) + cpu_seconds() - before
        runs.setdefault((group, enabled), []).append(summary(found))
    report(runs, cpu)
    return 0


def run_name(repeat: int, group: int, enabled: bool) -> str:
    return f"r{repeat}_g{group}_{'on' if enabled else 'off'}"


def read(work: Path) -> int:
    """The report of the finished runs kept in `work` (`--work`), pairs complete in both modes."""
    runs: dict[tuple[int, bool], list[dict[str, float]]] = {}
    names = {p.name for p in (work / "sweep").glob("r*_g*_o*") if p.is_dir()}
    for name in sorted(names):
        r, g, mode = name.split("_")
        twin = run_name(int(r[1:]), int(g[1:]), mode == "off")
        if mode == "off" and twin in names:
            for enabled, n in ((False, name), (True, twin)):
                found = scalars(work / "sweep" / n)
                runs.setdefault((int(g[1:]), enabled), []).append(summary(found))
    if not runs:
        raise SystemExit(f"{work}/sweep: no finished cache off/on pair of runs")
    report(runs, None)
    return 0


def report(runs: dict, cpu: dict | None) -> None:
    groups = sorted({g for g, _ in runs})
    for group in groups:
        print_shares(group, pooled(runs[(group, False)]))
    for group in groups:
        print_comparison(group, runs[(group, False)], runs[(group, True)])
        if cpu is not None:
            print(f"  CPU s of the runs      {cpu[(group, False)]:.0f} / {cpu[(group, True)]:.0f}")
    print(
        "\nideal = (decode + vision share of the cache-off step) x (1 - 1/G); phase timers: "
        "(decode + vision s off - on) / step off; wall clock: 1 - step on / step off per paired "
        "repeat, mean +- standard error; goal: measured >= 80% of ideal"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3, help="RL steps per run (the first left out)")
    p.add_argument("--repeats", type=int, default=2, help="off/on pairs per group size")
    p.add_argument("--batch-size", type=int, default=4, help="prompts per step (the demo's 4)")
    p.add_argument("--groups", type=int, nargs="+", default=[4, 8], help="group sizes G")
    p.add_argument("--cold-start-steps", type=int, default=250, help="the demo's 250; 0: none")
    p.add_argument("--work", type=Path, default=None, help="keep the sweep folder here")
    p.add_argument("--read", type=Path, default=None, help="report the runs kept in this --work")
    args = p.parse_args(argv)
    if args.read is not None:
        return read(args.read)
    if args.work is not None:
        return run(args, args.work)
    with tempfile.TemporaryDirectory() as tmp:
        return run(args, Path(tmp))


if __name__ == "__main__":
    raise SystemExit(main())
