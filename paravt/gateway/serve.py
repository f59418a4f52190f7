"""`paravt serve-gateway`: the OpenAI-compatible gateway over a checkpoint, under uvicorn.

    paravt serve-gateway --model DIR --media-root DIR [--port 8000 --engine hf --force-think
                         --episode-idle-s 600]

Agents open an episode (`POST /v1/episodes`), then talk to `/episodes/<id>/v1` as an OpenAI
base URL (or send the `X-Episode-Id` header); see paravt/gateway/app.py for the routes.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from paravt.agent.prompts import FORCED_THINK
from paravt.agent.render import ChatRenderer
from paravt.gateway.app import Gateway, build_app
from paravt.gateway.batcher import Batcher
from paravt.gateway.episode import EpisodeRenderer
from paravt.gateway.media import MediaConfig

PROG = "paravt serve-gateway"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a saved Qwen-VL checkpoint directory")
    p.add_argument("--media-root", required=True, help="videos are served only under this folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="the port to listen on")
    p.add_argument("--engine", default="hf", help="rollout engine: hf, vllm, vllm_server")
    p.add_argument("--force-think", action="store_true", help="open each turn with <think>")
    p.add_argument("--max-new-tokens", type=int, default=2048)
    p.add_argument("--max-batch", type=int, default=64, help="requests per engine call")
    p.add_argument("--max-body-mb", type=float, default=32.0)
    p.add_argument(
        "--episode-idle-s",
        type=float,
        default=600.0,
        help="close an episode no request touched for this long (0: never)",
    )
    return p


def build_gateway(model, processor, engine, args: argparse.Namespace) -> Gateway:
    """The gateway of a loaded model and its engine, configured by `args`."""
    from paravt.video.reader import VideoReader

    renderer = ChatRenderer(processor)
    media = MediaConfig(root=args.media_root, factor=renderer.frame_factor)
    prefix = FORCED_THINK if args.force_think else ""
    episodes = EpisodeRenderer(renderer, VideoReader(), media, prefix=prefix)
    return Gateway(
        episodes,
        Batcher(engine, max_batch=args.max_batch),
        max_new_tokens=args.max_new_tokens,
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        episode_idle_s=args.episode_idle_s or None,
    )


def problem(args: argparse.Namespace) -> str | None:
    """What makes `args` unservable, checked before the model loads (None: nothing)."""
    from paravt.rollout.factory import check_engine_name

    for flag, path in (("--model", args.model), ("--media-root", args.media_root)):
        if not Path(path).is_dir():
            return f"{flag} {path} is not a directory"
    try:
        check_engine_name(args.engine)
    except ValueError as err:
        return f"--engine {args.engine}: {err}"
    bounds = [
        ("--port", args.port, 1 <= args.port <= 65535, "in 1..65535"),
        ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 1, ">= 1"),
        ("--max-batch", args.max_batch, args.max_batch >= 1, ">= 1"),
        ("--max-body-mb", args.max_body_mb, 0 < args.max_body_mb < math.inf, "finite and > 0"),
        ("--episode-idle-s", args.episode_idle_s, args.episode_idle_s >= 0, ">= 0 (0: never)"),
    ]
    for flag, value, ok, rule in bounds:
        if not ok:  # NaN fails too
            return f"{flag} must be {rule} (got {value})"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    found = problem(args)
    if found:
        print(f"{PROG}: {found}", file=sys.stderr)
        return 2
    import uvicorn
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from paravt.rollout.factory import build_engine

    processor = AutoProcessor.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model).eval()
    engine = build_engine(args.engine, model, processor, model_path=args.model)
    app = build_app(build_gateway(model, processor, engine, args))
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    server = uvicorn.Server(config)
    return 0 if server.run() is None else 1


@contextlib.contextmanager
def serving(gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """`http://HOST:PORT` of uvicorn serving `gateway` in a thread of this process until the
    block ends (training's agent pool and the tests talk to it; port 0: a free one)."""
    import uvicorn

    config = uvicorn.Config(build_app(gateway), host=host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name="paravt-gateway")
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the gateway could not listen on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(10)
