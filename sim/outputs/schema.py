"""The output documents, defined once: the per-step table, the run summaries, the validation table.

`kvsim run`, the projection, `hwprobe run`, `hwprobe validate` and the report all read and write
these shapes through this module, so a key or column is spelled in one place. A summary is a frozen
pydantic model (`Document`); its fields, and so the keys of summary.json, come out in declaration
order, which the golden files pin (tests/golden/).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict

from sim.inputs.quiet_defaults import QuietDefaults

# ---- per-step table (steps.csv) --------------------------------------------------------------
STEP_COLUMNS = ["step", "t_s", "step_s", "compute_s", "stall_s", "h2d_bytes", "d2h_bytes",
                "tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3", "hbm_bytes", "host_bytes", "batch_active"]
TIMING_COLUMNS = ["t_s", "step_s", "compute_s", "stall_s", "h2d_bytes", "d2h_bytes"]  # empty when a run does not fit

# ---- run summary (summary.json) ------------------------------------------------------------
P50, P99 = 50, 99
LINK_BOTTLENECK_UTILIZATION = 0.9  # a direction busy this share of decode time is the bottleneck


def tpot_percentiles_s(step_s: np.ndarray) -> tuple[float, float]:
    """(p50, p99) of the time per output token: the decode step times of a batch."""
    return float(np.percentile(step_s, P50)), float(np.percentile(step_s, P99))


class Document(BaseModel):
    """An output document: every key declared, none added, nothing changed once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def fields_in_order(*groups: type[Document]) -> tuple[type[Document], ...]:
    """Bases for a document whose fields (and JSON keys) come out group by group in the order
    given: pydantic collects fields along the reversed MRO, so the bases are listed last first."""
    return groups[::-1]


# -- groups the simulated and the measured summary share (timing figures: None where undefined)
class RunName(Document):
    scenario: str
    model: str


class PolicyName(Document):
    policy: str  # full_hbm | evict_only | tiered
    semantics: str
    prefetch: str


class RunSize(Document):
    batch_size: int
    generated_tokens: int  # over the batch
    steps: int  # decode steps


class DecodeTime(Document):
    decode_s: float | None = None  # the end of the last decode step


class DecodeRates(Document):
    throughput_tok_per_s: float | None = None  # generated tokens / decode_s
    tpot_p50_s: float | None = None  # time per output token: the decode step times
    tpot_p99_s: float | None = None


class LinkFigures(Document):
    h2d_bytes: float | None = None
    d2h_bytes: float | None = None
    h2d_utilization: float | None = None  # share of decode time the direction is busy
    d2h_utilization: float | None = None
    transfer_share: float | None = None  # share of decode time either direction is busy
    stall_share: float | None = None  # share of decode time compute waits for a transfer


class TierTotals(Document):
    offloaded_tokens: int  # moved from HBM to the host (T1, T2)
    evicted_tokens: int  # dropped (T3)
    final_tokens_per_tier: dict[str, int]  # t0..t3 after the last step; empty without steps


class Provenance(Document):
    versions: dict[str, str]  # of the software that wrote it (left out of the golden files)
    resolved_scenario: dict[str, Any]


# -- the simulator's summary: `kvsim run`, `simulate(...).summary`
class _SimHardware(Document):
    gpu: str


class _SimMemory(Document):
    fits: bool
    hbm_shortfall_bytes: float
    host_shortfall_bytes: float
    hbm_capacity_bytes: float
    host_capacity_bytes: float
    hbm_peak_bytes: float
    hbm_saved_bytes: float  # against full_hbm
    host_peak_bytes: float
    offload_in_flight_peak_bytes: float
    runtime_reserve_bytes: float
    weights_bytes: float
    kv_bytes_per_token: float


class _SimPrefill(Document):
    prefill_s: float | None = None


class HostAccess(Document):  # shared with the measured summary
    access: str = "prefetch"  # prefetch | host_attention | split: how attention reaches T1/T2
    host_attention_share: float | None = None  # share of decode time the host CPU attends T1/T2


