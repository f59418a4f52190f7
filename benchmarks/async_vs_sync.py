"""Side-by-side: the demo's RL phase with `rollout.mode=sync` and `rollout.mode=async`.

One short cold start (shared: its weights are exported once), then the same RL steps and seeds
in both modes from those weights, one after the other in this process: sync (max_staleness 0)
and async (a generator process one step ahead, max_staleness 1, the decoupled loss in both).
Prints steps per minute (between the end of the first and of the last step: start-up and the
generator's spawn are left out; the held-out evaluation, which `BenchmarkValidation` runs in the
last step's batch-end hook before this script's clock records that step, is inside), the fit's
wall time (everything), engine and trainer busy time, mean staleness and the held-out accuracy
at the end. On a CPU the two modes share the same cores (docs/performance.md section 8).

    python benchmarks/async_vs_sync.py [--steps 6] [--cold-start-steps 60] [--eval 32]
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
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {}
    for events in sorted(run_dir.rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return out


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
    clock = StepClock()
    run.trainer.callbacks.append(clock)
    t0 = time.perf_counter()
    run.trainer.fit(run.module, datamodule=run.datamodule)
    wall = time.perf_counter() - t0
    s = scalars(run_dir)
    acc = next((v for k, v in s.items() if k.startswith("val/") and k.endswith("/accuracy")), [])
    return {
        "steps/min": 60 * (len(clock.ends) - 1) / (clock.ends[-1] - clock.ends[0]),
        "fit wall s": wall,
        "engine busy s": sum(s["time/rollout"]),
        "trainer busy s": sum(sum(s[f"time/{k}"]) for k in TRAINER),
        "trainer waited s": sum(s.get("time/rollout_wait", s["time/rollout"])),
        "mean staleness": sum(s["rollout/staleness"]) / len(s["rollout/staleness"]),
        "held-out accuracy": acc[-1] if acc else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--cold-start-steps", type=int, default=60)
    p.add_argument("--eval", type=int, default=32, help="held-out prompts scored at the end")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = cold_start(Path(tmp), args.cold_start_steps)
        rows = {m: rl(Path(tmp), model, m, args.steps, args.eval) for m in ("sync", "async")}
    print(f"{'':<20}{'sync':>12}{'async':>12}")
    for key in rows["sync"]:
        print(f"{key:<20}{rows['sync'][key]:>12.2f}{rows['async'][key]:>12.2f}")
    ratio = rows["async"]["steps/min"] / rows["sync"]["steps/min"]
    print(f"async/sync steps per minute: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
