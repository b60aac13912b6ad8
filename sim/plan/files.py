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

# One row per candidate, ranked (`search.search`).
PLAN_COLUMNS = ["rank", "gpu", "gpus", "tp", "dp", "policy", "status", "usd_per_hour", "ttft_p99_ms", "tpot_p99_ms",
                "max_rate_per_s", "max_rate_capped", "next_rate_per_s", "binding", "reason", "price_source"]

# One row per simulation, in the order the search ran them for each candidate. `offered_rate_per_s`
# and `goodput_req_per_s` are the whole configuration's (each of `dp` replicas serves rate / dp);
# latencies are one replica's. `goodput_req_per_s`: requests meeting every SLO target per second of
# the arrival window = offered rate x the share that met them (sim.plan.search.offered_goodput), not
# counting the drain after the last arrival. `step`: rate (the rate asked), double or bisect. `slo_missed`: empty
# when the probe passed, else the keys in MISS_KEYS it missed, joined by ';'.
PROBE_COLUMNS = ["candidate", "gpu", "gpus", "tp", "dp", "policy", "probe", "step", "offered_rate_per_s", "passed",
                 "slo_missed", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
                 "e2e_p99_ms", "goodput_req_per_s", "reason"]
PROBE_STEPS = ("rate", "double", "bisect")
MISS_TTFT, MISS_TPOT, MISS_FIT = "ttft_p99", "tpot_p99", "does_not_fit"
MISS_KEYS = (MISS_TTFT, MISS_TPOT, MISS_FIT)


def candidate_key(gpu: str, gpus: int, tp: int, policy: str) -> str:
    """One candidate's name in probes.csv; plan.csv's gpu, gpus, tp and policy columns give the same."""
    return f"{gpu} x{int(gpus)} tp{int(tp)} {policy}"


class PlanDoc(Document):
    """plan.json: the search that wrote the folder."""

    scenario: str  # the scenario's name
    scenario_path: str
    model: str
    rate_per_s: float = Field(gt=0.0)
    ttft_p99_ms: float | None = Field(None, gt=0.0)
    tpot_p99_ms: float | None = Field(None, gt=0.0)
    requests: int = Field(ge=1)  # per simulation
    max_factor: float = Field(ge=1.0)  # the max-rate search stops at max_factor x rate_per_s
    tolerance: float = Field(gt=0.0)  # ... or when its bracket is within this fraction
    gpus: list[str]
    counts: list[int]
    policies: list[str]
    replicas: bool
    prices_source: str
    price_overrides: list[str]
    kvtier_version: str


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
