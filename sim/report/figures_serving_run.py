"""Per-run views of one simulated serving run (a scenario with `workload.arrivals`, simulated by
`sim.serving.run.simulate_serving`): what each request waited for and the engine's state over the run.

- TTFT and TPOT of each request against its arrival time, with the scenario's SLO targets;
- the requests running and waiting (the queue) over time, with the scheduler's max_num_seqs;
- HBM and host memory in use over time (per GPU), against their capacities.

Sentences and tables of the summary's figures are in sim/report/summary_text.py and
sim.outputs.run_folder.serving_summary_rows.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.model.units import GB, MS
from sim.serving.run import ServingResult

from .style import ACTIVITY_COLORS, BASE_LAYOUT, TIER_COLORS

LATENCY_PANELS = (("ttft_s", "TTFT", "slo_ttft"), ("tpot_s", "TPOT", "slo_tpot"))
REQUEST_COLOR = "#1f77b4"
PREEMPTED_COLOR = "#ff7f0e"
SLO_LINE_COLOR = "#b00020"
LIMIT_LINE_COLOR = "#555555"
HOST_SCALE_SHARE = 0.1  # below this share of the host's memory at its peak, the host panel leaves out the capacity line
QUEUE_SERIES = (("running", "running", ACTIVITY_COLORS["compute"]), ("waiting", "waiting (queue)", ACTIVITY_COLORS["stall"]),
                ("swapped", "waiting, K/V swapped to host", ACTIVITY_COLORS["d2h"]))


def latency_title(name: str) -> str:
    return f"TTFT and TPOT of each request against its arrival time - {name}"


def queue_title(name: str) -> str:
    return f"Requests running and waiting over time - {name}"


def memory_title(name: str) -> str:
    return f"HBM and host memory in use over time (per GPU) - {name}"


def _slo_ms(result: ServingResult) -> dict[str, float | None]:
    slo = result.scenario.slo
    return {"slo_ttft": slo.ttft_ms if slo else None, "slo_tpot": slo.tpot_ms if slo else None}


def latency_figure(result: ServingResult) -> go.Figure:
    """One marker per request in each panel (log ms), preempted requests apart; TPOT leaves out
    one-token requests (they have none). The SLO targets, where the scenario has them, as lines."""
    reqs, slo = result.requests, _slo_ms(result)
    span = [0.0, max(float(reqs.arrival_s.max()), 1e-3)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=[f"{label} per request" for _, label, _ in LATENCY_PANELS],
                        horizontal_spacing=0.08)
    fig.update_layout(**BASE_LAYOUT)
    groups = (("requests", reqs[reqs.preemptions == 0], REQUEST_COLOR),
              ("preempted requests", reqs[reqs.preemptions > 0], PREEMPTED_COLOR))
    for col, (metric, label, slo_key) in enumerate(LATENCY_PANELS, start=1):
        for name, rows, color in groups:
            rows = rows.dropna(subset=[metric])
            if rows.empty:
                continue
            fig.add_trace(go.Scatter(
                x=rows.arrival_s, y=rows[metric] / MS, mode="markers", name=name, legendgroup=name, showlegend=col == 1,
                marker={"color": color, "size": 4, "opacity": 0.7},
                customdata=rows[["id", "prompt_tokens", "output_tokens", "preemptions"]].to_numpy(),
                hovertemplate=(f"request %{{customdata[0]}} at %{{x:.2f}} s<br>{label} %{{y:,.1f}} ms<br>"
                               "%{customdata[1]} + %{customdata[2]} tokens, %{customdata[3]} preemptions<extra></extra>")),
                row=1, col=col)
        target = slo[slo_key]
        if target is not None:  # a trace, not a shape: shapes and their labels on a log axis take log10 values
            fig.add_trace(go.Scatter(x=span, y=[target, target], mode="lines", name=f"{label} target {target:,.0f} ms",
                                     line={"color": SLO_LINE_COLOR, "dash": "dash", "width": 1.5}, hoverinfo="name"),
                          row=1, col=col)
    fig.update_xaxes(title_text="arrival time (s)")
    fig.update_yaxes(type="log", title_text="ms (log)")
    fig.update_layout(title_text=latency_title(result.scenario.name))
    return fig


def queue_figure(result: ServingResult) -> go.Figure:
    """The timeline's request counts (each held until the next row), with the running cap."""
    tl = result.timeline
    fig = go.Figure(layout=BASE_LAYOUT)
    for col, name, color in QUEUE_SERIES:
        if col in tl:
            fig.add_trace(go.Scatter(x=tl.t_s, y=tl[col], name=name, mode="lines", line={"color": color, "shape": "hv"},
                                     hovertemplate="%{x:.2f} s<br>%{y:,} requests<extra>" + name + "</extra>"))
    cap = result.summary.max_num_seqs
    fig.add_hline(y=cap, line={"color": LIMIT_LINE_COLOR, "dash": "dot"}, annotation_text=f"max_num_seqs {cap:,}",
                  annotation_position="top left")
    fig.update_layout(title_text=queue_title(result.scenario.name), xaxis_title="time (s)", yaxis_title="requests",
                      yaxis_rangemode="tozero")
    return fig


