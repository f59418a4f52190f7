"""What computing each video once saves in the demo: the vision cache off vs on, at G=4 and G=8.

Runs the embedded demo (`python train.py`, shortened as in benchmarks/demo_phases.py) once per
(group size, `rollout.vision_cache.enabled`) and reads the runs' TensorBoard events. It prints:
1. for the cache-off runs, the share of a step spent decoding video (`time/rollout_decode`) and in
   the vision tower, by phase: rollout (`time/rollout_vision`), old/reference log-probs
   (`time/logprobs_vision`) and update (`time/update_vision`);
2. the step time with the cache off / on, the feature- and crop-cache hit rates, and the ideal
   saving (vision + decode share x (1 - 1/G)) next to the measured one (1 - on / off); then the
   decode + vision seconds per step themselves, off / on, and each run's CPU seconds.
Step times are means over the steps after the first (its one-off costs left out). The step is
the sum of `time/sync|rollout|reward|logprobs|update`, as in demo_phases.py.

    python benchmarks/vision_cache.py [--steps 2] [--batch-size 1] [--groups 4 8]
                                      [--cold-start-steps 0]

Without a cold start the demo's random tiny policy rarely calls the crop tool, so the crop cache
is seldom asked; `--cold-start-steps 120` teaches it to crop first (several minutes per run).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path

from demo_phases import STEP_PHASES, train_demo

VISION = ("rollout_vision", "logprobs_vision", "update_vision")


def cpu_seconds() -> float:
    """User + system CPU seconds of the finished child processes so far (the training runs):
    a figure that, unlike wall time, other work on a shared machine barely moves."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def scalars(run: Path, prefixes: tuple[str, ...] = ("time/", "vision_cache/")) -> dict:
    """Every scalar of the run's TensorBoard events under `prefixes`, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {}
    for events in sorted(run.rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if tag.startswith(prefixes):
                out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    if "time/update" not in out:
        raise SystemExit(f"{run}: no time/update scalars; did the training run finish a step?")
    return out


def steady(values: list[float]) -> float:
    """The mean over the steps after the first (the first alone when there is one)."""
    return statistics.mean(values[1:] if len(values) > 1 else values)


def summary(found: dict[str, list[float]]) -> dict[str, float]:
    """Per-step means of the figures this benchmark reports."""
    mean = {k.split("/", 1)[1]: steady(v) for k, v in found.items() if k.startswith("time/")}
    out = {k: mean.get(k, 0.0) for k in (*STEP_PHASES, *VISION, "rollout_decode")}
    out["step"] = sum(out[k] for k in STEP_PHASES)
    total = {k: sum(v[1:] if len(v) > 1 else v) for k, v in found.items()}
    crops = total.get("vision_cache/crop_lookups", 0.0)
    out["crop_hit_rate"] = total.get("vision_cache/crop_hits", 0.0) / crops if crops else None
    out["crop_lookups"] = crops
    out["feature_hit_rate"] = steady(found.get("vision_cache/feature_hit_rate", [0.0]))
    out["tower_clips"] = steady(found.get("vision_cache/tower_clips", [0.0]))
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
        print(f"{name:<24}{phase:>10.2f}{decode / step:>9.1%}{vision / step:>9.1%}")


def print_comparison(results: dict[tuple[int, bool], dict[str, float]]) -> None:
    head = f"{'G':>3}{'off s':>9}{'on s':>9}{'off/on':>8}{'feat hit':>10}{'crop hit':>10}"
    head += f"{'ideal':>8}{'measured':>10}{'vision+decode s off/on':>24}{'CPU s off/on':>15}"
    head += f"{'tower clips off/on':>20}"
    print("\n" + head)
    for group in sorted({g for g, _ in results}):
        off, on = results[(group, False)], results[(group, True)]
        work = {
            k: sum(r[v] for v in VISION) + r["rollout_decode"]
            for k, r in (("off", off), ("on", on))
        }
        ideal = work["off"] / off["step"] * (1 - 1 / group)
        measured = 1 - on["step"] / off["step"]
        crop = on["crop_hit_rate"]
        crop_text = f"{crop:.0%}" if crop is not None else "n/a"
        print(
            f"{group:>3}{off['step']:>9.2f}{on['step']:>9.2f}{off['step'] / on['step']:>8.2f}"
            f"{on['feature_hit_rate']:>10.0%}{crop_text:>10}{ideal:>8.1%}{measured:>10.1%}"
            f"{work['off']:>13.3f} / {work['on']:<8.3f}{off['cpu_s']:>8.0f} / {on['cpu_s']:<5.0f}"
            f"{off['tower_clips']:>12.0f} / {on['tower_clips']:<5.0f}"
        )
    print(
        "s: mean seconds per step; ideal = (decode + vision share of the cache-off step) x "
        "(1 - 1/G); measured = 1 - on / off; vision+decode s: those seconds per step; CPU s: "
        "the whole run's CPU time (user + system, startup included); tower clips: clips the vision "
        "tower encoded per step (rollout rounds, log-prob passes, update); crop hit n/a: no crop "
        "asked"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2, help="RL steps per run (the first is left out)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per step")
    p.add_argument("--groups", type=int, nargs="+", default=[4, 8], help="group sizes G")
    p.add_argument("--cold-start-steps", type=int, default=0)
    args = p.parse_args(argv)
    results: dict[tuple[int, bool], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for group in args.groups:
            for enabled in (False, True):
                run = Path(tmp) / f"g{group}_{'on' if enabled else 'off'}"
                extra = (
                    f"rollout.group_size={group}",
                    f"rollout.vision_cache.enabled={str(enabled).lower()}",
                    f"data.batch_size={args.batch_size}",
                )
                before = cpu_seconds()
                train_demo(run, args.steps, args.cold_start_steps, extra)
                results[(group, enabled)] = summary(scalars(run))
                results[(group, enabled)]["cpu_s"] = cpu_seconds() - before
    for group in args.groups:
        print_shares(group, results[(group, False)])
    print_comparison(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
