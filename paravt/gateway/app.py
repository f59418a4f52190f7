"""The gateway's HTTP face: an OpenAI-compatible ASGI app (FastAPI) over paravt episodes.

Routes (docs/reuse.md, "Training an agent program through the gateway"):
    POST /v1/episodes                         open an episode: {"id"?, "payload"?} -> {"id"}
    GET  /v1/episodes/{id}                    its task payload, forks and turns so far
    POST /v1/episodes/{id}/reward             {"reward": float}: the agent's own reward (also
                                              at /episodes/{id}/v1/reward, the base URL's)
    POST /v1/episodes/{id}/finish             close it: its trajectories' tokens, mask, log-probs
    POST /v1/chat/completions                 the episode named by the X-Episode-Id header
    POST /episodes/{id}/v1/chat/completions   the same, for clients that only set a base URL
    GET  /v1/metrics                          gateway/forks, gateway/episodes, gateway/requests
`stream: true` answers with server-sent events (chunks, then `data: [DONE]`); the engine samples
a whole turn, so the stream frames one finished turn. Requests of one episode run one at a time;
different episodes' requests share engine calls (`Batcher`). An episode no request touched for
`episode_idle_s` seconds (none in flight) is closed and freed (`gateway/expired_episodes`): an
agent that crashed or hung holds nothing for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from paravt.errors import check_number
from paravt.gateway.batcher import Batcher
from paravt.gateway.episode import Episode, EpisodeRenderer, trajectories
from paravt.gateway.media import RequestError
from paravt.rollout.engine import SamplingParams
from paravt.types import Trajectory

EPISODE_HEADER = "X-Episode-Id"


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Gateway:
    """Episodes, their renderer and the batched engine: what the app serves and what paravt's
    training reads back (`finish` -> trajectories)."""

    def __init__(
        self,
        episodes: EpisodeRenderer,
        batcher: Batcher,
        max_new_tokens: int = 2048,
        max_body_bytes: int = 32 << 20,
        max_episodes: int = 10000,
        episode_idle_s: float | None = None,
    ):
        if episode_idle_s is not None and not episode_idle_s > 0:
            raise ValueError(f"episode_idle_s must be > 0 seconds or None, got {episode_idle_s}")
        self.renderer = episodes
        self.batcher = batcher
        self.max_new_tokens = max_new_tokens
        self.max_body_bytes = max_body_bytes
        self.max_episodes = max_episodes  # open at once: an agent that never finishes is capped
        self.episode_idle_s = episode_idle_s  # None: episodes wait for their finish for ever
        self.episodes: dict[str, Episode] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.forks: Counter = Counter()  # of finished episodes
        self.requests = 0
        self.expired = 0  # episodes closed for idleness
        self._open_lock = threading.Lock()  # training finishes episodes from its own threads

    def open(
        self,
        episode_id: str | None = None,
        payload: dict | None = None,
        params: SamplingParams | None = None,
        seed: int | None = None,
    ) -> str:
        """Open an episode; `params` (training) replace the sampling fields of its requests, and
        `seed` (training) is its seed stream (each request's seed derives from it and the turn)."""
        eid = episode_id or uuid.uuid4().hex
        if not isinstance(eid, str) or not eid or "/" in eid:
            raise HTTPError(400, f"episode id {eid!r} must be a non-empty string without '/'")
        if eid in self.episodes:
            raise HTTPError(409, f"episode {eid!r} is already open")
        if len(self.episodes) >= self.max_episodes:
            raise HTTPError(429, f"{self.max_episodes} episodes are open: finish some first")
        with self._open_lock:
            self.episodes[eid] = Episode(eid, dict(payload or {}), params=params, seed=seed)
            self.locks[eid] = asyncio.Lock()
        return eid

    def get(self, episode_id: str) -> Episode:
        """The open episode (and a touch: it is not idle)."""
        ep = self.episodes.get(episode_id)
        if ep is None:
            idle = f" or idle for {self.episode_idle_s:g} s" if self.episode_idle_s else ""
            why = f"never opened, finished{idle}"
            raise HTTPError(404, f"episode {episode_id!r} is not open ({why})")
        ep.touched = time.monotonic()
        return ep

    def finish(self, episode_id: str, **trajectory_fields) -> tuple[Trajectory, ...]:
        """Close the episode; its trajectories (`trajectories`' keyword fields pass through)."""
        with self._open_lock:
            ep = self.get(episode_id)
            del self.episodes[episode_id], self.locks[episode_id]
        self.forks.update(ep.forks)
        return trajectories(ep, **trajectory_fields)

    def expire(self, now: float | None = None) -> list[str]:
        """Close the episodes idle past `episode_idle_s` (no request in flight, not `held`);
        their ids. Their tokens are dropped: nobody is left to finish them."""
        if self.episode_idle_s is None:
            return []
        now = time.monotonic() if now is None else now
        with self._open_lock:
            gone = [
                eid
                for eid, ep in self.episodes.items()
                if not ep.held
                and now - ep.touched > self.episode_idle_s
                and not self.locks[eid].locked()
            ]
            for eid in gone:
                self.forks.update(self.episodes.pop(eid).forks)
                del self.locks[eid]
        self.expired += len(gone)
        return gone

    def metrics(self) -> dict[str, float]:
        forks = self.forks + sum((ep.forks for ep in self.episodes.values()), Counter())
        out = {f"gateway/forks_{k}": float(v) for k, v in sorted(forks.items())}
        out["gateway/forks"] = float(sum(forks.values()))
        out["gateway/episodes"] = float(len(self.episodes))
        out["gateway/expired_episodes"] = float(self.expired)
        out["gateway/requests"] = float(self.requests)
        out["gateway/engine_calls"] = float(self.batcher.batches)
        return out

    async def complete(self, episode_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion of the episode: render, sample (batched), commit; the reply."""
        ep = self.get(episode_id)
        params = ep.params or self.sampling(body)
        async with self.locks[episode_id]:
            try:
                pending = await run_in_threadpool(self.renderer.plan, ep, body.get("messages"))
            except RequestError as err:
                raise HTTPError(400, str(err)) from err
            out, version = await self.batcher.generate(pending.request(), params)
            message = self.renderer.commit(pending, out, version)
            ep.touched = time.monotonic()  # idle from the reply on, not from the request
        self.requests += 1
        # A turn cut by the token cap is "length" even when calls parse from it (OpenAI's rule):
        # it has no end-of-turn token, and paravt's loop ends such a trajectory.
        calls = "tool_calls" in message
        reason = "length" if out.finish_reason != "stop" else ("tool_calls" if calls else "stop")
        prompt_tokens = len(pending.request().token_ids)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model", "paravt")),
            "choices": [{"index": 0, "message": message, "finish_reason": reason}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(out.token_ids),
                "total_tokens": prompt_tokens + len(out.token_ids),
            },
        }

    def sampling(self, body: dict[str, Any]) -> SamplingParams:
        """OpenAI sampling fields -> `SamplingParams` (temperature 0: greedy; n must be 1); a
        field of the wrong type or out of range is a 400 naming it."""
        if body.get("n", 1) != 1:
            raise HTTPError(400, "n must be 1: each sample of a group is its own episode")
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_new_tokens
        temperature = body.get("temperature", 1.0)
        if temperature is None:
            temperature = 1.0
        seed = body.get("seed")
        try:
            check_number("max_tokens", cap, least=1, integer=True)
            check_number("temperature", temperature, least=0)
            check_number("seed", seed, least=0, integer=True, optional=True)
        except ValueError as err:
            raise HTTPError(400, str(err)) from err
        if seed is not None and seed >= 2**63:
            raise HTTPError(400, f"seed must be below 2**63, got {seed}")
        return SamplingParams(
            max_new_tokens=min(cap, self.max_new_tokens),
            temperature=float(temperature) if temperature else 1.0,
            greedy=not temperature,
            seed=seed,
        )


def build_app(gateway: Gateway) -> FastAPI:
    """The ASGI app of `gateway` (serve it with uvicorn)."""
    app = FastAPI(title="paravt gateway", lifespan=_reaper(gateway))
    app.state.gateway = gateway

    @app.exception_handler(HTTPError)
    async def _error(_request: Request, err: HTTPError) -> JSONResponse:
        body = {"error": {"message": str(err), "type": "invalid_request_error"}}
        return JSONResponse(body, status_code=err.status)

    _episode_routes(app, gateway)
    _chat_routes(app, gateway)
    return app


def _reaper(gateway: Gateway):
    """The app's lifespan: while it serves, idle episodes are closed every quarter of the idle
    limit (at most every 5 s)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        async def sweep():
            while True:
                await asyncio.sleep(min(gateway.episode_idle_s / 4, 5.0))
                gateway.expire()

        task = asyncio.create_task(sweep()) if gateway.episode_idle_s else None
        yield
        if task is not None:
            task.cancel()

    return lifespan


def _episode_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.post("/v1/episodes")
    async def open_episode(request: Request):
        body = await read_json(request, gateway.max_body_bytes)
        return {"id": gateway.open(body.get("id"), body.get("payload"))}

    @app.get("/v1/episodes/{episode_id}")
    async def episode(episode_id: str):
        ep = gateway.get(episode_id)
        turns = sum(len(b.turns) for b in ep.branches)
        return {"id": ep.id, "payload": ep.payload, "forks": sum(ep.forks.values()), "turns": turns}

    @app.post("/v1/episodes/{episode_id}/reward")
    @app.post("/episodes/{episode_id}/v1/reward")  # f"{base_url}/reward" for an agent program
    async def reward(episode_id: str, request: Request):
        body = await read_json(request, gateway.max_body_bytes)
        if not isinstance(body.get("reward"), (int, float)):
            raise HTTPError(400, 'post {"reward": <number>}')
        gateway.get(episode_id).reward = float(body["reward"])
        return {"id": episode_id, "reward": float(body["reward"])}

    @app.post("/v1/episodes/{episode_id}/finish")
    async def finish(episode_id: str):
        ep = gateway.get(episode_id)
        forks, reward = dict(ep.forks), ep.reward
        trajs = gateway.finish(episode_id)
        return {
            "id": episode_id,
            "forks": forks,
            "reward": reward,
            "trajectories": [
                {
                    "token_ids": list(t.token_ids),
                    "loss_mask": list(t.loss_mask),
                    "logprobs": list(t.logprobs),
                    "prompt_length": t.prompt_length,
                    "num_videos": len(t.visuals),
                    "finish_reason": t.finish_reason,
                }
                for t in trajs
            ],
        }

    @app.get("/v1/metrics")
    async def metrics():
        return gateway.metrics()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "paravt", "object": "model"}]}