def _bytes_trace(tl: pd.DataFrame, column: str, name: str, color: str) -> go.Scatter:
    return go.Scatter(x=tl.t_s, y=tl[column] / GB, name=name, mode="lines", line={"color": color, "shape": "hv"},
                      hovertemplate="%{x:.2f} s<br>%{y:,.2f} GB<extra>" + name + "</extra>")


def memory_figure(result: ServingResult) -> go.Figure:
    """Left: HBM in use (weights, activations and reserve, plus the K/V in HBM) against the HBM and
    where the KV budget starts; right: the K/V in host memory (T1 + T2) against the host's memory
    (a line when the peak reaches HOST_SCALE_SHARE of it, else a note)."""
    tl, s = result.timeline, result.summary
    fig = make_subplots(rows=1, cols=2, subplot_titles=["HBM", "host memory"], horizontal_spacing=0.08)
    fig.update_layout(**BASE_LAYOUT)
    fig.add_trace(_bytes_trace(tl, "hbm_bytes", "HBM in use", TIER_COLORS["T0 HBM"]), row=1, col=1)
    fig.add_trace(_bytes_trace(tl, "host_bytes", "host (T1 + T2)", TIER_COLORS["T1 host"]), row=1, col=2)
    fixed = s.hbm_capacity_bytes - s.kv_budget_bytes
    lines = [(1, s.hbm_capacity_bytes, "HBM capacity", "dash"), (1, fixed, "weights, activations, reserve", "dot")]
    host_peak = float(tl.host_bytes.max()) if len(tl) else 0.0
    if host_peak >= HOST_SCALE_SHARE * s.host_capacity_bytes:
        lines.append((2, s.host_capacity_bytes, "host capacity", "dash"))
    else:  # a line at the capacity would flatten the use to the axis: the capacity said in words
        fig.add_annotation(text=f"host capacity {s.host_capacity_bytes / GB:,.1f} GB (off the scale)", showarrow=False,
                           xref="x2 domain", yref="y2 domain", x=0.02, y=0.98, xanchor="left", yanchor="top")
    for col, value, label, dash in lines:
        fig.add_hline(y=value / GB, line={"color": LIMIT_LINE_COLOR if dash == "dot" else SLO_LINE_COLOR, "dash": dash},
                      row=1, col=col, annotation_text=f"{label} {value / GB:,.1f} GB", annotation_position="bottom left")
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text="GB", rangemode="tozero")
    fig.update_layout(title_text=memory_title(result.scenario.name))
    return fig


def serving_run_figures(result: ServingResult) -> list[tuple[str, go.Figure]]:
    """(name, figure) of a run that fits; none for one that does not (it was not timed)."""
    if not result.summary.fits or result.requests.empty:
        return []
    return [("latency", latency_figure(result)), ("queue", queue_figure(result)), ("memory", memory_figure(result))]
