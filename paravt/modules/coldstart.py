"""Cold start before RL: supervised steps on self-traced teacher trajectories.

The teacher (`paravt.agent.scripts.needle_teacher` behind a `ScriptedEngine`) drives the real agent
loop, so the trajectories hold real crops and real tool-response tokens, built exactly as RL
rollouts are. A few supervised steps on them give a tiny policy the format and the habit of
parallel crops; whether it can read the answer off the frames is what RL then has to improve.
This is the demo's stand-in for the paper's 97K-sample SFT stage, not a replacement for it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from paravt.agent.loop import AgentLoop
from paravt.agent.scripts import needle_teacher
from paravt.modules.sft import supervised_steps
from paravt.rollout.engine import SamplingParams
from paravt.rollout.scripted import ScriptedEngine
from paravt.types import Sample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColdStartConfig:
    steps: int = 120
    lr: float = 3e-3
    batch_size: int = 8
    strategy: str = "search"  # "search" (crop the hinted span) | "oracle" (the true windows)
    budgets: tuple[int, ...] = (4, 8)


def teacher_trajectories(agent: AgentLoop, samples: Sequence[Sample], cfg: ColdStartConfig):
    """One scripted trajectory per sample, overview budgets cycling through `cfg.budgets`."""
    engine = ScriptedEngine(agent.tokenizer, needle_teacher(samples, cfg.strategy))
    teacher = AgentLoop(engine, agent.renderer, agent.source, agent.cfg, agent.crop)
    budgets = [cfg.budgets[i % len(cfg.budgets)] for i in range(len(samples))]
    return teacher.run(samples, budgets, 1, SamplingParams(greedy=True))


def cold_start(
    module, samples: Sequence[Sample], cfg: ColdStartConfig, agent: AgentLoop
) -> list[float]:
    """Fit `module.policy` to the teacher's trajectories (rendered and cropped by `agent`'s
    renderer, reader and tools); returns the loss of every step."""
    trajs = teacher_trajectories(agent, samples, cfg)
    calls = sum(t.num_valid_calls for t in trajs) / max(len(trajs), 1)
    log.info("cold start: %d teacher trajectories, %.2f crops each", len(trajs), calls)
    losses = supervised_steps(
        module.policy, trajs, module.token_ids, cfg.steps, cfg.lr, cfg.batch_size
    )
    module.reset_reference()
    log.info("cold start: loss %.3f -> %.3f over %d steps", losses[0], losses[-1], len(losses))
    return losses
