"""Figures of "The paper, checked": KV sized the paper's way against GQA, and the prototype's
throughput as measured by the paper against the simulator."""

from __future__ import annotations

import textwrap

import plotly.graph_objects as go

from sim.model.units import GB
from sim.studies import paper_claims as paper
from sim.studies.paper_check import PaperCheck

from .style import BASE_LAYOUT

PAPER_COLOR = "#999999"
WRAPPED_LABELS_MARGIN_PX = 110  # room under the axis for three-line category labels
LABEL_WRAP_CHARS = 24  # category labels are wrapped so five bars fit side by side
SIM_COLORS = ("#222222", "#d62728", "#3182bd")  # full_hbm, prototype policy, this project's design
RULE_COLOR, GQA_COLOR, SAVED_COLOR = "#e6550d", "#31a354", "#74c476"


def kv_figure(check: PaperCheck) -> go.Figure:
    """KV of batch 8 x 4K tokens per model: the paper's sizing rule against GQA, plus HBM saved."""
    t = check.kv_table
    fig = go.Figure(layout=BASE_LAYOUT)
    for col, name, color in (("paper_rule_bytes", "KV, paper's rule (query heads)", RULE_COLOR),
                             ("gqa_bytes", "KV, GQA (KV heads): correct", GQA_COLOR),
                             ("saved_bytes", "HBM saved by tiering (simulator, GQA)", SAVED_COLOR)):
        gb = t[col] / GB
        fig.add_trace(go.Bar(x=t.model, y=gb, name=name, marker_color=color, text=[f"{v:.1f}" for v in gb],
                             textposition="outside", hovertemplate="%{x}: %{y:.2f} GB"))
    fig.update_layout(barmode="group", title_text=f"KV cache of batch {paper.PROJECTION_BATCH} x {paper.PROJECTION_CONTEXT_TOKENS:,} "
                      f"tokens ({paper.KV_DTYPE} KV): the paper's sizing against GQA", yaxis_title="GB")
    return fig


def throughput_figure(check: PaperCheck) -> go.Figure:
    """The prototype's decode throughput: the paper's two measurements, then the simulator's three runs,
    each tiered bar labelled with its cost against its own full-cache bar."""
    fig = go.Figure(layout=BASE_LAYOUT)
    paper_cost = 1 - paper.TIERED_TOK_PER_S / paper.FULL_TOK_PER_S
    fig.add_trace(go.Bar(x=[_wrap("paper: full cache"), _wrap("paper: tiered (50% HBM, 10% evicted)")],
                         y=[paper.FULL_TOK_PER_S, paper.TIERED_TOK_PER_S], name="paper (measured, RTX 5080)",
                         marker_color=PAPER_COLOR, textposition="outside",
                         text=[f"{paper.FULL_TOK_PER_S}", f"{paper.TIERED_TOK_PER_S} (-{paper_cost:.1%})"]))
    full = check.prototype[0].throughput_tok_per_s
    for i, (run, color) in enumerate(zip(check.prototype, SIM_COLORS)):
        cost = "" if i == 0 else f" (-{1 - run.throughput_tok_per_s / full:.2%})"
        fig.add_trace(go.Bar(x=[_wrap(f"simulator: {run.label}")], y=[run.throughput_tok_per_s], name=f"simulator: {run.label}",
                             marker_color=color, text=[f"{run.throughput_tok_per_s:.1f}{cost}"], textposition="outside",
                             hovertemplate=f"%{{y:.2f}} tok/s<br>transfers {run.transfer_share:.1%} of decode time"
                                           f"<br>stall {run.stall_share:.1%}<extra></extra>"))
    fig.update_layout(title_text="Paper prototype (RTX 5080, 7B int8, batch 1): throughput, measured and simulated",
                      yaxis_title="decode throughput (tok/s)", yaxis_rangemode="tozero", showlegend=False,
                      xaxis_tickangle=0, xaxis_tickfont_size=10, margin_b=WRAPPED_LABELS_MARGIN_PX)
    return fig


def _wrap(label: str) -> str:
    return "<br>".join(textwrap.wrap(label, LABEL_WRAP_CHARS))


def paper_figures(check: PaperCheck) -> list[tuple[str, go.Figure]]:
    figs = [("fig-paper-kv", kv_figure(check))]
    if check.prototype:
        figs.append(("fig-paper-throughput", throughput_figure(check)))
    return figs
