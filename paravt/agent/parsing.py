"""Parse the tool calls of one assistant turn into `ParsedCall` values.

Accepted forms, one call per block:
    <tool_call>{"name": "crop_video", "arguments": {"start_time": 30, "end_time": 50}}</tool_call>
    <tool_code>crop_video(video_path="v.mp4", start_time="0:30", end_time=50)</tool_code>
(the second is the form the pretrained prior drifts to). A final block may be left unclosed.

`dialect` (`DIALECTS`, config `rollout.agent.tool_dialect`) says how `<tool_code>` is read:
    "any" (default): both tags, one call per block, as above;
    "lines": a `<tool_code>` block holds one call per line (blank and `#` lines skipped), each
        line its own call, positional or keyword arguments; two positional arguments and no
        time by keyword are (start_time, end_time). The form a pretrained prior writes, e.g.
            <tool_code>
            crop_video(start_time=0, end_time=16)
            crop_video(16, 32)
            </tool_code>
    "tool_call": `<tool_call>` only; a `<tool_code>` block is one call that fails with an error
        text naming the right syntax (the RL dialect: a reverted turn gets the error back).
`paravt.rewards.format_reference.reverted_turn` tells whether a turn used `<tool_code>`, whatever
the dialect.
Argument aliases (`start`, `start_sec`, `end`, ...) are normalised to `start_time` / `end_time`
and time values ("30", "30s", "0:30", "00:00:30.5") to float seconds. Each block yields either a
call or a short error text meant for the model; one bad block never spoils its siblings.

This module deliberately does not run tools, know about videos, or check a window against a
video's duration (see `paravt.agent.tools.validate_window`). It never calls `eval`: Python-style
calls are read with `ast.parse` and `ast.literal_eval` only.
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from paravt.rewards.format_reference import CODE_TAG
from paravt.types import ParsedCall, ToolCall

KNOWN_TOOLS: tuple[str, ...] = ("crop_video",)
CALL_EXAMPLE = (
    '<tool_call>{"name": "crop_video", "arguments": '
    '{"video_path": "<video>", "start_time": 30.0, "end_time": 50.0}}</tool_call>'
)

DIALECTS: tuple[str, ...] = ("any", "lines", "tool_call")
_OPEN_RE = re.compile(r"<tool_call>|<tool_code>")
_CLOSE_RE = re.compile(r"</tool_call>|</tool_code>")
_FENCE_RE = re.compile(r"^\s*```[A-Za-z]*\s*|\s*```\s*$")
_TIME_UNITS: tuple[str, ...] = ("seconds", "second", "secs", "sec", "s")  # longest first
_CLOCK_RE = re.compile(r"^(?:(\d{1,6}):)?(\d{1,6}):(\d{1,6}(?:\.\d{0,9})?)$")
# A turn holds at most ~2K tokens; a block far longer than that is not a call worth parsing.
_MAX_BLOCK_CHARS = 20_000

ARGUMENT_ALIASES: dict[str, str] = {
    **dict.fromkeys(
        ("start", "start_time", "start_sec", "start_secs", "start_seconds", "start_s", "begin"),
        "start_time",
    ),
    **dict.fromkeys(
        ("end", "end_time", "end_sec", "end_secs", "end_seconds", "end_s", "stop"), "end_time"
    ),
    **dict.fromkeys(("video_path", "video", "path"), "video_path"),
}
TIME_ARGUMENTS: frozenset[str] = frozenset({"start_time", "end_time"})
# The built-in tools whose arguments get the aliases and time parsing above; a user's tool gets
# its arguments as written (its schema checks them: paravt.agent.schema).
ALIASED_TOOLS: frozenset[str] = frozenset({"crop_video", "zoom"})
# Positional order of Python-style calls, per tool.
POSITIONAL_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "crop_video": ("video_path", "start_time", "end_time"),
}


@dataclass(frozen=True)
class _Block:
    start: int  # offset of the opening tag
    end: int  # offset just past the closing tag, or where an unclosed block stops
    body: str


def _find_blocks(text: str) -> list[_Block]:
    """Blocks in order; an unclosed block runs to the next opening tag or to the end of text.

    Linear time: every tag is found once up front (tags cannot overlap one another), then one
    walk pairs each opening with the next closing or opening after it.
    """
    opens = [(m.start(), m.end()) for m in _OPEN_RE.finditer(text)]
    closes = [(m.start(), m.end()) for m in _CLOSE_RE.finditer(text)]
    blocks: list[_Block] = []
    c = 0  # index of the first closing tag not yet passed
    for i, (start, body_start) in enumerate(opens):
        while c < len(closes) and closes[c][0] < body_start:
            c += 1
        next_open = opens[i + 1][0] if i + 1 < len(opens) else None
        close = closes[c] if c < len(closes) else None
        if next_open is not None and (close is None or next_open < close[0]):
            end, body_end = next_open, next_open
        elif close is None:
            end, body_end = len(text), len(text)
        else:
            end, body_end = close[1], close[0]
        blocks.append(_Block(start, end, text[body_start:body_end]))
    return blocks


def has_tool_call_syntax(text: str) -> bool:
    """True when the text opens at least one `<tool_call>` or `<tool_code>` block."""
    return _OPEN_RE.search(text) is not None


_OPEN_TAGS: tuple[str, ...] = ("<tool_call>", "<tool_code>")
_CLOSE_TAGS: tuple[str, ...] = ("</tool_call>", "</tool_code>")
_TAG_LEN = len("<tool_call>")  # every opening tag has this length, every closing one more


def _ends_with_any(chars: list[str], tags: tuple[str, ...]) -> bool:
    if not chars or chars[-1] != ">":  # every tag ends in ">": one comparison per character
        return False
    return any("".join(chars[-len(tag) :]) == tag for tag in tags if len(chars) >= len(tag))


def strip_tool_blocks(text: str) -> str:
    """The text with every tool block (tags included) and stray closing tags removed.

    One left-to-right pass with a stack, linear in the text: characters are kept until the kept
    text ends in a tag. A closing tag outside a block is dropped; an opening tag starts a block,
    which is dropped up to and including its closing tag, up to the next opening tag, or to the
    end. A tag formed by joining the pieces around a removed tag counts as a tag
    ("<tool_</tool_call>call>x</tool_call>y" -> "y"), so the result never holds tool syntax.
    """
    kept: list[str] = []
    body: list[str] | None = None  # the current block's characters, None outside a block
    for ch in text:
        if body is None:
            kept.append(ch)
            if _ends_with_any(kept, _CLOSE_TAGS):
                del kept[-(_TAG_LEN + 1) :]
            elif _ends_with_any(kept, _OPEN_TAGS):
                del kept[-_TAG_LEN:]
                body = []
            continue
        body.append(ch)
        if _ends_with_any(body, _CLOSE_TAGS):
            body = None
        elif _ends_with_any(body, _OPEN_TAGS):
            body = []
    return "".join(kept)


def cap_error(index: int, max_calls: int) -> str:
    """Error text for the call at 0-based `index` beyond a per-turn cap of `max_calls`."""
    return f"call {index + 1} ignored: at most {max_calls} calls per turn"


def check_dialect(dialect: str) -> None:
    if dialect not in DIALECTS:
        raise ValueError(
            f"unknown tool dialect {dialect!r}: choose one of {', '.join(DIALECTS)} "
            "(rollout.agent.tool_dialect)"
        )


def parse_tool_calls(
    text: str,
    max_calls: int | None = None,
    known_tools: Collection[str] = KNOWN_TOOLS,
    dialect: str = "any",
) -> tuple[ParsedCall, ...]:
    """Every call of one assistant turn, in order, each with a call or an error text: one per
    block, or one per line of a `<tool_code>` block in the "lines" dialect."""
    check_dialect(dialect)
    parsed: list[ParsedCall] = []
    for block in _find_blocks(text):
        for piece in _pieces(block, text[block.start : block.end], dialect):
            index = len(parsed)
            if max_calls is not None and index >= max_calls:
                outcome: ToolCall | str = cap_error(index, max_calls)
            elif piece.refused:
                outcome = f"tool call {index + 1}: <tool_code> is not a tool call here; write "
                outcome += CALL_EXAMPLE
            else:
                outcome = _parse_body(piece.body, index + 1, known_tools, piece.times_first)
            if isinstance(outcome, str):
                parsed.append(ParsedCall(index=index, raw=piece.raw, error=outcome))
            else:
                parsed.append(ParsedCall(index=index, raw=piece.raw, call=outcome))
    return tuple(parsed)


@dataclass(frozen=True)
class _Piece:
    """What one call is read from: its raw text and the body to parse."""

    raw: str
    body: str
    times_first: bool = False  # two positional arguments are (start_time, end_time)
    refused: bool = False  # a `<tool_code>` block in the "tool_call" dialect


def _pieces(block: _Block, raw: str, dialect: str) -> list[_Piece]:
    """The calls of one block: the block itself, or each call line of a `<tool_code>` block."""
    if not raw.startswith(CODE_TAG) or dialect == "any":
        return [_Piece(raw, block.body)]
    if dialect == "tool_call":
        return [_Piece(raw, block.body, refused=True)]
    if len(block.body) > _MAX_BLOCK_CHARS:
        return [_Piece(raw, block.body)]  # parsed into the too-long error
    lines = [line.strip() for line in _FENCE_RE.sub("", block.body).splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    return [_Piece(line, line, times_first=True) for line in lines] or [_Piece(raw, "")]


def _short(value: Any, limit: int = 40) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_body(
    body: str, number: int, known_tools: Collection[str], times_first: bool = False
) -> ToolCall | str:
    if len(body) > _MAX_BLOCK_CHARS:
        return f"tool call {number} is too long ({len(body)} chars); write {CALL_EXAMPLE}"
    code = _FENCE_RE.sub("", body).strip()
    if not code:
        return f"tool call {number} is empty; write {CALL_EXAMPLE}"
    if code.startswith(("{", "[")):
        return _parse_json_call(code, number, known_tools)
    return _parse_python_call(code, number, known_tools, times_first)


def _parse_json_call(code: str, number: int, known_tools: Collection[str]) -> ToolCall | str:
    try:
        # raw_decode ignores text after the object: an unclosed final block runs on into prose.
        obj, _ = json.JSONDecoder().raw_decode(code)
    except (ValueError, RecursionError) as exc:
        return f"invalid JSON in tool call {number}: {_short(str(exc), 60)}; write {CALL_EXAMPLE}"
    if not isinstance(obj, dict):
        return f"tool call {number}: expected one JSON object per block; write {CALL_EXAMPLE}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f'tool call {number} has no "name"; write {CALL_EXAMPLE}'
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return f'invalid JSON in the "arguments" string of tool call {number}'
    if not isinstance(arguments, dict):
        return f'tool call {number}: "arguments" must be an object such as {{"start_time": 30}}'
    return _build_call(name, arguments.items(), number, known_tools)


# Model text is compiled by `ast.parse` under this file name. The compiler's warnings about it
# ("invalid decimal literal" for `start_time=12s`, invalid escapes) would print a line to stderr
# for every such call of every rollout and say nothing the error text does not: they are silenced
# for this name alone, by a filter (`catch_warnings` is not thread-safe; the gateway parses in
# threads).
MODEL_TEXT = "<paravt model tool call>"
for _category in (SyntaxWarning, DeprecationWarning):
    warnings.filterwarnings("ignore", category=_category, module=re.escape(MODEL_TEXT))


def _parse_python_call(
    code: str, number: int, known_tools: Collection[str], times_first: bool = False
) -> ToolCall | str:
    try:
        node = ast.parse(code, filename=MODEL_TEXT, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return f"tool call {number} is neither JSON nor a call; write {CALL_EXAMPLE}"
    if _is_print_wrapper(node):
        node = node.args[0]
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return f"tool call {number}: expected crop_video(start_time=..., end_time=...)"
    name = node.func.id
    if name not in known_tools:
        return _unknown_tool(name, number, known_tools)
    order = POSITIONAL_ARGUMENTS.get(name, ())
    named = {ARGUMENT_ALIASES.get((k.arg or "").strip().lower()) for k in node.keywords}
    if times_first and name == "crop_video" and len(node.args) == 2 and not named & TIME_ARGUMENTS:
        order = ("start_time", "end_time")  # crop_video(16, 32): two times, no path
    if len(node.args) > len(order):
        return f"tool call {number}: {name} takes at most {len(order)} positional arguments"
    nodes = list(zip(order, node.args, strict=False))  # fewer positionals is fine
    for keyword in node.keywords:
        if keyword.arg is None:
            return f"tool call {number}: **kwargs are not supported; name each argument"
        nodes.append((keyword.arg, keyword.value))
    pairs = []
    for key, value_node in nodes:
        try:
            pairs.append((key, ast.literal_eval(value_node)))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return f"tool call {number}: argument {key!r} must be a literal number or string"
    return _build_call(name, pairs, number, known_tools)


def _is_print_wrapper(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
        and len(node.args) == 1
        and not node.keywords
    )


def _unknown_tool(name: str, number: int, known_tools: Collection[str]) -> str:
    known = ", ".join(sorted(known_tools)) or "none"
    return f"unknown tool {_short(name)!r} in tool call {number}; known tools: {known}"


def _build_call(
    name: str, pairs: Iterable[tuple[str, Any]], number: int, known_tools: Collection[str]
) -> ToolCall | str:
    if name not in known_tools:
        return _unknown_tool(name, number, known_tools)
    arguments: dict[str, Any] = {}
    aliased = name in ALIASED_TOOLS
    for key, value in pairs:
        canonical = ARGUMENT_ALIASES.get(key.strip().lower(), key) if aliased else key
        if canonical in arguments:
            return f"tool call {number}: argument {canonical!r} given twice"
        if aliased and canonical in TIME_ARGUMENTS:
            seconds = parse_time(value)
            if isinstance(seconds, str):
                return f"tool call {number}: {canonical} {seconds}"
            value = seconds
        arguments[canonical] = value
    return ToolCall(name=name, arguments=arguments)


def parse_time(value: Any) -> float | str:
    """Seconds as a float, or an error text: numbers, "30", "30.5s", "MM:SS", "HH:MM:SS(.s)"."""
    hint = f"{_short(repr(value))} is not a time; use seconds (30.5), 'MM:SS' or 'HH:MM:SS'"
    if isinstance(value, bool):
        return hint
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            return hint
    elif isinstance(value, str):
        parsed = _parse_time_text(value)
        if parsed is None:
            return hint
        seconds = parsed
    else:
        return hint
    return seconds if math.isfinite(seconds) else hint


def _strip_unit(text: str) -> str:
    # endswith, not a `\s*(s|secs?|seconds?)$` regex: that one rescans a whitespace run from
    # every position in it (quadratic on a long run inside a tool argument).
    lowered = text.lower()
    for unit in _TIME_UNITS:
        if lowered.endswith(unit):
            return text[: -len(unit)].rstrip()
    return text


def _parse_time_text(text: str) -> float | None:
    text = _strip_unit(text.strip())
    try:
        return float(text)
    except ValueError:
        pass
    match = _CLOCK_RE.match(text)
    if match is None:
        return None
    hours, minutes, seconds = int(match.group(1) or 0), int(match.group(2)), float(match.group(3))
    # Clock notation is only unambiguous with in-range fields ("1:75" is a typo, not 135 s).
    if seconds >= 60 or (match.group(1) is not None and minutes >= 60):
        return None
    return hours * 3600.0 + minutes * 60.0 + seconds
