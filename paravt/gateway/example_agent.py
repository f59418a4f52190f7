"""An agent program of its own, trained through the gateway: `rollout.agent_program=
paravt.gateway.example_agent:run`. It is a plain `openai` client program (the gateway's episode
URL is its base URL), and its crop tool is its own, on decord, not paravt's: the frames it
returns go back as images with their times, and the gateway shows them to the policy as a clip
with its true clock."""

from __future__ import annotations

import base64
import io
import json

import decord
import numpy as np
from openai import OpenAI
from PIL import Image


def crop(video: str, start: float, end: float, max_frames: int = 8) -> dict:
    """The tool: up to `max_frames` frames spread over [start, end] (at most 1 fps), as a video
    part of images with their times."""
    reader = decord.VideoReader(video)
    fps, n = float(reader.get_avg_fps()), len(reader)
    step = max(1.0, (end - start) / max_frames)
    times = np.arange(max(start, 0.0), min(end, n / fps), step)[:max_frames]
    if len(times) < 2:
        raise ValueError(f"window {start}-{end}s holds fewer than 2 frames")
    indices = [min(int(t * fps), n - 1) for t in times]
    urls = []
    for frame in reader.get_batch(indices).asnumpy():
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    spec = {"images": urls, "timestamps": [i / fps for i in indices], "fps": fps}
    return {"type": "video_url", "video_url": spec}


def tool_message(call, video: str) -> dict:
    """The tool's answer to one `tool_calls` entry (an `Error: ...` text on bad arguments)."""
    try:
        args = json.loads(call.function.arguments)
        start, end = float(args["start_time"]), float(args["end_time"])
        part = crop(video, start, end)
    except (KeyError, ValueError, TypeError) as err:
        return {"role": "tool", "tool_call_id": call.id, "content": f"Error: {err}"}
    times = ", ".join(f"{t:.1f}s" for t in part["video_url"]["timestamps"])
    text = {"type": "text", "text": f"crop_video {start:.1f}s-{end:.1f}s, frames at {times}:\n"}
    return {"role": "tool", "tool_call_id": call.id, "content": [text, part]}


def run(base_url: str, payload: dict, max_rounds: int = 2) -> None:
    """One episode: the task's messages, then up to `max_rounds` rounds of crops, an answer."""
    messages = list(payload["messages"])
    with OpenAI(base_url=base_url, api_key="-", timeout=600, max_retries=0) as client:
        for round_index in range(max_rounds + 1):
            reply = client.chat.completions.create(model="paravt", messages=messages)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            cut = reply.choices[0].finish_reason == "length"  # no end of turn to go on from
            if cut or not message.tool_calls or round_index == max_rounds:
                return
            messages += [tool_message(c, payload["video"]) for c in message.tool_calls]
