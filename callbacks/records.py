"""`RolloutRecord`: what a training step leaves behind for the callbacks to read.

A LightningModule that wants the paravt callbacks sets `self.last_rollout` to one of these at the
end of every `training_step` (and to None in `__init__`). The record is a frozen snapshot of the
step's rollouts, group-major: the G rollouts of prompt b are `trajectories[b * G : (b + 1) * G]`.

This module deliberately holds no logic beyond shape checks: callbacks reduce the record
themselves, and nothing here imports Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass

from paravt.types import RewardBreakdown, Trajectory


@dataclass(frozen=True)
class RolloutRecord:
    """One training step's rollouts, rewards and per-prompt context, aligned group-major.

    `trajectories` and `rewards` have N = B * G entries; `budgets` (frame budget K of each
    prompt), `windows` (ground-truth windows in seconds) and `durations` (video length in
    seconds) have B entries.
    """

    step: int
    trajectories: tuple[Trajectory, ...]  # [N]
    rewards: tuple[RewardBreakdown, ...]  # [N]
    group_size: int  # G
    budgets: tuple[int, ...]  # [B]
    windows: tuple[tuple[tuple[float, float], ...], ...]  # [B]
    durations: tuple[float, ...]  # [B]

    def __post_init__(self) -> None:
        # Callers often hand lists; store tuples so the record stays immutable.
        for name in ("trajectories", "rewards", "budgets", "durations"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        windows = tuple(tuple((float(s), float(e)) for s, e in w) for w in self.windows)
        object.__setattr__(self, "windows", windows)
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
            raise TypeError(f"RolloutRecord.group_size must be an int, got {self.group_size!r}")
        if self.group_size < 1:
            raise ValueError(f"RolloutRecord.group_size must be >= 1, got {self.group_size}")
        num_groups = len(self.budgets)
        expected = num_groups * self.group_size
        if len(self.trajectories) != expected or len(self.rewards) != expected:
            raise ValueError(
                f"RolloutRecord needs B * G = {num_groups} * {self.group_size} = {expected} "
                f"trajectories and rewards (one per rollout, group-major); got "
                f"{len(self.trajectories)} trajectories and {len(self.rewards)} rewards"
            )
        if len(self.windows) != num_groups or len(self.durations) != num_groups:
            raise ValueError(
                f"RolloutRecord needs one windows entry and one duration per prompt (B = "
                f"{num_groups}, from budgets); got {len(self.windows)} windows and "
                f"{len(self.durations)} durations"
            )

    @property
    def num_groups(self) -> int:
        """B, the number of prompts."""
        return len(self.budgets)

    def group(self, b: int) -> tuple[Trajectory, ...]:
        """The G trajectories of prompt `b`."""
        return self.trajectories[b * self.group_size : (b + 1) * self.group_size]


def latest_rollout(pl_module: object, callback: str) -> RolloutRecord | None:
    """`pl_module.last_rollout`, with an error naming the contract when the module lacks it."""
    if not hasattr(pl_module, "last_rollout"):
        raise AttributeError(
            f"{callback} reads `last_rollout` from the LightningModule, but "
            f"{type(pl_module).__name__} has none; set `self.last_rollout = None` in __init__ and "
            "a callbacks.records.RolloutRecord at the end of every training_step"
        )
    record = pl_module.last_rollout
    if record is not None and not isinstance(record, RolloutRecord):
        raise TypeError(
            f"{callback}: {type(pl_module).__name__}.last_rollout must be a "
            f"callbacks.records.RolloutRecord or None, got {type(record).__name__}"
        )
    return record
