"""tool_reward levels, hand-computed from the reference release's rule (paravt/rewards/tool.py)."""

import math

import pytest

from paravt.rewards.tool import tool_reward


@pytest.mark.parametrize(
    ("calls", "responses", "accuracy", "expected"),
    [
        (0, 0, 1.0, 0.0),  # no parseable call: nothing, even when correct
        (0, 3, 1.0, 0.0),  # responses without a valid call (error-only turn) earn nothing
        (1, 0, 0.0, 0.1),  # a call whose result never came back
        (1, 0, 1.0, 0.6),  # ... a correct answer earns the bonus without one: 0.1 + 0.5
        (2, 0, 0.5, 0.6),  # once per trajectory, not per call; a partial F1 earns it too
        (1, 1, 0.0, 0.3),  # a call and a response, wrong answer: 0.3 (not 0.1 + 0.3)
        (3, 3, 1.0, 0.8),  # 0.3 + 0.5
        (2, 2, 0.2, 0.8),  # any accuracy > 0 (e.g. a partial IoU) earns the bonus
        (1, 1, math.nan, 0.3),  # NaN accuracy never earns it
        (-1, 1, 1.0, 0.0),
    ],
)
def test_levels(calls: int, responses: int, accuracy: float, expected: float) -> None:
    assert tool_reward(calls, responses, accuracy) == pytest.approx(expected)


def test_coefficients_are_parameters() -> None:
    assert tool_reward(1, 0, 0.0, call_reward=0.2) == pytest.approx(0.2)
    assert tool_reward(1, 0, 1.0, call_reward=0.2) == pytest.approx(0.7)  # 0.2 + 0.5
    assert tool_reward(1, 1, 1.0, response_reward=0.4, correct_bonus=0.5) == pytest.approx(0.9)


def test_capped_at_one_as_in_the_reference() -> None:
    # 0.4 + 1.0 = 1.4, capped at 1
    assert tool_reward(1, 1, 1.0, response_reward=0.4, correct_bonus=1.0) == pytest.approx(1.0)
