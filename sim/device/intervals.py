"""Busy time from the intervals a resource was busy (link directions in the simulator and in
hwprobe's measurements), and the exposed part of transfers (busy with nothing covering it)."""

from __future__ import annotations

from itertools import chain

import numpy as np

Interval = tuple[float, float]


def union_intervals(intervals: list[Interval]) -> list[Interval]:
    """Sorted, merged intervals (touching ones merge)."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def busy_union_s(*interval_lists: list[Interval], until: float) -> float:
    """Length of the union of busy intervals, clipped at `until`: the sum of b - a over
    `union_intervals` of the clipped intervals, in numpy (a run's link directions hold one interval
    per copy). Sorted by start, an interval opens a new merged one where it starts after every end
    before it (touching ones merge); each merged interval ends at the running maximum of the ends.
    The same floats as the loop: the same differences, added in the same order by `sum`."""
    n = sum(len(lst) for lst in interval_lists)
    if not n:
        return 0
    ab = np.fromiter(chain.from_iterable(chain.from_iterable(interval_lists)), dtype=np.float64,
                     count=2 * n).reshape(n, 2)
    a, b = ab[:, 0], np.minimum(ab[:, 1], until)
    keep = a < until
    a, b = a[keep], b[keep]
    if not len(a):
        return 0
    if np.any(b < a):  # a reversed interval: the running maximum below does not hold; the loop decides
        return sum(y - x for x, y in union_intervals(list(zip(a.tolist(), b.tolist()))))
    order = np.argsort(a, kind="stable")
    a, b = a[order], np.maximum.accumulate(b[order])
    opens = np.ones(len(a), dtype=bool)
    opens[1:] = a[1:] > b[:-1]
    starts = a[opens]
    ends = b[np.append(np.flatnonzero(opens)[1:] - 1, len(a) - 1)]  # each merged interval's last
    return sum((ends - starts).tolist())


def uncovered_intervals(busy: list[Interval], covering: list[Interval]) -> list[Interval]:
    """Parts of `busy` that no interval of `covering` overlaps, e.g. transfers in flight while no
    compute runs: the exposed (not hidden) transfer time."""
    covering = union_intervals(covering)
    out = []
    for a, b in union_intervals(busy):
        cur = a
        for ca, cb in covering:
            if cb <= cur or ca >= b:
                continue
            if ca > cur:
                out.append((cur, ca))
            cur = max(cur, cb)
        if cur < b:
            out.append((cur, b))
    return out
