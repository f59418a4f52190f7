"""Qwen-VL model inputs: the one place that knows how a clip reaches Qwen3-VL / Qwen2.5-VL.

Used by every path that feeds the model, so they cannot drift apart: the transformers and vLLM
engines (sampling), the teacher-forced forward (`paravt.models.forward`), SFT packing and the
chat renderer.
- `vision_placeholder_ids`: the ids never sampled (image/video pads, vision block delimiters);
- `mm_token_type_ids`: the modality of every token, as M-RoPE expects it;
- `visual_kwargs`: a batch's clips as model kwargs, in the order their tokens appear;
- `clip_metadata`: a clip's true sampling rate and source indices for the processor, so frames
  are labelled with their real timestamps (docs/method.md, pitfalls).
This module deliberately holds no model, no engine and no chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from paravt.models.vision_cache import register_sources
from paravt.types import Frames, Visual


def vision_placeholder_ids(tokenizer) -> list[int]:
    """Ids that must never be sampled: image/video pads and the vision block delimiters."""
    names = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    ids = [tokenizer.convert_tokens_to_ids(n) for n in names]
    return [i for i in ids if i is not None and i != tokenizer.unk_token_id]


def mm_token_type_ids(input_ids: torch.Tensor, image_id: int, video_id: int) -> torch.Tensor:
    """Modality of every token as Qwen-VL's M-RoPE expects it: text 0, image 1, video 2."""
    return (input_ids == image_id).long() + 2 * (input_ids == video_id).long()


def visual_kwargs(visuals: Sequence[Visual], device: torch.device | str) -> dict:
    """Model kwargs for the clips of a batch, concatenated in the order their tokens appear."""
    if not visuals:
        return {}
    out = {
        "pixel_values_videos": torch.cat([v.pixel_values_videos for v in visuals]).to(device),
        "video_grid_thw": torch.cat([v.video_grid_thw for v in visuals]).to(device),
    }
    # The vision feature cache keys clips by the (memoised) digests of these CPU tensors.
    sources = [(v.pixel_values_videos, v.video_grid_thw) for v in visuals]
    register_sources(out["pixel_values_videos"], sources)
    if all(v.second_per_grid_ts is not None for v in visuals):
        out["second_per_grid_ts"] = torch.tensor([v.second_per_grid_ts for v in visuals])
    return out


def clip_metadata(frames: Frames):
    """transformers `VideoMetadata` whose sampled fps is the clip's true frame rate.

    `total_num_frames` is the number of source frames the clip spans, so Qwen2.5-VL's
    `second_per_grid_ts` (2 / sampled_fps) is the true time between temporal patches.
    """
    from transformers.video_utils import VideoMetadata

    idx = list(frames.indices)
    k = len(idx)
    span = (idx[-1] - idx[0]) * k / (k - 1) if k > 1 and idx[-1] > idx[0] else k
    return VideoMetadata(
        total_num_frames=max(k, round(span)),
        fps=frames.fps,
        frames_indices=idx,
        duration=frames.duration,
    )


_WRAPPED_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


def chat_text(processor, messages: Sequence[dict[str, Any]], generation_prompt: bool) -> str:
    """The chat template's text, with each video as the placeholder the processor expects.

    Qwen3-VL's processor writes `<t seconds><|vision_start|>...<|vision_end|>` for every frame
    group itself, so the `<|vision_start|><|video_pad|><|vision_end|>` of the official template
    becomes the bare pad (as transformers 4.57's processor did; 5.x nests the blocks, docs/method.md
    pitfall 9). A designed difference from the template's own text (docs/engines.md).
    """
    text = processor.apply_chat_template(
        list(messages), add_generation_prompt=generation_prompt, tokenize=False
    )
    if type(processor).__name__.startswith("Qwen3VL"):
        text = text.replace(_WRAPPED_VIDEO, "<|video_pad|>")
    return text
