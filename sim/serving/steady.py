"""Steady-state serving figures: a p99 that describes the load, not the start-up or the drain of a run.

A run of n requests at a rate is a transient: the queue starts empty, and after the last arrival it
drains with less and less load. With long outputs a fixed 400 requests ends before the queue has
built up, so its percentiles overstate capacity (issue #21). A steady-state probe instead:

- sizes its arrival window from the mean end-to-end latency E2E (a hint first, then the run's own):
  WARMUP_E2E x E2E of warm-up arrivals whose figures are discarded, then MEASURE_E2E x E2E of
  measured arrivals (at least MIN_MEASURED requests), then COOL_E2E x E2E of arrivals that keep the
  load on while the last measured requests finish; the run ends when every measured one has;
- stops as soon as its verdict is certain (`SteadyStop`): when so many measured requests are already
  past a target that the p99 must be past it (exact, `must_exceed`), or when the queue diverges (a
  measured request has waited OVERLOAD_E2E x E2E, and at least OVERLOAD_MIN_S, without being
  admitted: a stable queue drains faster than that), so an overloaded probe fails fast;
- reports each p99 with a 95% confidence interval by batch means (BATCHES batches of measured requests
  in arrival order, the share of each batch above the p99 estimate; Student's t), and grows the
  window (x2, up to MAX_PROBE_REQUESTS requests) while a target lies inside an interval wider than
  CONVERGED_WIDTH of the estimate, or while the measured latencies still drift upwards (`drifting`:
  near capacity a queue grows too slowly for the early stop, and a short window would pass it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

WARMUP_E2E, MEASURE_E2E, COOL_E2E = 1.5, 4.0, 1.5  # a request's latency reflects the arrivals of one E2E before it
MIN_MEASURED = 400  # a p99 over fewer requests rests on its four largest
MAX_PROBE_REQUESTS = 40_000
OVERLOAD_E2E, OVERLOAD_MIN_S = 5.0, 30.0
QUANTILE = 0.99
BATCHES = 10
T_975 = 2.262  # Student's t, 97.5% point, BATCHES - 1 degrees of freedom
T_975_SLOPE = 2.306  # ... BATCHES - 2 degrees of freedom (a line's slope over the batches)
DRIFT_RISE = 0.1  # a fitted rise across the window above 10% of the mean, significant: not yet steady
CONVERGED_WIDTH = 0.2  # a 95% interval within +-10% of its p99 has converged
CHECK_EVERY = 16  # steps between two looks at the verdict (a look costs a few array passes)


def must_exceed(n: int, q: float = QUANTILE) -> int:
    """How many of n values above a target make their q-quantile (linear interpolation, as
    np.percentile) above it: the sorted values at floor(q (n - 1)) and above all exceed it."""
    return n - math.floor(q * (n - 1))


@dataclass(frozen=True)
class Window:
    """Arrival times [warmup_s, end_s) are measured; arrivals go on until cool_end_s."""

    warmup_s: float
    end_s: float
    cool_end_s: float

    def requests(self, rate_per_s: float) -> int:
        return max(1, math.ceil(rate_per_s * self.cool_end_s))

    def measured(self, arrival_s: np.ndarray) -> np.ndarray:
        return (arrival_s >= self.warmup_s) & (arrival_s < self.end_s)


def window_for(rate_per_s: float, e2e_s: float, scale: float = 1.0) -> Window:
    """The window for a mean E2E of `e2e_s` (`scale` x the measured span, at least MIN_MEASURED
    arrivals), cut to MAX_PROBE_REQUESTS requests in all."""
    warm = WARMUP_E2E * e2e_s
    measure = max(scale * MEASURE_E2E * e2e_s, MIN_MEASURED / rate_per_s)
    cool = COOL_E2E * e2e_s
    total = warm + measure + cool
    cap = MAX_PROBE_REQUESTS / rate_per_s
    if total > cap:  # keep the proportions, so the warm-up still precedes most of the measurement
        warm, measure, cool = (x * cap / total for x in (warm, measure, cool))
    return Window(warm, warm + measure, warm + measure + cool)


def window_of_requests(arrival_s: np.ndarray) -> Window:
    """`--requests N` given: the window in those N arrivals, in the default's proportions."""
    end = float(arrival_s[-1]) if len(arrival_s) else 0.0
    whole = WARMUP_E2E + MEASURE_E2E + COOL_E2E
    return Window(end * WARMUP_E2E / whole, end * (WARMUP_E2E + MEASURE_E2E) / whole, end)


