"""`kvsim plan`: the cheapest serving configurations that meet a latency SLO at a request rate.

Candidates are GPU kind x GPU count N x split (tensor parallelism tp = N, and - where a smaller
tensor-parallel group holds the model - the most replicas: the smallest feasible tp, N/tp data-parallel
replicas behind a load balancer that spreads requests evenly, each simulated at rate/replicas) x KV policy (full_hbm, evict_only, tiered at
hbm_ratio 0.25/0.5 and auto - tiering only under memory pressure - with the scenario's other policy fields;
with --access, each tiered one also with host_attention or split access). Before anything is simulated a
candidate is pruned when the model cannot be sharded over N GPUs (`ModelSpec.tp_problem`) or one
GPU's weight shard plus the runtime reserve exceeds its memory. Each survivor is simulated
(`sim.serving.run.simulate_serving`, step detail) with Poisson arrivals at the rate asked, the
scenario's prompt and output lengths and a fixed seed, and its p99 TTFT and TPOT checked against the
SLO; a passing one's highest sustainable rate is found by bisection on the rate (doubling from the
rate until one fails, then geometric bisection until the bracket is within `tolerance`; capped at
`max_factor` x the rate). Cost is N x an assumed
$/GPU-hour (sim/catalog/prices.yaml, `--price` overrides); passing rows rank by $/hour, then by max
rate. Each candidate's search is one task of the sweep machinery (`CandidateTask`, sim.runner.tasks):
local processes or Ray, and with a result store (--cache) a rerun simulates only candidates it has
not stored (prices are applied afterwards, so a new --price reuses every one).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any, ClassVar

import yaml

from sim.inputs import catalog
from sim.inputs.cost import over_budget, serving_steps
from sim.inputs.errors import ConfigError
from sim.inputs.limits import (
    MAX_ARRIVAL_S,
    MAX_PLAN_STEPS,
    MAX_RATE_FACTOR,
    MAX_RATE_PER_S,
    MAX_SECONDS,
    MAX_USD_PER_GPU_HOUR,
)
from sim.inputs.requests import build_requests
from sim.inputs.scenario import Scenario, scenario_from_dict
from sim.inputs.serving_config import PoissonArrivals
from sim.model.units import GB
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.runner.options import Execution
from sim.runner.store import NUMBER, OPTIONAL_NUMBER, OPTIONAL_TEXT, file_digests, has_fields, result_key
from sim.runner.tasks import run_tasks

from .files import MISS_FIT, MISS_TPOT, MISS_TTFT, PLAN_COLUMNS, candidate_key

DEFAULT_COUNTS = (1, 2, 4, 8)
TIERED_RATIOS = (0.25, 0.5, 0.75)
# by default tiered at 25% and 50% HBM and auto; 75% sits between 50% and full_hbm (`--policies tiered` adds it)
DEFAULT_POLICIES = ("full_hbm", "evict_only", "tiered:0.25", "tiered:0.5", "tiered:auto")
ACCESS = ("prefetch", "host_attention", "split")  # a tiered policy's /ACCESS suffix (prefetch: none)
MAX_COUNT = 64
MAX_REQUESTS_PLAN = 100_000
NEAR_FULL = 0.95  # a peak within 5% of capacity counts as that resource binding



@dataclass(frozen=True)
class PlanSpec:
    """What a configuration must do: `rate` requests/s with p99 TTFT <= ttft_s and p99 TPOT <= tpot_s."""

    rate: float
    ttft_s: float | None
    tpot_s: float | None
    requests: int = 400
    max_factor: float = 4.0  # the max-rate search stops at max_factor x rate
    tolerance: float = 0.1  # ... or when the bracket's upper end is within 10% of its lower


@dataclass(frozen=True)
class Candidate:
    gpu: str
    count: int  # GPUs in all
    policy: str
    tp: int | None = None  # GPUs per replica (default: all of them)

    @property
    def tp_size(self) -> int:
        return self.tp or self.count

    @property
    def replicas(self) -> int:
        return self.count // self.tp_size


# ---- inputs ----------------------------------------------------------------------------------
def parse_list(text: str | None, field: str) -> list[str]:
    items = [t.strip() for t in (text or "").split(",")]
    if not text or not all(items):
        raise ConfigError(f"expected a comma-separated list, got {text!r}", field=field)
    return items


def parse_gpus(text: str | None) -> list[str]:
    if text is None:
        return list(catalog.gpus())
    out = []
    for name in parse_list(text, "--gpus"):
        try:
            g = catalog.gpu(name).name
        except ConfigError as err:
            raise ConfigError(err.message, field="--gpus") from None
        if g not in out:
            out.append(g)
    return out


def parse_counts(text: str | None) -> list[int]:
    if text is None:
        return list(DEFAULT_COUNTS)
    out = []
    for item in parse_list(text, "--counts"):
        if not item.isdigit() or not 1 <= int(item) <= MAX_COUNT:
            raise ConfigError(f"expected GPU counts from 1 to {MAX_COUNT}, got {item!r}", field="--counts")
        if int(item) not in out:
            out.append(int(item))
    return sorted(out)


def parse_policies(text: str | None, access: str | None = None) -> list[str]:
    """full_hbm, evict_only, tiered (the three default hbm_ratios and auto), tiered:RATIO (0 < RATIO <= 1) or
    tiered:auto (sim/tiering/pressure.py), a tiered one optionally as tiered:X/ACCESS (host_attention, split).
    `access` (--access, a list of ACCESS) gives every tiered policy without a suffix each strategy listed."""
    accesses = [None]
    if access is not None:
        accesses = []
        for a in parse_list(access, "--access"):
            if a not in ACCESS:
                raise ConfigError(f"expected {', '.join(ACCESS)}, got {a!r}", field="--access")
            accesses.append(None if a == "prefetch" else a)
    out: list[str] = []
    for item in parse_list(text, "--policies") if text is not None else DEFAULT_POLICIES:
        item, _, suffix = item.partition("/")
        if item in ("full_hbm", "evict_only"):
            if suffix:
                raise ConfigError(f"an access strategy applies to tiered policies, got {item}/{suffix}", field="--policies")
            out += [item] if item not in out else []
            continue
        if item == "tiered":
            names = [f"tiered:{r:g}" for r in TIERED_RATIOS] + ["tiered:auto"]
        elif item == "tiered:auto":
            names = [item]
        elif item.startswith("tiered:"):
            try:
                r = float(item.split(":", 1)[1])
            except ValueError:
                r = math.nan
            if not 0.0 < r <= 1.0:
                raise ConfigError(f"expected tiered:RATIO with 0 < RATIO <= 1 or tiered:auto, got {item!r}",
                                  field="--policies")
            names = [f"tiered:{r:g}"]
        else:
            raise ConfigError(f"expected full_hbm, evict_only, tiered, tiered:RATIO or tiered:auto, got {item!r}",
                              field="--policies")
        if suffix and suffix not in ACCESS:
            raise ConfigError(f"expected {item}/ACCESS with ACCESS one of {', '.join(ACCESS)}, got {suffix!r}",
                              field="--policies")
        for a in ([None if suffix == "prefetch" else suffix] if suffix else accesses):
            out += [n + (f"/{a}" if a else "") for n in names if n + (f"/{a}" if a else "") not in out]
    return out


def load_prices() -> dict[str, tuple[float, str]]:
    """{gpu: ($/GPU-hour, source)} from sim/catalog/prices.yaml."""
    data = yaml.safe_load(resources.files("sim").joinpath("catalog", "prices.yaml").read_text())
    return {catalog.gpu(e["gpu"]).name: (float(e["usd_per_gpu_hour"]), str(e["source"])) for e in data["prices"]}


def parse_prices(items: list[str]) -> dict[str, tuple[float, str]]:
    """The catalog's prices with `GPU=DOLLARS_PER_HOUR` overrides."""
    prices = load_prices()
    for item in items:
        name, sep, value = item.partition("=")
        try:
            usd = float(value.strip().lstrip("$"))
        except ValueError:
            usd = math.nan
        if not sep or not name.strip() or not math.isfinite(usd) or usd < 0:
            raise ConfigError(f"expected GPU=DOLLARS_PER_HOUR, e.g. h100-sxm=2.5, got {item!r}", field="--price")
        if usd > MAX_USD_PER_GPU_HOUR:
            raise ConfigError(f"expected at most {MAX_USD_PER_GPU_HOUR:,.0f} $ per GPU-hour, got {item!r}", field="--price")
        try:
            g = catalog.gpu(name).name
        except ConfigError as err:
            raise ConfigError(err.message, field="--price") from None
        prices[g] = (usd, f"--price {g}={usd:g}")
    return prices


