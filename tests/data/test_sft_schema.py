"""The SFT row schema: what parses, and the message each defect gets."""

from __future__ import annotations

import json

import pytest

from paravt.data.sft_schema import (
    ImagePart,
    SFTRowError,
    TextPart,
    VideoPart,
    answer_spans,
    parse_row,
)

VIDEO = {
    "type": "video_url",
    "video_url": {"url": "a.mp4"},
    "video_start": 3,
    "video_end": 9.5,
    "max_pixels": 1024,
}


def row(*messages, **extra):
    return {"id": "r", "messages": list(messages), **extra}


def test_content_parts_parse_with_their_video_options():
    conv = parse_row(
        row(
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [
                    VIDEO,
                    {"type": "image_url", "image_url": {"url": "f.png"}},
                    {"type": "text", "text": "q?"},
                ],
            },
            {"role": "assistant", "content": "<answer>B</answer>"},
        )
    )
    system, user, assistant = conv.messages
    assert system.plain and system.text == "sys"
    assert user.parts == (
        VideoPart("a.mp4", start=3.0, end=9.5, max_pixels=1024),
        ImagePart("f.png"),
        TextPart("q?"),
    )
    assert not user.plain and assistant.text == "<answer>B</answer>"


def test_messages_may_be_a_json_string_as_in_parquet():
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert parse_row({"messages": json.dumps(msgs)}) == parse_row({"messages": msgs})


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([], "non-empty 'messages'"),
        ([{"role": "user", "content": "q"}], "last message must be the assistant"),
        ([{"role": "assistant", "content": "a"}], "starts with an assistant"),
        ([{"role": "bot", "content": "q"}, {"role": "assistant", "content": "a"}], "role 'bot'"),
        (
            [
                {"role": "user", "content": [{"type": "audio"}]},
                {"role": "assistant", "content": "a"},
            ],
            "unknown part type 'audio'",
        ),
        (
            [
                {"role": "user", "content": [{"type": "video_url", "video_url": {}}]},
                {"role": "assistant", "content": "a"},
            ],
            "needs {'video_url'",
        ),
        (
            [
                {"role": "user", "content": [{**VIDEO, "video_end": 1}]},
                {"role": "assistant", "content": "a"},
            ],
            "must be greater than video_start",
        ),
        (
            [
                {"role": "user", "content": [{**VIDEO, "frame_indices": []}]},
                {"role": "assistant", "content": "a"},
            ],
            "frame_indices",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": [VIDEO]}],
            "assistant content must be text only",
        ),
    ],
)
def test_each_defect_is_named(messages, needle):
    with pytest.raises(SFTRowError, match="row 'r'") as err:
        parse_row(row(*messages))
    assert needle in str(err.value)


def test_answer_spans_cover_only_closed_blocks():
    text = "x<answer>A</answer> y <answer>BC</answer><answer>open"
    # "<answer>" is 8 characters: contents at [9, 10) and [30, 32)
    assert answer_spans(text) == [(9, 10), (30, 32)]
