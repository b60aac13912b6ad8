"""The 7B-70B projection figures: throughput with the OOM wall, max batch, HBM saved, host-link
utilisation with the link-bound batch, transfer share. All follow the report's selectors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from sim.model.units import GB
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.studies.projection_grid import GridResult, length_label

from .selectable import Dimension, SelectableFigure, build_selectable
from .style import BASE_LAYOUT, PERCENT, policy_color

DIMS_ALL = ("model", "weights", "gpu", "length")
DIMS_NO_GPU = ("model", "weights", "length")
STAGGER_Y = 0.07  # vertical spacing (fraction of plot height) of OOM labels, so neighbours do not overlap


@dataclass
class Lookup:
    """The grid indexed by selection: points and limits of one (model, weights, gpu, length)."""

    grid: GridResult

    def __post_init__(self):
        keys = list(DIMS_ALL)
        self.points = {k: df for k, df in self.grid.points.groupby(keys, sort=False)}
        ordered = self.grid.points.sort_values("batch", kind="stable")  # each policy's line in batch order
        self.lines = {k: df for k, df in ordered.groupby([*keys, "policy"], sort=False)}
        self._fitting: dict[tuple, pd.DataFrame] = {}
        self.limits = {k: df.set_index("policy") for k, df in self.grid.limits.groupby(keys, sort=False)}
        self.gpu_label = {g.key: g.label for g in self.grid.gpus}
        self.policy_label = {p.key: p.label for p in self.grid.spec.policies}

    def cell(self, sel: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
        key = tuple(sel[d] for d in DIMS_ALL)
        return self.points[key], self.limits[key]

    def policy_points(self, sel: dict, policy: str, fitting: bool = True) -> pd.DataFrame:
        """One policy's points of a cell by batch (only those that fit, unless `fitting` is False);
        kept, since several figures draw the same line for every selection."""
        key = (*(sel[d] for d in DIMS_ALL), policy)
        if not fitting:
            return self.lines[key]
        if key not in self._fitting:
            self._fitting[key] = self.lines[key][self.lines[key].fits]
        return self._fitting[key]

    def max_batch_text(self, lim: pd.Series) -> str:
        mb = int(lim["max_batch"])
        if mb == 0:
            return "does not fit at batch 1"
        return f"max batch {mb}{'+' if mb >= lim['max_batch_limit'] else ''}"

    def where(self, sel: dict, gpu: bool = True) -> str:
        model = dict(self.grid.spec.models)[sel["model"]]
        on = f" on {self.gpu_label[sel['gpu']]}" if gpu else ""
        return f"{sel['model']} ({model}), {sel['weights']} weights{on}, {sel['length']} reasoning + {self.grid.spec.prompt_tokens} prompt tokens"


def dimensions(grid: GridResult) -> list[Dimension]:
    spec = grid.spec
    d = spec.default_selection
    models = tuple((lbl, f"{lbl} - {name}") for lbl, name in spec.models)
    weights = tuple((w, w) for w in spec.weight_dtypes)
    gpus = tuple((g.key, g.label) for g in grid.gpus)
    lengths = tuple((length_label(n), f"{n:,} tokens") for n in spec.lengths)

    def pick(name: str, options: tuple) -> str:
        values = [v for v, _ in options]
        return d.get(name) if d.get(name) in values else values[0]

    return [Dimension("model", "Model", models, pick("model", models)),
            Dimension("weights", "Weights", weights, pick("weights", weights)),
            Dimension("gpu", "GPU", gpus, pick("gpu", gpus)),
            Dimension("length", "Reasoning length", lengths, pick("length", lengths))]


def _batch_axis(grid: GridResult) -> dict:
    b = list(grid.spec.batches)
    return {"type": "log", "title": {"text": "batch (sequences decoded together)"}, "tickvals": b, "ticktext": [str(x) for x in b]}


def _batch_trace(p: pd.DataFrame, y: pd.Series, name: str, policy: str, hover: str, mode: str = "lines+markers",
                 **extra) -> dict:
    """One policy's line against batch, in the policy's colour."""
    return {"x": p.batch.tolist(), "y": y.tolist(), "name": name, "mode": mode, "line": {"color": policy_color(policy)},
            "hovertemplate": hover, **extra}


def throughput_figure(grid: GridResult, lk: Lookup) -> SelectableFigure:
    """Decode throughput against batch, one line per policy, ending at that policy's OOM wall."""
    top = max(grid.spec.batches)

    def view(sel):
        lim = lk.cell(sel)[1]
        traces, shapes, notes = [], [], []
        for i, pol in enumerate(grid.spec.policies):
            p = lk.policy_points(sel, pol.key)
            row = lim.loc[pol.key]
            traces.append(_batch_trace(p, p.throughput_tok_per_s, f"{pol.label} - {lk.max_batch_text(row)}", pol.key,
                                       "batch %{x}<br>%{y:,.0f} tok/s"))
            mb = int(row["max_batch"])
            if 1 <= mb <= top:
                shapes.append(wall_shape(mb, policy_color(pol.key)))
                # annotations on a log axis are placed in log10 units (shapes take data units)
                notes.append({"x": math.log10(mb), "y": 1 - STAGGER_Y * i, "xref": "x", "yref": "paper", "text": f"OOM {mb}",
                              "showarrow": False, "xanchor": "left", "font": {"size": 10, "color": policy_color(pol.key)}})
        return traces, {"title.text": f"Decode throughput vs batch - {lk.where(sel)}", "shapes": shapes, "annotations": notes}

    layout = {**BASE_LAYOUT, "xaxis": _batch_axis(grid), "yaxis": {"title": {"text": "decode throughput (tok/s)"}, "rangemode": "tozero"}}
    return build_selectable("fig-throughput", dimensions(grid), DIMS_ALL, layout, view,
                            "Dashed lines: the out-of-memory wall of each policy (largest batch whose peak HBM fits). "
                            "Lines stop there; the legend gives the exact max batch.")


