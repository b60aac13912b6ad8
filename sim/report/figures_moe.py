"""The "Mixture-of-experts and hybrid models" section's figure and table rows: the max batch of each
policy per model (bars) and the batch from which the host link binds (diamonds), following the
section's own GPU and length selectors; every number is read from `sim.studies.moe_projection`."""

from __future__ import annotations

import pandas as pd

from sim.inputs import catalog
from sim.model.units import GB
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.studies.moe_projection import MoeResult, Placement
from sim.studies.projection_grid import length_label

from .selectable import Dimension, SelectableFigure, build_selectable
from .style import BASE_LAYOUT, PERCENT, policy_color

GPU_DIM, LENGTH_DIM = "moe_gpu", "moe_length"  # distinct from the dense projection's selectors
DIMS = (GPU_DIM, LENGTH_DIM)
DEFAULT_LENGTH = 16384  # the longer chain: where tiering matters most
TABLE_HEADERS = ["GPU", "reasoning", "policy", "max batch", "at full_hbm's max batch: HBM saved / GPU", "tok/s",
                 "at its own max batch: HBM saved / GPU", "tok/s", "H2D busy", "binds", "link-bound from batch"]



def layout(pl) -> str:
    """"TP8", or "DPA8+EP8" (attention data-parallel, experts split over the 8 GPUs)."""
    return f"DPA{pl.tp}+EP{pl.tp}" if pl.model.experts and pl.tp > 1 else f"TP{pl.tp}"

def dimensions(moe: MoeResult) -> list[Dimension]:
    spec = moe.spec
    gpus = tuple((g, catalog.gpu(g).name) for g in spec.gpus)
    lengths = tuple((length_label(n), f"{n:,} tokens") for n in spec.lengths)
    length = length_label(DEFAULT_LENGTH) if DEFAULT_LENGTH in spec.lengths else lengths[0][0]
    return [Dimension(GPU_DIM, "GPU", gpus, gpus[0][0]), Dimension(LENGTH_DIM, "Reasoning length", lengths, length)]


def model_axis_label(pl: Placement) -> str:
    return f"{pl.model.label} ({pl.model.formats()}, {layout(pl)})" if pl.tp else f"{pl.model.label} (does not fit)"


def max_batch_figure(moe: MoeResult) -> SelectableFigure:
    """Max batch per model and policy at the selected GPU and length; a diamond at each tiered
    policy's link-bound batch (where H2D reaches the bottleneck share), none where it never does."""
    lim = moe.limits.set_index(["model", "gpu", "length", "policy"]) if len(moe.limits) else None
    pct = round(LINK_BOTTLENECK_UTILIZATION * PERCENT)

    def value(pl: Placement, sel: dict, policy: str, column: str):
        key = (pl.model.label, sel[GPU_DIM], sel[LENGTH_DIM], policy)
        return None if pl.tp is None or lim is None or key not in lim.index else lim.loc[key, column]

    def view(sel):
        placed = [pl for pl in moe.placements if pl.gpu == sel[GPU_DIM]]
        xs = [model_axis_label(pl) for pl in placed]
        traces = []
        for pol in moe.spec.policies:
            ys = [value(pl, sel, pol.key, "max_batch") for pl in placed]
            traces.append({"type": "bar", "x": xs, "y": ys, "name": f"{pol.label} - max batch", "offsetgroup": pol.key,
                           "text": ["-" if y is None else f"{int(y):,}" for y in ys], "textposition": "outside",
                           "marker": {"color": policy_color(pol.key)}, "hovertemplate": "%{x}<br>max batch %{y:,}"})
        for pol in (p for p in moe.spec.policies if p.tiered):
            ys = [value(pl, sel, pol.key, "link_bound_batch") for pl in placed]
            ys = [None if y is None or pd.isna(y) else int(y) for y in ys]
            traces.append({"type": "scatter", "mode": "markers", "x": xs, "y": ys, "offsetgroup": pol.key,
                           "name": f"{pol.label} - link-bound from", "marker": {"symbol": "diamond", "size": 11,
                           "color": policy_color(pol.key), "line": {"color": "#000", "width": 1}},
                           "hovertemplate": f"%{{x}}<br>H2D busy >= {pct}% from batch %{{y:,}}"})
        gpu = catalog.gpu(sel[GPU_DIM]).name
        where = f"{gpu}, {sel[LENGTH_DIM]} reasoning + {moe.spec.prompt_tokens} prompt tokens"
        return traces, {"title.text": f"Max batch, and where the host link binds - {where}"}

    layout = {**BASE_LAYOUT, "barmode": "group", "scattermode": "group",
              "yaxis": {"type": "log", "title": {"text": "batch (sequences, log)"}}}
    return build_selectable("fig-moe-max-batch", dimensions(moe), DIMS, layout, view,
                            f"Bars: the largest batch whose peak HBM fits, per GPU of the tensor-parallel group. "
                            f"Diamonds: the smallest batch at which the host-to-device link is busy >= {pct}% of "
                            f"decode time (searched between the swept powers of two); from there more sequences "
                            f"add capacity but not speed.")


