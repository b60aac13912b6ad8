"""The "Serving plan" section's figures, table and summary line, drawn from what `kvsim plan --out`
wrote (sim/report/plan_input.py) and nothing else: no simulation runs here.

- latency against offered rate: every probe of the search, one trace per candidate (configuration
  x policy) in each of two panels (p99 TTFT, p99 TPOT), coloured by policy, with the SLO targets as
  horizontal lines and the target rate as a vertical one; a menu shows one GPU configuration at a time;
- max sustainable rate per GPU configuration, one bar per policy, with the target rate;
- the ranked plan as a table.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .plan_input import PlanFiles, row_key
from .style import BASE_LAYOUT, policy_color

LATENCY_PANELS = (("ttft_p99_ms", "p99 TTFT"), ("tpot_p99_ms", "p99 TPOT"))
CONFIG_DASHES = ("solid", "dot", "dash", "longdash", "dashdot", "longdashdot")
SLO_LINE_COLOR = "#b00020"
TARGET_LINE_COLOR = "#555555"
ALL_CONFIGS = "every configuration"
LATENCY_HEIGHT_PX = 540
MENU_TOP_MARGIN_PX = 130  # room for the title, the configuration menu and the panel titles
MISS_TEXT = "misses"


def config_label(gpu: str, gpus: int, tp: int, dp: int) -> str:
    split = f"TP {tp}" if dp == 1 else f"TP {tp} x {dp} replicas"
    return f"{gpus} x {gpu} ({split})"


def policy_key(policy: str) -> str:
    """A plan policy (tiered:0.25) as sim/report/style.py's colour key (tiered_25)."""
    try:
        return f"tiered_{round(float(policy.split(':', 1)[1]) * 100)}" if policy.startswith("tiered:") else policy
    except ValueError:  # not a ratio: the fallback colour
        return policy


def _slo_ms(pf: PlanFiles) -> dict[str, float | None]:
    return {"ttft_p99_ms": pf.doc.ttft_p99_ms, "tpot_p99_ms": pf.doc.tpot_p99_ms}


def _config(r, seqs: bool) -> str:
    """A row's configuration label: GPUs and layout, and the scheduler settings where the plan searched them."""
    label = f"{r.gpus} x {r.gpu} ({r.layout}"
    label += f", {int(r.max_num_seqs)} seqs" if seqs and not pd.isna(r.max_num_seqs) else ""
    label += f", {int(r.max_num_batched_tokens)} tokens" if not pd.isna(r.max_num_batched_tokens) else ""
    return label + ")"


def simulated(pf: PlanFiles) -> pd.DataFrame:
    """plan.csv's rows that have probes (not pruned, not invalid), with their key and configuration
    label, ordered by policy (plan.json's order) then cost."""
    rows = pf.plan.assign(candidate=[row_key(r) for r in pf.plan.itertuples()],
                          config=[_config(r, len(pf.doc.max_num_seqs) > 1) for r in pf.plan.itertuples()])
    rows = rows[rows.candidate.isin(set(pf.probes.candidate))]
    order = {p: i for i, p in enumerate(pf.doc.policies)}
    rows = rows.assign(policy_order=[order.get(p, len(order)) for p in rows.policy])
    return rows.sort_values(["policy_order", "usd_per_hour", "gpus", "gpu", "tp"], kind="stable")


def _configs(cands: pd.DataFrame) -> list[str]:
    """The GPU configurations' labels, cheapest first."""
    return list(dict.fromkeys(cands.sort_values(["usd_per_hour", "gpus", "gpu", "tp"], kind="stable").config))