class _SimLimits(Document):
    link_bottleneck: bool | None = None  # a direction busy >= LINK_BOTTLENECK_UTILIZATION of decode time
    max_batch: int | None = None  # None: not searched (simulate(with_max_batch=False))
    max_batch_by_policy: dict[str, int] | None = None  # the baselines' (full_hbm, evict_only)


class _SimSources(Document):
    sources: dict[str, str]  # hardware figure -> where it came from
    profile: str | None  # the measured profile's path


class _AutoShares(Document):
    """`policy.hbm_ratio: auto` (sim/tiering/pressure.py). Quiet: a fixed-ratio run dumps none of these."""

    hbm_share_min: float | None = None  # the lowest T0 share memory pressure set (1.0: it never tiered)
    tiering_from_step: int | None = None  # the first step whose re-tier moved tokens out of T0 (None: none did)


class SimRunSummary(*fields_in_order(RunName, _SimHardware, PolicyName, RunSize, _SimMemory, TierTotals, _AutoShares,
                                     DecodeTime, _SimPrefill, DecodeRates, LinkFigures, HostAccess, _SimLimits,
                                     _SimSources, Provenance), QuietDefaults):
    """One simulated run. The timing figures are None when the run does not fit; the auto shares are
    left out of dumps while unset (a fixed-ratio run)."""

    QUIET_DEFAULTS = {name: f.default for name, f in _AutoShares.model_fields.items()}


# -- the fast projection's summary: `sim.decode.projection.project`
class ProjectionSummary(Document):
    """The `kvsim run` figures the projection estimates, in its own order (golden projection.json)."""

    fits: bool
    hbm_peak_bytes: float
    host_peak_bytes: float
    hbm_shortfall_bytes: float
    hbm_capacity_bytes: float
    hbm_saved_bytes: float
    max_batch: int | None  # None: not searched (project(with_max_batch=False))
    decode_s: float
    throughput_tok_per_s: float
    tpot_p50_s: float
    h2d_utilization: float
    d2h_utilization: float
    stall_share: float
    transfer_share: float
    h2d_bytes: float
    d2h_bytes: float


# -- the serving summary: `kvsim run` on a scenario with workload.arrivals (`sim.serving`)
# per-request table (requests.csv) and time series (timeline.csv)
REQUEST_COLUMNS = ["id", "arrival_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s",
                   "preemptions", "prompt_tokens", "output_tokens"]
SERVING_TIMELINE_COLUMNS = ["t_s", "running", "waiting", "hbm_bytes", "host_bytes", "step_s", "decodes",
                            "prefill_tokens"]
# with swap preemption (and only then) each table gains columns, after the one named: requests.csv a
# request's swaps (of its preemptions); timeline.csv the requests whose K/V waits on the host
# (`swapped`, of `waiting`) and the K/V bytes swaps moved each way since the previous row, this one
# included (so a column sums to the summary's swap_out_bytes / swap_in_bytes)
SWAP_REQUEST_COLUMNS = {"preemptions": ["swaps"]}
SWAP_TIMELINE_COLUMNS = {"waiting": ["swapped"], "host_bytes": ["swap_out_bytes", "swap_in_bytes"]}
P90 = 90


class _ServingSetup(Document):
    gpu: str
    tp: int
    policy: str
    arrivals: str  # poisson | gamma | closed_loop | trace
    offered_rate_per_s: float | None  # poisson, gamma
    clients: int | None  # closed_loop concurrency
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool


class _ServingMemory(Document):
    """Per GPU. KV budget = HBM - weights - activations - runtime reserve."""

    fits: bool
    does_not_fit: str | None  # why, when it does not
    hbm_capacity_bytes: float
    host_capacity_bytes: float
    weights_bytes: float
    activation_bytes: float  # held for a step of max_num_batched_tokens tokens
    runtime_reserve_bytes: float
    kv_budget_bytes: float
    kv_bytes_per_token: float
    hbm_peak_bytes: float | None = None
    host_peak_bytes: float | None = None


