"""Figure of "Which access strategy wins": throughput of each strategy at its own max batch over
full_hbm at its max batch, per GPU, with the resource that binds written on each bar and, on hover,
how much the host DRAM shared with the prefetch DMA slows the host's attention."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .style import BASE_LAYOUT

ACCESS_COLORS = {"prefetch": "#08519c", "host_attention": "#e6550d", "split": "#31a354"}


def access_figure(table: pd.DataFrame, model: str) -> go.Figure:
    t = table[table.model == model]
    fig = go.Figure(layout=BASE_LAYOUT)
    for access, color in ACCESS_COLORS.items():
        rows = t[t.access == access]
        slow = rows.get("host_dram_slowdown_last_step", pd.Series([1.0] * len(rows), index=rows.index))
        fig.add_trace(go.Bar(x=rows.gpu, y=rows.vs_full_hbm, name=access, marker_color=color,
                             text=[b if pd.notna(v) else "does not fit" for b, v in zip(rows.binds, rows.vs_full_hbm)],
                             textposition="outside", textfont_size=9, customdata=slow.fillna(1.0),
                             hovertemplate="%{x}: %{y:.2f}x full_hbm<br>%{text}<br>host attention x%{customdata:.2f} "
                                           "slower beside its prefetch DMA (last step)<extra>" + access + "</extra>"))
    fig.add_hline(y=1.0, line_dash="dash", line_color="#222222", annotation_text="full_hbm at its max batch")
    fig.update_layout(barmode="group", yaxis_type="log", yaxis_title="throughput / full_hbm's (both at max batch)",
                      title_text=f"{model}: which access strategy wins (tiered, 25% of candidates in HBM)")
    return fig
