"""The gateway on a real loopback server (uvicorn): plain and streamed completions (plain HTTP
and the real `openai` client), 50 episodes at once sharing engine calls, 500 kept apart, idle
episodes closed, hostile requests, and `paravt serve-gateway` on the tiny model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from urllib.parse import urlparse

import httpx
import pytest
from transformers import AutoProcessor

from paravt.agent.prompts import FORCED_THINK
from paravt.agent.render import ChatRenderer
from paravt.agent.tools import CropConfig
from paravt.gateway.app import Gateway
from paravt.gateway.batcher import Batcher
from paravt.gateway.episode import EpisodeRenderer
from paravt.gateway.media import MediaConfig, video_part
from paravt.gateway.serve import serving
from paravt.gateway.task import task_payload
from paravt.video.reader import VideoReader
from tests.gateway.mimic import play, tool_messages
from tests.gateway.test_episode import scripted

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def gateway(tiny_qwen3_dir, needle_dir):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    renderer = ChatRenderer(processor)
    media = MediaConfig(root=str(needle_dir), factor=renderer.frame_factor)
    episodes = EpisodeRenderer(renderer, VideoReader(), media, prefix=FORCED_THINK)
    engine = scripted(processor.tokenizer)
    return Gateway(episodes, Batcher(engine, max_batch=64), max_body_bytes=1 << 20)


@pytest.fixture(scope="module")
def url(gateway):
    with serving(gateway) as base:
        yield base


def stream_reply(lines) -> dict:
    """The assistant message assembled from OpenAI stream chunks (SSE `data:` lines)."""
    message: dict = {"role": "assistant", "content": ""}
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        delta = json.loads(line[6:])["choices"][0]["delta"]
        message["content"] += delta.get("content") or ""
        if "tool_calls" in delta:
            message["tool_calls"] = [
                {k: v for k, v in c.items() if k != "index"} for c in delta["tool_calls"]
            ]
    return message


def http_sender(client: httpx.Client, base: str, eid: str, stream: bool):
    def send(messages):
        body = {"model": "paravt", "messages": messages, "temperature": 0, "stream": stream}
        path = f"{base}/episodes/{eid}/v1/chat/completions"
        if not stream:
            reply = client.post(path, json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["message"]
        with client.stream("POST", path, json=body) as reply:
            assert reply.headers["content-type"].startswith("text/event-stream")
            return stream_reply(list(reply.iter_lines()))

    return send


def test_plain_and_streamed_episodes_give_the_same_trajectory(url, needle_samples):
    sample = needle_samples[0]
    payload = task_payload(sample, 4, VideoReader())
    trajs = []
    with httpx.Client(timeout=60) as client:
        for stream in (False, True):
            eid = client.post(f"{url}/v1/episodes", json={"payload": payload}).json()["id"]
            got = client.get(f"{url}/v1/episodes/{eid}").json()["payload"]
            assert got["frame_budget"] == 4
            messages = play(http_sender(client, url, eid, stream), got, VideoReader(), 2)
            assert messages[2]["tool_calls"][0]["function"]["name"] == "crop_video"
            trajs.append(client.post(f"{url}/v1/episodes/{eid}/finish").json())
            assert client.get(f"{url}/v1/episodes/{eid}").status_code == 404  # closed
    plain, streamed = (t["trajectories"] for t in trajs)
    assert plain == streamed and len(plain) == 1 and trajs[0]["forks"] == {}
    # Overview + 2 crops; the two turns' tokens trained, the prompt not.
    assert plain[0]["num_videos"] == 3 and sum(plain[0]["loss_mask"]) > 0
    assert sum(plain[0]["loss_mask"][: plain[0]["prompt_length"]]) == 0


def test_fifty_concurrent_episodes_share_engine_calls(url, gateway, needle_samples):
    sample = needle_samples[0]
    payload = task_payload(sample, 4, VideoReader())
    calls_before = gateway.batcher.batches

    async def episode(client: httpx.AsyncClient, i: int) -> str:
        eid = (await client.post(f"{url}/v1/episodes", json={"id": f"ep{i}"})).json()["id"]
        messages = list(payload["messages"])
        for _ in range(2):
            body = {"messages": messages, "temperature": 0}
            reply = await client.post(
                f"{url}/v1/chat/completions", json=body, headers={"X-Episode-Id": eid}
            )
            assert reply.status_code == 200, reply.text
            message = reply.json()["choices"][0]["message"]
            tools = tool_messages(message, sample.video, VideoReader(), CropConfig())
            messages = [*messages, message, *tools]
        return eid

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(episode(client, i) for i in range(50)))

    eids = asyncio.run(main())
    trajs = [gateway.finish(e) for e in eids]
    # Every episode: one trajectory (no fork), 2 turns, its own tokens equal to the others'.
    assert all(len(t) == 1 and len(t[0].turns) == 2 for t in trajs)
    assert len({t[0].token_ids for t in trajs}) == 1
    # 100 requests, batched: fewer engine calls than requests.
    assert gateway.batcher.batches - calls_before < 100


def test_the_openai_client_reads_plain_and_streamed_replies(url, gateway, needle_samples):
    """The real `openai` client on the loopback server: a stream is its `Stream` of
    `ChatCompletionChunk`s with the calls as `tool_calls` deltas, the SDK's own accumulator
    (`.stream()`) rebuilds them, and the assembled turn continues the episode without a fork."""
    from openai import OpenAI, Stream
    from openai.types.chat import ChatCompletionChunk

    sample = needle_samples[0]
    payload = task_payload(sample, 4, VideoReader())
    messages = list(payload["messages"])
    eid = gateway.open(payload=payload)
    with OpenAI(base_url=f"{url}/episodes/{eid}/v1", api_key="-", max_retries=0) as client:
        chunks = client.chat.completions.create(model="m", messages=messages, stream=True)
        assert isinstance(chunks, Stream)
        chunks = list(chunks)
        assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
        calls = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
        # The scripted turn crops [2, 6] s and [10, 14] s: two calls, indices 0 and 1.
        assert [(d.index, d.id, d.function.name) for d in calls] == [
            (0, "call_0_0", "crop_video"),
            (1, "call_0_1", "crop_video"),
        ]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        with client.chat.completions.stream(model="m", messages=messages) as stream:
            final = stream.get_final_completion().choices[0].message
        assert [c.id for c in final.tool_calls] == ["call_0_0", "call_0_1"]
        assert json.loads(final.tool_calls[1].function.arguments)["start_time"] == 10.0
        turn = final.model_dump(exclude_none=True)
        tools = tool_messages(turn, sample.video, VideoReader(), CropConfig())
        plain = client.chat.completions.create(model="m", messages=[*messages, turn, *tools])
        assert plain.choices[0].message.content.endswith("<answer>A</answer>")
        assert plain.choices[0].finish_reason == "stop" and not plain.choices[0].message.tool_calls
    ep = gateway.get(eid)
    # The stream, then the helper's retry of turn 1 (a fork), then its clean continuation.
    assert ep.forks == {"retried": 1} and len(ep.branches[-1].turns) == 2
    gateway.finish(eid)


async def post_json(url: str, path: str, body: dict) -> tuple[int, dict]:
    """One POST on a connection of its own, HTTP/1.1 by hand: httpx's async pool spends about
    15 s here on 500 connections at once, the server itself about 4."""
    host, port = urlparse(url).hostname, urlparse(url).port
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    raw = await reader.read()
    writer.close()
    status, _, payload = raw.partition(b"\r\n\r\n")
    return int(status.split()[1]), json.loads(payload)


def test_five_hundred_concurrent_episodes_stay_apart(url, gateway):
    """500 episodes open at once, each asking at the same time: every one is served, and every
    prompt holds its own episode's text only."""
    tok = gateway.renderer.renderer.tokenizer

    async def episode(i: int) -> str:
        status, opened = await post_json(url, "/v1/episodes", {"id": f"many{i}"})
        assert status == 200, opened
        body = {"messages": [{"role": "user", "content": f"episode {i} here"}]}
        status, reply = await post_json(url, f"/episodes/many{i}/v1/chat/completions", body)
        assert status == 200 and reply["choices"][0]["message"]["tool_calls"], reply
        return opened["id"]

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(500)))

    eids = asyncio.run(main())
    for i, eid in enumerate(eids):
        (traj,) = gateway.finish(eid)
        prompt = tok.decode(traj.token_ids[: traj.prompt_length])
        assert f"episode {i} here" in prompt and prompt.count("episode ") == 1


