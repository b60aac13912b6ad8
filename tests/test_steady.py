"""Steady-state probes (issue #21 item 1): the window, the exact early verdict, the batch-means
interval, the engine's stop, and the counterexample - a transient that passes where the steady
state fails - flipping to the right verdict, confirmed at 3x the run length."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from sim.inputs.scenario import scenario_from_dict
from sim.plan.probe import steady_probe
from sim.serving import steady as S
from sim.serving.run import simulate_serving

from .conftest import SCENARIOS


@pytest.mark.parametrize("n", [1, 2, 50, 99, 100, 101, 400, 1234])
def test_must_exceed_is_exact_for_the_p99(n):
    """k = must_exceed(n) values above a target always put np.percentile(., 99) above it (sufficient:
    with linear interpolation fewer can too, so a stop on it is never wrong, only sometimes late)."""
    rng = np.random.default_rng(n)
    k = S.must_exceed(n)
    for _ in range(50):
        v = rng.uniform(0, 1, n)
        v[:k] = rng.uniform(2, 3, k)  # k values above the target 1.5
        assert np.percentile(v, 99) > 1.5
    if k > 1:  # one fewer far above, the rest at the target: the p99 lands at or below it
        v = np.concatenate([np.full(n - k + 1, 1.5), np.full(k - 1, 1.5 + 1e-9)])
        assert np.percentile(v, 99) <= 1.5 + 1e-9


def test_window_in_mean_e2es_and_at_least_the_minimum_measured():
    w = S.window_for(rate_per_s=10.0, e2e_s=20.0)
    assert (w.warmup_s, w.end_s, w.cool_end_s) == (30.0, 110.0, 140.0)  # 1.5, +4, +1.5 E2Es
    assert w.requests(10.0) == 1400
    short = S.window_for(rate_per_s=10.0, e2e_s=1.0)  # 4 E2Es would measure 40 arrivals: 400 instead
    assert short.end_s - short.warmup_s == pytest.approx(S.MIN_MEASURED / 10.0)
    capped = S.window_for(rate_per_s=100.0, e2e_s=1000.0)
    assert capped.requests(100.0) == S.MAX_PROBE_REQUESTS
    assert capped.warmup_s / capped.cool_end_s == pytest.approx(1.5 / 7.0)  # the proportions kept
    arrival = np.arange(0.0, 70.0, 1.0)
    w = S.window_of_requests(arrival)  # --requests N: the same proportions of N arrivals
    assert (w.warmup_s, w.end_s, w.cool_end_s) == pytest.approx((69 * 1.5 / 7, 69 * 5.5 / 7, 69))
    assert w.measured(arrival).sum() == np.count_nonzero((arrival >= w.warmup_s) & (arrival < w.end_s))


def test_the_interval_covers_the_true_p99_of_iid_samples():
    rng = np.random.default_rng(0)
    truth = -math.log(0.01)  # exponential(1)'s 99th percentile
    hits = 0
    for _ in range(200):
        p = S.percentile_ci(rng.exponential(1.0, 2000))
        assert p.lo_s <= p.value_s <= p.hi_s
        hits += p.lo_s <= truth <= p.hi_s
    assert hits >= 170  # nominal 95%; batch means of ten is a little liberal
    assert S.percentile_ci(np.array([1.0, 2.0])).lo_s is None  # too few for an interval
    assert S.percentile_ci(np.array([])).value_s is None


class _Table:
    def __init__(self, n):
        self.arrival_s = np.arange(n, dtype=float)
        self.admitted_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.output = np.full(n, 11)


def test_the_stop_decides_only_what_is_certain():
    t = _Table(100)
    measured = np.ones(100, dtype=bool)
    stop = S.SteadyStop(measured, ttft_s=1.0, tpot_s=None, overload_wait_s=50.0)
    t.admitted_s[:] = t.first_token_s[:] = t.arrival_s + 0.5  # every first token 0.5 s after arrival
    assert stop.verdict(t, now=100.0) is None
    t.first_token_s[:1] = np.nan  # request 0 is still waiting at t = 2: 2 s > 1 s, but one late is not 2%
    t.admitted_s[:1] = np.nan
    assert stop.verdict(t, now=2.0) is None
    t.first_token_s[1:2] = np.nan
    t.admitted_s[1:2] = np.nan
    assert S.must_exceed(100) == 2 and stop.verdict(t, now=3.0) == "ttft_p99"
    stop = S.SteadyStop(measured, ttft_s=None, tpot_s=0.1, overload_wait_s=50.0)
    t = _Table(100)
    t.admitted_s[:] = t.first_token_s[:] = t.arrival_s
    t.finish_s[:] = t.first_token_s + 10 * 0.05  # all finished at 0.05 s a token
    t.finish_s[:1] = np.nan  # ... but request 0, running 0.9 s after its first token: >= 0.09 s a token
    assert stop.verdict(t, now=0.9) is None
    t.finish_s[1] = t.first_token_s[1] + 10 * 0.2  # and request 1 at 0.2 s a token
    assert stop.verdict(t, now=1.1) == "tpot_p99"  # request 0 is at >= 0.11 s a token: two past 0.1
    t.admitted_s[5] = t.first_token_s[5] = np.nan  # waited since t = 5: 60 s > 50 s
    assert S.SteadyStop(measured, None, None, 50.0).verdict(t, now=65.0) == "overloaded"
    t.finish_s[:] = 200.0
    assert stop.verdict(t, now=200.0) == "measured"


def _scenario(rate: float, requests: int, gpu: str = "h200-sxm"):
    d = yaml.safe_load((SCENARIOS / "serving-h100-70b-tp4.yaml").read_text())
    d["hardware"]["gpu"] = gpu
    d["workload"]["reasoning_tokens"] = 2048
    d["workload"]["arrivals"] = {"kind": "poisson", "rate_per_s": rate, "requests": requests}
    return scenario_from_dict(d, "steady")


def test_a_stopped_run_reports_the_requests_that_finished():
    calls = []

    def stop(sim):
        calls.append(sim.env.now)
        return len(calls) >= 3000

    res = simulate_serving(_scenario(4.0, 200), stop=stop)
    done = int(res.requests["finish_s"].notna().sum())
    assert res.stopped and len(calls) == 3000 and 0 < done < 200
    assert res.summary.steps == 3000 and res.summary.e2e_p99_s is not None


def test_the_transient_that_passes_fails_in_steady_state_and_3x_longer_confirms_it():
    """70B bf16 on 4 x H200 (TP4), 2,048-token outputs, p99 TTFT 2 s / TPOT 50 ms: 400 requests at
    4 req/s end before the queue builds (both targets met); the steady-state probe fails it, and so
    does a run three times as long. At 2 req/s (below capacity) every length passes."""
    transient = simulate_serving(_scenario(4.0, 400)).summary
    assert transient.ttft_p99_s < 2.0 and transient.tpot_p99_s < 0.05
    make = lambda rate: lambda n: _scenario(rate, n)  # noqa: E731
    steady = steady_probe(make(4.0), 4.0, 2.0, 0.05, e2e_hint_s=60.0)
    assert not steady.passed and steady.end == "ttft_p99" and steady.measured >= 400
    longer = steady_probe(make(4.0), 4.0, 2.0, 0.05, e2e_hint_s=60.0, requests=3 * steady.requests)
    assert not longer.passed
    below = steady_probe(make(2.0), 2.0, 2.0, 0.05, e2e_hint_s=60.0)
    assert below.passed and below.end == "measured" and below.certain(2.0, 0.05)
    for n in (400, 3 * below.requests):
        assert steady_probe(make(2.0), 2.0, 2.0, 0.05, e2e_hint_s=60.0, requests=n).passed


def test_drift_is_a_significant_rise_across_the_window():
    rng = np.random.default_rng(3)
    flat = rng.exponential(1.0, 2000)
    assert not S.drifting(flat)
    rising = flat * np.linspace(1.0, 1.5, 2000)  # 50% higher at the end than at the start
    assert S.drifting(rising)
    assert not S.drifting(flat * np.linspace(1.0, 1.05, 2000))  # significant perhaps, but under 10%
    assert not S.drifting(rising[:50])  # too few to say


def test_a_pass_that_touched_a_capacity_limit_is_run_again_longer():
    from types import SimpleNamespace

    from sim.plan.probe import saturated

    ok = SimpleNamespace(preemptions=0, hbm_peak_bytes=50.0, hbm_capacity_bytes=100.0, max_running=10)
    assert not saturated(ok, 256)
    assert saturated(SimpleNamespace(**{**vars(ok), "preemptions": 1}), 256)
    assert saturated(SimpleNamespace(**{**vars(ok), "hbm_peak_bytes": 96.0}), 256)
    assert saturated(SimpleNamespace(**{**vars(ok), "max_running": 256}), 256)
