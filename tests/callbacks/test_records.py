"""RolloutRecord's shape checks and the last_rollout contract check."""

from __future__ import annotations

import pytest
import torch

from paravt.callbacks.records import RolloutRecord, latest_rollout
from paravt.types import RewardBreakdown


def _record(toy, num_groups=2, group_size=2, overrides=None):
    fields = {
        "step": 0,
        "trajectories": [toy.trajectory(f"p{n // group_size}", n % group_size)
                         for n in range(num_groups * group_size)],
        "rewards": [RewardBreakdown(float(n)) for n in range(num_groups * group_size)],
        "group_size": group_size,
        "budgets": [4] * num_groups,
        "windows": [[[1, 2]]] * num_groups,
        "durations": [10.0] * num_groups,
    }  # fmt: skip
    fields.update(overrides or {})
    return RolloutRecord(**fields)


def test_lists_become_tuples_and_groups_are_contiguous(toy):
    record = _record(toy, num_groups=2, group_size=3)
    assert isinstance(record.trajectories, tuple) and isinstance(record.budgets, tuple)
    assert record.windows == (((1.0, 2.0),), ((1.0, 2.0),))
    assert record.num_groups == 2
    # group 1 holds rollouts 3, 4, 5 of the flat (group-major) list
    assert [t.group_index for t in record.group(1)] == [0, 1, 2]
    assert all(t.sample_id == "p1" for t in record.group(1))


def test_empty_record_is_allowed(toy):
    record = _record(toy, num_groups=0)
    assert record.num_groups == 0 and record.trajectories == ()


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"rewards": ()}, ValueError, r"B \* G = 2 \* 2 = 4"),
        ({"budgets": [4]}, ValueError, r"B \* G = 1 \* 2 = 2"),
        ({"durations": [1.0]}, ValueError, "one duration per prompt"),
        ({"windows": []}, ValueError, "one windows entry"),
        ({"group_size": 0}, ValueError, "group_size must be >= 1"),
        ({"group_size": 2.0}, TypeError, "group_size must be an int"),
    ],
)
def test_misaligned_records_are_rejected(toy, overrides, error, match):
    with pytest.raises(error, match=match):
        _record(toy, overrides=overrides)


def test_latest_rollout_names_the_contract(toy):
    module = torch.nn.Module()
    with pytest.raises(AttributeError, match=r"set `self.last_rollout = None` in __init__"):
        latest_rollout(module, "SomeCallback")
    module.last_rollout = {"not": "a record"}
    with pytest.raises(TypeError, match=r"SomeCallback: Module\.last_rollout must be a"):
        latest_rollout(module, "SomeCallback")
    module.last_rollout = None
    assert latest_rollout(module, "SomeCallback") is None
    record = _record(toy)
    module.last_rollout = record
    assert latest_rollout(module, "SomeCallback") is record
