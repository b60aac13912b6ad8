"""Interval arithmetic behind link utilisation and the timeline's stalls, against hand results."""

from __future__ import annotations

from sim.device.intervals import busy_union_s, uncovered_intervals, union_intervals


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


def _busy_union_loop_s(*interval_lists, until):
    """The pure-Python `busy_union_s` the numpy one replaced: the reference it must equal exactly."""
    clipped = [(a, min(b, until)) for lst in interval_lists for a, b in lst if a < until]
    return sum(b - a for a, b in union_intervals(clipped))


def _random_lists(rng, grid: bool):
    """One to three lists of intervals; on a coarse grid (`grid`) many touch, nest, repeat or have zero length."""
    lists = []
    for _ in range(rng.randint(1, 3)):
        lst = []
        for _ in range(rng.randint(0, 60)):
            a = rng.randint(0, 40) * 0.25 if grid else rng.uniform(0.0, 10.0)
            d = rng.choice([0.0, 0.25, 0.5, 1.0, 3.0]) if grid else rng.choice([0.0, rng.expovariate(2.0)])
            lst.append((a, a + d))
        lists.append(lst)
    return lists


def test_numpy_busy_time_equals_the_loop_exactly():
    """Same floats (==, not approx) on random intervals: touching, nested, repeated and zero-length
    ones, clipped inside an interval or before all of them, one list or several."""
    import random

    rng = random.Random(14)
    for case in range(3000):
        lists = _random_lists(rng, grid=case % 2 == 0)
        until = rng.choice([rng.uniform(0.0, 12.0), rng.randint(0, 44) * 0.25, 1e9])
        assert busy_union_s(*lists, until=until) == _busy_union_loop_s(*lists, until=until), (lists, until)
    # a nested run of intervals, each inside the one before, and one reversed (b < a) interval
    nested = [(float(i), 100.0 - i) for i in range(50)]
    assert busy_union_s(nested, [(3.0, 1.0)], until=80.0) == _busy_union_loop_s(nested, [(3.0, 1.0)], until=80.0)
    assert busy_union_s([], [], until=5.0) == 0