def latency_figure(pf: PlanFiles) -> go.Figure:
    doc, probes, cands = pf.doc, pf.probes, simulated(pf)
    configs = _configs(cands)
    fig = make_subplots(rows=1, cols=2, subplot_titles=[t for _, t in LATENCY_PANELS], horizontal_spacing=0.08)
    fig.update_layout(**BASE_LAYOUT)
    for c in cands.itertuples():
        p = probes[probes.candidate == c.candidate].sort_values("offered_rate_per_s")
        notes = ["meets the SLO" if ok else str(why) for ok, why in zip(p.passed, p.reason)]
        dash = CONFIG_DASHES[configs.index(c.config) % len(CONFIG_DASHES)]
        for col, (metric, label) in enumerate(LATENCY_PANELS, start=1):
            fig.add_trace(go.Scatter(
                x=p.offered_rate_per_s, y=p[metric], name=f"{c.policy} - {c.config}", legendgroup=c.candidate,
                showlegend=col == 1, mode="lines+markers", text=notes,
                line={"color": policy_color(policy_key(c.policy)), "dash": dash},
                marker={"symbol": ["circle" if ok else "x" for ok in p.passed], "size": 7},
                hovertemplate=f"{c.policy}, {c.config}<br>%{{x:.3g}} req/s: {label} %{{y:,.0f}} ms<br>%{{text}}<extra></extra>"),
                row=1, col=col)
    rates = [*probes.offered_rate_per_s, doc.rate_per_s]
    span = [min(rates) * 0.9, max(rates) * 1.05]
    n_slo = 0
    for col, (metric, label) in enumerate(LATENCY_PANELS, start=1):
        target = _slo_ms(pf)[metric]
        if target is not None:
            n_slo += 1
            fig.add_trace(go.Scatter(x=span, y=[target, target], mode="lines", name=f"{label} target {target:,.0f} ms",
                                     line={"color": SLO_LINE_COLOR, "dash": "dash", "width": 1.5}, hoverinfo="name"),
                          row=1, col=col)
    fig.add_vline(x=doc.rate_per_s, line_dash="dot", line_color=TARGET_LINE_COLOR, row="all", col="all",
                  annotation_text=f"target {doc.rate_per_s:g} req/s", annotation_position="top right")
    fig.update_xaxes(title_text="offered rate (requests/s, whole configuration)")
    fig.update_yaxes(type="log", title_text="ms (log)")
    buttons = [{"label": ALL_CONFIGS, "method": "restyle", "args": [{"visible": [True] * (len(LATENCY_PANELS) * len(cands) + n_slo)}]}]
    for cfg in configs:
        shown = [cfg == c for c in cands.config for _ in LATENCY_PANELS]
        buttons.append({"label": cfg, "method": "restyle", "args": [{"visible": shown + [True] * n_slo}]})
    fig.update_layout(
        title_text=f"{doc.model} ({doc.scenario}): p99 latency against offered rate, every simulation of the search",
        height=LATENCY_HEIGHT_PX, margin={**BASE_LAYOUT["margin"], "t": MENU_TOP_MARGIN_PX},
        updatemenus=[{"buttons": buttons, "direction": "down", "x": 0.0, "xanchor": "left", "y": 1.08,
                      "yanchor": "bottom", "showactive": True}])
    return fig


def max_rate_figure(pf: PlanFiles) -> go.Figure:
    """Each simulated configuration's max sustainable rate, one bar per policy; a bar of height 0
    marked MISS_TEXT: that one misses the SLO already at the target rate (no max rate)."""
    doc, cands = pf.doc, simulated(pf)
    configs = _configs(cands)
    fig = go.Figure(layout=BASE_LAYOUT)
    for policy in dict.fromkeys(cands.policy):
        rows = cands[cands.policy == policy].set_index("config")
        y, text, hover = [], [], []
        for cfg in configs:
            r = rows.loc[cfg] if cfg in rows.index else None
            if r is None:  # not simulated with this policy (invalid for it)
                y.append(None), text.append(""), hover.append("")
            elif r.status == "pass":
                mx = f">={r.max_rate_per_s:.3g}" if r.max_rate_capped else f"{r.max_rate_per_s:.3g}"
                y.append(r.max_rate_per_s), text.append(mx), hover.append(f"max rate {mx} req/s")
            else:
                y.append(0.0), text.append(MISS_TEXT), hover.append(str(r.reason))
        fig.add_trace(go.Bar(x=configs, y=y, name=policy, text=text, hovertext=hover, textposition="outside",
                             textfont_size=9, cliponaxis=False, marker_color=policy_color(policy_key(policy)),
                             hovertemplate="%{x}<br>%{hovertext}<extra>" + policy + "</extra>"))
    fig.add_hline(y=doc.rate_per_s, line_dash="dot", line_color=TARGET_LINE_COLOR,
                  annotation_text=f"target {doc.rate_per_s:g} req/s", annotation_position="top left")
    fig.update_layout(barmode="group", title_text=f"{doc.model}: max sustainable rate meeting the SLO, per GPU configuration",
                      yaxis_title="max rate (requests/s)", xaxis_title="GPU configuration (cheapest first)")
    return fig


TABLE_HEADERS = ["#", "GPU", "GPUs", "TP x DP", "policy", "output", "$/h", "$/M output tokens", "p99 TTFT at target",
                 "p99 TPOT at target", "max rate (req/s)", "next rate tried (fails)", "status", "binding", "why not"]


def _num(value, fmt: str, suffix: str = "") -> str:
    return "-" if pd.isna(value) else f"{value:{fmt}}{suffix}"


def table_rows(pf: PlanFiles) -> list[list[str]]:
    """plan.csv's rows in its order: passing (exact first) by $/hour then max rate, then failing,
    unsearched, screened and pruned."""
    rows = []
    for r in pf.plan.itertuples():
        mx = _num(r.max_rate_per_s, ".3g")
        if pd.isna(r.max_rate_per_s) and not pd.isna(r.screen_max_rate_per_s):
            mx = f"~{r.screen_max_rate_per_s:.3g} (screen)"
        rows.append([_num(r.rank, ".0f"), r.gpu, str(r.gpus), r.layout, r.policy, r.output, f"{r.usd_per_hour:,.2f}",
                     _num(r.usd_per_million_tokens, ",.2f"), _num(r.ttft_p99_ms, ",.0f", " ms"),
                     _num(r.tpot_p99_ms, ",.1f", " ms"), f">={mx}" if r.max_rate_capped else mx,
                     _num(r.next_rate_per_s, ".3g"), r.status,
                     "" if pd.isna(r.binding) else r.binding, "" if pd.isna(r.reason) else r.reason])
    return rows