def check_spec(spec: PlanSpec) -> None:
    """Every figure of the search within a range that means something; each refusal one line."""
    ms = lambda s: None if s is None else s * 1e3  # noqa: E731
    for field, value in (("--rate", spec.rate), ("--ttft-p99-ms", ms(spec.ttft_s)), ("--tpot-p99-ms", ms(spec.tpot_s))):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ConfigError(f"expected a positive number, got {value:g}", field=field)
    for field, value in (("--ttft-p99-ms", ms(spec.ttft_s)), ("--tpot-p99-ms", ms(spec.tpot_s))):
        if value is not None and value > MAX_SECONDS * 1e3:
            raise ConfigError(f"expected at most {MAX_SECONDS * 1e3:,.0f} ms (an hour), got {value:g}", field=field)
    if spec.ttft_s is None and spec.tpot_s is None:
        raise ConfigError("give --ttft-p99-ms, --tpot-p99-ms or both (or a scenario with slo:)", field="--ttft-p99-ms")
    if not 1 <= spec.requests <= MAX_REQUESTS_PLAN:
        raise ConfigError(f"expected 1 to {MAX_REQUESTS_PLAN:,} requests, got {spec.requests}", field="--requests")
    if not (math.isfinite(spec.max_factor) and 1.0 <= spec.max_factor <= MAX_RATE_FACTOR):
        raise ConfigError(f"expected 1 to {MAX_RATE_FACTOR:g}, got {spec.max_factor:g}", field="--max-factor")
    if spec.rate * spec.max_factor > MAX_RATE_PER_S:
        raise ConfigError(f"expected at most {MAX_RATE_PER_S:g} req/s, --max-factor times it included (the search "
                          f"probes up to {spec.rate * spec.max_factor:g}), got {spec.rate:g}", field="--rate")
    if spec.requests / spec.rate > MAX_ARRIVAL_S / 2:  # the last of the requests arrives about then
        raise ConfigError(f"expected at least {2 * spec.requests / MAX_ARRIVAL_S:.3g} req/s: {spec.requests:,} requests "
                          f"at {spec.rate:g} req/s would arrive over {spec.requests / spec.rate:.3g} s, beyond the "
                          f"horizon a run may span ({MAX_ARRIVAL_S:g} s)", field="--rate")


