"""Prompts (pure) and their rendering into token segments with the real tiny processor."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoProcessor

from paravt.agent import prompts
from paravt.agent.render import ChatRenderer
from paravt.models.qwen_vl import clip_metadata
from paravt.types import Frames, Sample, ToolResult


def _sample() -> Sample:
    return Sample(id="s", video="v.mp4", question="What colour?\nOptions:\nA. red", answer="A")


def _frames(indices, fps=2.0) -> Frames:
    pixels = np.zeros((len(indices), 64, 64, 3), dtype=np.uint8)
    return Frames(pixels, tuple(indices), tuple(i / fps for i in indices), fps, 64.0)


def test_user_turn_labels_every_overview_frame_with_its_time():
    msgs = prompts.main_messages(_sample(), [8.0, 24.0, 40.0, 56.0], 64.0)
    assert [m["role"] for m in msgs] == ["system", "user"]
    parts = msgs[1]["content"]
    assert parts[0] == {"type": "video"}
    assert "4 frames at 8.0s, 24.0s, 40.0s, 56.0s" in parts[1]["text"]
    assert "lasts 64.0 seconds" in parts[1]["text"] and "What colour?" in parts[1]["text"]
    assert "crop_video" in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]


def test_subagent_prompt_has_the_range_but_not_the_question():
    msgs = prompts.subagent_messages(12.0, 20.5)
    text = msgs[1]["content"][1]["text"]
    assert "12.0s to 20.5s" in text and "What colour?" not in text
    assert msgs[1]["content"][0] == {"type": "video"}


def test_tool_messages_per_mode():
    ok = ToolResult(0, "crop_video", frames=_frames([20, 22]), window=(10.0, 11.0))
    err = ToolResult(1, "crop_video", error="start_time must be < end_time")
    frames_msg = prompts.tool_message(ok, "frames")
    assert frames_msg["content"][1] == {"type": "video"}
    assert "frames at 10.0s, 11.0s" in frames_msg["content"][0]["text"]
    summary = prompts.tool_message(
        ToolResult(0, "crop_video", frames=ok.frames, window=(10.0, 11.0), summary="a red square"),
        "subagent",
    )
    assert summary["content"] == "crop_video 10.0s-11.0s: a red square"
    assert prompts.tool_message(err, "frames")["content"] == "Error: start_time must be < end_time"


def test_clip_metadata_gives_the_true_sampling_rate():
    # 1 fps crop of a 2 fps video: indices 20, 22, 24, 26 (step 2 frames). The clip spans
    # 4 x 2 = 8 source frames, so sampled_fps = 4 / 8 * 2 = 1.0 and Qwen2.5-VL's
    # second_per_grid_ts = 2 / 1.0 = 2 s.
    meta = clip_metadata(_frames([20, 22, 24, 26]))
    assert meta.total_num_frames == 8 and meta.sampled_fps == pytest.approx(1.0)
    assert meta.frames_indices == [20, 22, 24, 26]


@pytest.fixture(scope="module")
def renderer(tiny_qwen3_dir):
    return ChatRenderer(AutoProcessor.from_pretrained(tiny_qwen3_dir))


def test_continuation_renders_all_tool_responses_in_one_segment(renderer):
    history = prompts.main_messages(_sample(), [8.0], 64.0)
    history.append({"role": "assistant", "content": "<think>\nx</think>"})
    results = [
        ToolResult(0, "crop_video", frames=_frames([20, 22]), window=(10.0, 11.0)),
        ToolResult(1, "crop_video", error="bad window"),
    ]
    seg = renderer.continuation(
        history,
        [prompts.tool_message(r, "frames") for r in results],
        [results[0].frames],
        prompts.FORCED_THINK,
    )
    # The assistant turn ended at <|im_end|>: the segment starts with the template's newline,
    # holds one user turn with both responses in call order, and ends with the forced prefix.
    assert seg.text.startswith("\n<|im_start|>user\n<tool_response>\ncrop_video 10.0s-11.0s")
    assert seg.text.index("10.0s-11.0s") < seg.text.index("Error: bad window")
    assert seg.text.count("<|im_start|>user") == 1
    assert seg.text.endswith("<|im_start|>assistant\n<think>\n")
    assert len(seg.visuals) == 1
    tok = renderer.tokenizer
    decoded = tok.decode(list(seg.token_ids))
    # Qwen3-VL labels a 2-frame group with its mean time: frames 20, 22 at 2 fps -> (10 + 11) / 2.
    assert "<10.5 seconds>" in decoded


def test_a_template_that_rewrites_history_is_refused(tiny_qwen3_dir):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    # A template that prints the number of messages first changes earlier text as turns grow.
    processor.chat_template = "{{ messages | length }}" + processor.chat_template
    renderer = ChatRenderer(processor)
    with pytest.raises(ValueError, match="renders earlier messages differently"):
        renderer.continuation(
            [{"role": "user", "content": "q"}], [{"role": "tool", "content": "r"}]
        )
