"""Interval arithmetic behind link utilisation and the timeline's stalls, against hand results."""

from __future__ import annotations

from sim.intervals import busy_union_s, uncovered_intervals, union_intervals


def test_union_merges_overlapping_and_touching_intervals():
    assert union_intervals([(3.0, 4.0), (0.0, 1.0), (0.5, 2.0), (2.0, 2.5)]) == [(0.0, 2.5), (3.0, 4.0)]
    assert union_intervals([]) == []


def test_busy_time_is_the_union_clipped_at_the_end_of_decode():
    h2d, d2h = [(0.0, 1.0), (0.5, 1.5)], [(1.0, 2.0), (5.0, 6.0)]
    assert busy_union_s(h2d, until=10.0) == 1.5
    assert busy_union_s(h2d, d2h, until=10.0) == 3.0
    assert busy_union_s(h2d, d2h, until=1.8) == 1.8  # (0, 1.8) only; (5, 6) starts after the end
    assert busy_union_s(until=1.0) == 0


def test_uncovered_parts_of_transfers_are_the_exposed_stalls():
    copies = [(0.0, 2.0), (3.0, 6.0)]
    compute = [(1.0, 1.5), (4.0, 5.0), (5.0, 5.5)]
    assert uncovered_intervals(copies, compute) == [(0.0, 1.0), (1.5, 2.0), (3.0, 4.0), (5.5, 6.0)]
    assert uncovered_intervals(copies, [(-1.0, 10.0)]) == []
    assert uncovered_intervals(copies, []) == [(0.0, 2.0), (3.0, 6.0)]
