"""What crosses the DataModule -> LightningModule -> callbacks boundary, as frozen data.

- `RolloutBatch`: the B x G trajectories the `RolloutDataModule` generated for one step, with
  the prompts, their frame budgets, the sampling temperature and the engine's weight version.
- `RolloutRecord`: what a training step leaves behind for the callbacks to read
  (`pl_module.last_rollout`), group-major: the G rollouts of prompt b are
  `trajectories[b * G : (b + 1) * G]`.

Pure data with shape checks only; nothing here imports Lightning or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from paravt.types import RewardBreakdown, Sample, Trajectory


@dataclass(frozen=True)
class RolloutBatch:
    """One RL step's generated rollouts: N = B * G trajectories, group-major."""

    step: int
    epoch: int
    samples: tuple[Sample, ...]  # [B]
    budgets: tuple[int, ...]  # [B] overview frame budget K per prompt
    trajectories: tuple[Trajectory, ...]  # [N]
    group_size: int  # G
    temperature: float  # the sampling temperature the behaviour log-probs are under
    weight_version: int  # optimiser updates behind the weights that sampled them
    staleness: int = 0  # policy version - weight_version when sampled
    durations: tuple[float, ...] = ()  # [B] video lengths in seconds
    timings: Mapping[str, float] = field(default_factory=dict)  # seconds per phase (sync, ...)
    # (prompt id, reason) of this step's prompts left out for an undecodable video; not in samples
    skipped: tuple[tuple[str, str], ...] = ()
    counts: Mapping[str, float] = field(default_factory=dict)  # the run's skip counts so far

    def __post_init__(self) -> None:
        if len(self.budgets) != len(self.samples):
            raise ValueError(
                f"RolloutBatch: {len(self.budgets)} budgets for {len(self.samples)} prompts"
            )
        if len(self.trajectories) != len(self.samples) * self.group_size:
            raise ValueError(
                f"RolloutBatch needs B * G = {len(self.samples)} * {self.group_size} "
                f"trajectories (group-major), got {len(self.trajectories)}"
            )

    def repeated_samples(self) -> list[Sample]:
        """[N] the prompt of every trajectory."""
        return [s for s in self.samples for _ in range(self.group_size)]


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
