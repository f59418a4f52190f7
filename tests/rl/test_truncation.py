"""Truncation masking: a cut trajectory leaves the loss, by hand on a two-row example."""

from __future__ import annotations

import pytest
import torch

from paravt.rl.losses import ppo_clip_loss
from paravt.rl.truncation import is_cut, keep_uncut
from paravt.types import Trajectory


def traj(g: int, finish: str = "stop", truncated: bool = False) -> Trajectory:
    return Trajectory(
        "p", g, (1, 2, 3), (0, 1, 1), (0.0, -1.0, -1.0), (), 1, (), 0, 0, 0, 0, truncated, finish
    )


def test_cut_by_the_token_or_turn_limit():
    trajs = [traj(0), traj(1, "length"), traj(2, "truncated", True), traj(3, "video_error")]
    assert [is_cut(t) for t in trajs] == [False, True, True, False]
    keep, n = keep_uncut(torch.tensor([True, True, True, False]), trajs)
    assert keep.tolist() == [True, False, False, False] and n == 2


def test_the_cut_trajectory_leaves_the_loss():
    # Row 0 answered (A = +1), row 1 was cut (A = -1, scored as wrong). Ratios are 1, so each
    # kept token contributes -A: with both rows -(1 + 1 - 1 - 1) / 4 = 0; without the cut row
    # -(1 + 1) / 2 = -1.
    trajs = [traj(0), traj(1, "length")]
    logp = torch.zeros(2, 2)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    both, _ = ppo_clip_loss(logp, logp, adv, mask)
    keep, n = keep_uncut(torch.ones(2, dtype=torch.bool), trajs)
    masked, _ = ppo_clip_loss(logp, logp, adv, mask & keep[:, None])
    assert (float(both), float(masked), n) == pytest.approx((0.0, -1.0, 1))