class _ServingVolume(Document):
    requests: int
    total_input_tokens: int
    total_output_tokens: int
    duration_s: float | None = None  # first arrival (t = 0) to the last request's last token
    steps: int | None = None


class _ServingRates(Document):
    """`vllm bench serve`'s figures: requests and output tokens per second of the duration; goodput
    = requests meeting every SLO given, per second (None without slo)."""

    request_throughput_per_s: float | None = None
    output_throughput_tok_per_s: float | None = None
    total_token_throughput_tok_per_s: float | None = None  # prompt + output tokens
    goodput_req_per_s: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None


class _Ttft(Document):  # time to first token, queueing included
    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None


class _Tpot(Document):  # per request: (E2E - TTFT) / (output tokens - 1), requests of 2+ tokens
    tpot_mean_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p99_s: float | None = None


class _Itl(Document):  # every gap between successive tokens of a request, over all requests
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    itl_p99_s: float | None = None


class _E2e(Document):  # arrival to last token
    e2e_mean_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p90_s: float | None = None
    e2e_p99_s: float | None = None


class _ServingQueue(Document):
    queue_mean_s: float | None = None  # arrival to first scheduled
    preemptions: int | None = None
    preempted_requests: int | None = None


class _ServingSwap(Document):
    """Swap preemption (`scheduler.preemption: swap`, sim/serving/swap.py). Quiet (`SERVING_QUIET`):
    a recompute run dumps none of these keys, so its summary.json is what it was before swap existed."""

    preemption: str = "recompute"  # recompute | swap
    swap_space_bytes: float | None = None  # the swap space for T0 copies (absent: host memory alone bounds it)
    swaps: int | None = None  # preemptions whose K/V went to the host
    swap_ins: int | None = None  # ... and came back (the rest were given up: recomputed)
    swap_fallbacks: int | None = None  # preemptions recomputed because the host had no room, + swaps given up
    swap_out_bytes: float | None = None  # K/V copied device->host by swaps (per GPU)
    swap_in_bytes: float | None = None  # and host->device when they resumed


SERVING_QUIET = {name: f.default for name, f in _ServingSwap.model_fields.items()}


class _ServingConcurrency(Document):
    mean_concurrency: float | None = None  # time-average of requests in the system (arrived, not finished)
    mean_running: float | None = None  # time-average of requests the scheduler runs
    max_running: int | None = None


class _ServingLink(Document):
    h2d_utilization: float | None = None  # share of the run the host link is busy, per direction
    d2h_utilization: float | None = None


class ServingSummary(*fields_in_order(RunName, _ServingSetup, _ServingMemory, _ServingVolume, _ServingRates, _Ttft,
                                      _Tpot, _Itl, _E2e, _ServingQueue, _ServingSwap, _ServingConcurrency,
                                      _ServingLink, _SimSources, Provenance), QuietDefaults):
    """One simulated serving run. The timing figures are None when it does not fit; the swap
    figures are left out of dumps while they hold their defaults (a recompute run)."""

    QUIET_DEFAULTS = SERVING_QUIET


LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")  # each with _mean_s, _p50_s, _p90_s, _p99_s
LATENCY_STATS = (("mean", None), ("p50", P50), ("p90", P90), ("p99", P99))


# -- hwprobe's measured summary: `hwprobe run`, `measure_run(...).summary`
class _MeasuredDevice(Document):
    device: str  # cuda | cpu
    device_name: str
    measured: bool  # True: tells a measured summary from a simulated one
    timing: str  # how steps were timed (CUDA events, CPU wall clock)


class _MeasuredHost(Document):
    pinned: bool  # host stores in pinned memory (CUDA only)


class _MeasuredMemory(Document):
    hbm_peak_bytes: float
    hbm_peak_source: str
    # parts of the device memory peak, so validation can explain a gap (the simulator has no workspace)
    attention_workspace_bytes: float
    offload_in_flight_peak_bytes: float
    host_peak_bytes: float