def _chat_routes(app: FastAPI, gateway: Gateway) -> None:
    async def chat(request: Request, episode_id: str | None):
        if not episode_id:
            raise HTTPError(
                400,
                f"name the episode: the {EPISODE_HEADER} header or the path "
                "/episodes/<id>/v1/chat/completions",
            )
        body = await read_json(request, gateway.max_body_bytes)
        reply = await gateway.complete(episode_id, body)
        if not body.get("stream"):
            return reply
        return StreamingResponse(sse_chunks(reply), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_by_header(request: Request):
        return await chat(request, request.headers.get(EPISODE_HEADER))

    @app.post("/episodes/{episode_id}/v1/chat/completions")
    async def chat_by_path(episode_id: str, request: Request):
        return await chat(request, episode_id)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object; 413 past `limit` bytes (read no further), 400 if not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"request body of {declared} bytes exceeds the {limit}-byte limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks) or b"{}")
    except ValueError as err:
        raise HTTPError(400, f"the request body is not JSON: {err}") from err
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    return body


async def sse_chunks(reply: dict[str, Any]):
    """A finished reply as OpenAI stream chunks: role and content, tool calls, finish reason."""
    choice = reply["choices"][0]
    message = choice["message"]
    head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        body = head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(body)}\n\n"

    yield chunk({"role": "assistant", "content": message["content"]})
    if "tool_calls" in message:
        calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        yield chunk({"tool_calls": calls})
    yield chunk({}, choice["finish_reason"])
    yield "data: [DONE]\n\n"
