"""The generator's partial-rollout loop (paravt.generator.partial_rollouts), in this process: steps
in flight together, the weights synced at a turn boundary, results whole and in step order."""

from __future__ import annotations

import queue

import torch
import torch.multiprocessing as mp
from transformers import AutoProcessor

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.render import ChatRenderer
from paravt.generator.partial_rollouts import serve_partial
from paravt.generator.worker import GenTask
from paravt.rollout.sync.shared_weights import SharedWeights
from paravt.video.reader import VideoReader
from tests.agent.test_rounds import GREEDY, VersionedScript, segments, turn_script


class Outbox(list):
    """The result channel: keeps what is sent; stops the generator after `last` results."""

    def __init__(self, tasks, last: int):
        super().__init__()
        self.tasks, self.last = tasks, last

    def put(self, item) -> None:
        self.append(item)
        if len(self) == self.last:
            self.tasks.put(None)


def test_a_step_resumes_with_the_weights_published_while_it_was_in_flight(
    tiny_qwen3_dir, needle_samples
):
    processor = AutoProcessor.from_pretrained(tiny_qwen3_dir)
    long, short = needle_samples[0], needle_samples[1]
    trainer, generator = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    weights = SharedWeights.create(trainer, 0, mp.get_context("spawn"))
    tasks: queue.Queue = queue.Queue()
    task = GenTask(0, (long,), (4,), 2, GREEDY)
    tasks.put(task)

    class Engine(VersionedScript):
        def generate(self, requests, params):
            if self.calls == 1:  # after step 0's first round: update 1 lands, step 1 comes
                with torch.no_grad():
                    trainer.weight.add_(1.0)
                weights.publish(trainer, 1)
                tasks.put(GenTask(1, (short,), (4,), 2, GREEDY))
            return super().generate(requests, params)

    engine = Engine(processor.tokenizer, turn_script({long.question: 3, short.question: 1}))
    agent = AgentLoop(engine, ChatRenderer(processor), VideoReader(), AgentConfig(max_rounds=3))
    sent = Outbox(tasks, last=2)
    serve_partial(tasks, sent, weights, generator, engine, agent, skip_bad_videos=True)
    assert [r.step for r in sent] == [0, 1]
    # Step 0's first turn under version 0, the rest resumed under version 1 (the synced
    # weights reached the generator's model); its result carries the oldest version, 0.
    assert torch.equal(generator.weight, trainer.weight)
    assert [segments(t) for t in sent[0].trajectories] == [[(0, -0.1), (1, -0.2)]] * 2
    assert [segments(t) for t in sent[1].trajectories] == [[(1, -0.2)]] * 2
    assert (sent[0].version, sent[1].version) == (0, 1)
    # Step 1's only turn shared step 0's second engine call: 3 calls, not 3 + 1.
    assert engine.calls == 3
    assert sent[0].busy_s > 0 and "rollout_generate" in sent[0].timings
