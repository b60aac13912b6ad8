"""Busy time of a resource from the intervals it was busy (link directions, in the simulator and
in hwprobe's measurements alike)."""

from __future__ import annotations


def busy_union_s(*interval_lists: list[tuple[float, float]], until: float) -> float:
    """Length of the union of busy intervals, clipped at `until`."""
    ivs = sorted((a, min(b, until)) for lst in interval_lists for a, b in lst if a < until)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in ivs:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total