# ---- candidates --------------------------------------------------------------------------------
def candidate_scenario(base: Scenario, cand: Candidate, rate: float, spec: PlanSpec) -> Scenario:
    """The base scenario on `cand` (tp = its count), Poisson arrivals at `rate`, step detail and the
    plan's SLO. Hardware overrides that belong to the base GPU (link, host, copy engines) are kept
    only for that GPU; a measured profile is not used."""
    data = base.model_dump(mode="json")
    hw = dict(data.get("hardware") or {})
    hw.pop("profile", None)
    if catalog.gpu(hw.get("gpu", base.hardware.gpu)).name != cand.gpu:
        for key in ("link", "host", "copy_engines"):
            hw.pop(key, None)
    hw["gpu"] = cand.gpu
    policy = dict(data.get("policy") or {})
    name, _, access = cand.policy.partition("/")
    if name.startswith("tiered:"):
        ratio = name.split(":", 1)[1]
        policy.update(kind="tiered", hbm_ratio=ratio if ratio == "auto" else float(ratio))
        if access:  # host access pipelines its prefetched part per layer
            policy.update(access=access, prefetch="layerwise_async")
    else:
        policy["kind"] = name
    work = dict(data["workload"])
    old = base.workload.arrivals
    seed = getattr(old, "seed", None)
    work["arrivals"] = {"kind": "poisson", "rate_per_s": float(rate), "requests": spec.requests,
                        **({"seed": seed} if seed is not None else {})}
    slo = {k: v * 1000.0 for k, v in (("ttft_ms", spec.ttft_s), ("tpot_ms", spec.tpot_s)) if v is not None}
    data.update(hardware=hw, policy=policy, workload=work, parallel={"tp": cand.tp_size},
                sim={**(data.get("sim") or {}), "detail": "step"}, slo=slo)
    data["name"] = f"plan-{cand.gpu}-x{cand.count}-tp{cand.tp_size}-{cand.policy.replace(':', '-').replace('/', '-')}"
    return scenario_from_dict(data, "plan")


