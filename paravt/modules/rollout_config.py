"""The rollout group's config (`conf/rollout/`): grouped sampling, agent, crop tool, engine.

Plain frozen dataclasses in a module of their own, apart from the DataModule that uses them:
train.py and evaluate.py instantiate the rollout group to check a user's keys before anything is
built, and importing `paravt.modules.rollout_datamodule` would import Lightning (seconds) first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from paravt.agent.loop import AgentConfig
from paravt.agent.toolkit import build_toolbox
from paravt.agent.tools import CropConfig, CropVideoTool
from paravt.errors import check_number
from paravt.rollout.consistency import check_mode as check_consistency_mode
from paravt.rollout.engine import EngineConfig
from paravt.rollout.factory import check_engine_name
from paravt.rollout.sync.stream_buffer import StreamLimits

MODES = ("sync", "async", "stream")


@dataclass(frozen=True)
class VisionCacheConfig:
    """Each clip decoded and encoded once per step, whatever number of rollouts show it.

    `enabled`: the vision feature cache on the policy, the reference and an engine copy
    (paravt.models.vision_cache; exact: a trained tower is never cached under autograd, nor
    across a weight update) and the crop cache of the tools (paravt.agent.tools.CropCache).
    Bounds in bytes: `feature_bytes` of cached vision features (on the model's device, cleared
    every step), `crop_bytes` of decoded crop pixels (host memory, least recently used out).
    """

    enabled: bool = True
    feature_bytes: int = 1 << 30
    crop_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for name in ("feature_bytes", "crop_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"rollout.vision_cache.{name} must be >= 0 bytes, got {getattr(self, name)}; "
                    "set rollout.vision_cache.enabled=false to turn the caches off"
                )


@dataclass(frozen=True)
class RolloutConfig:
    """Grouped sampling: G rollouts per prompt at `temperature`, with the agent and crop tool."""

    group_size: int = 8
    temperature: float = 0.7
    frame_budget: int = 64
    max_staleness: int = 0  # rollouts may use weights this many updates old (decoupled loss)
    agent: AgentConfig = field(default_factory=AgentConfig)
    crop: CropConfig | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    # async: a generator process overlaps generation with the update (generator/async_rollouts.py);
    # stream: groups in flight, the trainer takes whole ones (generator/stream_rollouts.py)
    mode: str = "sync"
    # async: in-flight trajectories pause at each weight sync and resume with the new weights
    # (generator/partial_rollouts.py); each token records the policy version that sampled it.
    partial: bool = False
    generator_cores: int | None = None  # async on CPU: the generator's cores (None: half)
    # stream: trajectories in flight at most, finished + running groups at most (None: what the
    # staleness gate allows), what in-flight trajectories do at a weight sync (continue | drain)
    max_concurrent: int = 64
    buffer_groups: int | None = None
    on_sync: str = "continue"
    # async: seconds to wait for a step's rollouts before failing the run (None: for ever)
    generator_timeout_s: float | None = None
    # Rollout/trainer consistency of every trajectory (paravt.rollout.consistency): error |
    # warn (log it, drop the trajectory from the loss) | off.
    consistency: str = "warn"
    # Compute each video once per step: vision features and crops shared by the G rollouts.
    vision_cache: VisionCacheConfig = field(default_factory=VisionCacheConfig)
    # The agent's tools, instantiated from `rollout.toolbox` (docs/reuse.md, "Your own tools").
    toolbox: Sequence[Any] = field(default_factory=lambda: (CropVideoTool(),))
    # "package.module:function": rollouts by that agent program through the gateway
    # (paravt.gateway.rollouts) on `agent_workers` threads, instead of paravt's agent loop;
    # with mode=async the generator process plays it (not with `partial`).
    agent_program: str | None = None
    agent_workers: int = 16
    # seconds an agent program's episode may go without a request before it is closed and its
    # rollout failed (a hung program); None: wait for ever
    agent_idle_s: float | None = 600.0

    def __post_init__(self) -> None:
        self._check_numbers()
        check_consistency_mode(self.consistency)
        object.__setattr__(self, "toolbox", tuple(self.toolbox))  # Hydra gives a ListConfig
        build_toolbox(self.toolbox)  # a bad list fails when the config is checked
        if self.mode not in MODES:
            raise ValueError(f"rollout.mode must be one of {MODES}, got {self.mode!r}")
        check_engine_name(self.engine.name)
        if self.agent_program and self.agent_workers < 1:
            raise ValueError(
                f"rollout.agent_program needs rollout.agent_workers >= 1, got {self.agent_workers}"
            )
        if self.agent_program and self.partial:
            raise ValueError(
                "rollout.partial=true resumes paravt's own agent loop between rounds, but an "
                "agent program (rollout.agent_program) plays each episode whole: set "
                "rollout.partial=false"
            )
        if self.agent_program and self.mode == "stream":
            raise ValueError(
                "rollout.mode=stream plays paravt's own agent loop a round at a time, but an "
                "agent program (rollout.agent_program) plays each episode whole: set "
                "rollout.mode=async or sync"
            )
        if self.agent_idle_s is not None and not self.agent_idle_s > 0:
            raise ValueError(
                f"rollout.agent_idle_s must be > 0 seconds or null, got {self.agent_idle_s!r}"
            )
        if self.partial and self.mode != "async":
            why = {"stream": ", which resumes them by itself (rollout.on_sync=continue)"}
            raise ValueError(
                "rollout.partial=true resumes trajectories across weight syncs of the async "
                f"generator, but rollout.mode={self.mode!r}{why.get(self.mode, '')}: set "
                "rollout.mode=async (with rollout.max_staleness >= 1) or rollout.partial=false"
            )
        if self.mode == "stream":  # the limits that need no data (the batch size) checked now
            StreamLimits(
                self.group_size, 1, self.max_concurrent, self.max_staleness, 1, None, self.on_sync
            )
        if self.generator_timeout_s is not None and not self.generator_timeout_s > 0:
            raise ValueError(
                f"rollout.generator_timeout_s must be > 0 seconds or null (wait for ever), "
                f"got {self.generator_timeout_s!r}"
            )

    def _check_numbers(self) -> None:
        """What no run can use, refused when the config is read (not minutes later, after the
        data and the cold start are built)."""
        for name, least in (("group_size", 1), ("frame_budget", 1), ("max_concurrent", 1)):
            check_number(f"rollout.{name}", getattr(self, name), least=least, integer=True)
        check_number("rollout.max_staleness", self.max_staleness, least=0, integer=True)
        check_number("rollout.temperature", self.temperature, above=0)  # RL samples
        for name in ("generator_cores", "buffer_groups"):
            value = getattr(self, name)
            check_number(f"rollout.{name}", value, least=1, integer=True, optional=True)