class _MeasuredLinkRates(Document):
    h2d_achieved_bytes_per_s: float | None = None  # None: the direction was never busy
    d2h_achieved_bytes_per_s: float | None = None
    host_enqueue_p50_s: float | None = None  # host time to enqueue a step (launch-bound when near the step time)


class _MeasuredRun(Document):
    layers_model: int
    layers_run: int  # a model too large for the device runs a subset; figures are scaled to full depth
    layer_scale: float
    run_dtype: str
    weight_dtype_run: str
    attention: str
    prefill: str
    scores: str
    weights_bytes: float
    rope: bool
    notes: list[str]


class MeasuredSummary(*fields_in_order(RunName, _MeasuredDevice, PolicyName, _MeasuredHost, RunSize, DecodeTime,
                                       DecodeRates, _MeasuredMemory, LinkFigures, HostAccess, _MeasuredLinkRates,
                                       TierTotals, _MeasuredRun, Provenance)):
    """One run measured on the real tiered KV cache, with the simulator's keys where they mean the same."""


# ---- validation table (hwprobe validate's CSVs) ------------------------------------------------
def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured; None where undefined: a value missing or NaN, or measured 0
    while predicted is not (0 when both are 0)."""
    if predicted is None or measured is None:
        return None
    p, m = float(predicted), float(measured)
    if math.isnan(p) or math.isnan(m):
        return None
    if m == 0.0:
        return 0.0 if p == 0.0 else None
    return (p - m) / m


class ValidationRow(Document):
    """One metric of one scenario, both sides."""

    scenario: str
    metric: str
    predicted: float | None
    measured: float | None
    rel_error: float | None  # relative_error(predicted, measured)


class ErrorStat(Document):
    """One metric over the scenarios (the .errors.csv)."""

    metric: str
    n: int
    median_abs_rel_error: float | None
    worst_rel_error: float | None  # sign kept
    worst_scenario: str | None


class RatioRow(Document):
    """Throughput relative to the scenario's full_hbm baseline, both sides (the .ratios.csv)."""

    scenario: str
    baseline: str
    predicted_ratio: float | None
    measured_ratio: float | None
    rel_error: float | None


ROW_COLUMNS = list(ValidationRow.model_fields)
STAT_COLUMNS = list(ErrorStat.model_fields)
RATIO_COLUMNS = list(RatioRow.model_fields)


class Metric(NamedTuple):
    key: str
    label: str


def _summary_key(name: str) -> str:
    """`name`, a key of both the simulated and the measured summary (else an error at import)."""
    if name not in SimRunSummary.model_fields or name not in MeasuredSummary.model_fields:
        raise KeyError(f"{name!r} is not a key of both run summaries")
    return name


THROUGHPUT = Metric(_summary_key("throughput_tok_per_s"), "throughput tok/s")
TPOT_P50 = Metric(_summary_key("tpot_p50_s"), "step time p50 s")
TRANSFER_SHARE = Metric(_summary_key("transfer_share"), "transfer share")
# not a summary key: measured device memory is what torch allocated (no CUDA context, no allocator
# slack), so the prediction is the simulator's HBM peak less its runtime reserve
DEVICE_MEMORY_PEAK = Metric("device_memory_peak_bytes", "device memory peak B")
H2D_BYTES = Metric(_summary_key("h2d_bytes"), "H2D bytes")
D2H_BYTES = Metric(_summary_key("d2h_bytes"), "D2H bytes")
HOST_PEAK = Metric(_summary_key("host_peak_bytes"), "host memory peak B")
VALIDATION_METRICS = (THROUGHPUT, TPOT_P50, TRANSFER_SHARE, DEVICE_MEMORY_PEAK)  # the accuracy figures
VALIDATION_CHECKS = (H2D_BYTES, D2H_BYTES, HOST_PEAK)  # follow from the tier decisions alone