def prune(base: Scenario, gpu: str, count: int) -> str | None:
    """Why `count` x `gpu` (tp = count) cannot hold the model at all, or None."""
    from sim.decode.context import build_context
    from sim.inputs.catalog import resolve_model

    problem = resolve_model(base.model).tp_problem(count)
    if problem:
        return f"cannot shard: {problem}"
    sc = candidate_scenario(base, Candidate(gpu, count, "full_hbm"), 1.0, PlanSpec(1.0, 1.0, None, requests=1))
    ctx = build_context(sc)
    need = ctx.weights_bytes + ctx.hw.runtime_reserve_bytes
    if need > ctx.hw.memory_bytes:
        return (f"does not fit: weights {ctx.weights_bytes / GB:,.1f} GB + reserve {ctx.hw.runtime_reserve_bytes / GB:,.1f} GB "
                f"per GPU > {ctx.hw.memory_bytes / GB:,.1f} GB HBM")
    return None


def feasible_splits(base: Scenario, gpu: str, count: int) -> list[int] | str:
    """The tensor-parallel sizes tried for `count` GPUs: all of them as one group, and the smallest
    group that holds the model (the most replicas); or why even `count` GPUs cannot hold it."""
    why_all = prune(base, gpu, count)
    if why_all:
        return why_all
    smallest = next((tp for tp in range(1, count) if count % tp == 0 and prune(base, gpu, tp) is None), count)
    return sorted({smallest, count})


def _misses(summary, spec: PlanSpec) -> list[tuple[str, str]]:
    """(key in sim.plan.files.MISS_KEYS, text) for each SLO percentile a run missed."""
    if not summary.fits:
        return [(MISS_FIT, f"does not fit: {summary.does_not_fit}")]
    out = []
    for key, label, got, target in ((MISS_TTFT, "p99 TTFT", summary.ttft_p99_s, spec.ttft_s),
                                    (MISS_TPOT, "p99 TPOT", summary.tpot_p99_s, spec.tpot_s)):
        if target is not None and got is not None and got > target:
            out.append((key, f"{label} {got * 1e3:,.0f} ms > {target * 1e3:,.0f} ms (+{(got / target - 1) * 100:,.0f}%)"))
    return out


def slo_misses(summary, spec: PlanSpec) -> list[str]:
    """The SLO percentiles a run missed, each with by how much; empty when it meets the SLO."""
    return [text for _, text in _misses(summary, spec)]


def offered_goodput(summary, rate: float) -> float | None:
    """Requests meeting every SLO target per second of the arrival window: the offered `rate` times
    the share of the run's requests that met them (n requests arrive over n / rate seconds), so it
    equals the rate when every request passes. Not the summary's goodput_req_per_s (vLLM's: per
    second of the whole run, the drain after the last arrival included, so it reads low)."""
    if summary.goodput_req_per_s is None or not summary.duration_s or not summary.requests:
        return None
    good = round(summary.goodput_req_per_s * summary.duration_s)  # that goodput's own count
    return rate * good / summary.requests


