"""One candidate's search: its verdict at the rate asked and, if it passes, its max rate.

Every simulation is a steady-state probe (`sim.plan.probe`), sized from the screen's E2E estimate at
its rate (`sim.plan.screen.Curve.at`). The max rate: the screen's estimate is probed first (it
usually overstates by a few percent, so this probe usually fails, and fast), then a rate just
under it by the tolerance (which usually passes and closes the bracket); where the screen's rate
passes, rates above it by 1 + tolerance, then its square, its fourth power, ... (the screen
underestimates by a little where it does at all); without a screen's rate, doubling - each until a
rate fails or the cap (max_factor x the rate) passes; then bisection (`next_rate`) until the bracket
is within `tolerance`.
Every passing rate becomes the bracket's `lo` and every failing one its `hi`, so the max rate is the
highest passing probe and next_rate_per_s the lowest failing one. Each candidate's search is one
task of the sweep machinery (`CandidateTask`, sim.runner.tasks): local processes or Ray, and with a
result store (--cache) a rerun simulates only candidates it has not stored.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, ClassVar

from sim.inputs.errors import ConfigError
from sim.inputs.scenario import Scenario
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.runner.store import NUMBER, OPTIONAL_NUMBER, OPTIONAL_TEXT, file_digests, has_fields, result_key
from sim.serving.fleet import ROUND_ROBIN, simulate_fleet
from sim.serving.steady import Percentile

from .candidates import Candidate, PlanSpec, candidate_scenario
from .disagg import disagg_probe
from .files import PROBE_COLUMNS, candidate_key, prefill_label
from .probe import Probe, steady_probe
from .screen import Curve

NEAR_FULL = 0.95  # a peak within 5% of capacity counts as that resource binding


def binding(probe: Probe, scenario: Scenario, curve: Curve | None) -> str:
    """What stops a probe from meeting the SLO, in hardware words (or the scheduler setting); a
    disaggregated one's names its pool."""
    if probe.parts:
        pool = probe.pool_failed or "decode"
        part = dict(probe.parts)[pool]
        return f"{pool} pool: " + binding(part, scenario, curve if pool == "decode" else None)
    s = probe.summary
    if not s.fits:
        return "HBM capacity"
    if s.preemptions:
        return f"HBM capacity ({s.preemptions} preemptions)"
    if s.hbm_peak_bytes is not None and s.hbm_peak_bytes >= NEAR_FULL * s.hbm_capacity_bytes:
        return "HBM capacity (KV budget full, admission waits)"
    if s.host_peak_bytes and s.host_peak_bytes >= NEAR_FULL * s.host_capacity_bytes:
        return "host memory"
    link = max(s.h2d_utilization or 0.0, s.d2h_utilization or 0.0)
    if link >= LINK_BOTTLENECK_UTILIZATION:
        return f"host link (busy {link:.0%} of the run)"
    seqs = getattr(s, "max_num_seqs", None) or scenario.scheduler.max_num_seqs  # the cap the run applied
    if s.max_running is not None and s.max_running >= seqs:
        room = f"; HBM holds ~{curve.hbm_batch:,.0f}" if curve and curve.hbm_batch > seqs else ""
        return f"scheduler: max_num_seqs={seqs} (batch full{room})"
    if curve is None:
        return "compute/HBM bandwidth"
    k = min(range(len(curve.rate_per_s)), key=lambda i: abs(curve.rate_per_s[i] - probe.rate_per_s))
    return curve.step_binds[k]


def key_of(cand: Candidate) -> str:
    return candidate_key(cand.gpu, cand.count, cand.tp_size, cand.policy, prefill_label(cand.prefill), cand.max_num_seqs,
                         cand.experts, cand.pp, cand.token_budget)


def probe_rows(cand: Candidate, number: int, step: str, rate: float, probe: Probe, ttft_s: float | None,
               tpot_s: float | None) -> list[dict]:
    """A probe's probes.csv rows: one, or a disaggregated candidate's prefill and decode pools."""
    if not probe.parts:
        return [probe_row(cand, number, step, rate, probe, ttft_s, tpot_s)]
    pre, dec = (p for _, p in probe.parts)
    return [probe_row(cand, number, step, rate, pre, ttft_s, None, "prefill", probe.stats),
            probe_row(cand, number + 1, step, rate, dec, None, tpot_s, "decode")]


