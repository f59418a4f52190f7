"""The agent loop's token ids against the official chat template's tokenization of the same chat.

The loop builds a trajectory token by token (docs/engines.md): the prompt, then after every
assistant turn the sampled ids, then the next context segment. `official_ids` renders the same
conversation in one `apply_chat_template` call and tokenizes it with the processor, the way a
user of the released model would. Wherever the template defines the text, the two must be equal;
they differ only where `DESIGNED_DIFFERENCES` says, and `official_text` applies exactly those.

This module deliberately does not run the loop or judge a model; test_official_template.py calls
it with a finished trajectory. It lives with the tests, the only code that uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from paravt.agent import prompts
from paravt.models.qwen_vl import chat_text, clip_metadata
from paravt.types import Frames, Trajectory


@dataclass(frozen=True)
class DesignedDifference:
    """One place where the loop's ids differ on purpose from the official tokenization."""

    name: str
    where: str
    why: str


DESIGNED_DIFFERENCES: tuple[DesignedDifference, ...] = (
    DesignedDifference(
        "qwen3_video_wrapper",
        "every video of a Qwen3-VL chat",
        "the official template writes <|vision_start|><|video_pad|><|vision_end|> and the "
        "transformers 5.x processor then nests its own per-frame-group vision blocks inside; the "
        "loop writes the bare pad so each group is wrapped once (transformers 4.57's behaviour)",
    ),
    DesignedDifference(
        "final_turn_newline",
        "the end of the trajectory",
        "the template follows every <|im_end|> with '\\n'; a rollout stops at the sampled "
        "<|im_end|>, and the '\\n' is the next context segment's first token",
    ),
    DesignedDifference(
        "sampled_ids_at_turn_start",
        "the first pre-token of an assistant turn (after the generation prompt / forced prefix)",
        "the loop keeps the ids the model sampled; one tokenizer call over the whole chat can "
        "merge the context's last characters with the turn's first ones (e.g. '\\n' + '\\n\\n' "
        "-> one '\\n\\n\\n' token), so re-tokenizing text would change what was trained",
    ),
)


def conversation(
    prompt_messages: Sequence[dict[str, Any]],
    traj: Trajectory,
    mode: str = "frames",
    forced_answer: str = prompts.FORCED_ANSWER,
) -> list[dict[str, Any]]:
    """The chat of `traj` as messages: its prompt, each turn's text and tool responses."""
    messages = list(prompt_messages)
    for i, turn in enumerate(traj.turns):
        messages.append({"role": "assistant", "content": turn.text})
        messages += [prompts.tool_message(r, mode) for r in turn.results]
        following = traj.turns[i + 1] if i + 1 < len(traj.turns) else None
        if following is not None and following.forced_answer:
            messages.append(prompts.forced_answer_message(forced_answer))
    return messages


def official_text(processor, messages: Sequence[dict[str, Any]], ended: bool = True) -> str:
    """The template's text of `messages`, with the designed differences applied.

    `ended`: the last assistant turn stopped at its end-of-turn token (drop the template's '\\n').
    """
    text = chat_text(processor, messages, generation_prompt=False)  # qwen3_video_wrapper
    if ended and text.endswith("<|im_end|>\n"):
        text = text[:-1]  # final_turn_newline
    return text


def official_ids(processor, text: str, clips: Sequence[Frames]) -> list[int]:
    """`text` tokenized in one processor call, each video pad expanded for its clip."""
    if not clips:
        return list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    out = processor(
        text=[text],
        videos=[c.pixels for c in clips],
        video_metadata=[clip_metadata(c) for c in clips],
        do_sample_frames=False,
        return_tensors="pt",
    )
    return out["input_ids"][0].tolist()


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where `a` and `b` differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