def probe_row(cand: Candidate, probe: int, step: str, rate: float, summary, spec: PlanSpec) -> dict:
    """One simulation of the search as a probes.csv row (sim.plan.files.PROBE_COLUMNS)."""
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    misses = _misses(summary, spec)
    return dict(candidate=candidate_key(cand.gpu, cand.count, cand.tp_size, cand.policy), gpu=cand.gpu, gpus=cand.count,
                tp=cand.tp_size, dp=cand.replicas, policy=cand.policy, probe=probe, step=step, offered_rate_per_s=rate,
                passed=not misses, slo_missed=";".join(k for k, _ in misses),
                **{f"{m}_{p}_ms": ms(getattr(summary, f"{m}_{p}_s")) for m in ("ttft", "tpot") for p in ("p50", "p90", "p99")},
                e2e_p99_ms=ms(summary.e2e_p99_s),
                goodput_req_per_s=offered_goodput(summary, rate),  # each replica's share, of the whole rate
                reason="; ".join(t for _, t in misses) or None)


def binding(summary, scenario: Scenario) -> str:
    """The resource that stops a run from meeting the SLO, as far as the summary tells."""
    if not summary.fits:
        return "HBM capacity"
    if summary.preemptions:
        return f"HBM capacity ({summary.preemptions} preemptions)"
    if summary.hbm_peak_bytes is not None and summary.hbm_peak_bytes >= NEAR_FULL * summary.hbm_capacity_bytes:
        return "HBM capacity (KV budget full, admission waits)"
    if summary.host_peak_bytes and summary.host_peak_bytes >= NEAR_FULL * summary.host_capacity_bytes:
        return "host memory"
    link = max(summary.h2d_utilization or 0.0, summary.d2h_utilization or 0.0)
    if link >= LINK_BOTTLENECK_UTILIZATION:
        return f"host link (busy {link:.0%} of the run)"
    if summary.max_running is not None and summary.max_running >= scenario.scheduler.max_num_seqs:
        return "compute/bandwidth (batch at max_num_seqs)"
    return "compute/bandwidth"


def _run(base: Scenario, cand: Candidate, rate: float, spec: PlanSpec):
    """One replica's serving summary at `rate` requests/s for the whole configuration: the load
    balancer gives each of the `replicas` an equal share."""
    from sim.serving.run import simulate_serving

    return simulate_serving(candidate_scenario(base, cand, rate / cand.replicas, spec)).summary


def evaluate(base: Scenario, cand: Candidate, spec: PlanSpec) -> dict:
    """One candidate simulated at the rate asked and, if it meets the SLO, its max rate; under
    "probes", every simulation it took (probe_row)."""
    probes: list[dict] = []

    def run(rate: float, step: str):
        s = _run(base, cand, rate, spec)
        probes.append(probe_row(cand, len(probes) + 1, step, rate, s, spec))
        return s

    return {**_search(base, cand, spec, run), "probes": probes}


def _search(base: Scenario, cand: Candidate, spec: PlanSpec, run) -> dict:
    row = dict(gpu=cand.gpu, gpus=cand.count, tp=cand.tp_size, dp=cand.replicas, policy=cand.policy, status="fail",
               ttft_p99_ms=None, tpot_p99_ms=None, max_rate_per_s=None, max_rate_capped=None,
               next_rate_per_s=None, binding=None, reason=None)
    try:
        s = run(spec.rate, "rate")
    except ConfigError as err:  # e.g. the scenario's other policy ratios and this hbm_ratio exceed 1
        return {**row, "reason": f"invalid: {err.line()}"}
    row.update(ttft_p99_ms=None if s.ttft_p99_s is None else s.ttft_p99_s * 1e3,
               tpot_p99_ms=None if s.tpot_p99_s is None else s.tpot_p99_s * 1e3)
    sc = candidate_scenario(base, cand, spec.rate / cand.replicas, spec)
    misses = slo_misses(s, spec)
    if misses:
        return {**row, "reason": ("SLO missed: " if s.fits else "") + "; ".join(misses), "binding": binding(s, sc)}
    # doubling from the rate asked until a rate fails (or the cap passes), then geometric bisection:
    # every passing rate becomes `lo` and every failing one `hi`, so the max rate is the highest
    # passing probe and next_rate_per_s the lowest failing one
    cap = spec.rate * spec.max_factor
    lo, hi, hi_summary = spec.rate, spec.rate, None
    while hi < cap and hi_summary is None:
        hi = min(hi * 2.0, cap)
        top = run(hi, "double")
        if slo_misses(top, spec):
            hi_summary = top
        else:
            lo = hi
    if hi_summary is not None:
        while hi / lo > 1.0 + spec.tolerance:
            mid = math.sqrt(lo * hi)
            m = run(mid, "bisect")
            if slo_misses(m, spec):
                hi, hi_summary = mid, m
            else:
                lo = mid
    row.update(status="pass", max_rate_per_s=lo, max_rate_capped=hi_summary is None,
               next_rate_per_s=hi if hi_summary is not None else None,
               binding=binding(hi_summary, sc) if hi_summary is not None else "-",
               reason=None if hi_summary is not None else f"meets the SLO up to the search cap {spec.max_factor:g} x --rate")
    return row


