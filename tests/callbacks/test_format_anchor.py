"""FormatAnchorCurriculum in a real Trainer: what the training step sees and what is logged."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paravt.callbacks.format_anchor import ANCHOR_KEY, FORMAT_KEY, FormatAnchorCurriculum
from paravt.rewards.compose import RewardWeights

LINEAR = {"kind": "linear", "start": 1.0, "end": 0.0, "steps": 2}
STEP = {"kind": "step", "start": 0.0, "milestones": [1], "values": [0.25]}


@pytest.mark.parametrize("manual", [False, True])
def test_training_step_sees_the_scheduled_values(tmp_path, toy, manual):
    callback = FormatAnchorCurriculum(format_schedule=LINEAR, anchor_schedule=STEP)
    _, module, log_dir = toy.fit(tmp_path, [callback], module=toy.Module(manual=manual))
    # format: 1 + (0 - 1) * min(step / 2, 1) -> 1.0, 0.5, 0.0
    # anchor: 0.0 before milestone 1, then 0.25
    assert [(s["step"], s["fmt"], s["anchor"]) for s in module.seen] == [
        (0, 1.0, 0.0),
        (1, 0.5, 0.25),
        (2, 0.0, 0.25),
    ]
    # Every other reward weight is left as it was.
    assert module.reward_weights == replace(RewardWeights(), format_weight=0.0)
    events = toy.read_events(log_dir)
    assert toy.scalars(events, FORMAT_KEY) == {0: 1.0, 1: 0.5, 2: 0.0}
    assert toy.scalars(events, ANCHOR_KEY) == {0: 0.0, 1: 0.25, 2: 0.25}


def test_anchor_only_leaves_the_reward_weights_alone(tmp_path, toy):
    module = toy.Module()
    custom = replace(RewardWeights(), format_weight=0.7)
    module.reward_weights = custom
    callback = FormatAnchorCurriculum(anchor_schedule={"kind": "constant", "start": 0.05})
    _, module, log_dir = toy.fit(tmp_path, [callback], module=module)
    assert [s["fmt"] for s in module.seen] == [0.7, 0.7, 0.7]
    assert [s["anchor"] for s in module.seen] == [0.05, 0.05, 0.05]
    assert module.reward_weights is custom
    tags = toy.read_events(log_dir).Tags()["scalars"]
    assert ANCHOR_KEY in tags and FORMAT_KEY not in tags


def test_values_at_follows_the_step():
    callback = FormatAnchorCurriculum(
        format_schedule={"kind": "cosine", "start": 1.0, "end": 0.5, "steps": 2}
    )
    # 0.5 + (1.0 - 0.5) * 0.5 * (1 + cos(pi / 2)) = 0.75
    assert callback.values_at(1) == {FORMAT_KEY: pytest.approx(0.75)}


def test_needs_at_least_one_schedule():
    with pytest.raises(ValueError, match="needs format_schedule, anchor_schedule or both"):
        FormatAnchorCurriculum()


def test_bad_schedule_fails_at_construction_and_names_it():
    with pytest.raises(
        ValueError, match=r"anchor_schedule: kind 'linear' needs \['end', 'steps'\]"
    ):
        FormatAnchorCurriculum(anchor_schedule={"kind": "linear", "start": 1.0})


def test_module_without_the_anchor_protocol_is_named(tmp_path, toy):
    class NoAnchor(toy.Module):
        set_anchor_coef = None  # not callable: the module does not implement AnchorWeighted

    with pytest.raises(TypeError, match=r"needs NoAnchor to implement .*AnchorWeighted"):
        toy.fit(tmp_path, [FormatAnchorCurriculum(anchor_schedule=STEP)], module=NoAnchor())


def test_module_without_the_format_protocol_is_named(tmp_path, toy):
    class NoFormat(toy.Module):
        set_format_weight = None

    with pytest.raises(TypeError, match=r"format_schedule needs NoFormat .*FormatWeighted"):
        toy.fit(tmp_path, [FormatAnchorCurriculum(format_schedule=LINEAR)], module=NoFormat())


def test_a_module_with_only_the_schedules_protocol_is_enough(tmp_path, toy):
    class NoFormat(toy.Module):
        set_format_weight = None

    _, module, _ = toy.fit(
        tmp_path, [FormatAnchorCurriculum(anchor_schedule=STEP)], module=NoFormat()
    )
    assert [s["anchor"] for s in module.seen] == [0.0, 0.25, 0.25]
