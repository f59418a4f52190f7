"""benchmarks/vision_cache.py's arithmetic: the ideal and measured savings, the goal verdict and
the interleaved run order, on hand-computed figures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import vision_cache as bench


def test_saving_is_a_share_of_the_cache_off_step():
    # 10 s steps off, 9.5 s on; 1.0 s of decode + vision work off, 0.1 s on; G = 4:
    # ideal = 1.0 / 10 x (1 - 1/4) = 0.075; timers = (1.0 - 0.1) / 10 = 0.09; wall = 1 - 0.95.
    s = bench.saving(4, 10.0, 9.5, 1.0, 0.1)
    assert s.ideal == pytest.approx(0.075)
    assert s.timers == pytest.approx(0.09)
    assert s.wall == pytest.approx(0.05)


def test_saving_refuses_a_run_without_steps():
    with pytest.raises(ValueError, match="positive step times"):
        bench.saving(4, 0.0, 1.0, 0.0, 0.0)


def test_verdict_against_80_percent_of_the_ideal():
    assert bench.verdict(0.09, 0.075) == "120% of ideal: goal met"
    assert bench.verdict(0.03, 0.075) == "40% of ideal: goal NOT met"
    # a wall-clock saving whose standard error exceeds the ideal decides nothing
    assert bench.verdict(0.09, 0.075, noise=0.08).startswith("not resolvable")
    assert bench.verdict(0.09, 0.075, noise=None).startswith("one pair")


def test_a_wall_clock_saving_beyond_the_removed_seconds_is_called_load():
    # the cache removed 5.7 % of the step; 30 % +- 5 % saved on the wall clock is load
    assert "load" in bench.wall_note(0.30, 0.05, 0.057)
    assert bench.wall_note(0.10, 0.03, 0.057) == ""  # within 2 standard errors


def test_runs_alternate_off_and_on_and_swap_the_order_every_repeat():
    assert bench.plan([4, 8], 2) == [
        (0, 4, False), (0, 4, True), (0, 8, False), (0, 8, True),
        (1, 4, True), (1, 4, False), (1, 8, True), (1, 8, False),
    ]  # fmt: skip
