"""`paravt serve-rollout`: a rollout server, vLLM's engine behind a small HTTP API.

Runs in an environment with vLLM (on a CPU: .venv-vllm); the trainer talks to it with the
`vllm_server` engine (`paravt.rollout.serving.client`) and needs no vLLM itself. The server hosts
the in-process engine `paravt.rollout.engines.vllm.VLLMEngine`, so a request is built exactly as in
the in-process engine (each clip collapsed to one placeholder, its frames and per-clip metadata
sent along, vLLM's expansion checked against the trainer's ids) and the sampled ids and
log-probs are the ones it would return. Why not vLLM's own OpenAI server: its token-in route
takes a video only with server-wide frame metadata, so a crop that does not start at 0 s gets
wrong timestamps, and its chat route would re-tokenise the trainer's context.

Routes (JSON bodies):
    GET  /health         200 {"ok": true, ...} once the engine is up, 503 while it starts or
                         after the engine failed
    GET  /version        {"version": the weight version the server samples with}
    GET  /stats          {"requests": served so far, "names": the last named requests,
                         "syncs": the seconds of each weight sync on the server}
    POST /generate       {"requests": [...], "params": {...}} (paravt.rollout.serving.protocol)
                         -> {"outputs": [[...] per request], "version": v}
    POST /sync_weights   {"path": folder, "version": v, "plan": SYNC_PLAN}
                         -> {"version": v, "steps": the steps run, "seconds": s}
A bad request (a plan other than SYNC_PLAN, a context vLLM expands differently) gets 400 with
the error; an engine failure 500, and /health reports it from then on.

Weight sync: the plan is checked (`check_sync_plan`), then run step by step: `pause` takes the
engine lock (a running `generate` call finishes first, none starts), `load` streams the folder's
tensors into vLLM's `reload_weights`, the three cache resets, the new version, `resume`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from paravt.rollout.serving.protocol import (
    check_sync_plan,
    decode_params,
    decode_request,
    encode_output,
)


def iter_folder(folder: str | Path) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of every *.safetensors file in `folder`, one tensor at a time."""
    from safetensors import safe_open

    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


class RolloutService:
    """The engine, its lock and version, and what each route does (no HTTP here)."""

    def __init__(self, engine=None):
        self.engine = engine
        self.lock = threading.Lock()
        self.version = 0
        self.failure: str | None = None
        self.served = 0
        self.names: collections.deque[str] = collections.deque(maxlen=4096)
        self.syncs: collections.deque[float] = collections.deque(maxlen=4096)  # seconds each

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.failure is None

    def health(self) -> tuple[int, dict[str, Any]]:
        body = {"ok": self.ready, "version": self.version, "pid": os.getpid()}
        if self.failure:
            body["error"] = self.failure
        return (200 if self.ready else 503), body

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        decoded = [decode_request(r) for r in body["requests"]]
        params = decode_params(body["params"])
        with self.lock:
            outs = self.engine.generate(decoded, params)
            version = self.version
        self.served += len(decoded)
        self.names.extend(r.name for r in decoded if r.name)
        return {"outputs": [[encode_output(o) for o in out] for out in outs], "version": version}

    def sync(self, body: dict[str, Any]) -> dict[str, Any]:
        plan = tuple(body.get("plan", ()))
        check_sync_plan(plan)  # before anything changes
        if int(body["version"]) < self.version and not body.get("force"):  # never back
            return {"version": self.version, "steps": [], "skipped": "holds newer weights"}
        t0, done = time.perf_counter(), []
        try:
            for step in plan:
                getattr(self, f"_step_{step}")(body)
                done.append(step)
        finally:
            if self.lock.locked() and "resume" not in done:
                self.lock.release()
        self.syncs.append(time.perf_counter() - t0)
        return {"version": self.version, "steps": done, "seconds": self.syncs[-1]}

    # ---- the steps of SYNC_PLAN, in its order ---------------------------------------------
    def _step_pause(self, body) -> None:
        self.lock.acquire()

    def _step_load(self, body) -> None:
        path = body["path"]
        if not Path(path).is_dir():
            raise ValueError(f"checkpoint folder {path} does not exist on the server's machine")
        self.engine.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter_folder(path), "is_checkpoint_format": True},
        )

    def _step_reset_prefix_cache(self, body) -> None:
        self.engine.llm.reset_prefix_cache()

    def _step_reset_encoder_cache(self, body) -> None:
        self.engine.llm.llm_engine.reset_encoder_cache()

    def _step_reset_mm_cache(self, body) -> None:
        self.engine.llm.reset_mm_cache()
        self.engine._expansions.clear()

    def _step_set_version(self, body) -> None:
        self.version = int(body["version"])

    def _step_resume(self, body) -> None:
        self.lock.release()