def _gb(value) -> str:
    """GB to one decimal; a few MB below zero (the staging a tiered policy holds where it moves
    nothing to the host) print as 0.0."""
    if value is None or pd.isna(value):
        return "-"
    text = f"{value / GB:,.1f}"
    return f"{'0.0' if text == '-0.0' else text} GB"


def _pct(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.0%}"


def _tok(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:,.0f}"


def _int(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{int(value):,}"


def table_rows(moe: MoeResult, model_label: str) -> list[list[str]]:
    """One row per GPU, length and policy of `model_label`, in the spec's order (TABLE_HEADERS)."""
    label = {p.key: p.label for p in moe.spec.policies}
    tp = {pl.gpu: pl.tp for pl in moe.placements if pl.model.label == model_label}
    rows = []
    for r in moe.limits[moe.limits.model == model_label].itertuples():
        tiered = r.policy != "full_hbm"
        gpu = catalog.gpu(r.gpu).name
        rows.append([f"{gpu} x {tp[r.gpu]}" if tp[r.gpu] > 1 else gpu, r.length, label[r.policy], _int(r.max_batch),
                     _gb(r.at_full_max_hbm_saved_bytes) if tiered else "-", _tok(r.at_full_max_throughput_tok_per_s),
                     _gb(r.at_max_hbm_saved_bytes) if tiered else "-", _tok(r.at_max_throughput_tok_per_s),
                     _pct(r.at_max_h2d_utilization) if tiered else "-", r.binds,
                     _int(r.link_bound_batch) if tiered else "-"])
    return rows


def kv_text(kv_by_kind: dict) -> str:
    """'mla 70,272 B (61 layers)', 'full 36,864 B (18 layers) + window 36,864 B (18 layers, 128 tokens)'."""
    parts = []
    for kind, row in kv_by_kind.items():
        extra = f", {row['window_tokens']} tokens held" if "window_tokens" in row else ""
        if kind == "linear":
            parts.append(f"linear 0 B ({row['layers']} layers, {row['max_bytes_per_sequence'] / 1e6:,.1f} MB state "
                         f"a sequence)")
        else:
            parts.append(f"{kind} {row['bytes_per_token']:,.0f} B ({row['layers']} layers{extra})")
    return " + ".join(parts)


def placement_text(pl: Placement) -> str:
    """Where the model runs on one GPU kind and why that TP, in a sentence."""
    gpu = catalog.gpu(pl.gpu).name
    skipped = "; ".join(f"TP{tp}: {why}" for tp, why in pl.skipped)
    if pl.tp is None:
        return f"{gpu}: does not fit on {max(tp for tp, _ in pl.skipped)} GPUs ({skipped})."
    text = (f"{gpu}: {layout(pl)}, {pl.weights_bytes_per_gpu / GB:,.1f} GB of weights per GPU of "
            f"{pl.hbm_capacity_bytes / GB:,.1f} GB; KV per token per GPU: {kv_text(pl.kv_by_kind)}")
    return text + (f" (smaller groups: {skipped})." if skipped else ".")
