"""Answer (question, video) pairs with paravt's agent protocol, for harnesses such as lmms-eval.

`AgentRunner(pretrained, mode)` loads a checkpoint paravt exported (or any Qwen-VL it can load),
builds the transformers engine and the agent loop exactly as `evaluate.py` does, with the
paper's settings per mode (conf/mode/*.yaml): `parallel` (3 rounds, up to 5 crops a turn),
`sequential` (1 crop a turn), `no_tool` (no tool offered, one answer). `answer(items)` returns
each rollout's final turn text, the text `evaluate.py` scores. It deliberately knows nothing of
lmms-eval: the `lmms` subclass in `paravt.lmms.models.paravt` maps its requests onto this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from paravt.agent.loop import AgentConfig
from paravt.agent.tools import CropConfig
from paravt.errors import UserError
from paravt.eval.adapters.base import MCQ_FORCED_ANSWER
from paravt.eval.protocol import PAPER_AGENT, EvalConfig, build_agent_loop
from paravt.rollout import SamplingParams
from paravt.types import Sample

# conf/mode/*.yaml, as (agent overrides, crop.max_calls_per_turn)
MODES: dict[str, tuple[dict, int]] = {
    "parallel": ({"max_rounds": 3, "tools": True}, 5),
    "sequential": ({"max_rounds": 3, "tools": True}, 1),
    "no_tool": ({"max_rounds": 0, "tools": False}, 5),
}


@dataclass(frozen=True)
class Question:
    """One request: its id, the user text (options included) and the video file."""

    id: str
    question: str
    video: str


def protocol(mode: str, frame_budget: int, max_new_tokens: int, batch_size: int) -> EvalConfig:
    """The evaluation protocol of `mode` (the paper's agent settings otherwise)."""
    if mode not in MODES:
        raise UserError(f"paravt mode={mode!r} is unknown: choose one of {', '.join(MODES)}")
    agent_over, calls = MODES[mode]
    agent: AgentConfig = replace(PAPER_AGENT, max_new_tokens=max_new_tokens, **agent_over)
    crop = CropConfig(max_calls_per_turn=calls)
    return EvalConfig(agent=agent, crop=crop, frame_budget=frame_budget, batch_size=batch_size)


class AgentRunner:
    """A loaded policy + agent loop that answers `Question`s greedily."""

    def __init__(
        self,
        pretrained: str,
        mode: str = "parallel",
        frame_budget: int = 64,
        max_new_tokens: int = 2048,
        batch_size: int = 8,
        forced_answer: str = MCQ_FORCED_ANSWER,
        forced_answer_max_tokens: int | None = 64,  # the MCQ benchmarks' cap (a letter)
        device: str = "cpu",
    ) -> None:
        from paravt.agent.render import ChatRenderer
        from paravt.errors import check_model_path
        from paravt.models.loading import PolicySpec, load_policy
        from paravt.rollout.factory import build_engine
        from paravt.video.reader import VideoReader

        check_model_path(pretrained, None, None)
        self.cfg = protocol(mode, int(frame_budget), int(max_new_tokens), int(batch_size))
        model, processor = load_policy(PolicySpec(path=pretrained))
        model.eval().to(device)
        engine = build_engine("hf", model, processor, model_path=pretrained)
        self.source = VideoReader()
        self.loop = build_agent_loop(
            engine,
            ChatRenderer(processor),
            self.source,
            self.cfg,
            forced_answer,
            forced_answer_max_tokens,
        )

    def answer(self, questions: Sequence[Question]) -> list[str]:
        """The final turn text of each question's greedy rollout (batches of `batch_size`)."""
        import torch

        params = SamplingParams(
            greedy=True, max_new_tokens=self.cfg.agent.max_new_tokens, seed=self.cfg.seed
        )
        out: list[str] = []
        for start in range(0, len(questions), self.cfg.batch_size):
            batch = questions[start : start + self.cfg.batch_size]
            samples = [
                Sample(id=q.id, video=q.video, question=q.question, answer="") for q in batch
            ]
            with torch.no_grad():
                trajs = self.loop.run(samples, [self.cfg.frame_budget] * len(samples), 1, params)
            out += [t.turns[-1].text if t.turns else "" for t in trajs]
        return out

    def close(self) -> None:
        self.loop.executor.close()