def wall_shape(batch: int, color: str) -> dict:
    """A vertical dashed line at the OOM wall (x in data units, full plot height)."""
    return {"type": "line", "x0": batch, "x1": batch, "xref": "x", "y0": 0, "y1": 1, "yref": "paper",
            "line": {"color": color, "dash": "dash", "width": 1.5}}


def max_batch_figure(grid: GridResult, lk: Lookup) -> SelectableFigure:
    """Largest batch that fits, per GPU and policy."""

    def view(sel):
        traces = []
        for pol in grid.spec.policies:
            xs, ys, texts = [], [], []
            for g in grid.gpus:
                row = lk.cell({**sel, "gpu": g.key})[1].loc[pol.key]
                mb = int(row["max_batch"])
                xs.append(g.label)
                ys.append(mb)
                texts.append(f"{mb}{'+' if mb >= row['max_batch_limit'] else ''}")
            traces.append({"type": "bar", "x": xs, "y": ys, "text": texts, "name": pol.label, "textposition": "outside",
                           "marker": {"color": policy_color(pol.key)}, "hovertemplate": "%{x}<br>max batch %{y}"})
        return traces, {"title.text": f"Max batch that fits - {lk.where(sel, gpu=False)}"}

    layout = {**BASE_LAYOUT, "barmode": "group", "yaxis": {"title": {"text": "max batch (sequences)"}, "rangemode": "tozero"}}
    return build_selectable("fig-max-batch", dimensions(grid), DIMS_NO_GPU, layout, view,
                            "0: not even one sequence fits (weights + KV + runtime reserve exceed the GPU's memory). "
                            "A + marks the end of the search range.")


def hbm_saved_figure(grid: GridResult, lk: Lookup) -> SelectableFigure:
    """HBM saved against full_hbm for the same workload, per policy (independent of the GPU)."""
    first_gpu = grid.gpus[0].key

    def view(sel):
        cell = {**sel, "gpu": first_gpu}  # HBM saved does not depend on the GPU
        traces = []
        for pol in grid.spec.policies:
            if pol.key == "full_hbm":
                continue
            p = lk.policy_points(cell, pol.key, fitting=False)
            p = p[~p.wall_point]
            traces.append(_batch_trace(p, p.hbm_saved_bytes / GB, pol.label, pol.key, "batch %{x}<br>%{y:.2f} GB saved"))
        return traces, {"title.text": f"HBM saved vs full_hbm - {lk.where(sel, gpu=False)}"}

    layout = {**BASE_LAYOUT, "xaxis": _batch_axis(grid), "yaxis": {"title": {"text": "HBM saved (GB)"}, "rangemode": "tozero"}}
    return build_selectable("fig-hbm-saved", dimensions(grid), DIMS_NO_GPU, layout, view,
                            "Peak HBM of full_hbm minus peak HBM of the policy, same workload. It does not depend on the GPU; "
                            "whether the batch fits does (see the max-batch figure).")


