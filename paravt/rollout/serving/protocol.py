"""The wire format between the `vllm_server` engine (trainer side) and a paravt rollout server.

Pure: JSON-ready dicts from the engine contract's dataclasses and back (frames as raw uint8
bytes in base64 with their shape; log-probs as JSON floats, which round-trip exactly), and the
weight-sync plan the server runs. Both sides import this module; it imports neither torch nor
vLLM, so the trainer's process needs no vLLM.

The sync plan is fixed: a server's weights change only as
    pause -> load -> reset_prefix_cache -> reset_encoder_cache -> reset_mm_cache -> set_version
    -> resume
(vLLM's own order for a reload without restart). Each reset has a measured reason: without the
prefix-cache reset the cached KV blocks of the old weights are reused (stale log-probs); without
the encoder-cache reset a clip's old vision embeddings are reused (or the engine dies with
"Encoder cache miss"); without the multimodal-cache reset processed inputs tied to the old
encoder outputs are reused. `check_sync_plan` refuses any other plan, naming what is wrong; the
server runs only a checked plan and reports the steps it ran, which the client checks again.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from paravt.rollout.engine import GenerationOutput, GenerationRequest, SamplingParams
from paravt.types import Frames, Visual

SYNC_PLAN: tuple[str, ...] = (
    "pause",
    "load",
    "reset_prefix_cache",
    "reset_encoder_cache",
    "reset_mm_cache",
    "set_version",
    "resume",
)

WHY_STEP = {
    "pause": "no request may run while the weights change",
    "load": "the new weights are read from the checkpoint folder",
    "reset_prefix_cache": "the KV blocks cached under the old weights would be reused (stale "
    "log-probs)",
    "reset_encoder_cache": "the clips' vision embeddings of the old weights would be reused "
    "(vLLM then fails with 'Encoder cache miss')",
    "reset_mm_cache": "processed multimodal inputs tied to the old encoder outputs would be reused",
    "set_version": "the server would report the old weight version",
    "resume": "the server would stay paused",
}


class SyncPlanError(ValueError):
    """A weight-sync plan that leaves out or reorders a step of `SYNC_PLAN`."""


def check_sync_plan(plan: Sequence[str]) -> None:
    """Refuse any plan but `SYNC_PLAN`, naming the first missing, unknown or misplaced step."""
    plan = tuple(plan)
    if plan == SYNC_PLAN:
        return
    unknown = [s for s in plan if s not in WHY_STEP]
    if unknown:
        raise SyncPlanError(
            f"weight-sync plan has unknown step(s) {unknown}; it must be {SYNC_PLAN}"
        )
    missing = [s for s in SYNC_PLAN if s not in plan]
    if missing:
        raise SyncPlanError(
            f"weight-sync plan lacks {missing[0]!r}: without it {WHY_STEP[missing[0]]}; the plan "
            f"must be {SYNC_PLAN}"
        )
    at = next(i for i, (a, b) in enumerate(zip(plan, SYNC_PLAN, strict=False)) if a != b)
    raise SyncPlanError(
        f"weight-sync plan runs {plan[at]!r} where {SYNC_PLAN[at]!r} belongs (step {at}); the "
        f"plan must be {SYNC_PLAN}, in that order"
    )


# ---- frames and requests ----------------------------------------------------------------------
def encode_frames(frames: Frames) -> dict[str, Any]:
    pixels = np.ascontiguousarray(frames.pixels, dtype=np.uint8)
    return {
        "pixels": base64.b64encode(pixels.tobytes()).decode("ascii"),
        "shape": list(pixels.shape),
        "indices": list(frames.indices),
        "timestamps": list(frames.timestamps),
        "fps": frames.fps,
        "duration": frames.duration,
    }


def decode_frames(d: Mapping[str, Any]) -> Frames:
    raw = base64.b64decode(d["pixels"])
    pixels = np.frombuffer(raw, dtype=np.uint8).reshape(d["shape"])
    return Frames(
        pixels, tuple(d["indices"]), tuple(d["timestamps"]), float(d["fps"]), float(d["duration"])
    )


def encode_request(req: GenerationRequest) -> dict[str, Any]:
    """A request with its seed (the client resolves a missing one first, `request_seeds`, so
    a request sampled on any server gets the seed the in-process engine would give it)."""
    clips = []
    for k, visual in enumerate(req.visuals):
        if visual.frames is None:
            raise ValueError(
                f"{req.name or 'request'}: clip {k} has no decoded frames; a rollout server "
                "expands each clip from its frames (the renderer keeps them)"
            )
        clips.append(encode_frames(visual.frames))
    return {
        "token_ids": list(req.token_ids),
        "visuals": clips,
        "name": req.name,
        "seed": req.seed,
    }


def decode_request(d: Mapping[str, Any]) -> GenerationRequest:
    visuals = tuple(
        Visual(pixel_values_videos=None, video_grid_thw=None, frames=decode_frames(v))
        for v in d["visuals"]
    )
    seed = d.get("seed")
    return GenerationRequest(
        tuple(d["token_ids"]), visuals, d.get("name", ""), None if seed is None else int(seed)
    )


def encode_params(p: SamplingParams) -> dict[str, Any]:
    return {
        "max_new_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "greedy": p.greedy,
        "n": p.n,
        "seed": p.seed,
    }


def decode_params(d: Mapping[str, Any]) -> SamplingParams:
    return SamplingParams(**d)


def encode_output(o: GenerationOutput) -> dict[str, Any]:
    return {"token_ids": list(o.token_ids), "logprobs": list(o.logprobs), "finish": o.finish_reason}


def decode_output(d: Mapping[str, Any]) -> GenerationOutput:
    return GenerationOutput(tuple(d["token_ids"]), tuple(d["logprobs"]), d["finish"])