def slo_text(pf: PlanFiles) -> str:
    parts = [f"p99 {k} <= {v:,.0f} ms" for k, v in (("TTFT", pf.doc.ttft_p99_ms), ("TPOT", pf.doc.tpot_p99_ms)) if v is not None]
    return " and ".join(parts)


def plan_rows(pf: PlanFiles) -> list[dict]:
    """plan.csv's rows as the search returned them (sim.plan.answer reads these): empty cells None,
    counts whole numbers."""
    rows = [{k: (None if not isinstance(v, str) and pd.isna(v) else v) for k, v in r.items()}
            for r in pf.plan.to_dict("records")]
    for r in rows:
        for key in ("rank", "verdict_requests"):
            r[key] = None if r[key] is None else int(r[key])
    return rows


def plan_sentences(pf: PlanFiles) -> list[str]:
    """The answer sentence `kvsim plan` printed first, the fewest GPUs (where an exact configuration
    passes), then what the search covered."""
    from sim.plan.answer import answer_sentence, fewest_sentence
    from sim.plan.front import OFF_FRONT

    doc, plan = pf.doc, pf.plan
    rows = plan_rows(pf)
    counts = plan.status.value_counts()
    off = sum(r["status"] == "unsearched" and OFF_FRONT in (r["reason"] or "") for r in rows)
    front = f"{off} not simulated for the Pareto front (beaten by or tied with a simulated one), " if off else ""
    covered = (f"Serving plan for {doc.model} at {doc.rate_per_s:g} req/s with {slo_text(pf)}: "
               f"{counts.get('pass', 0)} of {len(plan)} configurations pass, {counts.get('fail', 0)} fail, "
               f"{counts.get('unsearched', 0) - off} not simulated (cheaper ones pass), {front}"
               f"{counts.get('screened', 0)} ruled out by the analytic screen, {counts.get('pruned', 0)} cannot hold "
               f"the model; prices are assumptions.")
    fewest = fewest_sentence(rows, doc.rate_per_s, doc.pareto or doc.top == 0)
    return [answer_sentence(rows, doc.rate_per_s, doc.requests, doc.engine)] + ([fewest] if fewest else []) + [covered]


def pareto_figure(pf: PlanFiles) -> go.Figure:
    """Per GPU count, every passing configuration as output tokens/s per GPU (at its max rate)
    against tokens/s per user (1 / its p99 TPOT at the rate asked); the front joined by a line
    (`sim.plan.answer.pareto`)."""
    from sim.plan.answer import budget_label, pareto

    rows = plan_rows(pf)
    mean_out = _mean_output_tokens(pf)
    fig = go.Figure(layout=BASE_LAYOUT)
    front = pareto(rows, mean_out) if mean_out else {}
    for n in sorted({r["gpus"] for r in rows if r["status"] == "pass" and r["tpot_p99_ms"]}):
        pts = [r for r in rows if r["status"] == "pass" and r["tpot_p99_ms"] and r["gpus"] == n]
        fig.add_trace(go.Scatter(
            x=[1e3 / r["tpot_p99_ms"] for r in pts], y=[r["max_rate_per_s"] * mean_out / n for r in pts],
            mode="markers", name=f"{n} GPUs", text=[f"{r['gpu']} {r['layout']} {r['policy']}{budget_label(r)}" for r in pts],
            hovertemplate="%{text}<br>%{x:.0f} tok/s/user, %{y:,.0f} tok/s/GPU<extra></extra>"))
        edge = sorted(front.get(n, []), key=lambda p: p["tokens_per_s_per_user"])
        fig.add_trace(go.Scatter(x=[p["tokens_per_s_per_user"] for p in edge], y=[p["tokens_per_s_per_gpu"] for p in edge],
                                 mode="lines", name=f"{n} GPUs: front", line={"dash": "dot"}, hoverinfo="skip"))
    fig.update_xaxes(title_text="tokens/s per user (1 / p99 TPOT at the target rate)")
    fig.update_yaxes(title_text="output tokens/s per GPU at the max rate")
    fig.update_layout(title_text=f"{pf.doc.model}: throughput per GPU against speed per user, per GPU count")
    return fig


def _mean_output_tokens(pf: PlanFiles) -> float | None:
    """The mean output of the plan's workload, from a passing row: $/h = $/M tokens x rate x 3600 x mean / 1e6."""
    r = pf.plan[(pf.plan.status == "pass") & pf.plan.usd_per_million_tokens.notna()]
    if r.empty or not r.iloc[0].usd_per_million_tokens:
        return None
    row = r.iloc[0]
    return float(row.usd_per_hour / row.usd_per_million_tokens * 1e6 / (pf.doc.rate_per_s * 3600))
