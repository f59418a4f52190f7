"""Render chat segments to token ids and visual inputs with the model's own processor.

A trajectory grows by appending segments (docs/method.md pitfall 3): the prompt, then after every
assistant turn the next context segment (tool responses of the turn together, an optional forced
answer message, the generation prompt and an optional forced prefix). A continuation segment is
found as the textual difference between the chat template rendered with and without the new
messages, with a placeholder standing for the assistant turn; it is never obtained by re-rendering
the whole chat and slicing tokens. The template must render earlier messages the same way
whatever follows them; `ChatRenderer` checks that and says so when it does not hold.

Clips are passed to the processor with their real fps and source frame indices, so Qwen3-VL
labels frames with their true timestamps (pitfall 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from paravt.models.qwen_vl import chat_text, clip_metadata
from paravt.types import Frames, Visual

_PLACEHOLDER = "\u0000PARAVT_ASSISTANT_TURN\u0000"


@dataclass(frozen=True)
class Segment:
    """Token ids of one rendered segment, the clips of its video placeholders, and its text."""

    token_ids: tuple[int, ...]
    visuals: tuple[Visual, ...]
    text: str


class ChatRenderer:
    """Turns messages + clips into `Segment`s with a Qwen-VL processor."""

    def __init__(self, processor, end_of_turn: str = "<|im_end|>"):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.end_of_turn = end_of_turn
        video = processor.video_processor
        self.frame_factor = int(video.patch_size * video.merge_size)

    def _template(self, messages: Sequence[dict[str, Any]], generation_prompt: bool) -> str:
        return chat_text(self.processor, messages, generation_prompt)

    def encode(self, text: str, clips: Sequence[Frames] = ()) -> Segment:
        """Tokenise `text`, expanding one video placeholder per clip, in order."""
        if not clips:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            return Segment(tuple(ids), (), text)
        out = self.processor(
            text=[text],
            videos=[c.pixels for c in clips],
            video_metadata=[clip_metadata(c) for c in clips],
            do_sample_frames=False,
            return_tensors="pt",
        )
        grids = out["video_grid_thw"]
        sizes = [int(g.prod()) for g in grids]
        pixels = out["pixel_values_videos"].split(sizes)
        seconds = out.get("second_per_grid_ts")
        visuals = tuple(
            Visual(
                pixel_values_videos=pixels[i],
                video_grid_thw=grids[i : i + 1],
                second_per_grid_ts=None if seconds is None else float(seconds[i]),
                frames=clips[i],
            )
            for i in range(len(clips))
        )
        return Segment(tuple(out["input_ids"][0].tolist()), visuals, text)

    def prompt(
        self, messages: Sequence[dict[str, Any]], clips: Sequence[Frames] = (), prefix: str = ""
    ) -> Segment:
        """The first segment: the rendered messages, the generation prompt and `prefix`."""
        return self.encode(self._template(messages, True) + prefix, clips)

    def continuation(
        self,
        history: Sequence[dict[str, Any]],
        new_messages: Sequence[dict[str, Any]],
        clips: Sequence[Frames] = (),
        prefix: str = "",
    ) -> Segment:
        """The segment that follows an assistant turn which ended with the end-of-turn token."""
        before = [*history, {"role": "assistant", "content": _PLACEHOLDER}]
        base = self._template(before, False)
        full = self._template([*before, *new_messages], True)
        if not full.startswith(base):
            raise ValueError(
                "the chat template renders earlier messages differently once tool messages "
                "follow them, so segments cannot be appended token-exactly; use a template "
                "that renders each message independently of the ones after it"
            )
        turn_end = base.rfind(self.end_of_turn)
        if turn_end < 0:
            raise ValueError(f"the chat template does not end turns with {self.end_of_turn!r}")
        tail = base[turn_end + len(self.end_of_turn) :]
        return self.encode(tail + full[len(base) :] + prefix, clips)
