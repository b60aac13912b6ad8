"""Throughput relative to the `full_hbm` baseline, predicted and measured.

For every scenario of a validation that has a `full_hbm` scenario with the same model, hardware,
workload and simulator settings (everything but the name and the policy), the ratio
throughput(policy) / throughput(full_hbm) on each side. Errors common to both runs (weight
streaming, launch overhead) largely cancel in it, so it checks what the tiering itself costs.
"""

from __future__ import annotations

import json

import pandas as pd

from sim.outputs.schema import RATIO_COLUMNS, THROUGHPUT, RatioRow, relative_error


def workload_key(scenario) -> str:
    """What a scenario and its full_hbm baseline must share: all but name, description and policy."""
    d = scenario.model_dump(mode="json")
    for k in ("name", "description", "policy"):
        d.pop(k, None)
    return json.dumps(d, sort_keys=True)


def _ratio(a, b) -> float | None:
    if a is None or b is None or pd.isna(a) or pd.isna(b) or float(b) == 0.0:
        return None
    return float(a) / float(b)


def ratio_rows(scenarios: list, rows: pd.DataFrame) -> pd.DataFrame:
    """rows: validate's long table (scenario, metric, predicted, measured, ...), possibly partial.
    One row per non-baseline scenario whose baseline has been measured too."""
    tput = rows[rows["metric"] == THROUGHPUT.key].drop_duplicates("scenario").set_index("scenario")
    baselines: dict[str, str] = {}
    for sc in scenarios:
        if sc.policy.kind == "full_hbm" and sc.name in tput.index:
            baselines.setdefault(workload_key(sc), sc.name)
    out = []
    for sc in scenarios:
        base = baselines.get(workload_key(sc))
        if base is None or base == sc.name or sc.name not in tput.index:
            continue
        p = _ratio(tput.at[sc.name, "predicted"], tput.at[base, "predicted"])
        m = _ratio(tput.at[sc.name, "measured"], tput.at[base, "measured"])
        err = relative_error(p, m) if m else None  # none for a measured ratio of 0
        out.append(RatioRow(scenario=sc.name, baseline=base, predicted_ratio=p, measured_ratio=m,
                            rel_error=err).model_dump())
    return pd.DataFrame(out, columns=RATIO_COLUMNS)


def print_ratios(ratios: pd.DataFrame, console) -> None:
    from rich.table import Table

    if ratios.empty:
        return
    t = Table(title="throughput relative to full_hbm (same model, hardware and workload)")
    for col in ("scenario", "baseline", "predicted", "measured", "rel. error"):
        t.add_column(col, justify="left" if col in ("scenario", "baseline") else "right")

    def cell(v, fmt, scale=1.0, unit=""):
        return "-" if v is None or pd.isna(v) else format(scale * v, fmt) + unit

    for r in ratios.itertuples():
        t.add_row(r.scenario, r.baseline, cell(r.predicted_ratio, ".3f"), cell(r.measured_ratio, ".3f"),
                  cell(r.rel_error, "+.1f", 100.0, " %"))
    console.print(t)
    errs = ratios["rel_error"].dropna().astype(float).abs()
    if len(errs):
        console.print(f"ratio error: median |error| {100 * errs.median():.1f} %, worst {100 * errs.max():.1f} % "
                      f"over {len(errs)} scenario(s)")
