"""Schedule maths, with every expected value computed by hand."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from paravt.callbacks.schedules import REQUIRED, SCHEDULES, check_schedule, schedule_value


def test_every_kind_lists_its_required_keys():
    assert set(SCHEDULES) == set(REQUIRED) == {"constant", "linear", "cosine", "step"}


@pytest.mark.parametrize("step", [0, 1, 1000])
def test_constant_ignores_end_and_steps(step):
    assert schedule_value("constant", step, start=0.3, end=9.0, steps=5) == 0.3


@pytest.mark.parametrize(
    ("step", "expected"),
    # 1 + (0 - 1) * min(step / 4, 1)
    [(0, 1.0), (1, 0.75), (2, 0.5), (3, 0.25), (4, 0.0), (10, 0.0)],
)
def test_linear_decay_then_holds_end(step, expected):
    assert schedule_value("linear", step, start=1.0, end=0.0, steps=4) == pytest.approx(expected)


def test_linear_rises():
    # 0.2 + (1.0 - 0.2) * 5 / 10 = 0.6
    assert schedule_value("linear", 5, start=0.2, end=1.0, steps=10) == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 1.0),  # 0 + 1 * 0.5 * (1 + cos 0) = 1
        (1, 0.8535533905932737),  # 0.5 * (1 + cos(pi/4)) = 0.5 * 1.70710678
        (2, 0.5),  # 0.5 * (1 + cos(pi/2)) = 0.5
        (3, 0.14644660940672624),  # 0.5 * (1 + cos(3pi/4)) = 0.5 * 0.29289322
        (4, 0.0),  # 0.5 * (1 + cos pi) = 0
        (9, 0.0),  # past `steps`: holds end
    ],
)
def test_cosine_decay(step, expected):
    assert schedule_value("cosine", step, start=1.0, end=0.0, steps=4) == pytest.approx(expected)


def test_cosine_rises():
    # 1.0 + (0.2 - 1.0) * 0.5 * (1 + cos(pi/2)) = 1.0 - 0.4 = 0.6
    assert schedule_value("cosine", 1, start=0.2, end=1.0, steps=2) == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("step", "expected"),
    # start until step 2, values[0] on steps 2..4, values[1] from step 5
    [(0, 0.0), (1, 0.0), (2, 0.5), (4, 0.5), (5, 1.0), (99, 1.0)],
)
def test_step_kind_switches_at_milestones(step, expected):
    got = schedule_value("step", step, start=0.0, milestones=(2, 5), values=(0.5, 1.0))
    assert got == expected


def test_step_kind_milestone_zero_replaces_start():
    assert schedule_value("step", 0, start=7.0, milestones=[0], values=[2.0]) == 2.0


@pytest.mark.parametrize(
    ("kind", "kwargs", "match"),
    [
        ("exp", {"start": 1.0}, "unknown schedule kind 'exp'"),
        ("linear", {"start": 1.0, "steps": 3}, r"needs \['end'\]"),
        ("cosine", {"start": 1.0, "end": 0.0}, r"needs \['steps'\]"),
        ("linear", {"start": 1.0, "end": 0.0, "steps": 0}, "steps must be an int >= 1"),
        ("linear", {"start": 1.0, "end": 0.0, "steps": 2.5}, "steps must be an int >= 1"),
        ("constant", {"start": math.nan}, "start must be a finite number"),
        ("constant", {"start": "1"}, "start must be a finite number"),
        ("linear", {"start": 1.0, "end": math.inf, "steps": 2}, "end must be a finite number"),
        ("step", {"start": 0.0}, r"needs \['milestones', 'values'\]"),
        ("step", {"start": 0.0, "milestones": (3, 3), "values": (1, 2)}, "strictly increasing"),
        ("step", {"start": 0.0, "milestones": (1, 2), "values": (1.0,)}, "one value per milestone"),
        ("step", {"start": 0.0, "milestones": (-1,), "values": (1.0,)}, "milestone must be an int"),
    ],
)
def test_invalid_schedules_are_named(kind, kwargs, match):
    with pytest.raises(ValueError, match=match):
        schedule_value(kind, 0, **kwargs)


def test_negative_step_is_rejected():
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        schedule_value("constant", -1, start=1.0)


def test_check_schedule_normalises_lists_and_hydra_configs():
    spec = OmegaConf.create({"kind": "step", "start": 1.0, "milestones": [2], "values": [0.5]})
    kwargs = check_schedule(spec, "format_schedule")
    assert kwargs["milestones"] == (2,) and kwargs["values"] == (0.5,)
    assert schedule_value(step=2, **kwargs) == 0.5


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"kind": "linear", "start": 1, "end": 0, "step": 5}, r"unknown key\(s\) \['step'\]"),
        ({"start": 1.0}, "missing 'kind'"),
        ([("kind", "constant")], "must be a mapping"),
        ({"kind": "linear", "start": 1.0}, r"my_schedule: kind 'linear' needs \['end', 'steps'\]"),
    ],
)
def test_check_schedule_names_the_schedule_and_the_fix(spec, match):
    with pytest.raises(ValueError, match=match):
        check_schedule(spec, "my_schedule")
