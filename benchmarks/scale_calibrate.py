"""Calibration of the timing model (`benchmarks/scale_model.py`) against runs measured here.

Runs `benchmarks/partial_rollouts.py`'s sync and async modes on the tiny Qwen3-VL (real engine
calls, real crops, real updates, the real generator process; each side on one core), back to
back, and records the sync run's phase times: every engine call (its requests, their context
tokens, the frames they carry, the tokens it samples, its seconds), every update (its tokens,
its seconds), every weight sync, and the rest of each step's generation (crops, prompts).
From those alone it sets the stand-ins' parameters (least squares: a decode iteration's base
cost and its cost per context token, a frame's; an update's fixed cost and its cost per token;
the sync; the crops), replays the same trajectories on the simulator (`lockstep`: the
transformers engine samples a call's longest turn for all of its requests), and prints the
predicted steps per minute of sync (one process, `colocated` with 1 rank) and async (a
generator of its own, `max_staleness` 1) beside the measured ones. The machine's load average
is printed before and after: other jobs on the cores move the measured figures.

    python benchmarks/scale_calibrate.py [--steps 10] [--warmup 2] [--prompts 2] [--group 4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import partial_rollouts as pr
from scalemodel.modes import Setup, run_async, run_sync
from scalemodel.params import Params
from scalemodel.workload import Rollout, Turn

from paravt.models.loading import PolicySpec, load_policy

CALLS: list[dict] = []  # one per engine call of the sync run
UPDATES: list[tuple[int, float]] = []  # (tokens, seconds) per update
SYNCS: list[float] = []


def _frames(req) -> int:
    return sum(2 * int(v.video_grid_thw[0][0]) for v in req.visuals)


class RecordedScript(pr.TurnScript):
    """`TurnScript` that records each call's shape and seconds."""

    def sync_weights(self, policy, version: int) -> None:
        t0 = time.perf_counter()
        super().sync_weights(policy, version)
        SYNCS.append(time.perf_counter() - t0)

    def generate(self, requests, params):
        t0 = time.perf_counter()
        out = super().generate(requests, params)
        CALLS.append(
            {
                "names": [r.name for r in requests],
                "ctx": [len(r.token_ids) for r in requests],
                "frames": [_frames(r) for r in requests],
                "new": [len(o[0].token_ids) for o in out],
                "s": time.perf_counter() - t0,
            }
        )
        return out


class RecordedTrainer(pr.Trainer):
    def update(self, trajs) -> float:
        seconds = super().update(trajs)
        UPDATES.append((sum(len(t.token_ids) for t in trajs), seconds))
        return seconds


