"""The streaming generator's loop (paravt.generator.streaming), in this process with a scripted
engine whose tokens tell the weights that sampled them: takes answered as soon as whole groups
are buffered, in finishing order; in-flight trajectories going on under weights published
mid-flight; a group doomed by the staleness bound dropped, counted and replaced."""

from __future__ import annotations

import queue
import time

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.generator.messages import GenTask, StreamResult, StreamTake
from paravt.generator.streaming import serve_stream
from paravt.rollout.sync.shared_weights import SharedWeights
from paravt.rollout.sync.stream_buffer import StreamLimits
from paravt.video.reader import VideoReader
from tests.agent.test_rounds import GREEDY, VersionedScript, segments, turn_script

pytestmark = pytest.mark.timeout(120)
LIMITS = StreamLimits(group_size=2, batch_groups=1, max_concurrent=4, max_staleness=1)


class Outbox(list):
    """The result channel: keeps what is sent; stops the generator after `last` batches."""

    def __init__(self, tasks, last: int):
        super().__init__()
        self.tasks, self.last = tasks, last

    @property
    def batches(self) -> list[StreamResult]:
        return [r for r in self if isinstance(r, StreamResult)]

    def put(self, item) -> None:
        self.append(item)
        if isinstance(item, StreamResult) and len(self.batches) == self.last:
            self.tasks.put(None)


class Trainer:
    """The trainer's side, played from inside engine calls: publish a version, ask for a step."""

    def __init__(self, tasks, sent: Outbox):
        self.model = torch.nn.Linear(2, 2)
        self.weights = SharedWeights.create(self.model, 0, mp.get_context("spawn"))
        self.tasks, self.sent = tasks, sent

    def take(self, step: int, version: int) -> None:
        if version != self.weights.version:
            with torch.no_grad():
                self.model.weight.add_(1.0)
            self.weights.publish(self.model, version)
        self.tasks.put(StreamTake(step, version))
        while self.tasks.qsize():  # the reader thread has it ...
            time.sleep(0.01)
        time.sleep(0.3)  # ... and acted on it before the next turn boundary

    def wait_for(self, batches: int) -> None:
        end = time.monotonic() + 30
        while len(self.sent.batches) < batches and time.monotonic() < end:
            time.sleep(0.01)
        assert len(self.sent.batches) == batches


def _serve(processor, samples, turns: list[int], hooks, last: int, max_rounds: int = 3):
    """Run `serve_stream` on `samples` (one prompt step, each prompt taking `turns` turns);
    `hooks[k](trainer)` runs at the start of engine call k (0-based)."""
    tasks: queue.Queue = queue.Queue()
    sent = Outbox(tasks, last)
    trainer = Trainer(tasks, sent)

    class Engine(VersionedScript):
        def generate(self, requests, params):
            if self.calls in hooks:
                hooks[self.calls](trainer)
            return super().generate(requests, params)

    script = turn_script({s.question: n for s, n in zip(samples, turns, strict=True)})
    engine = Engine(processor.tokenizer, script)
    agent = AgentLoop(
        engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=max_rounds)
    )
    n = len(samples)
    tasks.put(GenTask(0, tuple(samples), (4,) * n, 2, GREEDY, (), tuple(range(n))))
    generator = torch.nn.Linear(2, 2)
    serve_stream(tasks, sent, trainer.weights, generator, engine, agent, True, LIMITS)
    return sent, engine, trainer, generator


@pytest.fixture(scope="module")
def processor(tiny_qwen3_dir):
    return AutoProcessor.from_pretrained(tiny_qwen3_dir)


def test_in_flight_groups_go_on_under_new_weights_and_batches_go_in_finishing_order(
    processor, needle_samples
):
    """Prompt 0 takes 3 turns, prompts 1 and 2 one. Calls: 1) groups 0 and 1 (version 0);
    group 1 ends. 2) step 0 takes group 1, update 1 is published, step 1 asks; group 0's turn 2
    (still version 0). The boundary loads version 1; the gate ((1 + 1 + 1) x 1 - 1 accepted -
    1 running) admits group 2. 3) group 0's turn 3 and group 2's turn 1 under version 1: both
    end, group 0 first: it is step 1's batch, its tokens of versions 0 and 1."""
    s0, s1, s2 = needle_samples[:3]

    def at_call_1(trainer):
        trainer.take(0, 0)
        trainer.wait_for(1)
        trainer.take(1, 1)

    sent, engine, trainer, generator = _serve(processor, [s0, s1, s2], [3, 1, 1], {1: at_call_1}, 2)
    first, second = sent.batches
    assert [(b.step, [g.sample.id for g in b.groups]) for b in sent.batches] == [
        (0, [s1.id]),
        (1, [s0.id]),
    ]
    assert [segments(t) for t in first.groups[0].trajectories] == [[(0, -0.1)]] * 2
    assert [segments(t) for t in second.groups[0].trajectories] == [[(0, -0.1), (1, -0.2)]] * 2
    assert (second.in_flight, second.buffered, second.dropped) == (0, 1, 0)  # group 2 waits
    assert engine.calls == 3
    assert torch.equal(generator.weight, trainer.model.weight)  # the published weights


def test_a_group_the_bound_dooms_is_dropped_counted_and_replaced(processor, needle_samples):
    """max_staleness 1. Prompt 0 takes 4 turns, prompts 1-3 one. Steps 0 and 1 take groups 1
    and 2 (as above); at call 3, update 2 is published and step 2 asks: group 0, sampled from
    version 0, is 2 updates behind: dropped while running, its last turn thrown away; the gate
    ((2 + 1 + 1) x 1 - 2 accepted) admits group 3 under version 2, step 2's batch."""
    s0, s1, s2, s3 = needle_samples[:4]

    def at_call_1(trainer):
        trainer.take(0, 0)
        trainer.wait_for(1)
        trainer.take(1, 1)

    def at_call_3(trainer):
        trainer.wait_for(2)
        trainer.take(2, 2)

    hooks = {1: at_call_1, 3: at_call_3}
    sent, engine, _, _ = _serve(processor, [s0, s1, s2, s3], [4, 1, 1, 1], hooks, 3, max_rounds=4)
    assert [[g.sample.id for g in b.groups] for b in sent.batches] == [[s1.id], [s2.id], [s3.id]]
    assert [b.dropped for b in sent.batches] == [0, 0, 1]
    assert [segments(t) for t in sent.batches[2].groups[0].trajectories] == [[(2, -0.3)]] * 2
    assert engine.calls == 5  # group 0's turns 1-4, group 3's one (with group 2's in call 3)
