"""The GPU script's stages: each in a subprocess with its own timeout, one JSON result each, one
summary table. tests/gpu/run.sh calls it after installing the wheel folder; on a CPU,
`--device cpu --tiny` runs the same code at a small size (tests/gpu/test_stages.py).

    python tests/gpu/stages.py [--stages nccl,step,rollout_copy,engine,gpu_tests] [--out DIR]
                               [--device cuda|cpu] [--tiny] [--scale 1.0]

Writes DIR/<stage>.json per stage ({"stage", "status": ok|failed|timeout|error, "seconds",
"result" | "error"}), DIR/summary.json and the table in DIR/summary.txt; exits 0 when every
selected stage is ok, else 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name -> (seconds allowed on the lent H100 or H200, what it measures). Together 450 s, under
# run.sh's limit for this script (RUNNER_S: the runner's own start and table besides).
# Two ranks on the one GPU over NCCL are not a stage: NCCL refuses a communicator with two ranks
# on one device (ncclInvalidUsage, "Duplicate GPU detected"); the 2-rank FSDP2 path runs on CPU.
STAGES = {
    "nccl": (30, "single-rank NCCL collectives on CUDA tensors (fp32, bf16)"),
    "step": (150, "GRPOModule, Qwen3-VL-8B config at 2 and 4 layers, FSDP2 1 rank, 4k/16k tokens"),
    "rollout_copy": (60, "the transformers engine's own copy of an fp32-master policy"),
    "engine": (60, "transformers engine on the 4-layer model: tokens/s, memory"),
    "gpu_tests": (150, 'pytest tests/gpu -m "gpu and not vllm"'),
}
# Expected seconds of each stage there, each within 75% of its limit (tests/gpu/test_stages.py).
# Estimates, not GPU measurements: a stage's process imports torch, transformers and Lightning
# (7 s of CPU measured here); its CPU work is scaled from the `--device cpu --tiny` rehearsal on
# this project's 2 cores; its GPU work is small at the ~800 TFLOP/s bf16 the lent machines show:
# 6 x 2.6e9 parameters x 16,384 tokens = 2.6e14 FLOP, under a second a step.
# - nccl: imports + CUDA context + a 1-rank NCCL group.
# - step: imports, Qwen's processor folder (CPU), then 4 Lightning fits of about 8 s each
#   (model build on the GPU, FSDP2 wrap, trainer set-up, one step).
# - rollout_copy, engine: imports, a 4-layer model, 8 requests (8 and 128 new tokens).
# - gpu_tests: pytest's start, the session fixtures (the tiny tool caller is trained on the
#   CPU: 45 s of CPU measured here), the bf16 engine test and a 2-step CUDA training run.
EXPECTED_S = {"nccl": 10, "step": 60, "rollout_copy": 30, "engine": 25, "gpu_tests": 80}
# The device machine's time around the stages, counted in the session's 15 minutes: its start
# and the working tree's transfer ("a minute or more" each call, the device README), then
# run.sh's CUDA check and the wheels' unpacking (its `timeout 50`).
START_UP_S = 180
CUDA_CHECK_S = 10
DEVICE_BUDGET_S = 900


def select(spec: str | None) -> list[str]:
    """Stage names from a comma list (all, in order, when empty); unknown names are refused."""
    if not spec:
        return list(STAGES)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    return [n for n in STAGES if n in names]


def run_stage(name: str, opts: argparse.Namespace) -> dict:
    """One stage in a subprocess under its timeout (scaled by --scale); its JSON record."""
    limit = STAGES[name][0] * opts.scale
    out = Path(opts.out)
    cmd = [sys.executable, str(HERE / "stages.py"), "--child", name, "--out", str(out)]
    cmd += ["--device", opts.device] + (["--tiny"] if opts.tiny else [])
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False)
        status = None
    except subprocess.TimeoutExpired as err:
        done, status = err, "timeout"
    seconds = round(time.perf_counter() - t0, 1)
    path = out / f"{name}.json"
    record = json.loads(path.read_text()) if status is None and path.is_file() else {}
    if not record:
        stderr = done.stderr or ""
        stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        record = {"stage": name, "status": status or "error", "error": stderr[-3000:]}
    record |= {"seconds": seconds, "limit_s": limit}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def child(name: str, opts: argparse.Namespace) -> None:
    """The subprocess side: run the stage's function, write its JSON record."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parents[1]))
    import stage_work

    try:
        result = getattr(stage_work, name)(opts)
        record = {"stage": name, "status": "ok" if result.get("ok") else "failed", "result": result}
    except Exception as err:  # the record names it; the runner goes on
        record = {"stage": name, "status": "error", "error": traceback.format_exc()[-3000:]}
        print(f"{name}: {err}", file=sys.stderr)
    (Path(opts.out) / f"{name}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


def _headline(record: dict) -> str:
    """The one-line figure of a stage for the table."""
    res = record.get("result") or {}
    if record["stage"] == "step" and res.get("rows"):
        cells = []
        for r in res["rows"]:
            four = r["layers"]["4"]
            mem = f"plan {four['plan_gib']:.1f} GiB"
            if four.get("peak_gib") is not None:
                mem = f"peak {four['peak_gib']:.1f} GiB (4L), {mem}"
            cells.append(
                f"{r['tokens']}: loss {four['loss']:.3g}, |g| {four['grad_norm']:.3g}, {mem}, "
                f"{r['s_per_token_36l_est'] * 1e3:.3f} ms/tok(36L)"
            )
        return "; ".join(cells)
    if record["stage"] == "rollout_copy" and res:
        return f"{res['dtype']} on {res['device']}, {res['copy_gib']:.2f} GiB copy"
    if record["stage"] == "engine" and res:
        mem = f", {res['peak_gib']:.1f} GiB" if res.get("peak_gib") is not None else ""
        return f"{res['tokens_per_s']:.0f} tok/s{mem}"
    if record["stage"] == "gpu_tests" and res:
        bad = res.get("failures", 0) + res.get("errors", 0)
        return f"{res.get('tests', 0)} tests, {bad} failed, {res.get('skipped', 0)} skipped"
    if record["stage"] == "nccl" and res:
        return f"{res['backend']}: " + ", ".join(k for k in ("float32", "bfloat16") if res.get(k))
    return (record.get("error") or "").strip().splitlines()[-1:][0] if record.get("error") else ""


def summary_table(records: list[dict]) -> str:
    lines = [f"{'stage':<10} {'status':<8} {'s':>7}  figures", "-" * 78]
    for r in records:
        lines.append(f"{r['stage']:<10} {r['status']:<8} {r['seconds']:>7.1f}  {_headline(r)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", default="")
    p.add_argument("--out", default="runs/gpu")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="small config of the same architecture")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every stage's timeout")
    p.add_argument("--child", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    Path(opts.out).mkdir(parents=True, exist_ok=True)
    if opts.child:
        child(opts.child, opts)
        return 0
    records = [run_stage(name, opts) for name in select(opts.stages)]
    summary = {"device": opts.device, "tiny": opts.tiny, "stages": records}
    (Path(opts.out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = summary_table(records)
    (Path(opts.out) / "summary.txt").write_text(table + "\n")  # the one a person reads
    print(table)
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