def nonnegative_fit(rows: list[list[float]], seconds: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0: a column whose coefficient comes out
    negative is dropped (0) and the rest refitted."""
    a, b = np.array(rows, dtype=float), np.array(seconds, dtype=float)
    keep = list(range(a.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        if (coef >= 0).all():
            out = [0.0] * a.shape[1]
            for i, c in zip(keep, coef, strict=True):
                out[i] = float(c)
            return out
        keep = [k for k, c in zip(keep, coef, strict=True) if c >= 0]


def fit_params(base: Params, sync_gen_s: float) -> Params:
    """The stand-ins' parameters from the sync run's records (`sync_gen_s`: its generation
    seconds a step, engine calls and the rest)."""
    rows, secs = [], []
    for c in CALLS:
        iters = max(c["new"])
        ctx = sum(n + iters / 2 for n in c["ctx"])
        rows.append([iters, iters * ctx, sum(c["frames"])])
        secs.append(c["s"])
    base_s, per_ctx, per_frame = nonnegative_fit(rows, secs)
    fixed, per_token = nonnegative_fit([[1.0, n] for n, _ in UPDATES], [s for _, s in UPDATES])
    crops = sum(len(ts) - 1 for ts in recorded_turns().values()) / base.steps  # a turn's one call
    rest = max(0.0, sync_gen_s - sum(c["s"] for c in CALLS) / base.steps)  # a step's
    sync_s = sum(SYNCS) / len(SYNCS)
    return replace(
        base,
        decode_base_s=base_s,
        kv_bytes_per_token=1,
        hbm_gbps=1e-9 / max(per_ctx, 1e-15),
        prefill_tokens_per_s=float("inf"),
        vision_s_per_frame=per_frame,
        max_num_seqs=10_000,
        kv_capacity_tokens=10**12,
        train_tokens_per_s=1.0 / max(per_token, 1e-12),
        rl_pass_factor=1.0,
        update_fixed_s=fixed,
        weights_gb=sync_s,
        colocated_sync_gbps=1.0,
        server_sync_gbps=1.0,
        crop_frames=1,
        crop_s_per_frame=rest / max(1, crops),
        cpu_cores=1,
    )


def recorded_turns() -> dict[str, list[Turn]]:
    """Each trajectory's turns as the sync run's engine calls saw them."""
    turns: dict[str, list[Turn]] = {}
    for c in CALLS:
        for name, ctx, frames, new in zip(c["names"], c["ctx"], c["frames"], c["new"], strict=True):
            done = turns.setdefault(name, [])
            before = sum(t.prefill + t.decode for t in done)
            turns[name].append(Turn(ctx - before, frames, new, 1))
    for ts in turns.values():
        ts[-1] = replace(ts[-1], crops=0)
    return turns


def drawer_of(turns: dict[str, list[Turn]], prompts):
    """(step, prompt, index) -> the recorded trajectory (the agent loop's request names)."""

    def draw(step: int, prompt: int, index: int) -> Rollout:
        name = f"trajectory {prompts[step % len(prompts)][prompt].id}#{index}"
        return Rollout(step, prompt, index, tuple(turns[name]))

    return draw


def scaled(p: Params, gen: float, update: float) -> Params:
    """`p` with every generation-side time x `gen` and the update's x `update`: the phase
    times the async run measured with each side on its own core."""
    return replace(
        p,
        decode_base_s=p.decode_base_s * gen,
        hbm_gbps=p.hbm_gbps / gen,
        vision_s_per_frame=p.vision_s_per_frame * gen,
        crop_s_per_frame=p.crop_s_per_frame * gen,
        update_fixed_s=p.update_fixed_s * update,
        train_tokens_per_s=p.train_tokens_per_s / update,
    )


def predict(p: Params, mode: str, drawer) -> tuple[float, float, float]:
    """(steps/min, engine busy s a step, update s a step) the model predicts for `mode`."""
    if mode == "sync":
        stats = run_sync(Setup(1, 0, p, drawer), lockstep=True)
    else:
        stats = run_async(Setup(1, 1, p, drawer), 1, partial=False, lockstep=True)
    w, n = p.warmup, len(stats.ends) - p.warmup
    busy = (stats.engine_busy[-1] - stats.engine_busy[w - 1]) / n
    update = sum(stats.update_s[w:]) / n
    return 60 * n / (stats.ends[-1] - stats.ends[w - 1]), busy, update


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    args = ap.parse_args(argv)
    pr.TurnScript, pr.Trainer = RecordedScript, RecordedTrainer  # the sync run is in-process
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        spec = PolicySpec(path=str(Path(tmp) / "tiny"), build_tiny="qwen3_vl")
        load_policy(spec)
        prompts = pr.samples_of(Path(tmp) / "needle", args.steps, args.prompts)
        measured = {"sync": pr.run_sync(spec, prompts, args.group, args.warmup)}
        load.append(os.getloadavg())
        synced = len(UPDATES)
        measured["async"] = pr.run_async(spec, prompts, args.group, args.warmup, False, 1)
        del UPDATES[synced:]  # the async trainer's (in this process too): not the sync run's
    load.append(os.getloadavg())
    sync, asyn = measured["sync"], measured["async"]
    base = replace(Params(), prompts=args.prompts, group=args.group, steps=args.steps)
    base = replace(base, warmup=args.warmup, max_rounds=pr.AGENT.max_rounds)
    p = fit_params(base, sync["generator s/step"])
    print(
        f"fitted on the sync run: {p.decode_base_s * 1e3:.2f} ms an iteration + "
        f"{p.kv_s_per_token * 1e6:.3f} us a context token, {p.vision_s_per_frame * 1e3:.2f} ms "
        f"a frame; update {p.update_fixed_s:.3f} s + {1e3 / p.train_tokens_per_s:.3f} ms a "
        f"token; sync {p.weights_gb:.3f} s; crops and the rest {p.crop_s_per_frame:.3f} s a call"
    )
    gen = asyn["generator s/step"] / sync["generator s/step"]
    upd = asyn["trainer update s/step"] / sync["trainer update s/step"]
    print(f"async run's phase times / sync run's: generation {gen:.2f}x, update {upd:.2f}x")
    drawer = drawer_of(recorded_turns(), prompts)
    params = {"sync": p, "async": scaled(p, gen, upd)}
    predicted = {mode: predict(params[mode], mode, drawer) for mode in params}
    print(
        "load average (1, 5, 15 min) before, between, after: "
        + "; ".join(", ".join(f"{x:.1f}" for x in la) for la in load)
    )
    heads = ("gen s", "model engine s", "update s", "model", "steps/min", "predicted", "ratio")
    print(f"{'':<8}" + "".join(f"{h:>15}" for h in heads))
    for mode in ("sync", "async"):
        m, (q, busy, update) = measured[mode], predicted[mode]
        cells = (m["generator s/step"], busy, m["trainer update s/step"], update, m["steps/min"], q)
        print(f"{mode:<8}" + "".join(f"{c:>15.2f}" for c in cells) + f"{q / m['steps/min']:>15.3f}")
    worst = max(abs(predicted[k][0] / measured[k]["steps/min"] - 1) for k in predicted)
    print(f"worst error {100 * worst:.1f}% ({'within' if worst <= 0.15 else 'outside'} 15%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
