"""Episodes: token-incremental rendering of an external agent's requests into paravt trajectories.

An episode is one rollout of an agent program. Each chat request it sends carries its whole
history; the gateway never re-tokenises that history. It keeps, per trajectory (a `Branch`), the
token ids rendered and sampled so far and the request messages they stand for (assistant turns as
the gateway returned them). A request whose messages start with exactly those messages, and whose
last turn ended with the end-of-turn token, is CLEAN: only the new messages are rendered, as
paravt's loop renders tool responses (`ChatRenderer.continuation`), and appended. Anything else (an
edited, re-spaced or post-processed assistant text, a changed system prompt, a turn cut by the
token cap) is a FORK: the current trajectory is closed as it is and a new one starts from the
request's messages, counted in `forks` (`gateway/forks`), never silently re-aligned.

The model's own tokens are the only trained ones (mask 1, behaviour log-probs); everything the
renderer adds has mask 0, as in `paravt.agent.loop.AgentLoop`, so a conversation played the same
way gives the same `Trajectory`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from paravt.agent.loop import sampled_by
from paravt.agent.parsing import parse_tool_calls
from paravt.agent.render import ChatRenderer, Segment
from paravt.gateway.media import MediaConfig, RequestError, convert_message
from paravt.rollout.engine import (
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    derive_seed,
)
from paravt.types import Frames, ParsedCall, ToolResult, Trajectory, Turn, Visual


@dataclass
class Branch:
    """One trajectory of an episode: tokens so far and the request messages they cover."""

    ids: list[int]
    mask: list[int]
    logp: list[float]
    versions: list[int]
    visuals: list[Visual]
    prompt_length: int
    seen: list[str]  # canonical form of every request message covered, in order
    history: list[dict[str, Any]]  # the messages as paravt renders them
    turns: list[Turn] = field(default_factory=list)
    finish_reason: str = "stop"


@dataclass
class Episode:
    """One rollout of an agent program: its trajectories, task payload, forks and reward."""

    id: str
    payload: dict[str, Any] = field(default_factory=dict)
    branches: list[Branch] = field(default_factory=list)
    forks: Counter = field(default_factory=Counter)  # reason -> count
    reward: float | None = None
    params: SamplingParams | None = None  # set: the trainer's sampling, whatever the agent asks
    # set (training): the trajectory's seed stream, as `AgentLoop` gives each trajectory; the
    # request of turn t samples with derive_seed(seed, t, 0), as the agent loop's turn t does
    seed: int | None = None
    touched: float = field(default_factory=time.monotonic)  # the last request's time
    held: bool = False  # set (training): its agent returned, it waits for paravt's finish


@dataclass(frozen=True)
class Pending:
    """A rendered request not yet answered: committed only once its generation succeeded."""

    episode: Episode
    branch: Branch  # the branch it extends, or a new one (`fork` says why, "" if first)
    segment: Segment
    seen: tuple[str, ...]
    history: tuple[dict[str, Any], ...]
    new: bool
    fork: str = ""

    def request(self) -> GenerationRequest:
        seg, name = self.segment, f"episode {self.episode.id}"
        turn = 0 if self.new else len(self.branch.turns)
        seed = derive_seed(self.episode.seed, turn, 0)
        if self.new:
            return GenerationRequest(seg.token_ids, seg.visuals, name, seed)
        ids = (*self.branch.ids, *seg.token_ids)
        return GenerationRequest(ids, (*self.branch.visuals, *seg.visuals), name, seed)


ROLES = ("system", "user", "tool", "assistant")


def check_message(message: Any, index: int) -> None:
    """Refuse (`RequestError`, naming the message) what no OpenAI chat message is: a role other
    than `ROLES`, an assistant content that is not text, tool calls that are not
    {"function": {"name": str, "arguments": str | object}} objects. User, system and tool
    contents are checked where they are converted (`convert_message`)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object with a role")
    role = message.get("role")
    if role not in ROLES:
        raise RequestError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    if role != "assistant":
        return
    assistant_text(message, where)
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be a list")
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, str | dict | None):
            raise RequestError(
                f'{where}.tool_calls[{k}] must be {{"function": {{"name": "...", '
                f'"arguments": "<JSON>"}}}}, got {json.dumps(call)[:80]}'
            )
        if not isinstance(call.get("id"), str | None):
            raise RequestError(f"{where}.tool_calls[{k}].id must be a string")


