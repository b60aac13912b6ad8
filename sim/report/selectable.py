"""Figures that follow the report's model / weights / GPU / length selectors.

Each such figure is built once per combination of the dimensions it depends on. The initial
plotly figure shows the default selection; every combination is kept as the arguments of one
`Plotly.update(div, data, layout)` call (the page's script makes that call when a selector
changes). The trace list has the same length and order in every variant, so only numbers, names,
shapes and titles change: the data is stored once per combination, not once per trace.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import plotly.graph_objects as go

SIGNIFICANT_DIGITS = 4  # numbers in the embedded data: plenty for a plot, a third of the bytes


@dataclass(frozen=True)
class Dimension:
    """One selector: its name in variant keys, its label, and its (value, label) options."""

    name: str
    label: str
    options: tuple[tuple[str, str], ...]
    default: str


@dataclass
class SelectableFigure:
    fig_id: str
    figure: go.Figure
    dims: tuple[str, ...]
    variants: dict[str, dict] = field(default_factory=dict)
    caption: str = ""


def variant_key(selection: dict[str, str], dims: tuple[str, ...]) -> str:
    return "|".join(selection[d] for d in dims)


def compact(value):
    """Round floats to SIGNIFICANT_DIGITS and turn NaN/inf into None (JSON null), recursively."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v) for v in value]
    if hasattr(value, "item"):  # numpy scalar
        return compact(value.item())
    return value


# view(selection) -> (traces as dicts with the same keys in every variant, layout update)
View = Callable[[dict[str, str]], tuple[list[dict], dict]]
VARIED_TRACE_KEYS = ("x", "y", "name", "text")


def build_selectable(fig_id: str, dims: list[Dimension], used: tuple[str, ...], base_layout: dict,
                     view: View, caption: str = "") -> SelectableFigure:
    """Evaluate `view` for every combination of the `used` dimensions."""
    by_name = {d.name: d for d in dims}
    default = {d.name: d.default for d in dims}
    variants: dict[str, dict] = {}
    for combo in itertools.product(*(by_name[u].options for u in used)):
        sel = {**default, **{u: value for u, (value, _) in zip(used, combo)}}
        traces, layout = view(sel)
        data = {k: [compact(t.get(k)) for t in traces] for k in VARIED_TRACE_KEYS if any(k in t for t in traces)}
        variants[variant_key(sel, used)] = {"data": data, "layout": compact(layout)}
    traces, layout = view(default)
    fig = go.Figure(layout=base_layout)
    for t in traces:
        fig.add_trace(_trace(t))
    fig.update_layout(**_nested(compact(layout)))
    return SelectableFigure(fig_id=fig_id, figure=fig, dims=used, variants=variants, caption=caption)


def _trace(t: dict):
    kwargs = {k: v for k, v in compact(t).items() if k != "type"}
    return go.Bar(**kwargs) if t.get("type") == "bar" else go.Scatter(**kwargs)


def _nested(layout: dict) -> dict:
    """{'title.text': 'a'} -> {'title': {'text': 'a'}} (Plotly.update takes dotted keys; the
    python figure takes nested dicts)."""
    out: dict = {}
    for key, value in layout.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out