def test_idle_episodes_are_closed_and_counted(gateway):
    """An episode left alone past `episode_idle_s` is closed by the server's sweep (counted in
    gateway/expired_episodes, then 404); one that keeps asking stays open."""
    idle = Gateway(gateway.renderer, gateway.batcher, episode_idle_s=0.4)
    with serving(idle) as base, httpx.Client(timeout=60) as client:
        left, busy = (client.post(f"{base}/v1/episodes", json={}).json()["id"] for _ in "ab")
        for _ in range(10):  # 1 s: the sweep runs every 0.1 s
            assert client.get(f"{base}/v1/episodes/{busy}").status_code == 200
            time.sleep(0.1)
        gone = client.get(f"{base}/v1/episodes/{left}")
        assert gone.status_code == 404 and "idle for 0.4 s" in gone.json()["error"]["message"]
        metrics = client.get(f"{base}/v1/metrics").json()
        assert metrics["gateway/expired_episodes"] == 1 and metrics["gateway/episodes"] == 1
    with pytest.raises(ValueError, match="episode_idle_s"):
        Gateway(gateway.renderer, gateway.batcher, episode_idle_s=0)


def test_hostile_requests_get_clear_errors(url, gateway, needle_samples):
    video = needle_samples[0].video
    with httpx.Client(timeout=60) as client:
        eid = client.post(f"{url}/v1/episodes", json={}).json()["id"]
        chat = f"{url}/episodes/{eid}/v1/chat/completions"

        def status(content, path=chat, **kw):
            body = {"messages": [{"role": "user", "content": content}]}
            reply = client.post(path, json=body, **kw)
            return reply.status_code, reply.json()["error"]["message"]

        outside = video_part(os.path.join(os.path.dirname(video), "..", "..", "x.mp4"), [0, 1])
        assert status([outside])[0] == 400 and "outside" in status([outside])[1]
        bad_url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}
        assert status([bad_url])[0] == 400
        assert status("hi", f"{url}/episodes/nope/v1/chat/completions")[0] == 404
        assert status("hi", f"{url}/v1/chat/completions")[0] == 400  # no episode named
        big = client.post(chat, content=b"x" * (100 << 20))  # 100 MB, limit 1 MB here
        assert big.status_code == 413
        assert client.post(chat, content=b"{not json").status_code == 400
        assert client.post(f"{url}/v1/episodes", json={"id": eid}).status_code == 409
        cap, gateway.max_episodes = gateway.max_episodes, len(gateway.episodes)
        assert client.post(f"{url}/v1/episodes", json={}).status_code == 429  # too many open
        gateway.max_episodes = cap
        # A client that goes away mid-stream leaves the server serving.
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        with client.stream("POST", chat, json=body) as reply:
            next(reply.iter_lines())
        # Its turn was kept, and the episode goes on.
        assert client.get(f"{url}/v1/episodes/{eid}").json()["turns"] == 1
        reply = client.post(chat, json={"messages": [{"role": "user", "content": "again"}]})
        assert reply.status_code == 200 and gateway.finish(eid)


