"""What `kvsim plan --out DIR` writes, defined once: plan.csv (PLAN_COLUMNS, one row per
candidate, ranked), probes.csv (one row per simulation the search ran) and plan.json (what was asked).

The report's "Serving plan" section is drawn from these three files alone (sim/report/plan_input.py
reads them back): latency against offered rate from the probes, max rates and the ranking from
plan.csv, titles and SLO lines from plan.json.
"""

from __future__ import annotations

from pydantic import Field

from sim.outputs.csv_text import csv_text
from sim.outputs.run_folder import to_json
from sim.outputs.schema import Document

PLAN_CSV, PROBES_CSV, PLAN_JSON = "plan.csv", "probes.csv", "plan.json"
PLAN_FILES = (PLAN_CSV, PROBES_CSV, PLAN_JSON)

# One row per candidate, ranked (`search.search`). `layout`: "TP4 x 2" (two replicas of a 4-GPU
# tensor-parallel group), or disaggregated "1P(TP2) + 3D(TP2)" (`tp` and `dp` then the decode
# instances', `prefill` "1xTP2": the prefill instances; empty for an aggregated layout). `experts`: a
# mixture of experts' layout - empty (experts split by tensor parallelism), ep (whole experts split over
# the group, layout "TP8+EP8") or ep+dpa (and attention data-parallel, "DPA8+EP8"). `max_num_seqs`:
# the scheduler's cap on running sequences per instance (a searched dimension: --max-num-seqs);
# `max_num_batched_tokens`: its token budget per step where --max-num-batched-tokens searched one
# (empty: the scenario's). `output`: exact, or lossy for a policy that deletes tokens. `status`: pass,
# fail (simulated), screened (the analytic screen's max rate is far below the rate: not simulated),
# unsearched (cheaper configurations already passed: not simulated), pruned (cannot hold the model).
# `screen_max_rate_per_s`: the screen's estimate (sim.plan.screen). `usd_per_million_tokens`: $/hour
# over the output tokens an hour at the rate asked. `verdict_requests` and `verdict_duration_s`: the
# run length of the probe at the rate asked (one replica); `host_peak_bytes`: its host memory peak (the
# host KV pool a tiered launch command asks for).
PLAN_COLUMNS = ["rank", "gpu", "gpus", "tp", "pp", "dp", "prefill", "experts", "layout", "max_num_seqs", "max_num_batched_tokens", "policy", "output", "status", "usd_per_hour",
                "usd_per_million_tokens", "ttft_p99_ms", "tpot_p99_ms", "max_rate_per_s", "max_rate_capped",
                "next_rate_per_s", "screen_max_rate_per_s", "binding", "reason", "verdict_requests",
                "verdict_duration_s", "host_peak_bytes", "price_source"]

# One row per probe, in the order the search ran them for each candidate (sim.plan.probe: a
# steady-state run). `offered_rate_per_s` and `goodput_req_per_s` are the whole configuration's
# (each of `dp` replicas serves rate / dp); latencies are one replica's, over its measured requests
# (arrivals after the warm-up, before the cool-down). `goodput_req_per_s`: the offered rate x the
# share of measured requests that met every target - one definition, used everywhere in the plan.
# `pool`: aggregated, or prefill / decode (a disaggregated candidate probes both pools at each rate; its
# prefill row's TTFT includes the K/V transfer). `step`: rate (the rate asked), screen (the screen's max rate), below screen (that over 1 + the
# tolerance), above screen (a passing screen rate x (1 + tolerance), then x its square, ...), double, below failed (the lowest failing rate over 1 + the tolerance: `evaluate.next_rate`)
# or bisect. `end`: how the run
# ended - measured (every measured request finished), ttft_p99 / tpot_p99 (so many were already past
# the target that the p99 must be: its percentiles are left empty), overloaded (the queue diverged),
# does_not_fit. `requests`, `measured`, `window_s` (the measured arrivals' span), `duration_s`
# (simulated time) and `runs` (the window grows until the p99s converge) say how long it ran;
# `*_p99_lo_ms`/`*_p99_hi_ms`: a 95% interval (batch means); `certain`: the verdict holds at 95% (each
# target outside its interval, or the interval within +-10%, or the run stopped at the verdict). `slo_missed`: empty when the probe
# passed, else the keys in MISS_KEYS it missed, joined by ';'.
PROBE_COLUMNS = ["candidate", "gpu", "gpus", "tp", "dp", "policy", "pool", "probe", "step", "offered_rate_per_s", "passed",
                 "slo_missed", "end", "requests", "measured", "window_s", "duration_s", "runs", "certain",
                 "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_p99_lo_ms", "ttft_p99_hi_ms",
                 "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "tpot_p99_lo_ms", "tpot_p99_hi_ms",
                 "e2e_p99_ms", "e2e_mean_ms", "goodput_req_per_s", "reason"]
