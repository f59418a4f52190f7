"""The demo's RL phase with vLLM in-process and on a rollout server, sync and async, in one run.

One short cold start (its weights exported once), then the same RL steps and seeds four times
from those weights, one after the other in this process:
    vllm         sync    in-process vllm.LLM (rollout/engine=vllm)
    vllm         async   the same in the asynchronous generator process (max_staleness 2)
    vllm_server  sync    one paravt rollout server on 127.0.0.1 (rollout/engine=vllm_server)
    vllm_server  async   the same server, the generator process its client (max_staleness 2)
The server is started once (its start-up is reported, not counted) and shared by both server
runs (each loads the run's weights first). Prints steps per minute (between the end of the
first and of the last step: start-ups left out), the weight-sync seconds (`time/sync`, mean over
the syncs of a sync run: write + check + load for a server; an async run syncs in its generator
process, so 0 there), the server's own share of each sync (pause -> load -> resets -> resume,
from its /stats), the mean staleness and the held-out accuracy at the end. Needs vLLM in this
interpreter (on a CPU: .venv-vllm/bin/python).

    python benchmarks/rollout_servers.py [--steps 6] [--cold-start-steps 60] [--eval 16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_vs_sync import StepClock, cold_start, demo_cfg, scalars


def rl(tmp: Path, model: Path, engine: str, mode: str, steps: int, limit: int, url: str):
    from paravt.rollout.serving.client import http_json
    from paravt.run.build import build_run

    run_dir = tmp / f"{engine}-{mode}"
    overrides = [
        "cold_start=null",
        f"model.path={model}",
        "model.build_tiny=null",
        f"trainer.max_steps={steps}",
        f"rollout/engine={engine}",
        f"rollout.mode={mode}",
        f"rollout.max_staleness={2 if mode == 'async' else 0}",
        "algorithm.loss=decoupled_ppo",
        "callbacks.rollout_logger=null",
        "callbacks.benchmark_validation.at_start=false",
        f"callbacks.benchmark_validation.every_n_steps={steps}",
        f"callbacks.benchmark_validation.limit={limit}",
    ]
    if engine == "vllm_server":
        overrides.append(f"rollout.engine.server_urls=[{url}]")
        before = len(http_json(f"{url}/stats")[1]["syncs"])
    run = build_run(demo_cfg(run_dir, *overrides))
    clock = StepClock()
    run.trainer.callbacks.append(clock)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    engine_obj = run.datamodule.engine
    s = scalars(run_dir)
    acc = next((v for k, v in s.items() if k.startswith("val/") and k.endswith("/accuracy")), [])
    syncs = [v for v in s.get("time/sync", []) if v > 0]
    row = {
        "steps/min": 60 * (len(clock.ends) - 1) / (clock.ends[-1] - clock.ends[0]),
        "sync s (mean)": sum(syncs) / len(syncs) if syncs else float("nan"),
        "last sync s": getattr(engine_obj, "last_sync_s", float("nan")),
        "mean staleness": sum(s["rollout/staleness"]) / len(s["rollout/staleness"]),
        "held-out accuracy": acc[-1] if acc else float("nan"),
    }
    if engine == "vllm_server":  # the server's own part: pause, load, resets, resume
        on_server = http_json(f"{url}/stats")[1]["syncs"][before:]
        row["server sync s"] = sum(on_server) / max(1, len(on_server))
    else:
        row["server sync s"] = float("nan")
    run.datamodule.stop_async()
    if engine == "vllm" and hasattr(engine_obj, "llm"):
        del engine_obj.llm  # the in-process engine's memory before the next run
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--cold-start-steps", type=int, default=60)
    p.add_argument("--eval", type=int, default=16, help="held-out prompts scored at the end")
    args = p.parse_args(argv)
    from paravt.rollout.engine import EngineConfig
    from paravt.rollout.serving.launch import start_server

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = cold_start(Path(tmp), args.cold_start_steps)
        t0 = time.perf_counter()
        cfg = EngineConfig(name="vllm_server", dtype="float32", max_model_len=4096)
        server = start_server(str(model), cfg, sys.executable, str(Path(tmp) / "logs"))
        startup = time.perf_counter() - t0
        try:
            for engine in ("vllm", "vllm_server"):
                for mode in ("sync", "async"):
                    rows[f"{engine} {mode}"] = rl(
                        Path(tmp), model, engine, mode, args.steps, args.eval, server.url
                    )
        finally:
            server.stop()
    names = list(rows)
    print(f"{'':<20}" + "".join(f"{n:>20}" for n in names))
    for key in rows[names[0]]:
        print(f"{key:<20}" + "".join(f"{rows[n][key]:>20.2f}" for n in names))
    print(f"rollout server start-up (to /health): {startup:.1f} s")
    base = rows["vllm sync"]["steps/min"]
    for name in names[1:]:
        print(f"{name} / vllm sync steps per minute: {rows[name]['steps/min'] / base:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
