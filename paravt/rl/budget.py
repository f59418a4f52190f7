"""Frame-budget gating (docs/method.md §4 (ii)): each prompt's frame budget K, and the gate.

`FrameBudgetSampler` draws each prompt's overview budget K deterministically from the prompt's
identity, the epoch and a seed, so that all G rollouts of a group (and every re-run, process or
worker) see the same K. It uses blake2b, never Python's `hash()`, which is salted per process.
`gate_ratio` measures, per budget, how often tool-using rollouts out-scored tool-free ones.

This module deliberately does not sample frame indices or read videos (paravt/video/), and does
not decide where the budget is applied: it only returns the number.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

DEFAULT_BUDGETS: tuple[int, ...] = (4, 8, 16, 32, 64)


def _validate_budgets(budgets: Sequence[int]) -> tuple[int, ...]:
    values = tuple(budgets)
    if not values:
        raise ValueError("budgets must list at least one frame budget, e.g. (4, 8, 16, 32, 64)")
    bad = [b for b in values if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad:
        raise ValueError(f"every frame budget must be a positive int, got invalid {bad}")
    if len(set(values)) != len(values):
        raise ValueError(f"frame budgets must be distinct (use weights to favour one): {values}")
    return values


def _validate_weights(weights: Sequence[float] | None, n: int) -> tuple[float, ...]:
    if weights is None:
        return (1.0,) * n
    values = tuple(float(w) for w in weights)
    if len(values) != n:
        raise ValueError(f"weights has {len(values)} entries but there are {n} budgets")
    if any(not math.isfinite(w) or w < 0 for w in values) or sum(values) <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {values}")
    return values


@dataclass(frozen=True)
class FrameBudgetSampler:
    """Deterministic per-prompt frame budget K drawn from `budgets` with probability ~ `weights`."""

    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    weights: tuple[float, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        # Hydra hands lists; normalise to tuples so that the sampler stays hashable and frozen.
        budgets = _validate_budgets(self.budgets)
        object.__setattr__(self, "budgets", budgets)
        object.__setattr__(self, "weights", _validate_weights(self.weights, len(budgets)))

    def uniform(self, prompt_id: str, epoch: int) -> float:
        """A stable pseudo-random number in [0, 1) for (seed, epoch, prompt_id)."""
        key = f"{self.seed}\x1f{epoch}\x1f{prompt_id}".encode()
        digest = hashlib.blake2b(key, digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2.0**64

    def budget(self, prompt_id: str, epoch: int = 0) -> int:
        """The frame budget of `prompt_id` in `epoch` (identical for every rollout of its group)."""
        weights = self.weights or ()
        target = self.uniform(prompt_id, epoch) * sum(weights)
        drawable = [(b, w) for b, w in zip(self.budgets, weights, strict=True) if w > 0]
        cumulative = 0.0
        for budget, weight in drawable:
            cumulative += weight
            if target < cumulative:
                return budget
        return drawable[-1][0]  # float rounding can leave target == the sum of the weights


@dataclass(frozen=True)
class GateStat:
    """Per-budget gate statistic over groups.

    `defined` groups have both tool-using (num_calls > 0) and tool-free rollouts; `wins` of them
    had a strictly higher mean reward on the tool-using side; `undefined` groups had only one
    side. `ratio = wins / defined`, and 0.0 when `defined == 0` (check `defined` before plotting).
    """

    wins: int
    defined: int
    undefined: int
    ratio: float


def gate_ratio(
    rewards: Tensor,  # [B, G]
    num_calls: Tensor,  # [B, G] tool calls per rollout
    budgets: Tensor | Sequence[int],  # [B] frame budget of each group
) -> dict[int, GateStat]:
    """Share of groups, per frame budget, in which tool-using rollouts out-scored tool-free ones."""
    budgets_t = torch.as_tensor(budgets).reshape(-1)
    if rewards.dim() != 2 or num_calls.shape != rewards.shape or budgets_t.numel() != len(rewards):
        raise ValueError(
            f"expected rewards [B, G], num_calls [B, G], budgets [B]; got {tuple(rewards.shape)}, "
            f"{tuple(num_calls.shape)}, {tuple(budgets_t.shape)}"
        )
    tool = num_calls > 0
    r = rewards.double()
    n_tool = tool.sum(dim=1)
    n_free = (~tool).sum(dim=1)
    mean_tool = torch.where(tool, r, 0.0).sum(dim=1) / n_tool.clamp(min=1)
    mean_free = torch.where(~tool, r, 0.0).sum(dim=1) / n_free.clamp(min=1)
    defined = (n_tool > 0) & (n_free > 0)
    wins = defined & (mean_tool > mean_free)
    stats: dict[int, GateStat] = {}
    for k in sorted(set(budgets_t.tolist())):
        in_k = budgets_t == k
        n_def = int((defined & in_k).sum())
        n_win = int((wins & in_k).sum())
        stats[int(k)] = GateStat(
            wins=n_win,
            defined=n_def,
            undefined=int(in_k.sum()) - n_def,
            ratio=n_win / n_def if n_def else 0.0,
        )
    return stats