def link_figure(grid: GridResult, lk: Lookup) -> SelectableFigure:
    """Host->device link utilisation of the tiered policies, and the batch where it saturates."""
    tiered = [p for p in grid.spec.policies if p.tiered]
    top = max(grid.spec.batches)

    def view(sel):
        lim = lk.cell(sel)[1]
        traces = []
        shapes = [{"type": "line", "x0": 0, "x1": 1, "xref": "paper", "y0": LINK_BOTTLENECK_UTILIZATION * PERCENT,
                   "y1": LINK_BOTTLENECK_UTILIZATION * PERCENT, "yref": "y", "line": {"color": "#888", "dash": "dot"}}]
        for pol in tiered:
            p = lk.policy_points(sel, pol.key)
            lb = lim.loc[pol.key]["link_bound_batch"]
            if pd.isna(lb):
                note = "link not the bottleneck before OOM"
            else:
                note = f"link-bound from batch {int(lb)}"
                if lb <= top:
                    shapes.append({**wall_shape(int(lb), policy_color(pol.key)), "line": {"color": policy_color(pol.key), "dash": "dot", "width": 1.5}})
            traces.append(_batch_trace(p, p.h2d_utilization * PERCENT, f"{pol.label} - {note}", pol.key,
                                       "batch %{x}<br>H2D busy %{y:.1f}% of decode time"))
        return traces, {"title.text": f"Host->device link utilisation - {lk.where(sel)}", "shapes": shapes}

    layout = {**BASE_LAYOUT, "xaxis": _batch_axis(grid), "yaxis": {"title": {"text": "H2D busy (% of decode time)"}, "range": [0, 105]}}
    pct = round(LINK_BOTTLENECK_UTILIZATION * PERCENT)
    return build_selectable("fig-link", dimensions(grid), DIMS_ALL, layout, view,
                            f"Dotted horizontal line: {pct}% busy, where the link is the bottleneck. Dotted vertical lines: "
                            f"the smallest batch (searched between the swept powers of two) at which a policy reaches it.")


def transfer_share_figure(grid: GridResult, lk: Lookup) -> SelectableFigure:
    """Share of decode time with a transfer in flight, and the part of it compute had to wait for."""
    tiered = [p for p in grid.spec.policies if p.tiered]

    def view(sel):
        traces = []
        for pol in tiered:
            p = lk.policy_points(sel, pol.key)
            traces.append(_batch_trace(p, p.transfer_share * PERCENT, f"{pol.label} - transfer", pol.key,
                                       "batch %{x}<br>transfer in flight %{y:.1f}% of time", legendgroup=pol.key))
            stall = _batch_trace(p, p.stall_share * PERCENT, f"{pol.label} - stall (exposed)", pol.key,
                                 "batch %{x}<br>compute waiting %{y:.1f}% of time", mode="lines", legendgroup=pol.key)
            traces.append({**stall, "line": {**stall["line"], "dash": "dot"}})
        return traces, {"title.text": f"Transfer share of step time - {lk.where(sel)}"}

    layout = {**BASE_LAYOUT, "xaxis": _batch_axis(grid), "yaxis": {"title": {"text": "% of decode time"}, "rangemode": "tozero"}}
    return build_selectable("fig-transfer-share", dimensions(grid), DIMS_ALL, layout, view,
                            "Solid: time with a host transfer in flight. Dotted: the exposed part, when compute waits for "
                            "a prefetch (layerwise prefetch hides the rest behind the previous layer's compute).")


def projection_figures(grid: GridResult) -> list[SelectableFigure]:
    lk = Lookup(grid)
    return [throughput_figure(grid, lk), max_batch_figure(grid, lk), hbm_saved_figure(grid, lk),
            link_figure(grid, lk), transfer_share_figure(grid, lk)]
