"""The staleness contract's arithmetic (paravt.rollout.sync.staleness), by hand, and the core
split."""

from __future__ import annotations

import pytest

from paravt.generator.async_rollouts import split_cores
from paravt.rollout.sync.staleness import lag_steps, last_startable_step, too_stale


def test_lag_is_counted_in_whole_steps_of_updates():
    assert lag_steps(0, 1) == 0  # as sync: a step starts only after the previous update
    assert lag_steps(2, 1) == 2  # the reference recipe: up to 2 steps ahead
    assert lag_steps(2, 4) == 0  # 4 updates a step: one step ahead would be 4 stale
    assert lag_steps(5, 2) == 2
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        lag_steps(-1, 1)


def test_gate_and_check_agree():
    # After 3 trained steps with max_staleness 2 (1 update a step), steps 4 and 5 may start;
    # step 5 started under version 3 is trained at version 5: exactly at the bound.
    assert last_startable_step(3, 2, 1) == 5
    assert not too_stale(5, 3, 2)
    assert too_stale(6, 3, 2)
    assert not too_stale(0, 0, 0) and too_stale(1, 0, 0)


def test_cores_are_split_between_trainer_and_generator():
    assert split_cores([0, 1], None) == ([0], [1])
    assert split_cores([0, 1, 2, 3], 1) == ([0, 1, 2], [3])
    assert split_cores([0, 1, 2, 3], 9) == ([0], [1, 2, 3])  # the trainer keeps one
    assert split_cores([0], None) == ([0], [0])  # one core: shared


def partial(versions, mask, subs=()):
    from paravt.types import Trajectory

    n = len(versions)
    return Trajectory(
        "s", 0, (1,) * n, mask, (0.0,) * n, (), 0, versions=versions, sub_trajectories=subs
    )


def test_the_bound_is_checked_on_the_oldest_trained_token():
    from paravt.rollout.sync.staleness import oldest_version, version_metrics

    # Trained tokens of versions 3, 3 (prompt of version 2 untrained) then 4, 4 after a sync;
    # an on-policy trajectory of version 4; a sub-agent rollout of version 5 under the first.
    sub = partial((5, 5), (0, 1))
    mixed = partial((2, 3, 3, 4, 4), (0, 1, 1, 1, 1), (sub,))
    fresh = partial((4, 4), (1, 1))
    assert oldest_version([mixed, fresh], default=9) == 3
    assert oldest_version([partial((), ())], default=9) == 9  # nothing recorded
    assert too_stale(5, oldest_version([mixed], 9), 1)  # 5 - 3 = 2 > 1, though most are fresher
    # Trainer at 4: tokens 3, 3, 4, 4, 5 | 4, 4: 2 of 7 older; max 4 - 3 = 1; 1 of 2 mixed.
    assert version_metrics([mixed, fresh, None], 4) == pytest.approx(
        {
            "rollout/stale_token_frac": 2 / 7,
            "rollout/token_staleness_max": 1.0,
            "rollout/mixed_version_frac": 0.5,
        }
    )
    # A rank with no trained token logs the same keys (the metrics are averaged over ranks).
    assert version_metrics([None], 4) == dict.fromkeys(version_metrics([fresh], 4), 0.0)