def probe_row(cand: Candidate, number: int, step: str, rate: float, probe: Probe, ttft_s: float | None,
              tpot_s: float | None, pool: str = "aggregated", ttft_stats: dict | None = None) -> dict:
    """One probe as a probes.csv row (sim.plan.files.PROBE_COLUMNS): rates and goodput are the
    configuration's, latencies and requests one replica's (one pool's; with a load-aware balancer the
    fleet's, `sim.serving.fleet`); a p99 a stopped probe never measured is
    empty. `ttft_stats`: a prefill pool's TTFT with the K/V transfer added."""
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    st = dict(probe.stats)
    if ttft_stats and st:
        st.update({k: v for k, v in ttft_stats.items() if k.startswith("ttft")})
    if pool == "decode" and st:  # its requests arrive with their first token: TTFT is the prefill pool's
        st.update({k: Percentile(None) for k in ("ttft_p50", "ttft_p90", "ttft_p99")})
    row = dict(candidate=key_of(cand), gpu=cand.gpu, gpus=cand.count, pool=pool,
               tp=cand.tp_size, dp=cand.replicas, policy=cand.policy, probe=number, step=step, offered_rate_per_s=rate,
               passed=probe.passed, slo_missed=";".join(k for k, _ in probe.misses), end=probe.end,
               requests=probe.requests, measured=probe.measured, window_s=probe.window_s, duration_s=probe.duration_s,
               runs=probe.runs, certain=probe.certain(ttft_s, tpot_s),
               e2e_mean_ms=ms(probe.e2e_mean_s),
               goodput_req_per_s=None if probe.goodput_share is None else rate * probe.goodput_share,
               reason="; ".join(t for _, t in probe.misses) or None)
    for m in ("ttft", "tpot"):
        for p in ("p50", "p90", "p99"):
            row[f"{m}_{p}_ms"] = ms(st[f"{m}_{p}"].value_s) if st else None
        row[f"{m}_p99_lo_ms"] = ms(st[f"{m}_p99"].lo_s) if st else None
        row[f"{m}_p99_hi_ms"] = ms(st[f"{m}_p99"].hi_s) if st else None
    row["e2e_p99_ms"] = ms(st["e2e_p99"].value_s) if st and "e2e_p99" in st else None
    return {c: row[c] for c in PROBE_COLUMNS}


def e2e_hint_s(curve: Curve | None, rate_per_replica: float) -> float:
    """The screen's E2E at a replica's rate (past its cap: at the cap), or 10 s without a screen."""
    if curve is None:
        return 10.0
    at = curve.at(rate_per_replica) or curve.at(max(curve.rate_per_s))
    return at[2]


def probe_at(base: Scenario, cand: Candidate, spec: PlanSpec, rate: float, curve: Curve | None = None) -> Probe:
    """One steady-state probe of the configuration at `rate` (each replica at rate / replicas; a
    disaggregated one's two pools, `sim.plan.disagg`)."""
    per = float(rate) / cand.replicas
    if cand.prefill:
        return disagg_probe(base, cand, spec, float(rate), e2e_hint_s(curve, per))
    if cand.replicas > 1 and spec.balancer != ROUND_ROBIN:  # the replicas together, the fleet's arrivals
        fleet = partial(simulate_fleet, replicas=cand.replicas, balancer=spec.balancer)
        p = steady_probe(lambda n: candidate_scenario(base, cand, float(rate), spec, requests=n, spread=1), float(rate),
                         spec.ttft_s, spec.tpot_s, e2e_hint_s(curve, per), spec.requests, simulate=fleet)
        p.rate_per_s = per  # a replica's share, as `binding` reads the screen's curve
        return p
    return steady_probe(lambda n: candidate_scenario(base, cand, per, spec, requests=n), per, spec.ttft_s, spec.tpot_s,
                        e2e_hint_s(curve, per), spec.requests)


def evaluate(base: Scenario, cand: Candidate, spec: PlanSpec, curve: Curve | None = None,
             estimate: float | None = None) -> dict:
    """The candidate at the rate asked and, if it passes, its max rate; under "probes", every probe.
    `estimate`: the screen's max rate of the configuration (default: from `curve`)."""
    probes: list[dict] = []

    def run(rate: float, step: str) -> Probe:
        rate = float(rate)
        p = probe_at(base, cand, spec, rate, curve)
        probes.extend(probe_rows(cand, len(probes) + 1, step, rate, p, spec.ttft_s, spec.tpot_s))
        return p

    return {**_search(base, cand, spec, run, curve, estimate), "probes": probes}


