"""One steady-state probe of the planner: a candidate served at one rate until its verdict holds.

The window, the early stop and the intervals are `sim.serving.steady`'s. A probe starts from the
screen's E2E estimate; when the run's own mean E2E says the measured window was shorter than
MEASURE_E2E of them, or a target lies inside a p99's interval that has not converged, its window
grows (up to MAX_ATTEMPTS windows, MAX_PROBE_REQUESTS requests); so does one whose measured
latencies still drift upwards (near capacity), and a pass whose run touched a capacity limit (a
preemption, HBM within 5% of full, the batch at max_num_seqs) grows to SATURATED_SCALE times the
window: near a memory edge a long request can start a cascade of preemptions a short window never
sees. The probe is one run whose window grows while it runs (`GrowingStop`): its arrivals are a
prefix of a longer Poisson stream (`sim.inputs.requests`: each quantity its own stream), so the next
window continues the run rather than simulating its start again, and arrivals never stop while a
measured request is still in the system. `--requests N` runs N requests once instead. A probe that
stopped early has its verdict but no percentile worth printing: its p99 is known only to exceed the
target (or, overloaded, the run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import numpy as np

from sim.inputs.requests import build_requests
from sim.inputs.scenario import Scenario
from sim.serving.metrics import request_table
from sim.serving.run import simulate_serving
from sim.serving.steady import (
    MAX_PROBE_REQUESTS,
    MEASURE_E2E,
    OVERLOAD_E2E,
    OVERLOAD_MIN_S,
    Percentile,
    SteadyStop,
    drifting,
    percentile_ci,
    window_for,
    window_of_requests,
)

from .files import MISS_FIT, MISS_OVERLOAD, MISS_TPOT, MISS_TTFT

MAX_ATTEMPTS = 4
SATURATED_SCALE = 4.0  # a pass that touched a capacity limit is run again over 4x the window
NEAR_FULL = 0.95
HINT_MARGIN = 1.3  # the screen's E2E leaves out queueing: a window sized on it alone is often run twice
SHORT_WINDOW = 0.8  # a measured window under 80% of MEASURE_E2E mean E2Es is run again, longer


@dataclass
class Probe:
    """What one probe found, for one replica at `rate_per_s` (its share of the configuration's rate)."""

    rate_per_s: float
    summary: object  # ServingSummary of the last run (fits, memory, link figures for the binding)
    requests: int = 0  # the run's: its window's arrivals, and those that came while its measured requests finished
    measured: int = 0  # of them, in the measured window
    window_s: float = 0.0  # the measured arrivals' span
    duration_s: float = 0.0  # simulated time of the last run
    runs: int = 0
    end: str = "measured"  # measured | ttft_p99 | tpot_p99 | overloaded | does_not_fit
    stats: dict[str, Percentile] = field(default_factory=dict)  # ttft_p50 ... tpot_p99, e2e_p99 (measured requests)
    e2e_mean_s: float | None = None
    goodput_share: float | None = None  # of the measured requests, the share meeting every target
    misses: list[tuple[str, str]] = field(default_factory=list)  # (MISS_KEYS key, text)
    drifting: bool = False  # the measured TTFT or TPOT still rose across the window (`steady.drifting`)
    parts: list[tuple[str, "Probe"]] = field(default_factory=list)  # disaggregated: ("prefill", p), ("decode", p)
    pool_failed: str | None = None  # disaggregated: the pool that missed

    @property
    def passed(self) -> bool:
        return not self.misses

    def certain(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        """The verdict holds at 95%: stopped at it, or each target outside its p99's interval (or that
        interval within +-10%)."""
        if self.end != "measured":
            return True
        if self.drifting:
            return False
        return all(self.stats[k].decides(t) for k, t in (("ttft_p99", ttft_s), ("tpot_p99", tpot_s)))


def _stats(requests, measured: np.ndarray) -> dict[str, Percentile]:
    r = requests[measured]
    out = {}
    for metric in ("ttft", "tpot", "e2e"):
        values = r[f"{metric}_s"].to_numpy(dtype=float)
        out[f"{metric}_p99"] = percentile_ci(values)
        if metric != "e2e":
            for q in (0.5, 0.9):
                v = values[~np.isnan(values)]
                out[f"{metric}_p{int(q * 100)}"] = Percentile(float(np.percentile(v, 100 * q)) if len(v) else None)
    return out


def _misses(probe: Probe, ttft_s: float | None, tpot_s: float | None) -> list[tuple[str, str]]:
    if probe.end == "overloaded":
        return [(MISS_OVERLOAD, f"overloaded: the queue diverged (a request still waiting after "
                                f"{probe.duration_s:,.0f} s of a {probe.requests:,}-request run)")]
    out = []
    for key, label, target in ((MISS_TTFT, "p99 TTFT", ttft_s), (MISS_TPOT, "p99 TPOT", tpot_s)):
        if target is None:
            continue
        if probe.end == key:
            out.append((key, f"{label} > {target * 1e3:,.0f} ms (certain after {probe.duration_s:,.0f} s: over "
                             f"1% of the {probe.measured:,} measured requests already past it)"))
            continue
        got = probe.stats[key].value_s if probe.stats else None  # a stopped probe measured no percentile
        if got is not None and got > target:
            out.append((key, f"{label} {got * 1e3:,.0f} ms > {target * 1e3:,.0f} ms (+{(got / target - 1) * 100:,.0f}%)"))
    return out


def _good_share(requests, measured: np.ndarray, ttft_s: float | None, tpot_s: float | None) -> float | None:
    r = requests[measured]
    if not len(r):
        return None
    good = np.ones(len(r), dtype=bool)
    if ttft_s is not None:
        good &= r["ttft_s"].to_numpy(dtype=float) <= ttft_s
    if tpot_s is not None:
        good &= r["tpot_s"].fillna(0.0).to_numpy(dtype=float) <= tpot_s
    return float(good.mean())


def _evaluate(probe: Probe, requests, measured: np.ndarray, ttft_s, tpot_s) -> Probe:
    """`probe` (its run ended with `end`) with its figures over the measured requests and its misses."""
    if probe.end == "measured":
        probe.stats = _stats(requests, measured)
        e2e = requests["e2e_s"].to_numpy(dtype=float)[measured]
        probe.e2e_mean_s = float(np.nanmean(e2e)) if len(e2e) else None
        probe.goodput_share = _good_share(requests, measured, ttft_s, tpot_s)
        r = requests[measured]
        probe.drifting = drifting(r["ttft_s"].to_numpy(dtype=float)) or drifting(r["tpot_s"].to_numpy(dtype=float))
    probe.misses = _misses(probe, ttft_s, tpot_s)
    return probe


def run_once(scenario: Scenario, window, rate_per_s: float, ttft_s, tpot_s, e2e_s: float,
             prefilled: bool = False, simulate: Callable | None = None) -> Probe:
    """One run over `window` (its requests are the scenario's), stopped at its verdict; `prefilled`:
    a decode instance's (`simulate_serving`); `simulate(scenario, stop=)`: a fleet's instead."""
    arrival = build_requests(scenario.workload).arrival_s
    measured = window.measured(arrival)
    stop = SteadyStop(measured, ttft_s, tpot_s, max(OVERLOAD_MIN_S, OVERLOAD_E2E * e2e_s))
    res = simulate(scenario, stop=stop) if simulate else simulate_serving(scenario, stop=stop, prefilled=prefilled)
    s = res.summary
    probe = Probe(rate_per_s, s, requests=len(arrival), measured=int(measured.sum()),
                  window_s=window.end_s - window.warmup_s, duration_s=s.duration_s or 0.0, runs=1)
    if not s.fits:
        probe.end, probe.misses = "does_not_fit", [(MISS_FIT, f"does not fit: {s.does_not_fit}")]
        return probe
    probe.end = stop.reason or "measured"
    return _evaluate(probe, res.requests, measured, ttft_s, tpot_s)


class GrowingStop:
    """`stop` for a probe's one run that grows its window while it runs (`steady_probe`): the current
    window's `SteadyStop`; when its measured requests have all finished and the verdict does not yet
    hold (`next_window`), the next window takes over and the run goes on - what was simulated is
    not simulated again."""

    def __init__(self, arrival_s: np.ndarray, rate_per_s: float, ttft_s, tpot_s, e2e_s: float):
        self.arrival_s, self.rate_per_s, self.ttft_s, self.tpot_s = arrival_s, rate_per_s, ttft_s, tpot_s
        self.windows = 0
        self._start(e2e_s, 1.0)

    def _start(self, e2e_s: float, scale: float) -> None:
        self.e2e_s, self.scale, self.windows = e2e_s, scale, self.windows + 1
        self.window = window_for(self.rate_per_s, e2e_s, scale)
        self.n = min(len(self.arrival_s), self.window.requests(self.rate_per_s))
        self.measured = self.window.measured(self.arrival_s)
        self.stop = SteadyStop(self.measured, self.ttft_s, self.tpot_s, max(OVERLOAD_MIN_S, OVERLOAD_E2E * e2e_s))

    @property
    def reason(self) -> str | None:
        return self.stop.reason

    def __call__(self, sim) -> bool:
        if not self.stop(sim):
            return False
        if self.stop.reason != "measured":
            return True
        probe = self._live(sim)
        seqs = sim.scheduler.cfg.max_num_seqs  # the cap the run applies (SGLang's of its pool: `engine_scheduler`)
        grown = next_window(probe, self.e2e_s, self.scale, seqs, self.n, self.windows, self.ttft_s, self.tpot_s)
        if grown is None:
            return True
        self._start(*grown)
        return False

    def _live(self, sim) -> Probe:
        """The current window's figures from the run so far (its measured requests have all finished)."""
        trace = sim.trace
        steps = trace.steps
        summary = SimpleNamespace(preemptions=sim.scheduler.preemptions, max_running=max((r.running for r in steps), default=0),
                                  hbm_peak_bytes=max((r.hbm_bytes for r in steps), default=None),
                                  hbm_capacity_bytes=sim.scheduler.memory.hbm_capacity_bytes)
        probe = Probe(self.rate_per_s, summary, requests=self.n, measured=int(self.measured.sum()),
                      window_s=self.window.end_s - self.window.warmup_s, duration_s=sim.env.now, runs=self.windows)
        return _evaluate(probe, request_table(trace), self.measured, self.ttft_s, self.tpot_s)


def next_window(probe: Probe, e2e_s: float, scale: float, seqs: int | None, n: int, windows: int, ttft_s,
                tpot_s) -> tuple[float, float] | None:
    """(mean E2E, scale) of the window after this one, or None where its verdict stands (module
    docstring): a window short against the run's own E2E, a target inside an unconverged interval,
    a pass at a capacity limit; never past MAX_ATTEMPTS windows or MAX_PROBE_REQUESTS requests."""
    if probe.e2e_mean_s is None or windows >= MAX_ATTEMPTS or n >= MAX_PROBE_REQUESTS:
        return None
    if probe.window_s < SHORT_WINDOW * MEASURE_E2E * probe.e2e_mean_s:
        return probe.e2e_mean_s, scale  # the hint was short: size the window from the run's own E2E
    if not probe.certain(ttft_s, tpot_s):
        return e2e_s, scale * 2.0
    if probe.passed and scale < SATURATED_SCALE and saturated(probe.summary, seqs):
        return e2e_s, SATURATED_SCALE  # a pass at a capacity limit: rare long requests tip it over only in long runs
    return None


def steady_probe(make: Callable[[int], Scenario], rate_per_s: float, ttft_s: float | None, tpot_s: float | None,
                 e2e_hint_s: float, requests: int | None = None, prefilled: bool = False,
                 simulate: Callable | None = None) -> Probe:
    """`make(n)`: the candidate's scenario with n Poisson requests at `rate_per_s`. One run whose
    window grows until the verdict holds (module docstring, `GrowingStop`); `requests` fixes n.
    `simulate(scenario, stop=)`: what runs it (default `simulate_serving`; a fleet's,
    `sim.serving.fleet`)."""
    if requests is not None:
        sc = make(requests)
        return run_once(sc, window_of_requests(build_requests(sc.workload).arrival_s), rate_per_s, ttft_s, tpot_s,
                        e2e_hint_s, prefilled, simulate)
    sc = make(MAX_PROBE_REQUESTS)
    arrival = build_requests(sc.workload).arrival_s
    grow = GrowingStop(arrival, rate_per_s, ttft_s, tpot_s, max(HINT_MARGIN * e2e_hint_s, 1e-3))
    res = simulate(sc, stop=grow) if simulate else simulate_serving(sc, stop=grow, prefilled=prefilled)
    s = res.summary
    arrived = int(np.count_nonzero(~np.isnan(res.requests["arrival_s"].to_numpy(dtype=float))))
    probe = Probe(rate_per_s, s, requests=max(grow.n, arrived), measured=int(grow.measured.sum()),
                  window_s=grow.window.end_s - grow.window.warmup_s, duration_s=s.duration_s or 0.0, runs=grow.windows)
    if not s.fits:
        probe.end, probe.misses = "does_not_fit", [(MISS_FIT, f"does not fit: {s.does_not_fit}")]
        return probe
    probe.end = grow.reason or "measured"
    return _unsteady(_evaluate(probe, res.requests, grow.measured, ttft_s, tpot_s))


def saturated(summary, seqs: int | None) -> bool:
    """The run touched a capacity limit: a preemption, HBM within 5% of full, or the batch at max_num_seqs."""
    near = summary.hbm_peak_bytes is not None and summary.hbm_peak_bytes >= NEAR_FULL * summary.hbm_capacity_bytes
    at_cap = seqs is not None and summary.max_running is not None and summary.max_running >= seqs
    return bool(summary.preemptions or near or at_cap)


def _unsteady(probe: Probe) -> Probe:
    """The longest run it may take still drifts upwards: not a steady state, so it does not pass."""
    if probe.drifting and probe.passed:
        probe.misses.append((MISS_OVERLOAD, f"not steady: latencies still rising across the window after "
                                            f"{probe.duration_s:,.0f} s ({probe.requests:,} requests)"))
    return probe
