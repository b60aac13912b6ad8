"""Tier peaks: the most tokens any row holds in each tier at any moment of the run.

Tier sizes follow from the ratios alone (sim/tiering/counts.py mirrors sim/tiering/tiers.py exactly), so the peaks
are exact before a single token is scored, and every store is allocated once at its final size: no
reallocation (and no allocator noise in the measured memory peak) during the decode loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.tiering.counts import count_trajectory
from sim.tiering.tiers import T0, T1, T2, TierPolicy


@dataclass(frozen=True)
class TierPeaks:
    t0: int
    t1: int
    t2: int


def row_peaks(policy: TierPolicy, prompt_tokens: int, reasoning_tokens: int) -> TierPeaks:
    """Peaks of one sequence, from the simulator's own tier counts (`sim.tiering.counts.count_trajectory`,
    counts after each step's re-tier). T0 peaks just before a re-tier: the previous step's T0 plus
    the step's new token."""
    after = count_trajectory(prompt_tokens, reasoning_tokens, policy)
    t0_before_retier = np.concatenate([[prompt_tokens], after[:-1, T0]]) + 1
    return TierPeaks(int(max(prompt_tokens, t0_before_retier.max(initial=0))),
                     int(after[:, T1].max(initial=0)), int(after[:, T2].max(initial=0)))


def batch_peaks(policy: TierPolicy, prompt_tokens: int, lengths) -> TierPeaks:
    """Per-row peaks over a batch of reasoning lengths (equal lengths are planned once)."""
    peaks = [row_peaks(policy, prompt_tokens, int(n)) for n in sorted(set(int(x) for x in lengths))]
    return TierPeaks(max(p.t0 for p in peaks), max(p.t1 for p in peaks), max(p.t2 for p in peaks))
