"""Throughput of paravt's rollout modes at the paper's scale, from a timing model.

A discrete-event simulation on a virtual clock (`benchmarks/scalemodel/`): paravt's own
scheduling decisions (the staleness gate `last_startable_step` and `too_stale`, the agent
loop's rounds, the turn-boundary weight loads of partial rollouts, the streaming
`StreamScheduler`, the server `Router`, the ranks' shares by `shard_bounds`) drive stand-ins
whose time follows a model of Qwen3-VL-8B on H100s (vLLM continuous batching, FSDP2 updates, a
weight sync per GB, crops on the CPU), over long-tailed trajectories of the paper's shape.
Every parameter is an option (`--help` names each one's source). Modelled: the engines (one a
server or a colocated rank), every trainer rank's share, the crops' CPU time; not modelled:
rewards, prompt building, sub-agent summaries, failures (docs/performance.md, section 6).

Printed, for colocated 8 GPUs, 1 + 7, 2 + 6 and 2 nodes (16 GPUs: 2 or 4 servers, 14 prompts a
step), and each mode that topology can start (async modes need a generator apart from the
trainer's GPUs): steps per hour, the trainer's and the
generator's idle fractions, mean and max staleness (updates behind, oldest token), groups
dropped as too stale; then the step's phases, the tail drawn, the scheduler's own overhead per
step (every stand-in at zero time, real seconds), and `stream vs sync, 1 + 7: N.NNx`.

    python benchmarks/scale_model.py [--max-staleness 2] [--steps 24] [--decode-base-s 0.008] ...
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from scalemodel.modes import Setup, Stats, run_async, run_sync
from scalemodel.params import Params, add_arguments, from_args
from scalemodel.stream import run_stream, run_stream_per_turn
from scalemodel.workload import draw

TOPOLOGIES = (  # name, trainer ranks, servers (0: colocated), prompts a step (None: --prompts)
    ("colocated 8", 8, 0, None),
    ("1 + 7", 7, 1, None),
    ("2 + 6", 6, 2, None),
    ("2 nodes 2 + 14", 14, 2, 14),
    ("2 nodes 4 + 12", 12, 4, 14),
)
MODES = ("sync", "async", "partial", "stream")


def run_mode(setup: Setup, mode: str, staleness: int) -> Stats:
    if mode == "sync":
        return run_sync(setup)
    if mode == "stream":
        return run_stream(setup, staleness)
    return run_async(setup, staleness, partial=mode == "partial")


def figures(st: Stats, warmup: int) -> dict[str, float]:
    """The table's figures over the steps after `warmup`."""
    w, n = warmup, len(st.ends) - warmup
    wall = st.ends[-1] - st.ends[w - 1]
    gen_busy = st.engine_busy[-1] - st.engine_busy[w - 1]
    return {
        "steps/h": 3600 * n / wall,
        "s/step": wall / n,
        "trainer idle": 1 - sum(st.update_s[w:]) / wall,
        "generator idle": 1 - gen_busy / (wall * st.engines),
        "staleness mean": sum(st.staleness[w:]) / n,
        "staleness max": max(st.staleness[w:]),
        "dropped groups": st.dropped,
        "update s": sum(st.update_s[w:]) / n,
        "engine busy s/step": gen_busy / n / st.engines,
    }


def table(p: Params, staleness: int) -> dict[tuple[str, str], dict[str, float]]:
    rows = {}
    for name, ranks, servers, prompts in TOPOLOGIES:
        setup = Setup(ranks, servers, replace(p, prompts=prompts or p.prompts))
        for mode in MODES if servers else ("sync",):
            rows[(name, mode)] = figures(run_mode(setup, mode, staleness), p.warmup)
    return rows