# what evaluate returns, as a stored result must hold it (CandidateTask.accepts)
CANDIDATE_RESULT = {"gpu": str, "gpus": int, "tp": int, "dp": int, "policy": str, "status": str,
                    "ttft_p99_ms": OPTIONAL_NUMBER, "tpot_p99_ms": OPTIONAL_NUMBER, "max_rate_per_s": OPTIONAL_NUMBER,
                    "max_rate_capped": (bool, type(None)), "next_rate_per_s": OPTIONAL_NUMBER,
                    "binding": OPTIONAL_TEXT, "reason": OPTIONAL_TEXT, "probes": list}
PROBE_RESULT = {"candidate": str, "gpu": str, "gpus": int, "tp": int, "dp": int, "policy": str, "probe": int, "step": str,
                "offered_rate_per_s": NUMBER, "passed": bool, "slo_missed": str,
                **{f"{m}_{p}_ms": OPTIONAL_NUMBER for m in ("ttft", "tpot") for p in ("p50", "p90", "p99")},
                "e2e_p99_ms": OPTIONAL_NUMBER, "goodput_req_per_s": OPTIONAL_NUMBER, "reason": OPTIONAL_TEXT}


@dataclass(frozen=True)
class CandidateTask:
    """One candidate's search as a task (sim.runner.tasks), keyed by the base scenario (its name aside),
    the files it names, the candidate and the spec: not by prices, applied after."""

    kind: ClassVar[str] = "plan candidate"
    base: Scenario
    cand: Candidate
    spec: PlanSpec

    def inputs(self) -> dict[str, Any]:
        base = {k: v for k, v in self.base.model_dump(mode="json").items() if k != "name"}
        return {"base": base, "files": file_digests(self.base), "candidate": asdict(self.cand), "spec": asdict(self.spec)}

    @property
    def key(self) -> str:
        return result_key(self.kind, self.inputs())

    def run(self) -> dict:
        return evaluate(self.base, self.cand, self.spec)

    def accepts(self, result: Any) -> bool:
        """A stored result is this candidate's search: evaluate's row and probes, of this candidate."""
        if not has_fields(result, CANDIDATE_RESULT) or result["status"] not in ("pass", "fail"):
            return False
        mine = (self.cand.gpu, self.cand.count, self.cand.tp_size, self.cand.replicas, self.cand.policy)
        if (result["gpu"], result["gpus"], result["tp"], result["dp"], result["policy"]) != mine:
            return False
        name = candidate_key(self.cand.gpu, self.cand.count, self.cand.tp_size, self.cand.policy)
        return all(has_fields(p, PROBE_RESULT) and p["candidate"] == name for p in result["probes"])


@dataclass
class PlanResult:
    rows: list[dict]  # PLAN_COLUMNS, ranked
    probes: list[dict]  # sim.plan.files.PROBE_COLUMNS: every simulation, candidate by candidate
    computed: int = 0  # candidates searched by this run
    stored: int = 0  # candidates found in the result store
    damaged: int = 0  # entries the store held but could not verify: searched again


def probes_at_most(spec: PlanSpec) -> int:
    """Simulations one candidate's search may take: the rate, the doublings to the cap, the bisections."""
    doublings = math.ceil(math.log2(spec.max_factor) - 1e-12) if spec.max_factor > 1.0 else 0
    bisections = max(0, math.ceil(math.log2(math.log(2.0) / math.log1p(spec.tolerance)) - 1e-12))
    return 1 + doublings + bisections


