"""An agent program that plays paravt's own loop through the gateway: the task payload's
messages, then per turn each call block of the reply's text answered as paravt's loop does (a
crop with the frames paravt's `crop_video` would pick, as a video part; an error text for a
malformed call or a bad window), and the forced-answer message after the last tool round.
Played against the same engine, it must give `AgentLoop`'s trajectory token for token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from paravt.agent import prompts
from paravt.agent.parsing import parse_tool_calls
from paravt.agent.tools import CropConfig, CropVideoTool
from paravt.gateway.task import crop_part
from paravt.video.reader import VideoReader
from paravt.video.sampling import timestamps

Send = Callable[[list[dict[str, Any]]], dict[str, Any]]


def tool_messages(reply: dict[str, Any], video: str, source, crop: CropConfig) -> list[dict]:
    """One tool message per call block of `reply`'s text, in order, as paravt's loop answers
    them: a malformed block (not in `tool_calls`) or a bad window gets its error text, a crop
    its clip."""
    out = []
    info = source.info(video)
    ids = iter(c["id"] for c in reply.get("tool_calls", []))
    for parsed in parse_tool_calls(reply["content"], max_calls=crop.max_calls_per_turn):
        if not parsed.ok:
            out.append({"role": "tool", "content": f"Error: {parsed.error}"})
            continue
        call_id = next(ids)
        plan = CropVideoTool().plan(parsed.call, info, crop)
        if isinstance(plan, str):
            out.append({"role": "tool", "tool_call_id": call_id, "content": f"Error: {plan}"})
            continue
        start, end = plan.window
        times = prompts.format_times(timestamps(plan.indices, info.fps))
        text = f"crop_video {start:.1f}s-{end:.1f}s, frames at {times}:\n"
        content = [{"type": "text", "text": text}, crop_part(video, plan.indices, crop)]
        out.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return out


def play(send: Send, payload: dict[str, Any], source, max_rounds: int, crop=None) -> list:
    """Run one episode through `send` (the reply's message, with the choice's `finish_reason`
    where the sender has it); the final message list."""
    crop = crop or CropConfig()
    messages = [dict(m) for m in payload["messages"]]
    for round_index in range(max_rounds + 1):
        reply = send(messages)
        cut = reply.pop("finish_reason", "stop") == "length"  # as the sender saw the choice
        messages.append(reply)
        tools = tool_messages(reply, payload["video"], source, crop)
        if cut or not tools or round_index >= max_rounds:  # the loop ends a cut turn too
            break
        messages += tools
        if round_index + 1 >= max_rounds:
            messages.append(prompts.forced_answer_message())
    return messages


def http_program(base_url: str, payload: dict[str, Any]) -> float:
    """The mimic as an agent program (`paravt.gateway.rollouts`): plain HTTP to its episode's
    OpenAI base URL, two tool rounds; it reports a reward of 1."""
    with httpx.Client(timeout=300) as client:

        def send(messages):
            body = {"model": "paravt", "messages": messages, "temperature": 0.3}
            reply = client.post(f"{base_url}/chat/completions", json=body)
            choice = reply.raise_for_status().json()["choices"][0]
            return {**choice["message"], "finish_reason": choice["finish_reason"]}

        play(send, payload, VideoReader(), max_rounds=2)
    return 1.0


def failing_program(base_url: str, payload: dict[str, Any]) -> None:
    """An agent program with a bug on the sample whose id ends in 1."""
    if payload["sample_id"].endswith("1"):
        raise KeyError("choices")
    http_program(base_url, payload)


def logging_program(base_url: str, payload: dict[str, Any]) -> float:
    """`http_program` that first appends the episode's sample id to the file named by
    PARAVT_TEST_AGENT_LOG: a training run's proof that its rollouts were the program's."""
    import os

    with open(os.environ["PARAVT_TEST_AGENT_LOG"], "a") as log:
        log.write(payload["sample_id"] + "\n")
    return http_program(base_url, payload)


def hanging_program(base_url: str, payload: dict[str, Any]) -> float:
    """An agent program that hangs after its first turn on the sample whose id ends in 1."""
    import time

    with httpx.Client(timeout=300) as client:
        body = {"model": "paravt", "messages": payload["messages"]}
        client.post(f"{base_url}/chat/completions", json=body).raise_for_status()
    if payload["sample_id"].endswith("1"):
        time.sleep(2.5)
    return 1.0


def posting_program(base_url: str, payload: dict[str, Any]) -> float:
    """`http_program` that posts a reward of 0.25 to its episode (`{base_url}/reward`) and
    returns 1, which the posted reward overrides."""
    http_program(base_url, payload)
    httpx.post(f"{base_url}/reward", json={"reward": 0.25}, timeout=60).raise_for_status()
    return 1.0


def silent_program(base_url: str, payload: dict[str, Any]) -> None:
    """`http_program` that neither posts nor returns a reward."""
    http_program(base_url, payload)


def editing_program(base_url: str, payload: dict[str, Any]) -> None:
    """An agent that post-processes the model's text: it answers again after rewriting its
    first reply (a history the gateway cannot extend token for token: one fork)."""
    with httpx.Client(timeout=300) as client:
        messages = list(payload["messages"])
        for _ in range(2):
            body = {"model": "paravt", "messages": messages}
            reply = client.post(f"{base_url}/chat/completions", json=body).raise_for_status()
            message = reply.json()["choices"][0]["message"]
            edited = {"role": "assistant", "content": "edited: " + (message["content"] or "")}
            messages += [edited, {"role": "user", "content": "Answer now."}]
