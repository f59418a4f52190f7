"""JudgeGuard: when the share of judge fallbacks stops training (pure, hand-computed)."""

import pytest

from paravt.errors import UserError
from paravt.rewards.judge_guard import JudgeFailure, JudgeGuard

URL = "http://127.0.0.1:8000/v1/chat/completions"


def test_default_stops_at_the_first_step_with_a_fallback():
    guard = JudgeGuard()
    m = guard.update(4, 0, URL, None)
    assert m == {"judge/calls": 4.0, "judge/fallbacks": 0.0, "judge/fallback_rate": 0.0}
    with pytest.raises(JudgeFailure) as err:
        guard.update(8, 1, URL, "URLError: <urlopen error [Errno 111] Connection refused>")
    text = str(err.value)
    assert URL in text and "Connection refused" in text and "1 of 8" in text
    assert isinstance(err.value, UserError)  # train.py prints one line and exits 2


def test_a_step_without_open_ended_answers_counts_nothing():
    guard = JudgeGuard(max_share=0.0, window=2)
    assert guard.update(0, 0, URL, None)["judge/fallback_rate"] == 0.0
    guard.update(5, 0, URL, None)


def test_share_over_a_window_of_steps():
    guard = JudgeGuard(max_share=0.25, window=3)
    guard.update(4, 1, URL, "e")  # 1/4 over 1 step: window not full, not all failed
    guard.update(4, 2, URL, "e")  # 3/8 = 0.375 > 0.25 but window not full yet
    with pytest.raises(JudgeFailure, match=r"4 of 12 .* \(share 0.33 > max_share 0.25\)"):
        guard.update(4, 1, URL, "e")  # (1+2+1)/12 = 0.333
    ok = JudgeGuard(max_share=0.25, window=3)
    for fallbacks in (1, 1, 1, 0):  # 3/12 = 0.25, not above; then (1+1+0)/12
        ok.update(4, fallbacks, URL, "e")


def test_a_dead_judge_stops_before_the_window_fills():
    guard = JudgeGuard(max_share=0.5, window=10)
    with pytest.raises(JudgeFailure, match="2 of 2"):
        guard.update(2, 2, URL, "TimeoutError: timed out")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_share": 1.5}, "max_share must be in"), ({"window": 0}, "window must be an int")],
)
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        JudgeGuard(**kwargs)