PROBE_STEPS = ("rate", "screen", "below screen", "above screen", "double", "below failed", "bisect")
MISS_TTFT, MISS_TPOT, MISS_FIT, MISS_OVERLOAD = "ttft_p99", "tpot_p99", "does_not_fit", "overloaded"
MISS_KEYS = (MISS_TTFT, MISS_TPOT, MISS_FIT, MISS_OVERLOAD)


def candidate_key(gpu: str, gpus: int, tp: int, policy: str, prefill: str | None = None,
                  max_num_seqs: int | None = None, experts: str | None = None, pp: int = 1,
                  max_num_batched_tokens: int | None = None) -> str:
    """One candidate's name in probes.csv; plan.csv's gpu, gpus, tp, pp, policy, prefill, max_num_seqs,
    experts and max_num_batched_tokens columns give the same."""
    return (f"{gpu} x{int(gpus)} tp{int(tp)}" + (f" pp{int(pp)}" if pp > 1 else "") + (f" {experts}" if experts else "") + f" {policy}"
            + (f" prefill {prefill}" if prefill else "") + (f" seqs {int(max_num_seqs)}" if max_num_seqs else "")
            + (f" tokens {int(max_num_batched_tokens)}" if max_num_batched_tokens else ""))


def prefill_label(prefill: tuple[int, int] | None) -> str | None:
    """plan.csv's `prefill` of a disaggregated candidate: "2xTP1" (2 prefill instances of one GPU)."""
    return None if not prefill else f"{prefill[0]}xTP{prefill[1]}"


def parse_prefill_label(label: str | None) -> tuple[int, int] | None:
    """`prefill_label` back: "2xTP1" -> (2, 1); empty -> None."""
    if not label:
        return None
    x, tp = label.split("xTP")
    return int(x), int(tp)


class PlanDoc(Document):
    """plan.json: the search that wrote the folder."""

    scenario: str  # the scenario's name
    scenario_path: str
    model: str
    rate_per_s: float = Field(gt=0.0)
    ttft_p99_ms: float | None = Field(None, gt=0.0)
    tpot_p99_ms: float | None = Field(None, gt=0.0)
    requests: int | None = Field(None, ge=1)  # per simulation; None: steady-state probes sized themselves
    top: int = Field(5, ge=0)  # the search stopped once this many exact configurations passed (0: every one)
    max_factor: float = Field(ge=1.0)  # the max-rate search stops at max_factor x rate_per_s
    tolerance: float = Field(gt=0.0)  # ... or when its bracket is within this fraction
    gpus: list[str]
    counts: list[int]
    policies: list[str]
    replicas: bool  # every TP x DP layout was searched
    disagg: bool = False  # ... and every prefill/decode split
    pareto: bool = False  # ... and every candidate that may lie on a GPU count's Pareto front (--pareto)
    max_num_seqs: list[int] = []  # the caps on running sequences searched
    max_num_batched_tokens: list[int] = []  # the token budgets searched (empty: the scenario's)
    prices_source: str
    price_overrides: list[str]
    kvtier_version: str
    engine: str | None = None  # the engine the plan assumed (`answer.engine_phrase`); None in folders from before it


def plan_json(doc: PlanDoc) -> str:
    return to_json(doc) + "\n"


def plan_csv(rows: list[dict]) -> str:
    import pandas as pd

    df = pd.DataFrame(rows, columns=PLAN_COLUMNS)
    df["rank"] = df["rank"].astype("Int64")
    return csv_text(df)


def probes_csv(probes: list[dict]) -> str:
    import pandas as pd

    return csv_text(pd.DataFrame(probes, columns=PROBE_COLUMNS))


def plan_dir_files(rows: list[dict], probes: list[dict], doc: PlanDoc) -> dict[str, str]:
    """{file name: text} for sim.outputs.atomic.write_dir_atomic: the three files replaced together."""
    return {PLAN_CSV: plan_csv(rows), PROBES_CSV: probes_csv(probes), PLAN_JSON: plan_json(doc)}
