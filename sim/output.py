"""Writing a run directory and formatting a summary for people."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from .atomic import write_text_atomic
from .hardware import SCENARIO as SCENARIO_OVERRIDE
from .schema import SimRunSummary
from .units import GB, MS


def to_json(document: BaseModel | dict) -> str:
    """A summary (a schema model, or a dict such as one read back from summary.json) as indented
    JSON: keys in declaration order, NaN and infinities as null."""
    def clean(v):
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if hasattr(v, "item"):  # numpy scalars
            return v.item()
        return v

    data = document.model_dump() if isinstance(document, BaseModel) else document
    return json.dumps(clean(data), indent=2, sort_keys=False)


RUNS_DIR = Path("runs")


def default_run_path(label: str, suffix: str = "") -> Path:
    """runs/<label>-<UTC time><suffix>: where a run goes when --out is not given."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return RUNS_DIR / f"{label}-{stamp}{suffix}"


def write_run_dir(out_dir: str | Path, scenario, summary: BaseModel, steps) -> Path:
    """The resolved scenario, summary.json and the per-step table as steps.csv, each written atomically."""
    from .scenario import scenario_to_yaml

    out = Path(out_dir)
    write_text_atomic(out / "scenario.resolved.yaml", scenario_to_yaml(scenario))
    write_text_atomic(out / "steps.csv", steps.to_csv(index=False))
    write_text_atomic(out / "summary.json", to_json(summary) + "\n")
    return out


def _gb(x) -> str:
    return "-" if x is None else f"{x / GB:,.2f} GB"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _where(s: SimRunSummary) -> str:
    tp = s.resolved_scenario.get("parallel", {}).get("tp", 1)
    return f"{tp} x {s.gpu} (tensor parallel; memory figures per GPU)" if tp > 1 else s.gpu


def summary_rows(s: SimRunSummary) -> list[tuple[str, str]]:
    """(label, value) rows in reading order."""
    rows = [
        ("scenario", f"{s.scenario}: {s.model} on {_where(s)}, batch {s.batch_size}, "
                     f"{s.policy} ({s.semantics}, {s.prefetch})"),
    ]
    if s.fits:
        rows.append(("fits", "yes"))
    else:
        need = s.hbm_peak_bytes
        rows.append(("fits", f"NO - does not fit: needs {_gb(need)} HBM, has {_gb(s.hbm_capacity_bytes)}"
                     + (f"; host needs {_gb(s.host_peak_bytes)}, has {_gb(s.host_capacity_bytes)}" if s.host_shortfall_bytes else "")))
    tput = s.throughput_tok_per_s
    rows += [
        ("decode throughput", "-" if tput is None else f"{tput:,.1f} tok/s"),
        ("TPOT p50 / p99", "-" if s.tpot_p50_s is None else f"{s.tpot_p50_s / MS:.3f} / {s.tpot_p99_s / MS:.3f} ms"),
        ("HBM peak", _gb(s.hbm_peak_bytes) + f" of {_gb(s.hbm_capacity_bytes)}"),
        ("HBM saved vs full_hbm", _gb(s.hbm_saved_bytes)),
        ("host peak", _gb(s.host_peak_bytes)),
        ("H2D / D2H bytes", f"{_gb(s.h2d_bytes)} / {_gb(s.d2h_bytes)}"),
        ("link utilisation H2D / D2H", f"{_pct(s.h2d_utilization)} / {_pct(s.d2h_utilization)}"),
        ("transfer share / stall share", f"{_pct(s.transfer_share)} / {_pct(s.stall_share)}"),
        ("offloaded / evicted tokens", f"{s.offloaded_tokens:,} / {s.evicted_tokens:,}"),
        ("max batch that fits", str(s.max_batch) + (
            f" (full_hbm {s.max_batch_by_policy['full_hbm']}, evict_only {s.max_batch_by_policy['evict_only']})"
            if s.max_batch_by_policy else "")),
    ]
    measured = sorted(k for k, v in s.sources.items() if str(v).startswith("profile"))
    rows.append(("hardware figures", f"measured ({', '.join(measured)}) from {s.profile}; others datasheet x default efficiency"
                 if measured else "datasheet x default efficiency (no profile)"))
    overridden = sorted(k for k, v in s.sources.items() if v == SCENARIO_OVERRIDE)
    if overridden:
        rows.append(("scenario overrides", ", ".join(overridden)))
    if s.link_bottleneck:
        rows.append(("bottleneck", "host link (a direction is busy >= 90% of decode time)"))
    return rows