def make_handler(service: RolloutService) -> type[BaseHTTPRequestHandler]:
    from paravt.rollout.serving.nccl import receiver_routes  # weight_transfer=nccl's routes

    nccl_routes = receiver_routes(service)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args) -> None:
            pass  # one line per request would flood the server's log

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(*service.health())
            elif self.path == "/version":
                self._send(200, {"version": service.version})
            elif self.path == "/stats":
                stats = {"requests": service.served, "names": list(service.names)}
                self._send(200, stats | {"syncs": list(service.syncs)})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            routes = {"/generate": service.generate, "/sync_weights": service.sync} | nccl_routes
            if self.path not in routes:
                self._send(404, {"error": f"no route {self.path}"})
                return
            if not service.ready:
                self._send(503, service.health()[1])
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            try:
                self._send(200, routes[self.path](body))
            except ValueError as err:  # the request's fault: the server stays up
                self._send(400, {"error": str(err)})
            except Exception as err:
                service.failure = f"{type(err).__name__}: {err}"
                self._send(500, {"error": traceback.format_exc(limit=8)})

    return Handler


def _watch_parent(parent: int) -> None:
    """Exit when the process that started this server is gone: no orphan servers."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(3)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="paravt serve-rollout", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF checkpoint folder (model + processor)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (see --port-file)")
    p.add_argument("--port-file", default=None, help="write the bound port here")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-videos", type=int, default=16, help="clips per context")
    p.add_argument("--kv-cache-gb", type=int, default=1, help="CPU backend's KV cache")
    p.add_argument("--mm-cache-gb", type=float, default=4.0)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-transfer", choices=["checkpoint", "nccl"], default="checkpoint")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process ends")
    return p.parse_args(argv)


def build_engine_from_args(args: argparse.Namespace):
    from transformers import AutoProcessor

    from paravt.rollout.engine import EngineConfig
    from paravt.rollout.engines.vllm import VLLMEngine

    dtype = args.dtype
    if dtype == "auto":  # the checkpoint's own dtype (vLLM's "auto" would serve fp32 in 16 bits)
        config = json.loads((Path(args.model) / "config.json").read_text())
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    cfg = EngineConfig(
        name="vllm",
        dtype=dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=not args.no_prefix_caching,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        kv_cache_gb=args.kv_cache_gb,
        mm_processor_cache_gb=args.mm_cache_gb,
        max_videos_per_prompt=args.max_videos,
        seed=args.seed,
        weight_transfer=args.weight_transfer,  # nccl: paravt.rollout.serving.nccl's routes
    )
    processor = AutoProcessor.from_pretrained(args.model)
    # world=1: a standalone engine, never the external launcher of a launch it may sit in
    return VLLMEngine.from_model(cfg, None, processor, model_path=args.model, world=1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    service = RolloutService()
    # Bind first: the port is known (and /health answers 503) while the engine starts.
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(service))
    httpd.daemon_threads = True
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    if args.port_file:
        tmp = Path(args.port_file).with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.rename(args.port_file)
    print(f"paravt rollout server: starting vLLM on {args.model}, port {port}", flush=True)
    service.engine = build_engine_from_args(args)
    print(f"paravt rollout server: ready on http://{args.host}:{port}", flush=True)
    threading.Event().wait()  # until SIGTERM / SIGKILL
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
