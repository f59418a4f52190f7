"""A tool-use collapse alarm: warns when the policy stops calling tools or reverts its tags.

Agentic video RL can quietly collapse into answering without tools (kappa, the mean number of
tool calls per training rollout at the sampling temperature, falls towards 0) or into the
prior's `<tool_code>` tags (tag reversion). After every step the callback reads the step's
rollouts (`pl_module.last_rollout`) and, when kappa stays below `min_kappa` or the tag-reversion
share above `max_tag_reversion` for `patience` consecutive steps, logs a warning naming the step
and the figures (once per episode: it warns again only after a healthy step). `tools` names
the tools whose calls count in kappa (None: every call; e.g. [zoom] watches that the policy
keeps zooming). It changes nothing in training. The counting lives in `AlarmState`, free of
Lightning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import lightning.pytorch as pl

from paravt.rl.metrics import drift_metrics, kappa
from paravt.types import Trajectory

log = logging.getLogger(__name__)


@dataclass
class AlarmState:
    """Consecutive-step counter of one alarm; `update` returns the warning text when it fires."""

    min_kappa: float | None = 0.2
    max_tag_reversion: float | None = 0.5
    patience: int = 5
    run: int = 0  # consecutive unhealthy steps so far

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"callbacks.tool_alarm.patience must be >= 1, got {self.patience}")

    def problems(self, kappa_value: float, reversion: float) -> list[str]:
        out = []
        if self.min_kappa is not None and kappa_value < self.min_kappa:
            out.append(f"kappa {kappa_value:.3f} < min_kappa {self.min_kappa:g}")
        if self.max_tag_reversion is not None and reversion > self.max_tag_reversion:
            out.append(
                f"tag reversion {reversion:.3f} > max_tag_reversion {self.max_tag_reversion:g}"
            )
        return out

    def update(self, step: int, kappa_value: float, reversion: float) -> str | None:
        found = self.problems(kappa_value, reversion)
        self.run = self.run + 1 if found else 0
        if self.run != self.patience:
            return None
        return (
            f"tool-use alarm at step {step}: {' and '.join(found)} for {self.patience} "
            "consecutive step(s) (the policy may be collapsing to answers without tools or to "
            "the prior's tags; see docs/training.md, 'Rollout guards')"
        )


class ToolUseAlarm(pl.Callback):
    """Warn on a sustained tool-use collapse (see the module docstring)."""

    def __init__(
        self,
        min_kappa: float | None = 0.2,
        max_tag_reversion: float | None = 0.5,
        patience: int = 5,
        tools: Sequence[str] | None = None,
    ):
        self.state = AlarmState(min_kappa, max_tag_reversion, patience)
        self.tools = None if tools is None else frozenset(tools)
        self.warnings: list[str] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = getattr(pl_module, "last_rollout", None)
        if record is None or not record.trajectories:
            return
        trajs = record.trajectories
        k = kappa([self.calls(t) for t in trajs])
        reversion = drift_metrics([t.response_text for t in trajs])["drift/tag_reversion"]
        text = self.state.update(record.step, k, reversion)
        if text is not None:
            self.warnings.append(text)
            log.warning(text)

    def calls(self, traj: Trajectory) -> int:
        """The rollout's calls that count in kappa: all of them, or those of `tools`."""
        if self.tools is None:
            return traj.num_calls
        return sum(
            c.call is not None and c.call.name in self.tools for t in traj.turns for c in t.calls
        )
