"""Tests of paravt.rl.metrics (named test_rl_metrics so it cannot clash with other test_metrics)."""

from __future__ import annotations

import math

import pytest
import torch

from paravt.rl.metrics import f_tau, kappa, per_budget


def test_f_tau_and_kappa_hand_computed() -> None:
    # (0.2 + 0.4 + 0.9) / 3 = 0.5; (0 + 2 + 1 + 1) / 4 = 1.0
    assert f_tau([0.2, 0.4, 0.9]) == pytest.approx(0.5)
    assert kappa([0, 2, 1, 1]) == 1.0
    assert f_tau(torch.tensor([[1.0, 0.0], [0.0, 0.0]])) == 0.25  # any shape, flattened
    assert kappa(torch.tensor([3])) == 3.0


def test_empty_inputs_are_zero_not_nan() -> None:
    for value in (f_tau([]), kappa([]), f_tau(torch.tensor([])), kappa(torch.zeros(0, 8))):
        assert value == 0.0 and not math.isnan(value)
    assert per_budget([], []) == {}


def test_per_budget_hand_computed() -> None:
    # K=4: (1 + 3) / 2 = 2; K=8: (2 + 4) / 2 = 3; K=64: 10
    got = per_budget([1.0, 2.0, 3.0, 4.0, 10.0], torch.tensor([4, 8, 4, 8, 64]))
    assert got == {4: 2.0, 8: 3.0, 64: 10.0}
    assert list(got) == [4, 8, 64]


def test_per_budget_matches_loop() -> None:
    torch.manual_seed(0)
    values = torch.rand(100)
    budgets = torch.tensor([4, 8, 16, 32, 64])[torch.randint(0, 5, (100,))]
    loop: dict[int, list[float]] = {}
    for v, k in zip(values.tolist(), budgets.tolist(), strict=True):
        loop.setdefault(k, []).append(v)
    expected = {k: sum(vs) / len(vs) for k, vs in sorted(loop.items())}
    got = per_budget(values, budgets)
    assert got.keys() == expected.keys()
    assert all(got[k] == pytest.approx(expected[k]) for k in expected)


def test_per_budget_length_mismatch() -> None:
    with pytest.raises(ValueError, match=r"values \(2\) and budgets \(3\)"):
        per_budget([1.0, 2.0], [4, 8, 16])


def test_format_compliance_is_r_fmt_in_unit_interval():
    from paravt.rewards.compose import RewardWeights, compute_reward
    from paravt.rl.metrics import format_compliance
    from paravt.types import RewardBreakdown

    good = "<think>\nThe red square is at 12 s.</think>\n<answer>B</answer>"
    # f_tau averages R_fmt itself, anchor included, clipped at 1 (0.7 + 0.35 + 0.1 -> 1).
    assert format_compliance(compute_reward(good, "B", "mcq")) == 1.0
    legacy = compute_reward(good, "B", "mcq", weights=RewardWeights(format_formula="mean"))
    assert legacy.format > 1.0 and format_compliance(legacy) == 1.0
    # an answer outside the tags: think 0.2 + 0.5 * 0.4 closed think + balance 0.1 = 0.5
    outside = compute_reward("<think>\nI compare the frames.</think> B", "B", "mcq")
    assert format_compliance(outside) == pytest.approx(0.5)
    # an unclosed think alone: -0.5 * 0.3, kept (the reference clips from above only)
    unclosed = compute_reward("<think>\nI compare the frames and", "B", "mcq")
    assert format_compliance(unclosed) == pytest.approx(0.2 - 0.15)
    assert format_compliance(RewardBreakdown(total=-0.15, format=-0.15)) == -0.15
    assert format_compliance(RewardBreakdown(total=0.4, format=0.4)) == 0.4


def test_drift_metrics_count_the_prior_tag_and_dropped_closers():
    from paravt.rl.metrics import drift_metrics, dropped_closers

    good = '<think>\nlook</think><tool_call>{"name": "crop_video"}</tool_call>'
    reverted = "<think>\nlook</think><tool_code>crop_video(1, 5)"  # prior tag, unclosed
    lost = "<think>\nI think the answer<answer>B"  # think and answer left open
    assert [dropped_closers(t) for t in (good, reverted, lost)] == [0, 1, 2]
    # </tool_code> without an opener is not the prior's tag and drops nothing
    assert dropped_closers("</tool_code>") == 0
    m = drift_metrics([good, reverted, lost, good + "<answer>B</answer>"])
    assert m["drift/tag_reversion"] == pytest.approx(1 / 4)
    assert m["drift/dropped_closers"] == pytest.approx(3 / 4)
    assert m["drift/dropped_any"] == pytest.approx(2 / 4)
    assert m["drift/no_answer"] == pytest.approx(3 / 4)
    assert set(drift_metrics([]).values()) == {0.0}
