"""Host memory over a long CPU run: resident set size (RSS) per training step, growth after warm-up.

Runs the demo recipe (tiny local Qwen3-VL, synthetic needle videos, demo sizes: 4 prompts x 4
rollouts, 2 tool rounds, 160 new tokens per turn, a checkpoint every step) without its cold
start for `--steps` steps, reads this process's RSS from /proc after every step and prints, for
the raw RSS and for the "live" RSS (after `gc.collect()` and `malloc_trim(0)`, which give freed
heap pages back), the medians of the first and last 50 steps after warm-up, the growth between
them and the least-squares slope; every sample goes to `RUN_DIR/rss.csv`. A leak (a list of
rollouts kept per step, a growing cache) shows as growth that keeps rising with the number of
steps; the goal is < 5% after warm-up.

    python benchmarks/memory_rss.py [--steps 200] [--warmup 20] [--run-dir /tmp/rss]
    make venv-vllm && OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
        VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
        .venv-vllm/bin/python benchmarks/memory_rss.py --engine vllm

With `--engine vllm` the in-process vLLM engine (CPU build, `.venv-vllm`) generates the rollouts
and is synced in place after every update; its KV cache is allocated once, so RSS must stay flat
there too. Linux only (/proc/self/statm).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import statistics
import tempfile
from pathlib import Path

import lightning.pytorch as pl
from hydra import compose, initialize_config_dir

from paravt.run.build import build_run

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")
LIBC = ctypes.CDLL("libc.so.6")


def rss_mib() -> float:
    """This process's resident set size in MiB (current, not the peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def live_rss_mib() -> float:
    """RSS after a garbage collection and glibc's `malloc_trim(0)`: freed heap pages go back to
    the OS, so what remains is (close to) what is still referenced: the leak signal."""
    gc.collect()
    LIBC.malloc_trim(0)
    return rss_mib()


class RSSRecorder(pl.Callback):
    """Appends (step, RSS MiB, live RSS MiB) after every training batch."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, float, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.samples.append((trainer.global_step, rss_mib(), live_rss_mib()))


def growth(values: list[float], warmup: int, window: int) -> tuple[float, float, float]:
    """(median of the `window` values after warm-up, median of the last `window`, growth %).

    Raw RSS swings by ~10% from step to step (heap pages taken and given back with rollout
    lengths), so single steps would measure the swing; window medians measure the trend.
    """
    after = values[warmup:]
    if len(after) < 2 * window:
        raise ValueError(f"need warm-up {warmup} + 2 x {window} steps, recorded {len(values)}")
    start = statistics.median(after[:window])
    end = statistics.median(after[-window:])
    return start, end, 100.0 * (end - start) / start


def slope_per_100(values: list[float], warmup: int) -> float:
    """Least-squares slope of `values` after warm-up, in MiB per 100 steps."""
    ys = values[warmup:]
    xs = range(len(ys))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return 100.0 * num / sum((x - mx) ** 2 for x in xs)


def small_overrides(run_dir: Path) -> list[str]:
    data = run_dir / "needle"
    return [
        f"data.train_path={data / 'train.jsonl'}",
        f"data.eval_path={data / 'eval.jsonl'}",
        f"data.generate.out_dir={data}",
        "data.generate.num_train=32",
        "data.generate.num_eval=4",
        "rollout.agent.max_rounds=1",
        "rollout.agent.max_new_tokens=32",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument(
        "--small",
        action="store_true",
        help="shorter rollouts (1 tool round, 32 new tokens per turn) on 32 needle videos "
        "generated in the run folder: the same step structure at ~1/5 of the time per step",
    )
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="extra Hydra overrides, e.g. rollout.engine.mm_processor_cache_gb=0",
    )
    args = parser.parse_args()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="paravt-rss-"))
    overrides = small_overrides(run_dir) if args.small else []
    if args.engine == "vllm":
        # the demo's 4,096-token trajectories plus one turn of new tokens
        overrides += ["rollout/engine=vllm", "rollout.engine.max_model_len=4608"]
    overrides += [
        "experiment=demo",
        "cold_start=null",
        f"run_dir={run_dir}",
        f"trainer.max_steps={args.steps}",
        "trainer.enable_progress_bar=false",
        "callbacks.benchmark_validation=null",
        "callbacks.rollout_logger.every_n_steps=10",
        *args.overrides,
    ]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    run = build_run(cfg)
    recorder = RSSRecorder()
    run.trainer.callbacks.append(recorder)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    (run_dir / "rss.csv").write_text(
        "step,rss_mib,live_rss_mib\n"
        + "".join(f"{st},{raw:.1f},{live:.1f}\n" for st, raw, live in recorder.samples)
    )
    every = max(1, len(recorder.samples) // 20)
    print("step  rss_mib  live_rss_mib")
    for step, raw, live in recorder.samples[::every]:
        print(f"{step:>4}  {raw:7.1f}  {live:12.1f}")
    window = min(50, (len(recorder.samples) - args.warmup) // 2)
    for name, column in (("RSS", 1), ("live RSS", 2)):
        values = [sample[column] for sample in recorder.samples]
        start, end, pct = growth(values, args.warmup, window)
        print(
            f"engine {args.engine}  {name}: median of the {window} steps after warm-up "
            f"{start:.1f} MiB, of the last {window} {end:.1f} MiB, growth {pct:+.2f}% "
            f"(goal < 5%); slope {slope_per_100(values, args.warmup):+.1f} MiB / 100 steps; "
            f"peak {max(values):.1f} MiB"
        )
    print(f"per-step samples: {run_dir / 'rss.csv'}")


if __name__ == "__main__":
    main()
