"""Side-by-side: one round of parallel crops through `ParallelToolExecutor` vs. naive reads.

The executor plans every crop of a round first and decodes the union of their frames with one
read per video; the naive way opens and decodes each call on its own, one after another. Both
run in this process on the same real mp4 files, and the script prints the ratio.

    python benchmarks/crop_executor.py [--trajectories 8] [--calls 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from paravt.agent.parsing import parse_tool_calls
from paravt.agent.scripts import call_text
from paravt.agent.tools import CropConfig, CropVideoTool, ParallelToolExecutor
from paravt.video.reader import VideoReader
from paravt.video.sampling import window_indices
from paravt.video.synthetic import NeedleConfig, generate


def naive_round(turns, cfg: CropConfig) -> int:
    """Each call opens its own reader and decodes its own frames, sequentially."""
    frames = 0
    for calls, video in turns:
        for parsed in calls:
            reader = VideoReader(cache_size=1)
            info = reader.info(video)
            args = parsed.call.arguments
            idx = window_indices(
                info.num_frames,
                info.fps,
                args["start_time"],
                min(args["end_time"], info.duration),
                cfg.sample_fps,
                cfg.min_frames,
                cfg.max_frames,
            )
            frames += len(reader.read(video, idx, cfg.max_pixels, cfg.factor).indices)
            reader.close()
    return frames


def executor_round(turns, executor: ParallelToolExecutor) -> int:
    results = executor.run_many(turns)
    return sum(len(r.frames.indices) for res in results for r in res if r.ok)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trajectories", type=int, default=8, help="rollouts of one prompt (G)")
    p.add_argument("--calls", type=int, default=4, help="parallel calls per turn")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(NeedleConfig(num_train=1, num_eval=0, width=224, height=224), Path(tmp))
        video = str(next((Path(tmp) / "videos").glob("*.mp4")))
        text = "".join(call_text(8.0 * i, 8.0 * i + 16.0) for i in range(args.calls))
        turns = [(parse_tool_calls(text), video) for _ in range(args.trajectories)]
        cfg = CropConfig()
        naive, fast = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            n_frames = naive_round(turns, cfg)
            naive.append(time.perf_counter() - t0)
            with ParallelToolExecutor({"crop_video": CropVideoTool()}, VideoReader(), cfg) as ex:
                t0 = time.perf_counter()
                f_frames = executor_round(turns, ex)
                fast.append(time.perf_counter() - t0)
        assert n_frames == f_frames, (n_frames, f_frames)
    n, f = statistics.median(naive), statistics.median(fast)
    print(f"{args.trajectories} trajectories x {args.calls} parallel crops, {n_frames} frames")
    print(f"naive per-call open+decode : {n * 1000:8.1f} ms")
    print(f"ParallelToolExecutor       : {f * 1000:8.1f} ms")
    print(f"speed-up                   : {n / f:8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