COLUMNS = (  # heading, key, format
    ("steps/h", "steps/h", ".1f"),
    ("s/step", "s/step", ".1f"),
    ("trainer idle", "trainer idle", ".2f"),
    ("gen idle", "generator idle", ".2f"),
    ("stale mean", "staleness mean", ".2f"),
    ("max", "staleness max", ".0f"),
    ("dropped", "dropped groups", ".0f"),
    ("update s", "update s", ".1f"),
    ("gen busy s", "engine busy s/step", ".1f"),
)


def print_table(rows) -> None:
    """One line a row; `gen busy s`: a generation GPU's busy seconds a step."""
    print(f"{'topology':<16}{'mode':<9}" + "".join(f"{h:>13}" for h, _, _ in COLUMNS))
    for (topo, mode), f in rows.items():
        cells = "".join(
            f"{max(0.0, f[k]) if 'idle' in k else f[k]:>13{fmt}}" for _, k, fmt in COLUMNS
        )
        print(f"{topo:<16}{mode:<9}" + cells)


def tail(p: Params, n: int = 4000) -> str:
    """What the drawn trajectories look like (n of them)."""
    rs = [draw(p, 10_000 + i // 56, (i // 8) % 7, i % 8) for i in range(n)]
    turns = sorted(t.decode for r in rs for t in r.turns)
    calls = sum(t.crops for r in rs for t in r.turns) / n
    capped = sum(d >= p.max_new_tokens for d in turns) / len(turns)
    return (
        f"tail: {statistics.mean(len(r.turns) for r in rs):.2f} turns, {calls:.2f} crops (kappa) "
        f"and {statistics.mean(r.tokens for r in rs):.0f} tokens a trajectory; tokens a turn "
        f"median {turns[len(turns) // 2]}, p90 {turns[9 * len(turns) // 10]}, "
        f"{100 * capped:.1f}% at the {p.max_new_tokens} cap"
    )


def overhead(p: Params, staleness: int) -> dict[str, float]:
    """Real seconds a step of each mode on 1 + 7 with every stand-in at zero time."""
    zero = replace(
        p,
        decode_base_s=0.0,
        kv_bytes_per_token=0,
        prefill_tokens_per_s=float("inf"),
        vision_s_per_frame=0.0,
        crop_s_per_frame=0.0,
        train_tokens_per_s=float("inf"),
        update_fixed_s=0.0,
        weights_gb=0.0,
    )
    out = {}
    for mode in MODES:
        t0 = time.perf_counter()
        run_mode(Setup(7, 1, zero), mode, staleness)
        out[mode] = (time.perf_counter() - t0) / zero.steps
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-staleness", type=int, default=2, help="async modes (reference: 2)")
    ap.add_argument("--reference-step-s", type=float, default=250.0, help="the reference's s/step")
    add_arguments(ap)
    args = ap.parse_args(argv)
    p = from_args(args)
    if p.warmup < 1 or p.steps <= p.warmup:
        ap.error(f"need 1 <= --warmup < --steps, got {p.warmup} and {p.steps}")
    print(tail(p))
    rows = table(p, args.max_staleness)
    print_table(rows)
    ref, reported = rows[("1 + 7", "stream")]["s/step"], args.reference_step_s
    print(f"the reference's mode (stream, 1 + 7): {ref:.0f} s a step; it reports ~{reported:.0f}")
    cost = overhead(p, args.max_staleness)
    worst = max(cost.values())
    print(
        "scheduler overhead per step (zero-time stand-ins, real s): "
        + ", ".join(f"{m} {s * 1e3:.2f} ms" for m, s in cost.items())
        + f"; worst {100 * worst / reported:.4f}% of a {reported:.0f} s step"
    )
    free = figures(run_stream_per_turn(Setup(7, 1, p), args.max_staleness), p.warmup)
    print(
        f"stream without round barriers (each trajectory's turns sent on their own), 1 + 7: "
        f"{free['steps/h']:.1f} steps/h, {free['dropped groups']:.0f} groups dropped"
    )
    ratio = rows[("1 + 7", "stream")]["steps/h"] / rows[("1 + 7", "sync")]["steps/h"]
    print(f"stream vs sync, 1 + 7: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
