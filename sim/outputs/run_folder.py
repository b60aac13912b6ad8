"""Writing a run directory and formatting a summary for people."""

from __future__ import annotations

import json
import math
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from sim.device.hardware import SCENARIO as SCENARIO_OVERRIDE
from sim.inputs.accuracy_bands import (
    BATCH_LATENCY,
    OFFLINE_THROUGHPUT,
    SERVED_ITL,
    SERVED_TTFT,
    run_band,
    workload_shape,
)
from sim.inputs.errors import ConfigError
from sim.model.units import GB, MS

from .atomic import write_dir_atomic
from .csv_text import csv_text
from .schema import SimRunSummary


def finite_data(v):
    """JSON-ready data with NaN and infinities as None (JSON has neither), numpy scalars as Python's."""
    if isinstance(v, dict):
        return {k: finite_data(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite_data(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy scalars
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def to_json(document: BaseModel | dict | list, *, sort_keys: bool = False) -> str:
    """A summary (a schema model, or data such as a dict read back from summary.json, or a list of
    rows) as indented JSON: keys in declaration order, NaN and infinities as null. Every JSON the
    tools print or write goes through here, so none holds `NaN` or `Infinity` (not JSON)."""
    data = document.model_dump() if isinstance(document, BaseModel) else document
    return json.dumps(finite_data(data), indent=2, sort_keys=sort_keys, allow_nan=False)


RUNS_DIR = Path("runs")


MAX_FOLDER_NAME = 100


def safe_name(label: str) -> str:
    """`label` as one harmless path component: letters, digits, '.', '_' and '-' kept, any other run
    of characters (a '/', spaces) one '-', no leading dot (no '..', no hidden folder)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", label).lstrip(".-")[:MAX_FOLDER_NAME].rstrip(".-")
    return name or "run"


def default_run_path(label: str, suffix: str = "") -> Path:
    """runs/<label>-<UTC time><suffix>: where a run goes when --out is not given (the label made
    safe_name, so a scenario name cannot put it outside runs/)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return RUNS_DIR / f"{safe_name(label)}-{stamp}{suffix}"


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_out_path(path: str | Path, *, folder: bool, field: str = "--out") -> None:
    """Before any work: `path` can be written as a folder (folder=True; an existing folder is
    written into) or as a file; a path under a file, an existing entry of the other kind or an
    unwritable folder is a ConfigError naming `field`."""
    p = Path(path)
    try:
        if p.exists():
            if folder and not p.is_dir():
                raise ConfigError(f"{p} exists and is not a folder", field=field)
            if not folder and p.is_dir():
                raise ConfigError(f"{p} is a folder; expected the path of a file", field=field)
        base = _nearest_existing(p.parent if not p.exists() or not folder else p)
        if not base.is_dir():
            raise ConfigError(f"{base} is a file; cannot write {p} under it", field=field)
        if not os.access(base, os.W_OK | os.X_OK):
            raise ConfigError(f"cannot write in {base}", field=field)
    except OSError as exc:
        raise ConfigError(f"cannot write {p}: {exc.strerror or exc}", field=field) from None


def write_run_dir(out_dir: str | Path, scenario, summary: BaseModel, steps=None, tables: dict | None = None) -> Path:
    """The resolved scenario, summary.json and the per-step table as steps.csv (or, given `tables`,
    each DataFrame as its named CSV: a serving run's requests.csv and timeline.csv), written as a
    whole (sim/outputs/atomic.py write_dir_atomic): an interrupted write leaves the complete folder or none."""
    from sim.inputs.scenario import scenario_to_yaml

    csvs = tables if tables is not None else {"steps.csv": steps}
    return write_dir_atomic(out_dir, {
        "scenario.resolved.yaml": scenario_to_yaml(scenario),
        **{name: csv_text(table) for name, table in csvs.items()},
        "summary.json": to_json(summary) + "\n",
    })


def _gb(x) -> str:
    return "-" if x is None else f"{x / GB:,.2f} GB"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _auto_rows(s: SimRunSummary) -> list[tuple[str, str]]:
    """hbm_ratio auto: how far pressure pushed the T0 share, and from when."""
    if s.hbm_share_min is None:
        return []
    if s.tiering_from_step is None:
        return [("hbm_ratio auto", "no memory pressure: every token stayed in HBM")]
    return [("hbm_ratio auto", f"tiered under memory pressure from step {s.tiering_from_step:,}; "
                               f"T0 share as low as {100 * s.hbm_share_min:.1f} %")]


def parallel_words(parallel: dict) -> str:
    """A scenario's `parallel:` in words: "tensor parallel", "tensor parallel, experts EP8",
    "attention data-parallel x8, experts EP8"."""
    ep, dp = parallel.get("ep", 1), parallel.get("attention_dp", 1)
    attention_tp = parallel.get("tp", 1) // dp
    words = (f"attention data-parallel x{dp}" + (f" (TP{attention_tp} each)" if attention_tp > 1 else "")
             if dp > 1 else "tensor parallel")
    pp = parallel.get("pp", 1)
    if pp > 1:  # "pipeline of 2 stages x TP2": memory figures are the largest stage's GPU's
        words = f"pipeline of {pp} stages x TP{parallel.get('tp', 1)}"
    return words + (f", experts EP{ep}" if ep > 1 else "")


def _max_batch_text(s: SimRunSummary) -> str:
    """'1352 (full_hbm 1352, evict_only 1476)'; a figure at the search's upper end (sim.max_batch_limit)
    as '4096+': more may fit."""
    limit = s.resolved_scenario.get("sim", {}).get("max_batch_limit")

    def at_limit(n) -> bool:
        return limit is not None and n is not None and n >= limit

    def text(n) -> str:
        return f"{n}+" if at_limit(n) else str(n)

    by = s.max_batch_by_policy
    more = f" (full_hbm {text(by['full_hbm'])}, evict_only {text(by['evict_only'])})" if by else ""
    return text(s.max_batch) + more + (" - the search's limit, sim.max_batch_limit" if at_limit(s.max_batch) else "")


def summary_rows(s: SimRunSummary, measured_on: str | None = None) -> list[tuple[str, str]]:
    """(label, value) rows in reading order. `measured_on`: the device the run's profile measured
    (sim.inputs.profile.measured_device), said beside the GPU so CPU figures never pass for the GPU's."""
    where = f"{s.gpu} (measured figures from {measured_on})" if measured_on else s.gpu
    parallel = s.resolved_scenario.get("parallel", {})
    if parallel.get("tp", 1) > 1:
        where = f"{parallel['tp']} x {where} ({parallel_words(parallel)}; memory figures per GPU)"
    rows = [
        ("scenario", f"{s.scenario}: {s.model} on {where}, batch {s.batch_size}, "
                     f"{s.policy} ({s.semantics}, {s.prefetch})"),
    ]
    if s.fits:
        rows.append(("fits", "yes"))
    else:
        need = s.hbm_peak_bytes
        rows.append(("fits", f"NO - does not fit: needs {_gb(need)} HBM, has {_gb(s.hbm_capacity_bytes)}"
                     + (f"; host needs {_gb(s.host_peak_bytes)}, has {_gb(s.host_capacity_bytes)}" if s.host_shortfall_bytes else "")))
    tput = s.throughput_tok_per_s
    rows += [  # a closed batch is what the public batch-latency rows measured (docs/accuracy.md)
        ("decode throughput", "-" if tput is None else
         f"{tput:,.1f} tok/s" + run_band(BATCH_LATENCY, s.gpu, s.sources, s.model, _batch_shape(s))),
        ("TPOT p50 / p99", "-" if s.tpot_p50_s is None and s.tpot_p99_s is None else
         f"{_f(None if s.tpot_p50_s is None else s.tpot_p50_s / MS, '.3f')} / "
         f"{_f(None if s.tpot_p99_s is None else s.tpot_p99_s / MS, '.3f')} ms"),
        ("HBM peak", _gb(s.hbm_peak_bytes) + f" of {_gb(s.hbm_capacity_bytes)}"),
        ("HBM saved vs full_hbm", _gb(s.hbm_saved_bytes)),
        ("host peak", _gb(s.host_peak_bytes)),
        ("H2D / D2H bytes", f"{_gb(s.h2d_bytes)} / {_gb(s.d2h_bytes)}"),
        ("link utilisation H2D / D2H", f"{_pct(s.h2d_utilization)} / {_pct(s.d2h_utilization)}"),
        ("transfer share / stall share", f"{_pct(s.transfer_share)} / {_pct(s.stall_share)}"),
        ("offloaded / evicted tokens", f"{s.offloaded_tokens:,} / {s.evicted_tokens:,}"),
        *_auto_rows(s),
        ("max batch that fits", _max_batch_text(s)),
    ]
    measured = sorted(k for k, v in s.sources.items() if str(v).startswith("profile"))
    on = f" on {measured_on}" if measured_on else ""
    rows.append(("hardware figures", f"measured{on} ({', '.join(measured)}) from {s.profile}; others datasheet x default efficiency"
                 if measured else "datasheet x default efficiency (no profile)"))
    overridden = sorted(k for k, v in s.sources.items() if v == SCENARIO_OVERRIDE)
    if overridden:
        rows.append(("scenario overrides", ", ".join(overridden)))
    if s.link_bottleneck:
        rows.append(("bottleneck", "host link (a direction is busy >= 90% of decode time)"))
    return rows


def _batch_shape(s: SimRunSummary) -> str | None:
    """A closed batch's workload shape (`workload_shape`): its prompt against its mean output, the prefill's
    token and the decode steps' (`generated_tokens` over the batch); None without a batch."""
    prompt = s.resolved_scenario.get("workload", {}).get("prompt_tokens")
    if not isinstance(prompt, int) or s.batch_size < 1:
        return None
    return workload_shape(prompt, 1 + s.generated_tokens / s.batch_size)


def _ms(x) -> str:
    return "-" if x is None else f"{x / MS:,.1f} ms"


def _f(x, spec: str, unit: str = "") -> str:
    """`x` formatted by `spec` (and followed by `unit`), or "-" where the run left it None (a
    closed-loop run has no offered rate, a run of one-token requests no TPOT)."""
    return "-" if x is None else f"{x:{spec}}{unit}"


def _load(s) -> str:
    """How requests arrived, each kind with the figure it has."""
    if s.arrivals in ("poisson", "gamma"):
        return f"{'Poisson' if s.arrivals == 'poisson' else 'gamma'} at {_f(s.offered_rate_per_s, 'g', ' req/s')}"
    if s.arrivals == "closed_loop":
        return f"closed loop, {_f(s.clients, ',')} clients"
    return str(s.arrivals)


def serving_summary_rows(s) -> list[tuple[str, str]]:
    """(label, value) rows of a ServingSummary, in reading order; a figure the run left None is "-"."""
    parallel = s.resolved_scenario.get("parallel", {})
    gpus = s.tp * parallel.get("pp", 1)
    where = s.gpu if gpus == 1 else f"{gpus} x {s.gpu} ({parallel_words(parallel)}; memory figures per GPU)"
    rows = [("scenario", f"{s.scenario}: {s.model} on {where}, {s.policy}, {_f(s.requests, ',')} requests, {_load(s)}"),
            ("scheduler", f"max_num_seqs {s.max_num_seqs}, max_num_batched_tokens {_f(s.max_num_batched_tokens, ',')}, "
                          f"chunked prefill {'on' if s.chunked_prefill else 'off'}"
                          + (f", max_model_len {s.sources['max_model_len']}" if "max_model_len" in s.sources else ""))]
    if not s.fits:
        rows.append(("fits", f"NO - does not fit: {s.does_not_fit}"))
        return rows

    n = s.requests
    shape = workload_shape(s.total_input_tokens / n, s.total_output_tokens / n) if n else None  # the band's shape

    def band(value, family: str) -> str:  # the public measurements' band, beside a figure the run has
        return "" if value is None else run_band(family, s.gpu, s.sources, s.model, shape)

    rows += [
        ("fits", "yes"),
        ("duration", f"{_f(s.duration_s, ',.1f', ' s')} ({_f(s.steps, ',')} steps)"),
        ("request / output throughput", f"{_f(s.request_throughput_per_s, ',.2f', ' req/s')} / "
                                        f"{_f(s.output_throughput_tok_per_s, ',.0f', ' tok/s')}"
                                        + band(s.output_throughput_tok_per_s, OFFLINE_THROUGHPUT)),
        ("TTFT mean / p50 / p99", f"{_ms(s.ttft_mean_s)} / {_ms(s.ttft_p50_s)} / {_ms(s.ttft_p99_s)}"
                                  + band(s.ttft_p50_s, SERVED_TTFT)),
        ("TPOT mean / p50 / p99", f"{_ms(s.tpot_mean_s)} / {_ms(s.tpot_p50_s)} / {_ms(s.tpot_p99_s)}"
                                  + band(s.tpot_p50_s, SERVED_ITL)),
        ("ITL p50 / p99", f"{_ms(s.itl_p50_s)} / {_ms(s.itl_p99_s)}" + band(s.itl_p50_s, SERVED_ITL)),
        ("E2E mean / p99", f"{_f(s.e2e_mean_s, ',.2f')} / {_f(s.e2e_p99_s, ',.2f', ' s')}"),
    ]
    if s.goodput_req_per_s is not None:
        targets = ", ".join(t for t in (f"TTFT <= {_ms(s.slo_ttft_s)}" if s.slo_ttft_s else "",
                                        f"TPOT <= {_ms(s.slo_tpot_s)}" if s.slo_tpot_s else "") if t)
        rows.append(("goodput", f"{s.goodput_req_per_s:,.2f} req/s ({targets})"))
    rows += [
        ("concurrency mean / running mean / max", f"{_f(s.mean_concurrency, ',.1f')} / {_f(s.mean_running, ',.1f')} / "
                                                  f"{_f(s.max_running, '')}"),
        ("queue mean", _f(s.queue_mean_s, ',.3f', ' s')),
        ("preemptions", f"{_f(s.preemptions, ',')} ({_f(s.preempted_requests, ',')} requests)"),
        *_swap_rows(s),
        ("HBM peak / KV budget", f"{_gb(s.hbm_peak_bytes)} of {_gb(s.hbm_capacity_bytes)} / {_gb(s.kv_budget_bytes)}"),
        ("host peak", _gb(s.host_peak_bytes)),
    ]
    return rows


def _swap_rows(s) -> list[tuple[str, str]]:
    """With swap preemption (only then): what the swaps moved, and the preemptions recomputed instead."""
    if s.preemption != "swap":
        return []
    space = "host memory" if s.swap_space_bytes is None else f"swap space {_gb(s.swap_space_bytes)}"
    return [("swapped out / in", f"{_f(s.swaps, ',')} / {_f(s.swap_ins, ',')} requests, {_gb(s.swap_out_bytes)} / "
                                 f"{_gb(s.swap_in_bytes)} per GPU"),
            ("recompute fallbacks", f"{_f(s.swap_fallbacks, ',')} (no room in {space}, or swap given up)")]
