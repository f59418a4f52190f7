"""Encode SFT conversations to token-exact training examples, the way the agent loop builds them.

The encoding walks the conversation turn by turn with the agent's own `ChatRenderer`: the context
before the first assistant turn is the prompt segment (`renderer.prompt`), the context between
two assistant turns (tool responses, a forced-answer message) is a continuation segment
(`renderer.continuation`), and each assistant turn contributes its own tokens followed by the
end-of-turn token with loss mask 1. When an assistant turn starts with the agent's forced prefix
(`<think>\n`), the prefix belongs to the context segment, exactly as in a rollout. A trajectory
recorded from the agent loop and written by `paravt.data.sft_writer` therefore encodes to the same
token ids, loss mask and clips the loop produced (tested), so the cold start teaches the format RL
samples in. Images are fed as 2-frame still clips (the trajectory types carry video clips only;
Qwen-VL repeats an image to its temporal patch of 2 anyway).

It deliberately does not batch, pack or compute losses (`paravt.data.packing`, `modules/sft.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paravt.agent.render import ChatRenderer
from paravt.data.sft_schema import (
    ImagePart,
    SFTConversation,
    SFTMessage,
    SFTRowError,
    TextPart,
    VideoPart,
    answer_spans,
)
from paravt.types import Frames, Trajectory
from paravt.video.sampling import fit_pixels, timestamps, window_indices


@dataclass(frozen=True)
class SFTVideoConfig:
    """Defaults for video parts without their own options (docs/method.md section 5)."""

    fps: float = 1.0
    max_frames: int = 64
    max_pixels: int = 50176  # per frame
    min_pixels: int = 0
    force_prefix: str = "<think>\n"  # the agent's forced prefix ("" when force_think is off)
    max_tokens: int = 8192  # longer examples are reported and skipped, never truncated


@dataclass(frozen=True)
class SFTExample:
    """One encoded conversation: a trajectory (logprobs 0) plus the answer-token mask."""

    id: str
    trajectory: Trajectory
    answer_mask: tuple[int, ...]  # 1 on trained tokens inside <answer>...</answer>

    @property
    def num_tokens(self) -> int:
        return len(self.trajectory.token_ids)


def _resolve(url: str, root: str | None) -> str:
    url = url.removeprefix("file://")
    return url if root is None or Path(url).is_absolute() else str(Path(root) / url)


def read_video(part: VideoPart, source, cfg: SFTVideoConfig, factor: int, root=None) -> Frames:
    """The frames of a video part: its `frame_indices`, else `fps` sampling over its window."""
    path = _resolve(part.url, root)
    indices = part.frame_indices
    if indices is None:
        info = source.info(path)
        start = part.start or 0.0
        end = min(part.end if part.end is not None else info.duration, info.duration)
        if start >= end:
            raise SFTRowError(f"{path}: window [{start}, {end}] s is empty or beyond the video")
        cap = part.max_frames or cfg.max_frames
        indices = window_indices(
            info.num_frames, info.fps, start, end, part.fps or cfg.fps, min(2, cap), cap
        )
    max_px = part.max_pixels or cfg.max_pixels
    min_px = part.min_pixels if part.min_pixels is not None else cfg.min_pixels
    return source.read(path, list(indices), max_px, factor, min_px)


def read_image(part: ImagePart, cfg: SFTVideoConfig, factor: int, root=None) -> Frames:
    """An image as a 2-frame still clip, resized to the per-frame pixel cap."""
    from PIL import Image

    path = _resolve(part.url, root)
    try:
        image = Image.open(path).convert("RGB")
    except (OSError, ValueError) as err:
        raise SFTRowError(f"image {path!r} cannot be read ({err}); fix the url") from err
    height, width = fit_pixels(image.height, image.width, cfg.max_pixels, factor, cfg.min_pixels)
    pixels = np.asarray(image.resize((width, height)), dtype=np.uint8)
    return Frames(np.stack([pixels, pixels]), (0, 1), tuple(timestamps([0, 1], 1.0)), 1.0, 2.0)


def loop_message(msg: SFTMessage) -> dict[str, Any]:
    """The message as the agent loop writes it: `{"type": "video"}` where a clip goes."""
    if msg.plain or msg.role == "assistant":
        return {"role": msg.role, "content": msg.text}
    parts = [
        {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "video"}
        for p in msg.parts
    ]
    return {"role": msg.role, "content": parts}


class SFTEncoder:
    """Conversations -> `SFTExample`s with one model's renderer and a frame source."""

    def __init__(self, renderer: ChatRenderer, source, cfg: SFTVideoConfig = SFTVideoConfig()):
        self.renderer, self.source, self.cfg = renderer, source, cfg
        self.tokenizer = renderer.tokenizer

    def clips(self, msgs: Sequence[SFTMessage], root: str | None) -> list[Frames]:
        factor = self.renderer.frame_factor
        out = []
        for part in (p for m in msgs for p in m.parts):
            if isinstance(part, VideoPart):
                out.append(read_video(part, self.source, self.cfg, factor, root))
            elif isinstance(part, ImagePart):
                out.append(read_image(part, self.cfg, factor, root))
        return out

    def assistant_tokens(self, body: str) -> tuple[list[int], list[int]]:
        """(ids, answer flags) of an assistant body followed by the end-of-turn token."""
        text = body + self.renderer.end_of_turn
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = answer_spans(text)
        flags = [
            int(any(s < e_tok and b > s_tok for s, b in spans))
            for s_tok, e_tok in enc["offset_mapping"]
        ]
        return list(enc["input_ids"]), flags

    def encode(self, conv: SFTConversation, root: str | None = None) -> SFTExample:
        ids, mask, answer, visuals = [], [], [], []
        history: list[dict[str, Any]] = []
        prompt_length, start = 0, 0
        turns = [i for i, m in enumerate(conv.messages) if m.role == "assistant"]
        for k, a in enumerate(turns):
            context = conv.messages[start:a]
            text = conv.messages[a].text
            pre = self.cfg.force_prefix
            prefix = pre if pre and text.startswith(pre) else ""
            new = [loop_message(m) for m in context]
            clips = self.clips(context, root)
            if k == 0:
                seg = self.renderer.prompt(new, clips, prefix)
            else:
                seg = self.renderer.continuation(history, new, clips, prefix)
            body_ids, body_answer = self.assistant_tokens(text[len(prefix) :])
            ids += [*seg.token_ids, *body_ids]
            mask += [0] * len(seg.token_ids) + [1] * len(body_ids)
            answer += [0] * len(seg.token_ids) + body_answer
            visuals += seg.visuals
            prompt_length = prompt_length or len(seg.token_ids)
            history += [*new, {"role": "assistant", "content": text}]
            start = a + 1
        if len(ids) > self.cfg.max_tokens:
            raise SFTRowError(
                f"row {conv.id!r}: {len(ids)} tokens exceed max_tokens={self.cfg.max_tokens}; "
                "raise it (and the packing length) or use fewer frames"
            )
        traj = Trajectory(
            sample_id=conv.id,
            group_index=0,
            token_ids=tuple(ids),
            loss_mask=tuple(mask),
            logprobs=(0.0,) * len(ids),
            visuals=tuple(visuals),
            prompt_length=prompt_length,
        )
        return SFTExample(conv.id, traj, tuple(answer))
