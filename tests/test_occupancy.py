"""Idle slot-seconds of a sweep from its trials' times (analysis/occupancy.py)."""

from __future__ import annotations

import pytest

from loopscale.analysis.occupancy import occupancy


def test_two_slots_with_a_gap_between_stages_and_a_tail():
    # slot 1: 0-10, 12-30; slot 2: 0-10, 12-20; the sweep ends at 30
    o = occupancy([(0, 10), (0, 10), (12, 30), (12, 20)], start=0, end=30, slots=2)
    assert o.busy_s == pytest.approx(10 + 10 + 18 + 8)
    assert o.idle_s == pytest.approx(60 - 46)  # 2 x 2 s between the stages, 10 s of one slot at the tail
    assert o.running_s == pytest.approx({0: 2.0, 1: 10.0, 2: 18.0})
    assert "14 idle (23.3%)" in o.line()


def test_trials_are_clipped_to_the_sweeps_interval():
    o = occupancy([(-5, 5), (8, 50)], start=0, end=10, slots=1)
    assert o.busy_s == pytest.approx(7) and o.running_s == pytest.approx({0: 3.0, 1: 7.0})
