"""The Tool Prior Paradox end to end: the pre-RL diagnostic, then the arms, then the report.

For each seed: composes `experiment=demo_prior_paragrpo seed=N`, builds the run and its tool
prior and cold start (or loads them from artifacts/prior_cache, where every arm of the seed
finds them), and prints the pre-RL diagnostic (`paravt.run.prior_diagnostic`: 32 prompts x G=4
at K=2 and K=16 at the sampling temperature, tool / no-tool share, accuracy, no-answer and
truncation rates, mean raw and shaped reward). Unless `--diagnostic-only`, it then trains each
arm (`python train.py experiment=demo_prior_<arm> seed=N`, one after another: the seeds share
artifacts/needle_demo) and prints `paravt paradox-report` over the runs.

    python benchmarks/paradox.py [--seeds 0 1 2] [--arms grpo paragrpo ...] [--diagnostic-only]
                                 [--prompts 32] [--group 4] [--budgets 2 16] [-- OVERRIDES...]
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paravt.run.paradox_report import GROUPS

ROOT = Path(__file__).resolve().parents[1]
ARMS = tuple(arm for _, arms in GROUPS for arm, *_ in arms)  # the factorial (docs/paradox.md)


def compose(seed: int, overrides: list[str], run_dir: str, arm: str = "paragrpo"):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(
            "train",
            overrides=[
                f"experiment=demo_prior_{arm}",
                f"seed={seed}",
                f"run_dir={run_dir}",
                "logger=csv",
                *overrides,
            ],
        )


def diagnose(seed: int, args: argparse.Namespace) -> None:
    """Build (or load) the seed's prior and cold start and print the diagnostic."""
    from hydra.utils import instantiate

    from paravt.run.build import build_run, maybe_cold_start
    from paravt.run.prior_diagnostic import diagnostic_table, run_diagnostic

    with tempfile.TemporaryDirectory(prefix="paradox-diagnostic-") as run_dir:
        cfg = compose(seed, args.overrides, run_dir)
        started = time.perf_counter()
        run = maybe_cold_start(cfg, build_run(cfg))
        prior_s = time.perf_counter() - started
        for line in run.cold_start.notes:
            print(f"  {line}")
        rows = run_diagnostic(
            run.module,
            run.datamodule.agent,
            run.datamodule.eval_samples,
            instantiate(cfg.algorithm.advantage),
            budgets=args.budgets,
            prompts=args.prompts,
            group_size=args.group,
            temperature=cfg.rollout.temperature,
            seed=seed,
        )
    took = time.perf_counter() - started - prior_s
    print(
        f"\npre-RL diagnostic, seed {seed} (prior and cold start {prior_s:.0f} s, diagnostic "
        f"{took:.0f} s; {args.prompts} held-out prompts x G={args.group} at "
        f"T={cfg.rollout.temperature}):\n{diagnostic_table(rows)}\n",
        flush=True,
    )


def train_arms(seeds: list[int], arms: list[str], overrides: list[str]) -> list[Path]:
    runs = []
    for seed in seeds:
        for arm in arms:
            cmd = [sys.executable, "train.py", f"experiment=demo_prior_{arm}", f"seed={seed}"]
            print("running:", " ".join(cmd[1:] + overrides), flush=True)
            subprocess.run(cmd + overrides, check=True, cwd=ROOT)
            runs.append(ROOT / "runs" / f"demo_prior_{arm}_seed{seed}")
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--diagnostic-only", action="store_true", help="no RL: the diagnostic only")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--budgets", type=int, nargs="+", default=[2, 16])
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every stage (after --)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for seed in args.seeds:
        diagnose(seed, args)
    if args.diagnostic_only:
        return 0
    runs = train_arms(args.seeds, args.arms, args.overrides)
    report = [sys.executable, "-m", "paravt.run.paradox_report", *map(str, runs)]
    return subprocess.run(report, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