def blank_row(cand: Candidate) -> dict:
    """A candidate's row before any figure (a failure until the search says otherwise)."""
    stages = {"pp": cand.pp} if cand.pp > 1 else {}  # (a row without pp has none: as stored before pipelines)
    budget = {"max_num_batched_tokens": cand.token_budget} if cand.token_budget else {}  # (... nor one without a budget)
    return dict(gpu=cand.gpu, gpus=cand.count, tp=cand.tp_size, **stages, dp=cand.replicas, prefill=prefill_label(cand.prefill),
                experts=cand.experts, max_num_seqs=cand.max_num_seqs, **budget, policy=cand.policy, status="fail",
                ttft_p99_ms=None, tpot_p99_ms=None, max_rate_per_s=None, max_rate_capped=None, next_rate_per_s=None,
                binding=None, reason=None, verdict_requests=None, verdict_duration_s=None, host_peak_bytes=None)


def _search(base: Scenario, cand: Candidate, spec: PlanSpec, run, curve: Curve | None, estimate: float | None) -> dict:
    row = blank_row(cand)
    try:
        first = run(spec.rate, "rate")
    except ConfigError as err:  # e.g. the scenario's other policy ratios and this hbm_ratio exceed 1
        return {**row, "reason": f"invalid: {err.line()}"}
    sc = candidate_scenario(base, cand, spec.rate / cand.replicas, spec)
    p99 = lambda p, m: p.stats[f"{m}_p99"].value_s * 1e3 if p.stats and p.stats[f"{m}_p99"].value_s is not None else None  # noqa: E731
    row.update(ttft_p99_ms=p99(first, "ttft"), tpot_p99_ms=p99(first, "tpot"), verdict_requests=first.requests,
               verdict_duration_s=first.duration_s, host_peak_bytes=first.summary.host_peak_bytes)
    if not first.passed:
        why = "; ".join(t for _, t in first.misses)
        return {**row, "reason": ("SLO missed: " if first.summary.fits else "") + why,
                "binding": binding(first, sc, curve)}
    lo, hi, failed = spec.rate, None, None
    cap = spec.rate * spec.max_factor
    screen = estimate if estimate is not None else _screen_rate(curve, cand, spec)
    guess = min(cap, max(screen, spec.rate * (1 + spec.tolerance) * 1.05))
    x, step = (guess, "screen") if guess > spec.rate * (1 + spec.tolerance) else (min(cap, spec.rate * 2), "double")
    growth = 1.0 + spec.tolerance
    while x <= cap and lo < cap:
        p = run(x, step)
        if p.passed:
            lo = x
            if hi is not None:
                break
            if step in ("screen", "above screen"):  # the screen underestimated, most likely by a little:
                x, step = min(cap, x * growth / (1.0 + 1e-6)), "above screen"  # x 1.1, 1.21, 1.46, ... above it
                growth *= growth
            else:
                x, step = min(cap, x * 2.0), "double"
            if lo >= cap:
                break
        else:
            hi, failed = x, p
            break
    if hi is not None and step == "screen" and hi / lo > 1.0 + spec.tolerance:
        # the screen overstates by a few percent where it is right at all: just under it first
        x = hi / (1.0 + spec.tolerance) * (1.0 + 1e-6)
        p = run(x, "below screen")
        if p.passed:
            lo = x
        else:
            hi, failed = x, p
    while hi is not None and hi / lo > 1.0 + spec.tolerance:
        x, step = next_rate(lo, hi, spec.tolerance)
        p = run(x, step)
        if p.passed:
            lo = x
        else:
            hi, failed = x, p
    row.update(status="pass", max_rate_per_s=float(lo), max_rate_capped=hi is None, next_rate_per_s=hi,
               binding=binding(failed, candidate_scenario(base, cand, hi / cand.replicas, spec), curve) if failed else "-",
               reason=None if failed else f"meets the SLO up to the search cap {spec.max_factor:g} x --rate")
    return row


def next_rate(lo: float, hi: float, tolerance: float) -> tuple[float, str]:
    """The next probe of a bracket [lo passes, hi fails] wider than 1 + tolerance, and its step name.
    Within (1 + tol)^2 < hi / lo <= (1 + tol)^3 just under hi by the tolerance ("below failed"): a
    pass there closes the bracket at once, a failure leaves one within (1 + tol)^2, which one bisection
    closes - never more probes than bisecting (two, whatever they find), one fewer where the max rate
    lies near hi, as it does after the screen's estimate fails (the screen overstates by ~10%:
    benchmarks/plan_speed.py). Otherwise the geometric midpoint ("bisect")."""
    r = 1.0 + tolerance
    if r * r < hi / lo <= r ** 3:
        return hi / r * (1.0 + 1e-6), "below failed"
    return math.sqrt(lo * hi), "bisect"