class SteadyStop:
    """`stop` for `simulate_serving`: True once every measured request finished, or a p99 target is
    certain to be missed (`decided`: ttft_p99 | tpot_p99), or the queue diverges (`overloaded`)."""

    def __init__(self, measured: np.ndarray, ttft_s: float | None, tpot_s: float | None, overload_wait_s: float):
        self.ids = np.flatnonzero(measured)
        self.ttft_s, self.tpot_s, self.overload_wait_s = ttft_s, tpot_s, overload_wait_s
        self.looks = 0
        self.reason: str | None = None  # None: the run ended by itself
        self.at_s: float | None = None

    def __call__(self, sim) -> bool:
        self.looks += 1
        if self.looks % CHECK_EVERY:
            return False
        reason = self.verdict(sim.table, sim.env.now)
        if reason is not None:
            self.reason, self.at_s = reason, sim.env.now
        return reason is not None

    def verdict(self, t, now: float) -> str | None:
        i = self.ids
        arrived, first, finish = t.arrival_s[i], t.first_token_s[i], t.finish_s[i]
        if not np.isnan(finish).any():
            return "measured"
        if self.ttft_s is not None:
            waited = np.where(np.isnan(first), now, first) - arrived  # NaN while not arrived: never late
            if np.count_nonzero(waited > self.ttft_s) >= must_exceed(len(i)):
                return "ttft_p99"
        if self.tpot_s is not None:
            many = t.output[i] > 1
            so_far = (np.where(np.isnan(finish), now, finish) - first) / np.maximum(t.output[i] - 1, 1)
            if np.count_nonzero(many & (so_far > self.tpot_s)) >= must_exceed(int(many.sum())):
                return "tpot_p99"  # (now - first token) / (N - 1) can only grow until the request finishes
        queued = np.isnan(t.admitted_s[i]) & ~np.isnan(arrived)
        if queued.any() and now - float(np.min(arrived[queued])) > self.overload_wait_s:
            return "overloaded"
        return None


@dataclass(frozen=True)
class Percentile:
    """A q-quantile over the measured requests and its 95% batch-means interval (None: too few)."""

    value_s: float | None
    lo_s: float | None = None
    hi_s: float | None = None

    @property
    def converged(self) -> bool:
        if self.value_s is None or self.lo_s is None or self.value_s <= 0:
            return True
        return (self.hi_s - self.lo_s) / self.value_s <= CONVERGED_WIDTH

    def decides(self, target_s: float | None) -> bool:
        """The target lies outside the interval (or the interval is narrow): more run would not flip it."""
        return target_s is None or self.converged or not (self.lo_s <= target_s <= self.hi_s)


def percentile_ci(values: np.ndarray, q: float = QUANTILE, batches: int = BATCHES) -> Percentile:
    """The q-quantile of `values` (in arrival order) with a 95% interval: the share above the
    estimate in each of `batches` consecutive batches is a batch mean of an indicator, which
    queueing's correlation between neighbours leaves far less biased than one binomial; its
    interval, mapped back through the empirical quantile function, bounds the quantile."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not len(v):
        return Percentile(None)
    p = float(np.percentile(v, 100 * q))
    if len(v) < batches * 10:
        return Percentile(p)
    shares = np.array([np.mean(b > p) for b in np.array_split(v, batches)])
    half = T_975 * float(np.std(shares, ddof=1)) / math.sqrt(batches)
    lo = float(np.percentile(v, 100 * max(0.0, q - half)))
    hi = float(np.percentile(v, 100 * min(1.0, q + half)))
    return Percentile(p, lo, max(hi, p))


def drifting(values: np.ndarray, batches: int = BATCHES) -> bool:
    """Whether `values` (in arrival order) still rise across the window: the least-squares slope of
    their batch means over the batch index is significantly above zero (one-sided 97.5%, Student's t)
    and the fitted rise from the first batch to the last exceeds DRIFT_RISE of their mean."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if len(v) < batches * 10:
        return False
    means = np.array([b.mean() for b in np.array_split(v, batches)])
    x = np.arange(batches, dtype=float)
    slope, intercept = np.polyfit(x, means, 1)
    resid = means - (slope * x + intercept)
    se = math.sqrt(float(np.sum(resid**2)) / (batches - 2) / float(np.sum((x - x.mean()) ** 2)))
    significant = slope > 0 and (se == 0 or slope / se > T_975_SLOPE)
    return bool(significant and slope * (batches - 1) > DRIFT_RISE * abs(float(means.mean())))
