"""Capacity plan: the most tokens any row holds in each tier at any moment of the run.

Tier sizes follow from the ratios alone (sim/counts.py mirrors sim/tiers.py exactly), so the plan
is exact before a single token is scored, and every store is allocated once at its final size: no
reallocation (and no allocator noise in the measured memory peak) during the decode loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.counts import retier_counts
from sim.tiers import TierPolicy


@dataclass(frozen=True)
class TierPeaks:
    t0: int
    t1: int
    t2: int


def row_peaks(policy: TierPolicy, prompt_tokens: int, reasoning_tokens: int) -> TierPeaks:
    """Peaks of one sequence. T0 peaks just before a re-tier (after that step's append)."""
    counts = (prompt_tokens, 0, 0, 0)
    p0, p1, p2 = prompt_tokens, 0, 0
    for step in range(reasoning_tokens):
        counts = (counts[0] + 1, *counts[1:])
        p0 = max(p0, counts[0])
        if policy.retier_due(step):
            counts = retier_counts(counts, prompt_tokens + step + 1, prompt_tokens, policy)
        p1, p2 = max(p1, counts[1]), max(p2, counts[2])
    return TierPeaks(p0, p1, p2)


def batch_peaks(policy: TierPolicy, prompt_tokens: int, lengths) -> TierPeaks:
    """Per-row peaks over a batch of reasoning lengths (equal lengths are planned once)."""
    peaks = [row_peaks(policy, prompt_tokens, int(n)) for n in sorted(set(int(x) for x in lengths))]
    return TierPeaks(max(p.t0 for p in peaks), max(p.t1 for p in peaks), max(p.t2 for p in peaks))
