"""Per-run views of one simulated scenario: tier occupancy, HBM and host bytes over the decode,
and the engine's timeline window of compute and host<->device copies with the stalls between."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sim.decode.simulate import SimResult
from sim.device.intervals import uncovered_intervals
from sim.model.units import GB, MS

from .style import ACTIVITY_COLORS, BASE_LAYOUT, TIER_COLORS

MAX_POINTS_PER_SERIES = 1500  # per-step series are thinned to about this many points (every k-th step)
TIER_COLUMNS = (("tokens_t0", "T0 HBM"), ("tokens_t1", "T1 host"), ("tokens_t2", "T2 host, compressed"), ("tokens_t3", "T3 evicted"))
ROW_LABELS = {"compute": "compute", "h2d": "host -> device", "d2h": "device -> host", "stall": "stall (compute waits)"}
TIMELINE_ROWS = ("compute", "h2d", "d2h", "stall")


def thin(steps: pd.DataFrame) -> pd.DataFrame:
    """Every k-th step (and the last), so a long run stays a few thousand points."""
    stride = max(1, int(np.ceil(len(steps) / MAX_POINTS_PER_SERIES)))
    keep = steps.iloc[::stride]
    if len(steps) and keep.index[-1] != steps.index[-1]:
        keep = pd.concat([keep, steps.iloc[[-1]]])
    return keep


def occupancy_figure(result: SimResult) -> go.Figure:
    """Stacked tokens per tier (summed over the batch) after each decode step."""
    s = thin(result.steps)
    fig = go.Figure(layout=BASE_LAYOUT)
    for col, label in TIER_COLUMNS:
        fig.add_trace(go.Scatter(x=s.step, y=s[col], name=label, stackgroup="tiers", mode="lines",
                                 line={"width": 0.5, "color": TIER_COLORS[label]},
                                 hovertemplate="step %{x}<br>%{y:,} tokens"))
    fig.update_layout(title_text=f"Tier occupancy - {result.scenario.name}", xaxis_title="decode step",
                      yaxis_title="tokens (all sequences of the batch)")
    return fig


def memory_figure(result: SimResult) -> go.Figure:
    """HBM and host bytes over the decode, with the GPU's capacity."""
    s = thin(result.steps)
    fig = go.Figure(layout=BASE_LAYOUT)
    fig.add_trace(go.Scatter(x=s.step, y=s.hbm_bytes / GB, name="HBM", mode="lines", line={"color": TIER_COLORS["T0 HBM"]},
                             hovertemplate="step %{x}<br>%{y:.2f} GB"))
    fig.add_trace(go.Scatter(x=s.step, y=s.host_bytes / GB, name="host (T1 + T2)", mode="lines",
                             line={"color": TIER_COLORS["T1 host"]}, hovertemplate="step %{x}<br>%{y:.2f} GB"))
    cap = result.summary.hbm_capacity_bytes / GB
    fig.add_hline(y=cap, line={"dash": "dash", "color": "#d62728"}, annotation_text=f"HBM capacity {cap:.0f} GB",
                  annotation_position="top left")
    fig.update_layout(title_text=f"HBM and host memory - {result.scenario.name}", xaxis_title="decode step",
                      yaxis_title="GB", yaxis_rangemode="tozero")
    return fig


def stall_intervals(timeline: pd.DataFrame) -> list[tuple[float, float]]:
    """Time with a transfer in flight and no compute running: the exposed (not hidden) transfers."""
    if timeline.empty:
        return []
    compute = list(timeline.loc[timeline.kind == "compute", ["start_s", "end_s"]].itertuples(index=False, name=None))
    copies = list(timeline.loc[timeline.kind != "compute", ["start_s", "end_s"]].itertuples(index=False, name=None))
    return uncovered_intervals(copies, compute)


def timeline_rows(timeline: pd.DataFrame) -> dict[str, list[tuple[float, float, str]]]:
    """(start, end, what) per timeline row, stalls derived from the recorded intervals."""
    rows: dict[str, list[tuple[float, float, str]]] = {k: [] for k in TIMELINE_ROWS}
    for r in timeline.itertuples(index=False):
        rows[r.kind].append((r.start_s, r.end_s, r.what))
    rows["stall"] = [(a, b, "compute waits for a copy") for a, b in stall_intervals(timeline)]
    return rows


def timeline_note(result: SimResult) -> str:
    """What the window shows, or why it shows no transfers."""
    tl = result.timeline
    if tl.empty:
        return "The engine recorded no timeline (the scenario does not fit, so it was not timed)."
    pol = result.scenario.policy
    notes = []
    if pol.prefetch == "layerwise_async" and result.scenario.sim.detail == "step" and pol.kind == "tiered":
        notes.append("with sim.detail: step the engine times the layerwise prefetch in closed form and does not "
                     "record its per-layer copies here; set sim.detail: layer in the scenario to see them")
    if (tl.kind == "compute").all():
        notes.append("no host<->device copy falls in this window: the engine records the four steps around the first "
                     "re-tier, and here that re-tier moves no tokens (typically because the protected prompt, sinks and "
                     "recent window are still all the tokens there are)")
    return "; ".join(notes)


def timeline_figure(result: SimResult) -> go.Figure:
    """Gantt-like bars of compute, H2D and D2H over the engine's timeline window (ms from its start)."""
    fig = go.Figure(layout={**BASE_LAYOUT, "barmode": "overlay"})
    rows = timeline_rows(result.timeline)
    t0 = float(result.timeline.start_s.min()) if not result.timeline.empty else 0.0
    for kind in TIMELINE_ROWS:
        items = rows[kind]
        fig.add_trace(go.Bar(
            y=[ROW_LABELS[kind]] * len(items), x=[(b - a) / MS for a, b, _ in items], base=[(a - t0) / MS for a, _, _ in items],
            orientation="h", name=ROW_LABELS[kind], marker={"color": ACTIVITY_COLORS[kind], "line": {"width": 0}},
            customdata=[w for _, _, w in items], hovertemplate="%{customdata}<br>start %{base:.3f} ms<br>%{x:.3f} ms<extra></extra>"))
    fig.update_layout(title_text=f"Timeline window - {result.scenario.name}", xaxis_title="time from window start (ms)",
                      yaxis={"categoryorder": "array", "categoryarray": [ROW_LABELS[k] for k in reversed(TIMELINE_ROWS)]})
    return fig


def run_figures(result: SimResult) -> list[tuple[str, go.Figure]]:
    return [("occupancy", occupancy_figure(result)), ("memory", memory_figure(result)), ("timeline", timeline_figure(result))]
