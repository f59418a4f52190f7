"""Prompts of the agent as chat messages (pure: strings and dicts, no processor, no torch).

The same functions build the training and the evaluation prompts, so the overview frames carry
their true timestamps in both (docs/method.md pitfall 5). Messages use OpenAI-style content parts;
`{"type": "video"}` marks where a clip's frames go, in the order the clips are passed to the
processor. Rendering to tokens is `paravt.agent.render`'s job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from paravt.types import Sample, ToolResult

FORCED_THINK = "<think>\n"
# Video-MME's with-subtitles prefix (docs/evaluation.md); FRAME_SUBTITLES is the `Sample.extra`
# key of timed blocks whose text is shown only where a sampled frame falls (`subtitles_at`).
SUBTITLE_PREFIX = "This video's subtitles are listed below:\n{text}\n\n"
FRAME_SUBTITLES = "frame_subtitles"

CROP_VIDEO_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "crop_video",
        "description": "Return frames sampled at 1 fps from [start_time, end_time] of the video.",
        "parameters": {
            "type": "object",
            "properties": {
                "video_path": {"type": "string", "description": "the video to crop"},
                "start_time": {"type": "number", "description": "window start in seconds"},
                "end_time": {"type": "number", "description": "window end in seconds"},
            },
            "required": ["video_path", "start_time", "end_time"],
        },
    },
}

SYSTEM_TEMPLATE = (
    "You are a video agent. You see a few frames of a long video, each labelled with its time. "
    "Think inside <think> </think>. To look closer, call the tool, one <tool_call> block per "
    "call; you may call it several times in one turn and the calls run in parallel:\n"
    "<tool_call>{example}</tool_call>\n"
    "Tools:\n{tools}\n"
    "When you know the answer, write it inside <answer> </answer>."
)

NO_TOOL_SYSTEM = (
    "You are a video agent. You see a few frames of a long video, each labelled with its time. "
    "Think inside <think> </think>, then write the answer inside <answer> </answer>."
)

# A short system prompt for tiny models (the CPU demo): the call format by example, no JSON
# schema. ~60 tokens instead of ~440 with the tiny tokenizer.
COMPACT_SYSTEM = (
    "You see a few frames of a video. Think in <think> </think>. To see more, crop windows, "
    "several calls run in parallel: "
    '<tool_call>{"name": "crop_video", "arguments": {"video_path": "video.mp4", '
    '"start_time": 30.0, "end_time": 46.0}}</tool_call> '
    "Then answer in <answer> </answer>."
)

# Named system prompts: `AgentConfig.system` may give one of these names instead of a text.
SYSTEM_PROMPTS: dict[str, str] = {"compact": COMPACT_SYSTEM}

FORCED_ANSWER = "You have no tool calls left. Answer now, inside <answer> </answer>."

SUBAGENT_SYSTEM = "You describe video segments factually and briefly."
SUBAGENT_TEMPLATE = (
    "These frames cover {start:.1f}s to {end:.1f}s of a video. "
    "Describe what is visible: objects, colours, shapes and when they appear."
)


def system_prompt(tools: Sequence[Mapping[str, Any]] = (CROP_VIDEO_SCHEMA,)) -> str:
    example = {
        "name": "crop_video",
        "arguments": {"video_path": "video.mp4", "start_time": 30.0, "end_time": 50.0},
    }
    return SYSTEM_TEMPLATE.format(
        example=json.dumps(example), tools="\n".join(json.dumps(t) for t in tools)
    )


TOOLS_INTRO = (
    "You are a video agent. You see a few frames of a long video, each labelled with its time. "
    "Think inside <think> </think>. To look closer, call the tools, one <tool_call> block per "
    "call; you may make several calls in one turn and they run in parallel. "
    "When you know the answer, write it inside <answer> </answer>."
)
# The Qwen3-VL chat template's rendering of a `tools` list (paravt/models/templates), after the
# system text; Qwen2.5-VL's VL template has no tools block, and this is Qwen2.5's own wording.
TOOLS_BLOCK = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
COMPACT_TOOLS = (
    "You see a few frames of a video. Think in <think> </think>. To see more, call tools, "
    "several calls run in parallel: {examples} Then answer in <answer> </answer>."
)


def tools_system_prompt(
    system: str | None,
    schemas: Sequence[Mapping[str, Any]],
    examples: Sequence[Mapping[str, Any]],
) -> str:
    """The system prompt of a tool list other than the default `[crop_video]`: `system` None
    lists the schemas as the chat template renders `tools`; "compact" gives one example call per
    tool (`examples`: {"name", "arguments"} each); any other text is kept and the list follows."""
    if system == "compact":
        calls = " ".join(f"<tool_call>{json.dumps(e)}</tool_call>" for e in examples)
        return COMPACT_TOOLS.format(examples=calls)
    text = TOOLS_INTRO if system is None else SYSTEM_PROMPTS.get(system, system)
    listed = "".join("\n" + json.dumps(s, ensure_ascii=False) for s in schemas)
    return text + TOOLS_BLOCK.format(tools=listed)


def format_times(timestamps: Sequence[float]) -> str:
    return ", ".join(f"{t:.1f}s" for t in timestamps)


def subtitles_at(blocks: Sequence[tuple[float, float, str]], times: Sequence[float]) -> list[str]:
    """The texts of the timed subtitle blocks `(start s, end s, text)` shown at any of `times`
    (start <= t < end), in block order, each once: subtitles aligned to the sampled frames."""
    return [text for start, end, text in blocks if any(start <= t < end for t in times)]


def user_text(sample: Sample, timestamps: Sequence[float], duration: float) -> str:
    """The overview's clock, then the question; a sample with `extra[FRAME_SUBTITLES]` (timed
    blocks) gets the subtitles of the frames it is shown, in `SUBTITLE_PREFIX`, before it."""
    blocks = sample.extra.get(FRAME_SUBTITLES) if sample.extra else None
    lines = subtitles_at(blocks, timestamps) if blocks else []
    prefix = SUBTITLE_PREFIX.format(text="\n".join(lines)) if lines else ""
    return (
        f"The video lasts {duration:.1f} seconds. You see {len(timestamps)} frames at "
        f"{format_times(timestamps)}.\n{prefix}{sample.question}"
    )


def main_messages(
    sample: Sample, timestamps: Sequence[float], duration: float, system: str | None = None
) -> list[dict[str, Any]]:
    """System + user turn with the overview clip; `timestamps` are the overview frames' times.

    `system`: None for the default prompt with the tool schema, a name of `SYSTEM_PROMPTS`
    ("compact"), or the prompt text itself.
    """
    text = system_prompt() if system is None else SYSTEM_PROMPTS.get(system, system)
    return [
        {"role": "system", "content": text},
        {
            "role": "user",
            "content": [
                {"type": "video"},
                {"type": "text", "text": user_text(sample, timestamps, duration)},
            ],
        },
    ]


def tool_message(result: ToolResult, mode: str) -> dict[str, Any]:
    """One tool response: an error text, a tool's text, the clip (mode "frames") or a summary;
    a clip is headed by its tool's name and window ("crop_video 30.0s-50.0s")."""
    if not result.ok:
        return {"role": "tool", "content": f"Error: {result.error}"}
    if result.text is not None:
        return {"role": "tool", "content": result.text}
    start, end = result.window or (0.0, 0.0)
    head = f"{result.name or 'crop_video'} {start:.1f}s-{end:.1f}s"
    if mode == "subagent":
        return {"role": "tool", "content": f"{head}: {result.summary or ''}"}
    frames = result.frames
    times = format_times(frames.timestamps) if frames is not None else ""
    return {
        "role": "tool",
        "content": [{"type": "text", "text": f"{head}, frames at {times}:\n"}, {"type": "video"}],
    }


def forced_answer_message(text: str = FORCED_ANSWER) -> dict[str, Any]:
    """The user message after the last tool round (benchmarks pass their own wording)."""
    return {"role": "user", "content": text}


def subagent_messages(start: float, end: float) -> list[dict[str, Any]]:
    """The sub-agent's fresh single-turn prompt: the crop and its time range, not the question."""
    return [
        {"role": "system", "content": SUBAGENT_SYSTEM},
        {
            "role": "user",
            "content": [
                {"type": "video"},
                {"type": "text", "text": SUBAGENT_TEMPLATE.format(start=start, end=end)},
            ],
        },
    ]
