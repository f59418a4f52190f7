"""The agent loop a round at a time: several runs in one engine call, weights changed between
rounds (partial rollouts), every token's policy version and behaviour log-prob per segment."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.agent.scripts import call_text
from paravt.rollout.engine import SamplingParams, derive_seed, request_seeds
from paravt.rollout.engines.scripted import ScriptedEngine
from paravt.video.reader import VideoReader

GREEDY = SamplingParams(greedy=True, max_new_tokens=200)


class VersionedScript(ScriptedEngine):
    """A scripted assistant with a weight version: each sampled token's log-prob is
    -0.1 * (version + 1), so a token tells which weights sampled it. Stands in for a policy
    whose weights change between turns (the loop under test only reads what it returns)."""

    def __init__(self, tokenizer, responder):
        super().__init__(tokenizer, responder)
        self.version, self.calls = 0, 0

    @property
    def weight_version(self) -> int:
        return self.version

    def sync_weights(self, policy, version: int) -> None:
        self.version = version

    def generate(self, requests, params):
        self.calls += 1
        lp = -0.1 * (self.version + 1)
        rows = super().generate(requests, params)
        return [[replace(o, logprobs=(lp,) * len(o.token_ids)) for o in row] for row in rows]


def turn_script(turns: dict[str, int]):
    """The assistant calls the crop tool until its question has had `turns[question] - 1`
    tool rounds, then answers."""

    def respond(context: str) -> str:
        question = next(q for q in turns if q in context)
        if context.count("<tool_response>") < turns[question] - 1:
            return "look</think>\n" + call_text(1, 5)
        return "done</think>\n<answer>A</answer>"

    return respond


@pytest.fixture(scope="module")
def processor(tiny_qwen3_dir):
    return AutoProcessor.from_pretrained(tiny_qwen3_dir)


def segments(traj):
    """[(version, behaviour log-prob)] of each run of trained tokens."""
    out = []
    for v, m, lp in zip(traj.versions, traj.loss_mask, traj.logprobs, strict=True):
        if m and (not out or out[-1][0] != v):
            out.append((v, round(lp, 6)))
    return out


def test_rounds_of_two_runs_share_engine_calls_and_record_each_tokens_version(
    processor, needle_samples
):
    long, short = needle_samples[0], needle_samples[1]
    engine = VersionedScript(
        processor.tokenizer, turn_script({long.question: 3, short.question: 1})
    )
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=3))
    first = loop.start([long], [4], 2, GREEDY)
    loop.advance([first])  # turn 1 of `first` under version 0
    engine.sync_weights(None, 1)  # a turn boundary: new weights, nothing in flight
    second = loop.start([short], [4], 2, GREEDY)
    loop.advance([first, second])  # one call: turn 2 of `first`, turn 1 of `second`
    assert engine.calls == 2 and second.done is False
    engine.sync_weights(None, 2)
    while not (first.done and second.done):
        loop.advance([first, second])
    a, b = loop.finish(first), loop.finish(second)
    # `first`: 3 turns sampled under versions 0, 1, 2, each with that version's log-probs;
    # `second`: 1 turn under version 1.
    for traj in a:
        assert segments(traj) == [(0, -0.1), (1, -0.2), (2, -0.3)]
        assert len(traj.versions) == len(traj.token_ids) and traj.num_rounds == 2
    for traj in b:
        assert segments(traj) == [(1, -0.2)] and traj.num_rounds == 0
    # Calls: [a1], [a2 b1], [a3]; the next advance finds no one active and makes none.
    assert engine.calls == 3


def test_run_equals_start_advance_finish(processor, needle_samples):
    script = turn_script({s.question: 2 for s in needle_samples[:2]})
    loop = AgentLoop(
        VersionedScript(processor.tokenizer, script),
        ChatRenderer(processor),
        VideoReader(),
        AgentConfig(max_rounds=3),
    )
    whole = loop.run(needle_samples[:2], [4, 4], 2, GREEDY)
    rounds = loop.start(needle_samples[:2], [4, 4], 2, GREEDY)
    while not rounds.done:
        loop.advance([rounds])
    stepped = loop.finish(rounds)
    fields = ("token_ids", "loss_mask", "logprobs", "versions", "num_rounds", "finish_reason")
    assert [[getattr(t, f) for f in fields] for t in stepped] == [
        [getattr(t, f) for f in fields] for t in whole
    ]
    assert {v for t in whole for v in t.versions} == {0}


class SeedScript(ScriptedEngine):
    """The scripted assistant, recording (request name, seed) of every request it samples."""

    def __init__(self, tokenizer, responder):
        super().__init__(tokenizer, responder)
        self.seen: list[tuple[str, int | None]] = []

    def generate(self, requests, params):
        seeds = request_seeds(requests, params)
        self.seen += [(r.name, s) for r, s in zip(requests, seeds, strict=True)]
        return super().generate(requests, params)


def test_merged_runs_keep_each_trajectorys_own_seed_stream(processor, needle_samples):
    """Partial rollouts play the rounds of two steps in one engine call: each trajectory still
    samples each turn with its own step's seeds, as it would alone (not the first run's)."""
    long, short = needle_samples[0], needle_samples[1]
    script = turn_script({long.question: 3, short.question: 2})
    engine = SeedScript(processor.tokenizer, script)
    loop = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=3))
    step0, step1 = SamplingParams(seed=derive_seed(0, 0)), SamplingParams(seed=derive_seed(0, 1))
    loop.run([long], [4], 2, step0)
    loop.run([short], [4], 2, step1)
    alone, engine.seen = engine.seen, []
    first = loop.start([long], [4], 2, step0)
    loop.advance([first])
    second = loop.start([short], [4], 2, step1)
    while not (first.done and second.done):
        loop.advance([first, second])
    # long: 3 turns x G = 2, short: 2 turns x 2; all 10 seeds distinct, the same in both plays
    assert len(engine.seen) == len(alone) == 10 and len({s for _, s in alone}) == 10
    assert sorted(engine.seen) == sorted(alone)


def test_the_tool_calls_of_merged_runs_run_in_one_executor_round(processor, needle_samples):
    """Streaming and partial rollouts merge the rounds of several runs: their crops then run in
    ONE `run_many` a round (not one per run, which serialises the runs' tools), and every
    trajectory gets its own results: the same tokens as each run played alone."""
    long, short = needle_samples[0], needle_samples[1]
    script = turn_script({long.question: 3, short.question: 2})
    loop = AgentLoop(
        VersionedScript(processor.tokenizer, script),
        ChatRenderer(processor),
        VideoReader(),
        AgentConfig(max_rounds=3),
    )
    alone = [loop.run([s], [4], 2, GREEDY) for s in (long, short)]
    rounds_of_tools: list[int] = []  # trajectories whose calls each run_many call received
    run_many = loop.executor.run_many
    loop.executor.run_many = lambda turns: rounds_of_tools.append(len(turns)) or run_many(turns)
    first, second = loop.start([long], [4], 2, GREEDY), loop.start([short], [4], 2, GREEDY)
    while not (first.done and second.done):
        loop.advance([first, second])
    # round 1: both runs' 2 + 2 trajectories call; round 2: only `long`'s 2 call again
    assert rounds_of_tools == [4, 2]
    for played, solo in zip((loop.finish(first), loop.finish(second)), alone, strict=True):
        assert [t.token_ids for t in played] == [t.token_ids for t in solo]
        assert [len(t.visuals) for t in played] == [len(t.visuals) for t in solo]
