"""An episode's task payload: what paravt hands the agent program for one rollout of a sample.

The payload holds the sample's question, options, video and frame budget K, and `messages`: the
first request paravt's own loop would render (system prompt, the overview clip as a video part
naming its K frames, the clock and the question), so an agent that sends them unchanged starts
from the same tokens as `AgentLoop`. `crop_part` is the video part of one crop as paravt's
`crop_video` reads it, for agents whose tool returns frames.
"""

from __future__ import annotations

from typing import Any

from paravt.agent import prompts
from paravt.agent.tools import CropConfig
from paravt.gateway.media import video_part
from paravt.types import Sample
from paravt.video.sampling import overview_indices, timestamps


def task_payload(
    sample: Sample,
    budget: int,
    source,
    system: str | None = None,
    overview_max_pixels: int = 50176,
) -> dict[str, Any]:
    """The payload of one episode of `sample` with frame budget `budget` (K).

    `system`: as `AgentConfig.system` (None: the prompt with the tool schema, "compact", or a
    text); `source` a paravt `FrameSource` (the overview's clock needs the video's frame count)."""
    info = source.info(sample.video)
    indices = overview_indices(info.num_frames, budget)
    times = timestamps(indices, info.fps)
    messages = prompts.main_messages(sample, times, info.duration, system)
    user = messages[1]
    user["content"] = [
        video_part(sample.video, num_frames=budget, max_pixels=overview_max_pixels),
        *user["content"][1:],  # the text after paravt's video placeholder
    ]
    return {
        "sample_id": sample.id,
        "question": sample.question,
        "options": list(sample.options),
        "video": sample.video,
        "frame_budget": budget,
        "duration": info.duration,
        "messages": messages,
    }


def crop_part(video: str, indices, crop: CropConfig | None = None) -> dict[str, Any]:
    """The video part of a crop of `video` at source frame `indices`, at paravt's crop size."""
    crop = crop or CropConfig()
    return video_part(video, indices, max_pixels=crop.max_pixels, min_pixels=crop.min_pixels)