def check_plan_cost(base: Scenario, tasks: list[CandidateTask], spec: PlanSpec, *, allow: bool) -> None:
    """The search's simulations together within MAX_PLAN_STEPS (or allowed): each candidate is
    simulated once at least, each run at least `sim.inputs.cost.serving_steps` steps."""
    if not tasks:
        return
    seed = getattr(base.workload.arrivals, "seed", None)  # the lengths every candidate_scenario draws
    arrivals = PoissonArrivals(kind="poisson", rate_per_s=spec.rate, requests=spec.requests, seed=seed)
    requests = build_requests(base.workload.model_copy(update={"arrivals": arrivals}))
    per_run = serving_steps(requests, base.scheduler.max_num_seqs, base.scheduler.max_num_batched_tokens)
    least = len(tasks) * per_run
    if least > MAX_PLAN_STEPS:
        over_budget(f"{len(tasks):,} candidates x at least {per_run:,} simulated steps each (up to {probes_at_most(spec)} "
                    f"simulations a candidate) = at least {least:,} steps, more than the {MAX_PLAN_STEPS:,} a plan may "
                    f"take", allow=allow, field="--requests")


def plan(base: Scenario, spec: PlanSpec, gpus: list[str], counts: list[int], policies: list[str],
         prices: dict[str, tuple[float, str]], workers: int | None = None, replicas: bool = False,
         execution: Execution | None = None) -> list[dict]:
    """Every candidate's row (PLAN_COLUMNS), ranked: search(...).rows."""
    return search(base, spec, gpus, counts, policies, prices, workers=workers, replicas=replicas, execution=execution).rows


def search(base: Scenario, spec: PlanSpec, gpus: list[str], counts: list[int], policies: list[str],
           prices: dict[str, tuple[float, str]], workers: int | None = None, replicas: bool = False,
           execution: Execution | None = None, allow_large: bool = False) -> PlanResult:
    """Every candidate's row (PLAN_COLUMNS), ranked (`replicas`: also the most-replicas split of
    each count, which roughly doubles the search): passing by $/hour then max rate (rank 1, 2, ...),
    then failing, then pruned (rank None); and the probes behind them. The candidates run as
    `execution` says (default: local processes, `workers` of them, no store). A search past
    MAX_PLAN_STEPS is refused before any simulation unless `allow_large` (check_plan_cost)."""
    check_spec(spec)
    for g in gpus:
        if g not in prices:
            raise ConfigError(f"no price for {g} in sim/catalog/prices.yaml; give --price {g}=DOLLARS_PER_HOUR", field="--price")
    rows, todo = [], []
    for g in gpus:
        for n in counts:
            splits = feasible_splits(base, g, n)
            for p in policies:
                if isinstance(splits, str):
                    rows.append(dict(gpu=g, gpus=n, tp=n, dp=1, policy=p, status="pruned", ttft_p99_ms=None,
                                     tpot_p99_ms=None, max_rate_per_s=None, max_rate_capped=None, next_rate_per_s=None,
                                     binding=None, reason=splits))
                else:
                    todo += [CandidateTask(base, Candidate(g, n, p, tp), spec) for tp in (splits if replicas else [n])]
    check_plan_cost(base, todo, spec, allow=allow_large)
    execution = execution or Execution(workers=workers)
    done = run_tasks(todo, execution.runner(), store=execution.store())
    rows += [dict(r) for r in done.results]
    probes = [p for r in rows for p in r.pop("probes", [])]
    for r in rows:
        usd, source = prices[r["gpu"]]
        r.update(usd_per_hour=r["gpus"] * usd, price_source=source)
    order = {"pass": 0, "fail": 1, "pruned": 2}
    rows.sort(key=lambda r: (order[r["status"]], r["usd_per_hour"], -(r["max_rate_per_s"] or 0.0), r["gpu"], r["gpus"]))
    rank = 0
    for r in rows:
        rank += r["status"] == "pass"
        r["rank"] = rank if r["status"] == "pass" else None
    return PlanResult([{c: r[c] for c in PLAN_COLUMNS} for r in rows], probes, done.computed, done.stored_before,
                      done.damaged)
