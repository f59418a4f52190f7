"""Tests of tool-call parsing: the canonical JSON form, the drifted <tool_code> form, times,
aliases, per-call errors, the cap, and property tests that no input makes the parser raise."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paravt.agent.parsing import (
    has_tool_call_syntax,
    parse_time,
    parse_tool_calls,
    strip_tool_blocks,
)


def call_block(start: object, end: object, name: str = "crop_video", key: str = "arguments") -> str:
    arguments = {"video_path": "v.mp4", "start_time": start, "end_time": end}
    return "<tool_call>" + json.dumps({"name": name, key: arguments}) + "</tool_call>"


def only_call(text: str, **kwargs: object):
    (parsed,) = parse_tool_calls(text, **kwargs)
    assert parsed.error is None, parsed.error
    return parsed.call


# --- the canonical JSON form ----------------------------------------------------------------


def test_one_json_call_is_normalised_to_float_seconds() -> None:
    text = "<think>look at 30-50</think>" + call_block(30, "50")
    call = only_call(text)
    assert call.name == "crop_video"
    assert call.arguments == {"video_path": "v.mp4", "start_time": 30.0, "end_time": 50.0}
    assert isinstance(call.arguments["start_time"], float)


def test_several_calls_keep_order_index_and_raw_text() -> None:
    blocks = [call_block(0, 10), call_block(10, 20), call_block(20, 30)]
    parsed = parse_tool_calls("think\n" + "\n".join(blocks) + "\ntail")
    assert [p.index for p in parsed] == [0, 1, 2]
    assert [p.call.arguments["start_time"] for p in parsed] == [0.0, 10.0, 20.0]
    assert [p.raw for p in parsed] == blocks


def test_parameters_key_and_arguments_as_json_string_are_accepted() -> None:
    assert only_call(call_block(1, 2, key="parameters")).arguments["end_time"] == 2.0
    inner = json.dumps({"start_time": "0:30", "end_time": 45})
    text = "<tool_call>" + json.dumps({"name": "crop_video", "arguments": inner}) + "</tool_call>"
    # "0:30" = 0*60 + 30 = 30 s
    assert only_call(text).arguments == {"start_time": 30.0, "end_time": 45.0}


def test_unclosed_final_block_is_parsed_and_trailing_prose_ignored() -> None:
    text = (
        call_block(0, 5) + '<tool_call>{"name": "crop_video", "arguments": {"start": 7, "end": 9}}'
    )
    text += "\nI will wait for the frames."
    parsed = parse_tool_calls(text)
    assert [p.ok for p in parsed] == [True, True]
    assert parsed[1].call.arguments == {"start_time": 7.0, "end_time": 9.0}


def test_unclosed_block_before_another_block_stops_at_the_next_opening_tag() -> None:
    first = '<tool_call>{"name": "crop_video", "arguments": {"start": 1, "end": 2}}'
    parsed = parse_tool_calls(first + call_block(3, 4))
    assert [p.call.arguments["start_time"] for p in parsed] == [1.0, 3.0]
    assert parsed[0].raw == first


def test_code_fences_inside_a_block_are_ignored() -> None:
    call = '{"name": "crop_video", "arguments": {"start": 1, "end": 3}}'
    text = f"<tool_call>\n```json\n{call}\n```\n</tool_call>"
    assert only_call(text).arguments == {"start_time": 1.0, "end_time": 3.0}


# --- the <tool_code> form -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('crop_video(video_path="v.mp4", start_time=30, end_time=50.5)', (30.0, 50.5)),
        ('crop_video("v.mp4", 30, 50)', (30.0, 50.0)),  # positional: path, start, end
        ('crop_video("v.mp4", "1:00", end="01:10")', (60.0, 70.0)),  # 1:00 = 60 s, 1:10 = 70 s
        ("print(crop_video(start=2, end=4))", (2.0, 4.0)),
        ("```python\ncrop_video(start_sec=-1, end_sec='3s')\n```", (-1.0, 3.0)),
    ],
)
def test_tool_code_calls_are_read_as_literals(body: str, expected: tuple[float, float]) -> None:
    call = only_call(f"<tool_code>{body}</tool_code>")
    assert (call.arguments["start_time"], call.arguments["end_time"]) == expected


def test_tool_code_never_evaluates_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    body = f"crop_video(start_time=__import__('os').system('touch {marker}'), end_time=5)"
    (parsed,) = parse_tool_calls(f"<tool_code>{body}</tool_code>")
    assert parsed.call is None
    assert "'start_time' must be a literal" in parsed.error
    assert not marker.exists()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("crop_video(**args)", "**kwargs are not supported"),
        ('crop_video("v", 1, 2, 3)', "at most 3 positional arguments"),
        ("1 + 2", "expected crop_video(start_time=..., end_time=...)"),
        ("tools.crop_video(start=1, end=2)", "expected crop_video("),
        ("crop_video(start=1, end=2", "neither JSON nor a call"),
        ('crop_video("v", 1, start_time=2, end=3)', "'start_time' given twice"),
    ],
)
def test_bad_tool_code_gives_a_message(body: str, fragment: str) -> None:
    (parsed,) = parse_tool_calls(f"<tool_code>{body}</tool_code>")
    assert parsed.call is None
    assert fragment in parsed.error


# --- times and aliases ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (12.5, 12.5),
        ("30", 30.0),
        (" 45 ", 45.0),
        (".5", 0.5),
        ("30s", 30.0),
        ("30.5 seconds", 30.5),
        ("1:30", 90.0),  # 1*60 + 30
        ("01:02:03.5", 3723.5),  # 1*3600 + 2*60 + 3.5
        ("0:00:59", 59.0),
        ("-5", -5.0),  # negative is a time; the window check clamps it
    ],
)
def test_parse_time_accepts(value: object, seconds: float) -> None:
    assert parse_time(value) == seconds


@pytest.mark.parametrize(
    "value",
    ["1:75", "1:60:00", "1:2:3:4", "abc", "", "nan", "inf", float("inf"), True, None, [1], 10**400],
)
def test_parse_time_rejects_with_a_hint(value: object) -> None:
    error = parse_time(value)
    assert isinstance(error, str)
    assert "is not a time; use seconds" in error


@pytest.mark.parametrize(
    ("start_key", "end_key"),
    [("start", "end"), ("start_sec", "end_sec"), ("begin", "stop"), ("Start_Time", "END_TIME")],
)
def test_aliases_are_normalised(start_key: str, end_key: str) -> None:
    arguments = {"video": "x.mp4", start_key: 3, end_key: 4}
    text = "<tool_call>" + json.dumps({"name": "crop_video", "arguments": arguments})
    call = only_call(text)
    assert call.arguments == {"video_path": "x.mp4", "start_time": 3.0, "end_time": 4.0}


def test_two_aliases_of_one_argument_are_an_error() -> None:
    (parsed,) = parse_tool_calls(call_block(1, 2).replace('"end_time"', '"start"'))
    assert parsed.error == "tool call 1: argument 'start_time' given twice"


def test_bad_time_names_the_argument() -> None:
    (parsed,) = parse_tool_calls(call_block("soon", 2))
    assert parsed.error.startswith("tool call 1: start_time 'soon' is not a time")


# --- per-call errors, known tools, the cap ----------------------------------------------------


def test_a_bad_call_does_not_spoil_its_siblings() -> None:
    text = call_block(0, 5) + '<tool_call>{"name": "crop_video", "arguments": {</tool_call>'
    text += call_block(5, 9, name="zoom") + call_block(9, 12)
    parsed = parse_tool_calls(text)
    assert [p.ok for p in parsed] == [True, False, False, True]
    assert parsed[1].error.startswith("invalid JSON in tool call 2: ")
    assert parsed[2].error == "unknown tool 'zoom' in tool call 3; known tools: crop_video"
    assert parsed[3].call.arguments["end_time"] == 12.0


def test_known_tools_can_be_widened() -> None:
    call = only_call(call_block(1, 2, name="zoom"), known_tools=("crop_video", "zoom"))
    assert call.name == "zoom"
    (parsed,) = parse_tool_calls("<tool_code>zoom(1)</tool_code>", known_tools=("zoom",))
    # zoom has no positional order registered: 1 positional > 0 allowed
    assert parsed.error == "tool call 1: zoom takes at most 0 positional arguments"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("", "tool call 1 is empty"),
        ("[1, 2]", "expected one JSON object per block"),
        ('{"arguments": {}}', 'tool call 1 has no "name"'),
        ('{"name": "crop_video", "arguments": [1]}', '"arguments" must be an object'),
        ('{"name": "crop_video", "arguments": "{oops"}', 'invalid JSON in the "arguments" string'),
        ("{" * 5000, "invalid JSON in tool call 1"),
        ("x" * 30_000, "tool call 1 is too long (30000 chars)"),
    ],
)
def test_malformed_json_gives_a_message(body: str, fragment: str) -> None:
    (parsed,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.call is None
    assert fragment in parsed.error


def test_calls_beyond_the_cap_are_ignored_with_a_message() -> None:
    text = "".join(call_block(i, i + 1) for i in range(7))
    parsed = parse_tool_calls(text, max_calls=5)
    assert [p.ok for p in parsed] == [True] * 5 + [False, False]
    assert parsed[5].error == "call 6 ignored: at most 5 calls per turn"
    assert parsed[6].error == "call 7 ignored: at most 5 calls per turn"


def test_text_without_blocks_has_no_calls() -> None:
    assert parse_tool_calls('I would call {"name": "crop_video"} but I will not.') == ()
    assert parse_tool_calls("</tool_call>") == ()


# --- has_tool_call_syntax and strip_tool_blocks ---------------------------------------------


def test_has_tool_call_syntax() -> None:
    assert has_tool_call_syntax("a <tool_call>{")
    assert has_tool_call_syntax("<tool_code>crop_video()")
    assert not has_tool_call_syntax("tool_call </tool_call> <toolcall>")


def test_strip_tool_blocks_removes_blocks_and_stray_closing_tags() -> None:
    assert strip_tool_blocks("A" + call_block(1, 2) + "B</tool_call>C") == "ABC"
    assert strip_tool_blocks("answer: B <tool_code>crop_video(1, 2") == "answer: B "
    # The stray closer is dropped, joining "<tool_" + "call>" into an opening tag; that block
    # is closed by the next closer, and what follows it is kept.
    assert strip_tool_blocks("<tool_</tool_call>call>x</tool_call>y") == "y"
    # Nested joins, one layer per tag: the old fixpoint loop took one full pass per layer.
    layers = 50
    nested = "</tool_" * layers + "</tool_call>" + "call>" * layers + "kept"
    assert strip_tool_blocks(nested) == "kept"


# --- properties -----------------------------------------------------------------------------

_OPENING = re.compile(r"<tool_call>|<tool_code>")
FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<tool_code>", "</tool_code>", "{", "}", "[", "]", '"', "'",
    ":", ",", "(", ")", "=", " ", "\n", "```", '"name"', '"crop_video"', '"zoom"', '"arguments"',
    '"parameters"', '"start_time"', '"end"', '"1:30"', "30", "-5", "1e999", "NaN", "0.5", "null",
    "true", "crop_video", "print", "start=", "end_time=", "video_path=", "**", "x", "\\",
]  # fmt: skip


def assert_well_formed(text: str, max_calls: int | None) -> None:
    parsed = parse_tool_calls(text, max_calls=max_calls)
    assert len(parsed) == len(_OPENING.findall(text))  # every opening tag starts one block
    for i, p in enumerate(parsed):
        assert p.index == i
        assert (p.call is None) != (p.error is None)
        if p.call is not None:
            assert p.call.name == "crop_video"
            assert max_calls is None or i < max_calls
            for key in ("start_time", "end_time"):
                assert key not in p.call.arguments or isinstance(p.call.arguments[key], float)
    stripped = strip_tool_blocks(text)
    assert not has_tool_call_syntax(stripped)
    assert "</tool_call>" not in stripped


@settings(max_examples=300, deadline=None)
@given(st.text(), st.one_of(st.none(), st.integers(0, 4)))
def test_arbitrary_text_never_raises(text: str, max_calls: int | None) -> None:
    assert_well_formed(text, max_calls)


@settings(max_examples=600, deadline=None)
@given(
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=40),
    st.one_of(st.none(), st.integers(0, 4)),
)
def test_fragment_soup_never_raises(fragments: list[str], max_calls: int | None) -> None:
    assert_well_formed("".join(fragments), max_calls)


finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    finite,
    finite,
    st.sampled_from(["start", "start_time", "start_sec"]),
    st.sampled_from(["end", "end_time", "end_sec"]),
    st.booleans(),
)
def test_well_formed_calls_round_trip(
    start: float, end: float, start_key: str, end_key: str, code_form: bool
) -> None:
    if code_form:
        text = f"<tool_code>crop_video({start_key}={start!r}, {end_key}={end!r})</tool_code>"
    else:
        arguments = json.dumps({start_key: start, end_key: end})
        text = f'<tool_call>{{"name": "crop_video", "arguments": {arguments}}}</tool_call>'
    assert only_call(text).arguments == {"start_time": start, "end_time": end}


def _find_blocks_rescan(text: str) -> list[tuple[int, int, str]]:
    """The readable (quadratic) form: search for the next closing and opening after each tag."""
    blocks, pos = [], 0
    while (opening := _OPENING.search(text, pos)) is not None:
        body = opening.end()
        closing = re.compile(r"</tool_call>|</tool_code>").search(text, body)
        following = _OPENING.search(text, body)
        if following is not None and (closing is None or following.start() < closing.start()):
            blocks.append((opening.start(), following.start(), text[body : following.start()]))
            pos = following.start()
        elif closing is None:
            blocks.append((opening.start(), len(text), text[body:]))
            break
        else:
            blocks.append((opening.start(), closing.end(), text[body : closing.start()]))
            pos = closing.end()
    return blocks


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=40))
def test_linear_find_blocks_matches_the_rescan_form(parts: list[str]) -> None:
    from paravt.agent.parsing import _find_blocks

    text = "".join(parts)
    assert [(b.start, b.end, b.body) for b in _find_blocks(text)] == _find_blocks_rescan(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=40))
def test_strip_tool_blocks_leaves_no_tool_syntax(parts: list[str]) -> None:
    out = strip_tool_blocks("".join(parts))
    assert not has_tool_call_syntax(out)
    assert "</tool_call>" not in out and "</tool_code>" not in out


# ---- dialects: how a <tool_code> block is read ------------------------------------------------

PRIOR_BLOCK = (
    "<think>\nLet me look closer.</think>\n<tool_code>\n"
    "crop_video(start_time=0, end_time=16)\n"
    "crop_video(16, 32)\n"
    'crop_video("v.mp4", "0:04", end_time="12s")\n'
    "</tool_code>"
)


def windows(parsed) -> list[tuple[float, float] | str]:
    return [
        (p.call.arguments["start_time"], p.call.arguments["end_time"]) if p.ok else p.error
        for p in parsed
    ]


def test_lines_dialect_reads_one_call_per_line_positional_or_keyword():
    parsed = parse_tool_calls(PRIOR_BLOCK, max_calls=5, dialect="lines")
    assert windows(parsed) == [(0.0, 16.0), (16.0, 32.0), (4.0, 12.0)]
    assert [p.index for p in parsed] == [0, 1, 2]
    assert parsed[1].raw == "crop_video(16, 32)"  # each call keeps its own line


def test_the_default_dialect_is_unchanged_and_rejects_a_multi_line_block():
    (parsed,) = parse_tool_calls(PRIOR_BLOCK, max_calls=5)
    assert not parsed.ok and "neither JSON nor a call" in parsed.error
    # one line, two positionals: (video_path, start_time) as before, so no window
    (one,) = parse_tool_calls("<tool_code>crop_video(16, 32)</tool_code>")
    assert one.ok and one.call.arguments == {"video_path": 16, "start_time": 32.0}


def test_tool_call_dialect_answers_tool_code_with_an_error_and_runs_tool_call():
    text = PRIOR_BLOCK + "\n" + call_block(1, 2)
    code, json_call = parse_tool_calls(text, max_calls=5, dialect="tool_call")
    assert not code.ok and "<tool_code> is not a tool call here" in code.error
    assert "<tool_call>" in code.error  # it names the syntax to write instead
    assert json_call.ok and json_call.call.arguments["end_time"] == 2.0


def test_lines_dialect_on_hostile_blocks():
    # junk lines fail alone; comments, blank lines and code fences are skipped
    junk = "<tool_code>\n```python\n# crop\n\ncrop_video(1, 3)\nimport os\ncrop_video(\n```\n"
    parsed = parse_tool_calls(junk + "</tool_code>", max_calls=9, dialect="lines")
    assert [p.ok for p in parsed] == [True, False, False]
    assert "neither JSON nor a call" in parsed[2].error
    # unterminated: the block runs to the end of the text; nested tags split the blocks
    unterminated = parse_tool_calls("<tool_code>\ncrop_video(1, 3)\ncrop_vi", dialect="lines")
    assert [p.ok for p in unterminated] == [True, False]
    nested = "<tool_code><tool_code>\ncrop_video(2, 4)\n</tool_code></tool_code>"
    assert windows(parse_tool_calls(nested, dialect="lines"))[1:] == [(2.0, 4.0)]
    assert "empty" in parse_tool_calls(nested, dialect="lines")[0].error
    assert "empty" in parse_tool_calls("<tool_code>\n# x\n</tool_code>", dialect="lines")[0].error
    # many calls: the cap applies per call, not per block
    many = "<tool_code>\n" + "crop_video(1, 2)\n" * 400 + "</tool_code>"
    capped = parse_tool_calls(many, max_calls=5, dialect="lines")
    assert len(capped) == 400 and sum(p.ok for p in capped) == 5
    assert capped[5].error == "call 6 ignored: at most 5 calls per turn"
    # a block over the length limit is one error, not thousands of calls
    huge = "<tool_code>\n" + "crop_video(1, 2)\n" * 2000 + "</tool_code>"
    (too_long,) = parse_tool_calls(huge, dialect="lines")
    assert "too long" in too_long.error


def test_an_unknown_dialect_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="any, lines, tool_call"):
        parse_tool_calls("x", dialect="python")
    from paravt.agent.loop import AgentConfig

    with pytest.raises(ValueError, match=r"rollout\.agent\.tool_dialect"):
        AgentConfig(tool_dialect="code")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=40))
def test_no_input_makes_any_dialect_raise(parts: list[str]) -> None:
    text = "".join(parts)
    for dialect in ("lines", "tool_call"):
        parsed = parse_tool_calls(text, max_calls=3, dialect=dialect)
        assert all((p.call is None) != (p.error is None) for p in parsed)
        assert [p.index for p in parsed] == list(range(len(parsed)))


def test_model_text_the_compiler_warns_about_prints_nothing_and_still_gets_its_error() -> None:
    """`start_time=12s` or an invalid escape makes Python's compiler warn (SyntaxWarning; an
    invalid escape is a DeprecationWarning before 3.12): without the filter every such call of
    every rollout printed a line to stderr. Run in a fresh interpreter, every warning shown."""
    import subprocess
    import sys

    script = (
        "from paravt.agent.parsing import parse_tool_calls\n"
        "calls = ['crop_video(start_time=12s, end_time=20s)', 'crop_video(1is 2)',\n"
        "         'crop_video(0x, 3)', r'crop_video(start_time=\"\\d\", end_time=2)',\n"
        "         'crop_video(1if 2 else 3, 4)']\n"
        "for code in calls:\n"
        "    (p,) = parse_tool_calls('<tool_code>' + code + '</tool_code>')\n"
        "    print(p.error is not None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.split() == ["True"] * 5  # none of them is a valid crop_video call
