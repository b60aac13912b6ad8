"""Busy time from the intervals a resource was busy (link directions in the simulator and in
hwprobe's measurements), and the exposed part of transfers (busy with nothing covering it)."""

from __future__ import annotations

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
    """Length of the union of busy intervals, clipped at `until`."""
    clipped = [(a, min(b, until)) for lst in interval_lists for a, b in lst if a < until]
    return sum(b - a for a, b in union_intervals(clipped))


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