def _screen_rate(curve: Curve | None, cand: Candidate, spec: PlanSpec) -> float:
    """The configuration's max rate by the screen (0 without one)."""
    return cand.replicas * curve.max_rate(spec.ttft_s, spec.tpot_s)[0] if curve is not None else 0.0


# what evaluate returns, as a stored result must hold it (CandidateTask.accepts)
CANDIDATE_RESULT = {"gpu": str, "gpus": int, "tp": int, "dp": int, "prefill": OPTIONAL_TEXT, "experts": OPTIONAL_TEXT,
                    "max_num_seqs": (int, type(None)), "policy": str, "status": str,
                    "ttft_p99_ms": OPTIONAL_NUMBER, "tpot_p99_ms": OPTIONAL_NUMBER, "max_rate_per_s": OPTIONAL_NUMBER,
                    "max_rate_capped": (bool, type(None)), "next_rate_per_s": OPTIONAL_NUMBER,
                    "binding": OPTIONAL_TEXT, "reason": OPTIONAL_TEXT, "verdict_requests": (int, type(None)),
                    "verdict_duration_s": OPTIONAL_NUMBER, "host_peak_bytes": OPTIONAL_NUMBER, "probes": list}
PROBE_RESULT = {"candidate": str, "gpu": str, "gpus": int, "tp": int, "dp": int, "policy": str, "pool": str, "probe": int,
                "step": str,
                "offered_rate_per_s": NUMBER, "passed": bool, "slo_missed": str, "end": str, "requests": int,
                "measured": int, "window_s": NUMBER, "duration_s": NUMBER, "runs": int, "certain": bool,
                **{f"{m}_{p}_ms": OPTIONAL_NUMBER for m in ("ttft", "tpot") for p in ("p50", "p90", "p99", "p99_lo", "p99_hi")},
                "e2e_p99_ms": OPTIONAL_NUMBER, "e2e_mean_ms": OPTIONAL_NUMBER, "goodput_req_per_s": OPTIONAL_NUMBER,
                "reason": OPTIONAL_TEXT}


@dataclass(frozen=True)
class CandidateTask:
    """One candidate's search as a task (sim.runner.tasks), keyed by the base scenario (its name aside),
    the files it names, the candidate and the spec: not by prices, applied after, nor by the screen's
    curve and estimate, which the rest determines."""

    kind: ClassVar[str] = "plan candidate"
    base: Scenario
    cand: Candidate
    spec: PlanSpec
    curve: Curve | None = None
    estimate: float | None = None  # the screen's max rate (a disaggregated one's: the smaller pool's)

    def inputs(self) -> dict[str, Any]:
        base = {k: v for k, v in self.base.model_dump(mode="json").items() if k != "name"}
        spec = asdict(self.spec)
        if spec["balancer"] == ROUND_ROBIN:  # the default: keys stored before there was a choice still hold
            del spec["balancer"]
        cand = asdict(self.cand)
        if cand["pp"] == 1:  # no pipeline: keys stored before there were pipeline layouts still hold
            del cand["pp"]
        if cand["token_budget"] is None:  # the scenario's budget: ... and before budgets were searched
            del cand["token_budget"]
        return {"base": base, "files": file_digests(self.base), "candidate": cand, "spec": spec,
                "search": "steady-state probes, screen-bracketed, above a passing screen, below the lowest failure"}

    @property
    def key(self) -> str:
        return result_key(self.kind, self.inputs())

    def run(self) -> dict:
        return evaluate(self.base, self.cand, self.spec, self.curve, self.estimate)

    def accepts(self, result: Any) -> bool:
        """A stored result is this candidate's search: evaluate's row and probes, of this candidate."""
        if not isinstance(result, dict) or not isinstance(result.get("pp", 1), int) \
                or not isinstance(result.get("max_num_batched_tokens", 0), int):
            return False
        row = {k: v for k, v in result.items() if k not in ("pp", "max_num_batched_tokens")}  # only some rows have them
        if not has_fields(row, CANDIDATE_RESULT) or result["status"] not in ("pass", "fail"):
            return False
        c = self.cand
        mine = (c.gpu, c.count, c.tp_size, c.replicas, prefill_label(c.prefill), c.experts, c.max_num_seqs, c.policy)
        got = ("gpu", "gpus", "tp", "dp", "prefill", "experts", "max_num_seqs", "policy")
        if tuple(result[k] for k in got) != mine or result.get("pp", 1) != c.pp \
                or result.get("max_num_batched_tokens") != c.token_budget:  # (stored before pp: 1; no budget: None)
            return False
        name = key_of(c)
        return all(has_fields(p, PROBE_RESULT) and p["candidate"] == name for p in result["probes"])
