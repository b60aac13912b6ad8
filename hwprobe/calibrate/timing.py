"""Timed samples: many calls inside one timing window, the median of several windows, the spread.

FACTS.md measurement practice: warm up, then time many calls between one pair of events (the
window at least ~2 ms so event resolution and launch jitter do not matter), take the median of
at least 3 samples and keep the relative spread so a noisy figure is visible as noisy.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from sim.model.units import MS

MIN_WINDOW_S = 2 * MS  # one timing window spans at least this long
MAX_REPS = 100_000  # calls in one window, so a mis-timed trial cannot run away
FLOOR_S = 1e-12  # a coarse clock can read 0 for a window; times stay positive
WARMUP_CALLS = 1  # the first call pays for lazy initialisation and kernel selection; the trial call after it is warm too

# window(reps) runs `reps` calls and returns the elapsed seconds of all of them together.
Window = Callable[[int], float]


@dataclass(frozen=True)
class WindowTiming:
    """Per-call time over `samples` windows of `reps` calls each."""

    median_s: float
    best_s: float
    rel_spread: float  # (max - min) / median over the samples
    samples: int
    reps: int


def summarize(per_call_s: Sequence[float], reps: int) -> WindowTiming:
    if not per_call_s:
        raise ValueError("no samples")
    med = statistics.median(per_call_s)
    spread = (max(per_call_s) - min(per_call_s)) / med if med > 0 else 0.0
    return WindowTiming(med, min(per_call_s), spread, len(per_call_s), reps)


def reps_for(min_window_s: float, one_call_s: float) -> int:
    """How many calls fill one window of at least `min_window_s`."""
    if one_call_s <= 0 or not math.isfinite(one_call_s):
        return MAX_REPS
    return max(1, min(MAX_REPS, math.ceil(min_window_s / one_call_s)))


def time_window(window: Window, *, samples: int, min_window_s: float = MIN_WINDOW_S,
                warmup: int = WARMUP_CALLS) -> WindowTiming:
    """Warm up, size the window from one trial call, then time `samples` windows."""
    if warmup > 0:
        window(warmup)
    reps = reps_for(min_window_s, window(1))
    return summarize([max(window(reps) / reps, FLOOR_S) for _ in range(samples)], reps)


PairWindow = Callable[[int], tuple[float, float]]


def time_window_pair(window: PairWindow, *, samples: int, min_window_s: float = MIN_WINDOW_S,
                     warmup: int = WARMUP_CALLS) -> tuple[WindowTiming, WindowTiming]:
    """Like `time_window` for two activities started together, each timed in its own window."""
    if warmup > 0:
        window(warmup)
    a, b = window(1)
    reps = reps_for(min_window_s, max(a, b))
    pairs = [window(reps) for _ in range(samples)]
    return (summarize([max(a / reps, FLOOR_S) for a, _ in pairs], reps),
            summarize([max(b / reps, FLOOR_S) for _, b in pairs], reps))
