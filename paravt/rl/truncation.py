"""Truncation masking: trajectories cut by a limit leave the loss instead of scoring as wrong.

A trajectory the agent loop stopped at `max_total_tokens` (finish_reason "truncated") or whose
turn hit `max_new_tokens` ("length") never had the chance to answer; with
`algorithm.mask_truncated` it takes no part in the update (as Mini-o3's over-turn masking), so a
long, still-searching rollout is not pushed down as if it had answered wrongly. Its reward stays
in its group's statistics (the group keeps G members). Pure: trajectories in, masks out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from paravt.types import Trajectory

CUT_REASONS = ("truncated", "length")


def is_cut(traj: Trajectory) -> bool:
    """Whether a token or turn limit stopped `traj` before it finished on its own."""
    return traj.truncated or traj.finish_reason in CUT_REASONS


def keep_uncut(keep: Tensor, trajs: Sequence[Trajectory]) -> tuple[Tensor, int]:  # [N] bool
    """`keep` without the cut trajectories, and how many it removed."""
    cut = torch.tensor([is_cut(t) for t in trajs], dtype=torch.bool)
    if cut.numel() == 0:
        return keep, 0
    return keep & ~cut, int((keep & cut).sum())
