"""The evaluation protocol: the SAME agent and crop settings as training, plus the eval knobs.

`EvalConfig` holds an `AgentConfig` and a `CropConfig` (composed by Hydra from conf/rollout's
`agent` / `crop` groups, so training and evaluation share one source of truth) and only what is
evaluation's own: the overview frame budget, the batch size and the seed. The call cap is ONE
knob, `crop.max_calls_per_turn` (the sequential preset sets it to 1); `agent.tools=false` is the
no-tool preset (no tool in the system prompt, no call parsed); `agent.deny_calls=true` the
tools-denied one (the tool offered, its calls never run, an answer forced). Presets:
conf/mode/*.yaml.

This module deliberately does not run anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

from paravt.agent.loop import AgentConfig, AgentLoop
from paravt.agent.tools import CropConfig
from paravt.errors import check_number

# The paper's protocol (docs/method.md section 6): 2,048 new tokens per turn, 3 rounds, 5 calls.
PAPER_AGENT = AgentConfig(max_new_tokens=2048, max_total_tokens=65536)


@dataclass(frozen=True)
class EvalConfig:
    """Agent + crop settings (shared with training) and the evaluation's own knobs."""

    agent: AgentConfig = PAPER_AGENT
    crop: CropConfig = field(default_factory=CropConfig)
    frame_budget: int = 64
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("frame_budget", "batch_size"):
            check_number(f"protocol.{name}", getattr(self, name), least=1, integer=True)
        check_number("protocol.seed", self.seed, least=0, integer=True)

    def identity(self) -> dict[str, Any]:
        """What decides the predictions (batch size and tool timeout do not)."""
        settings = dataclasses.asdict(self)
        settings.pop("batch_size")
        settings["crop"].pop("timeout_s", None)
        settings["crop"].pop("max_workers", None)
        settings["crop"].pop("factor", None)  # set from the model's processor at run time
        return settings


def agent_config(
    cfg: EvalConfig, forced_answer: str, forced_answer_max_tokens: int | None = None
) -> AgentConfig:
    """The protocol's agent settings with a benchmark's forced-answer message and cap."""
    return replace(
        cfg.agent, forced_answer=forced_answer, forced_answer_max_tokens=forced_answer_max_tokens
    )


def build_agent_loop(
    engine,
    renderer,
    source,
    cfg: EvalConfig,
    forced_answer: str,
    forced_answer_max_tokens: int | None = None,
    tools=None,
) -> AgentLoop:
    """An `AgentLoop` set up for the protocol `cfg` and a benchmark's forced-answer message;
    `tools`: `rollout.toolbox`, instantiated (None: `[crop_video]`)."""
    agent = agent_config(cfg, forced_answer, forced_answer_max_tokens)
    return AgentLoop(engine, renderer, source, agent, cfg.crop, tools=tools)
