"""Side-by-side: paravt's crop path vs. qwen-vl-utils `fetch_video` on one long H.264 video.

The peer frameworks (verl, TRL, the ParaVT reference release) decode a tool's crop window with
`qwen_vl_utils.fetch_video({"video": path, "video_start": s, "video_end": e, "fps": 1, ...})`:
one fresh decord reader per window, full-size decoding, then a torchvision bicubic resize.
paravt's `ParallelToolExecutor` plans every crop of a round and decodes their union once.

The video is generated here (10 min, 640x360, 25 fps, H.264 with a keyframe every 250 frames)
and cached under --cache. Cases: K = 1, 5, 8 crops of one turn, and 8 trajectories x 4 crops of
one video (one round of a GRPO group). Each case runs both paths `--repeats` times, alternating,
and prints medians and their ratio. qwen-vl-utils is a benchmark-only dependency
(`benchmarks/requirements.txt`).

    python benchmarks/crop_vs_qwen_vl_utils.py [--repeats 3] [--cache /tmp/paravt-bench]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

import numpy as np

from paravt.agent.parsing import parse_tool_calls
from paravt.agent.scripts import call_text
from paravt.agent.tools import CropConfig, CropVideoTool, ParallelToolExecutor
from paravt.video.reader import VideoReader

WIDTH, HEIGHT, FPS, SECONDS, GOP = 640, 360, 25, 600, 250


def long_video(cache: Path) -> Path:
    """The 10-minute test video, encoded once: drifting gradients, a moving box, a frame counter."""
    import av  # the encoder is PyAV, as in paravt.video.writer

    path = cache / f"long_{WIDTH}x{HEIGHT}_{FPS}fps_{SECONDS}s_gop{GOP}.mp4"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    ys, xs = np.mgrid[0:HEIGHT, 0:WIDTH]
    tmp = path.with_suffix(".part.mp4")
    with av.open(str(tmp), mode="w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "23", "g": str(GOP), "keyint_min": str(GOP)}
        stream.options["x264-params"] = f"scenecut=0:keyint={GOP}:min-keyint={GOP}"
        for i in range(FPS * SECONDS):
            rgb = np.empty((HEIGHT, WIDTH, 3), np.uint8)
            rgb[..., 0] = (xs + 2 * i) % 256
            rgb[..., 1] = (ys + i) % 256
            rgb[..., 2] = ((xs + ys) // 4 + 3 * i) % 256
            x0, y0 = (7 * i) % (WIDTH - 64), (3 * i) % (HEIGHT - 64)
            rgb[y0 : y0 + 64, x0 : x0 + 64] = 255 - rgb[y0 : y0 + 64, x0 : x0 + 64]
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    tmp.rename(path)
    return path


def windows(k: int, seed: int) -> list[tuple[float, float]]:
    """K windows of 4..20 s at random places in the video (16 frames at 1 fps at most)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        length = float(rng.integers(4, 21))
        start = float(rng.integers(0, SECONDS - 21))
        out.append((start, start + length))
    return out


def qwen_round(video: str, turns: list[list[tuple[float, float]]], cfg: CropConfig) -> int:
    """The peer path: one `fetch_video` per crop window, one after another."""
    from qwen_vl_utils import fetch_video

    frames = 0
    for wins in turns:
        for start, end in wins:
            ele = {
                "video": video,
                "video_start": start,
                "video_end": end,
                "fps": cfg.sample_fps,
                "min_frames": cfg.min_frames,
                "max_frames": cfg.max_frames,
                "max_pixels": cfg.max_pixels,
                "min_pixels": cfg.min_pixels,
            }
            frames += int(fetch_video(ele, image_patch_size=cfg.factor // 2).shape[0])
    return frames


def paravt_round(video: str, turns: list[list[tuple[float, float]]], cfg: CropConfig) -> int:
    """paravt's path: one executor round over every turn, from a cold reader (open included)."""
    parsed = [(parse_tool_calls("".join(call_text(s, e) for s, e in w)), video) for w in turns]
    with ParallelToolExecutor({"crop_video": CropVideoTool()}, VideoReader(), cfg) as ex:
        results = ex.run_many(parsed)
    assert all(r.ok for res in results for r in res), [r.error for res in results for r in res]
    return sum(len(r.frames.indices) for res in results for r in res)


def measure(video: str, turns, cfg: CropConfig, repeats: int) -> tuple[float, float, int, int]:
    qwen, ours = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        q_frames = qwen_round(video, turns, cfg)
        qwen.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        p_frames = paravt_round(video, turns, cfg)
        ours.append(time.perf_counter() - t0)
    return statistics.median(qwen), statistics.median(ours), q_frames, p_frames


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache", type=Path, default=Path("/tmp/paravt-bench"))
    p.add_argument("--cases", default="1,5,8,8x4", help="K crops of one turn, or GxK")
    args = p.parse_args(argv)
    logging.getLogger("qwen_vl_utils").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    video = str(long_video(args.cache))
    print(f"video: {video} ({time.perf_counter() - t0:.1f} s to make or find)")
    print(f"{'case':<18}{'frames':>12}{'fetch_video s':>15}{'paravt s':>10}{'speed-up':>10}")
    for case in args.cases.split(","):
        g, k = (int(x) for x in case.split("x")) if "x" in case else (1, int(case))
        turns = [windows(k, seed=1000 * k + t) for t in range(g)]
        cfg = CropConfig(max_calls_per_turn=max(k, 5))
        qwen, ours, q_frames, p_frames = measure(video, turns, cfg, args.repeats)
        label = f"K={k}" if g == 1 else f"{g} traj x {k} crops"
        print(
            f"{label:<18}{f'{q_frames}/{p_frames}':>12}{qwen:>15.2f}{ours:>10.2f}"
            f"{qwen / ours:>9.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
