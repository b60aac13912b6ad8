"""Predicted (simulator) against measured (hwprobe run), one panel per metric, with the y = x line
and the +-10 % / +-25 % error bands."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import BASE_LAYOUT, FIGURE_HEIGHT_PX
from .validation_table import BANDS, metric_display

PANELS_PER_ROW = 2
LOG_AXIS_SPAN = 100.0  # a metric whose values span more than this factor gets log axes
AXIS_PAD = 1.2  # axis range: the data's range widened by this factor
BAND_COLORS = ("rgba(44,160,44,0.18)", "rgba(255,127,14,0.12)")
POINT_COLOR = "#1f77b4"


def _band(lo: float, hi: float, rel: float, color: str, name: str, show: bool, row: int, col: int) -> go.Scatter:
    """The area between y = (1 - rel) x and y = (1 + rel) x (straight on linear and log axes)."""
    return go.Scatter(x=[lo, hi, hi, lo, lo], y=[lo * (1 - rel), hi * (1 - rel), hi * (1 + rel), lo * (1 + rel), lo * (1 - rel)],
                      fill="toself", fillcolor=color, line={"width": 0}, mode="lines", name=name, legendgroup=name,
                      showlegend=show, hoverinfo="skip")


def validation_figure(table: pd.DataFrame) -> go.Figure:
    usable = table.dropna(subset=["predicted", "measured"])
    metrics = list(dict.fromkeys(usable.metric))
    cols = min(PANELS_PER_ROW, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    titles = [f"{metric_display(m)[0]} ({metric_display(m)[2]})" if metric_display(m)[2] else m for m in metrics]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.1, vertical_spacing=0.14)
    for i, metric in enumerate(metrics):
        r, c = i // cols + 1, i % cols + 1
        d = usable[usable.metric == metric]
        _, scale, unit = metric_display(metric)
        pred, meas = d.predicted * scale, d.measured * scale
        values = pd.concat([pred, meas])
        positive = values[values > 0]
        log = len(positive) == len(values) and positive.max() / positive.min() > LOG_AXIS_SPAN
        lo = positive.min() / AXIS_PAD if log else min(0.0, values.min() * AXIS_PAD)
        hi = values.max() * AXIS_PAD if values.max() > 0 else 1.0
        first = i == 0
        for rel, color in sorted(zip(BANDS, BAND_COLORS), reverse=True):
            fig.add_trace(_band(lo, hi, rel, color, f"+-{rel:.0%}", first, r, c), row=r, col=c)
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"color": "#444", "dash": "dash", "width": 1},
                                 name="y = x (exact)", legendgroup="exact", showlegend=first, hoverinfo="skip"), row=r, col=c)
        err = d.rel_error.map(lambda e: "-" if pd.isna(e) else f"{e:+.1%}")
        fig.add_trace(go.Scatter(x=meas, y=pred, mode="markers", marker={"color": POINT_COLOR, "size": 9},
                                 name="scenario", legendgroup="points", showlegend=first,
                                 customdata=list(zip(d.scenario, err)),
                                 hovertemplate=f"%{{customdata[0]}}<br>measured %{{x:.4g}} {unit}<br>predicted %{{y:.4g}} {unit}"
                                               "<br>error %{customdata[1]}<extra></extra>"), row=r, col=c)
        axis = {"type": "log"} if log else {"range": [lo, hi]}
        fig.update_xaxes(title_text="measured", row=r, col=c, **axis)
        fig.update_yaxes(title_text="predicted", row=r, col=c, **axis)
    fig.update_layout(**{**BASE_LAYOUT, "height": FIGURE_HEIGHT_PX * rows},
                      title_text="Predicted (simulator) against measured (hwprobe run)")
    return fig