HI = {"role": "user", "content": "hi"}
MALFORMED = [
    ({"messages": [HI, {"role": "assistant", "tool_calls": "x"}, HI]}, "tool_calls must be a list"),
    ({"messages": [HI, {"role": "assistant", "tool_calls": ["x"]}, HI]}, "tool_calls[0]"),
    (
        {"messages": [HI, {"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}, HI]},
        "tool_calls[0]",
    ),
    ({"messages": [HI, {"role": "assistant", "content": {"a": 1}}, HI]}, "messages[1]"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "role 'robot'"),
    ({"messages": [HI, 7]}, "messages[1]"),
    ({"messages": [HI], "max_tokens": 1e309}, "max_tokens"),
    ({"messages": [HI], "max_tokens": True}, "max_tokens"),
    ({"messages": [HI], "temperature": float("nan")}, "temperature"),
    ({"messages": [HI], "temperature": "hot"}, "temperature"),
    ({"messages": [HI], "seed": "x"}, "seed"),
    ({"messages": [HI], "seed": 2**64}, "seed"),
]


@pytest.mark.parametrize(("body", "named"), MALFORMED)
def test_malformed_messages_and_sampling_fields_are_400s_naming_the_field(url, body, named):
    """Shapes no OpenAI client sends: before, tool calls that were not objects raised deep in
    the renderer (the connection dropped), and inf / NaN / a string seed reached the engine."""
    with httpx.Client(timeout=60) as client:
        eid = client.post(f"{url}/v1/episodes", json={}).json()["id"]
        chat = f"{url}/episodes/{eid}/v1/chat/completions"
        raw = json.dumps(body)  # allow_nan: Python's json reads Infinity and NaN back
        reply = client.post(chat, content=raw, headers={"content-type": "application/json"})
        assert reply.status_code == 400, reply.text
        assert named in reply.json()["error"]["message"]
        # The episode is unharmed: a well-formed request still gets its answer.
        assert client.post(chat, json={"messages": [HI]}).status_code == 200


def test_an_assistant_turn_sent_back_as_text_parts_extends_the_episode(url, gateway):
    """OpenAI's array form of an assistant content is the same text: no fork."""
    with httpx.Client(timeout=60) as client:
        eid = client.post(f"{url}/v1/episodes", json={}).json()["id"]
        chat = f"{url}/episodes/{eid}/v1/chat/completions"
        reply = client.post(chat, json={"messages": [HI]}).json()["choices"][0]["message"]
        parts = {**reply, "content": [{"type": "text", "text": reply["content"]}]}
        tool = {"role": "tool", "content": "no video here"}
        assert client.post(chat, json={"messages": [HI, parts, tool]}).status_code == 200
        assert not gateway.get(eid).forks and len(gateway.get(eid).branches) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--engine", "foo"], "--engine foo: rollout.engine.name 'foo' is unknown"),
        (["--port", "-1"], "--port must be in 1..65535 (got -1)"),
        (["--max-batch", "0"], "--max-batch must be >= 1 (got 0)"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1 (got 0)"),
        (["--episode-idle-s", "nan"], "--episode-idle-s must be >= 0 (0: never) (got nan)"),
        (["--max-body-mb", "inf"], "--max-body-mb must be finite and > 0 (got inf)"),
    ],
)
def test_serve_gateway_refuses_unservable_flags_before_loading(tiny_qwen3_dir, extra, said, capsys):
    """Before: Python tracebacks after the model loaded (a port, an engine name), or a server
    that answered every request with nothing (--max-new-tokens 0)."""
    from paravt.gateway.serve import main

    argv = ["--model", str(tiny_qwen3_dir), "--media-root", str(tiny_qwen3_dir), *extra]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().startswith(f"paravt serve-gateway: {said}")


@pytest.mark.slow
def test_serve_gateway_cli_serves_the_tiny_model(tiny_qwen3_dir, needle_dir, needle_samples):
    port = free_port()
    argv = ["serve-gateway", "--model", str(tiny_qwen3_dir), "--media-root", str(needle_dir)]
    argv += ["--port", str(port), "--force-think", "--max-new-tokens", "16"]
    cmd = [sys.executable, "-c", "import sys; from paravt.cli import main; sys.exit(main())", *argv]
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=120) as client:
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{base}/v1/models").status_code == 200:
                        break
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
            payload = task_payload(needle_samples[0], 4, VideoReader())
            eid = client.post(f"{base}/v1/episodes", json={"payload": payload}).json()["id"]
            reply = http_sender(client, base, eid, stream=True)(payload["messages"])
            assert reply["content"].startswith(FORCED_THINK)
            assert client.get(f"{base}/v1/episodes/{eid}").json()["turns"] == 1
    finally:
        proc.terminate()
        proc.wait(30)