def assistant_text(message: dict[str, Any], where: str = "an assistant message") -> str:
    """An assistant message's content as text: a string, null (calls only) or a list of text
    parts (OpenAI's array form), joined."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(f"{where}: an assistant content must be text (a string or text parts)")


def canonical(message: dict[str, Any]) -> str:
    """What of a request message decides its tokens: role and content, and for an assistant
    turn its tool calls (id, name, arguments as JSON values: a client that re-serialises them
    with other spacing changes nothing, the tokens hold the model's own text); fields clients
    add (null refusals, names) do not count."""
    role = message.get("role")
    if role == "assistant":
        calls = [
            (c.get("id"), c.get("function", {}).get("name"), _json(c.get("function", {})))
            for c in message.get("tool_calls") or ()
        ]
        return json.dumps([role, assistant_text(message), calls], sort_keys=True)
    return json.dumps([role, message.get("content")], sort_keys=True)


def _json(function: dict[str, Any]) -> Any:
    arguments = function.get("arguments")
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


class EpisodeRenderer:
    """Renders requests of episodes token-incrementally and turns sampled outputs into replies.

    Rendering goes through one lock: the processor's fast tokenizer is not safe to share between
    threads, and rendering is CPU-bound anyway."""

    def __init__(
        self,
        renderer: ChatRenderer,
        source,
        media: MediaConfig,
        prefix: str = "",
        max_calls: int = 5,
        tool_dialect: str = "any",
    ):
        self.renderer = renderer
        self.source = source
        self.media = media
        self.prefix = prefix
        self.max_calls = max_calls
        self.tool_dialect = tool_dialect
        self._lock = threading.Lock()

    def plan(self, episode: Episode, messages: list[dict[str, Any]]) -> Pending:
        """The request's context: the current branch extended (CLEAN) or a new branch (FORK)."""
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list")
        for index, message in enumerate(messages):
            check_message(message, index)
        if messages[-1].get("role") == "assistant":
            raise RequestError("the last message is an assistant turn: nothing to answer")
        keys = [canonical(m) for m in messages]
        branch = episode.branches[-1] if episode.branches else None
        with self._lock:
            if branch is None:
                return self._start(episode, messages, keys, "")
            reason = self._drift(branch, keys, messages)
            if reason:
                return self._start(episode, messages, keys, reason)
            new = messages[len(branch.seen) :]
            converted, clips = self._convert(new)
            seg = self.renderer.continuation(branch.history, converted, clips, self.prefix)
            history = (*branch.history, *converted)
            return Pending(episode, branch, seg, tuple(keys), history, new=False)

    @staticmethod
    def _drift(branch: Branch, keys: list[str], messages: list[dict[str, Any]]) -> str:
        """Why the request cannot extend `branch` ("" when it can)."""
        n = len(branch.seen)
        if len(keys) < n and keys == branch.seen[: len(keys)]:
            return "retried"  # an earlier point of the history again: a fresh sample there
        if keys[:n] != branch.seen:
            return "edited"  # an earlier message differs from what the tokens hold
        if any(m.get("role") == "assistant" for m in messages[n:]):
            return "inserted"  # an assistant turn the model did not write
        if branch.finish_reason != "stop":
            return "unfinished"  # the last turn has no end-of-turn token to continue after
        return ""

    def _start(self, episode: Episode, messages, keys, reason: str) -> Pending:
        converted, clips = self._convert(messages)
        seg = self.renderer.prompt(converted, clips, self.prefix)
        branch = Branch([], [], [], [], [], len(seg.token_ids), [], [])
        return Pending(episode, branch, seg, tuple(keys), tuple(converted), True, reason)

    def _convert(self, messages) -> tuple[list[dict[str, Any]], list[Frames]]:
        converted: list[dict[str, Any]] = []
        clips: list[Frames] = []
        for m in messages:
            if m.get("role") == "assistant":  # few-shot turns of a first prompt: text only
                converted.append({"role": "assistant", "content": assistant_text(m)})
                continue
            msg, found = convert_message(m, self.source, self.media)
            converted.append(msg)
            clips += found
        return converted, clips

    def commit(self, pending: Pending, out: GenerationOutput, version: int) -> dict[str, Any]:
        """Append the request's segment and the sampled turn; the assistant message to return."""
        ep, br, seg = pending.episode, pending.branch, pending.segment
        if pending.new:
            if pending.fork:
                ep.forks[pending.fork] += 1
            ep.branches.append(br)
        elif br.turns and seg.visuals:  # the clips the agent's tools answered the turn with
            results = tuple(_clip_result(i, v.frames) for i, v in enumerate(seg.visuals))
            br.turns[-1] = replace(br.turns[-1], results=results)
        br.ids += seg.token_ids
        br.mask += [0] * len(seg.token_ids)
        br.logp += [0.0] * len(seg.token_ids)
        br.versions += [version] * len(seg.token_ids)
        br.visuals += seg.visuals
        br.ids += out.token_ids
        br.mask += [1] * len(out.token_ids)
        br.logp += out.logprobs
        br.versions += [sampled_by(out, version)] * len(out.token_ids)
        text = self.prefix + self._body(out)
        calls = parse_tool_calls(text, max_calls=self.max_calls, dialect=self.tool_dialect)
        reply = assistant_message(text, calls, len(br.turns))
        br.turns.append(Turn(text=text, calls=calls))
        br.history = [*pending.history, {"role": "assistant", "content": text}]
        br.seen = [*pending.seen, canonical(reply)]
        br.finish_reason = out.finish_reason
        return reply

    def _body(self, out: GenerationOutput) -> str:
        tok = self.renderer.tokenizer
        with self._lock:
            body = tok.decode(list(out.token_ids), skip_special_tokens=False)
        end = self.renderer.end_of_turn
        return body[: -len(end)] if body.endswith(end) else body


def _clip_result(index: int, frames: Frames) -> ToolResult:
    """A clip of a turn's tool messages as the `ToolResult` paravt's consistency check reads
    (`paravt.rollout.consistency`: which turn brought which clip into the context)."""
    window = (frames.timestamps[0], frames.timestamps[-1])
    return ToolResult(index, "agent_tool", frames=frames, window=window)


def assistant_message(text: str, calls: tuple[ParsedCall, ...], turn: int) -> dict[str, Any]:
    """The OpenAI assistant message of a turn: its whole text, and its valid calls as
    `tool_calls` (ids `call_<turn>_<index>`; a malformed call stays in the text only)."""
    tool_calls = [
        {
            "id": f"call_{turn}_{c.index}",
            "type": "function",
            "function": {"name": c.call.name, "arguments": json.dumps(dict(c.call.arguments))},
        }
        for c in calls
        if c.ok
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def trajectories(
    episode: Episode, sample_id: str = "", group_index: int = 0, frame_budget: int = 0
) -> tuple[Trajectory, ...]:
    """The episode's trajectories, one per branch that sampled a turn, oldest first: the same
    type (and, for a conversation played the same way, the same tokens, mask, log-probs,
    versions and visuals) as `AgentLoop` returns. Tool responses are the tool messages that do
    not start with "Error" (paravt's error convention)."""
    out = []
    for br in episode.branches:
        calls = [c for t in br.turns for c in t.calls]
        responses = sum(
            1 for m in br.history if m["role"] == "tool" and not _text(m).startswith("Error")
        )
        out.append(
            Trajectory(
                sample_id=sample_id or episode.id,
                group_index=group_index,
                token_ids=tuple(br.ids),
                loss_mask=tuple(br.mask),
                logprobs=tuple(br.logp),
                visuals=tuple(br.visuals),
                prompt_length=br.prompt_length,
                versions=tuple(br.versions),
                turns=tuple(br.turns),
                num_calls=len(calls),
                num_valid_calls=sum(c.ok for c in calls),
                num_tool_responses=responses,
                num_rounds=sum(1 for t in br.turns if t.calls),
                finish_reason=br.finish_reason,
                frame_budget=frame_budget,
            )
        )
    return tuple(out)


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")
