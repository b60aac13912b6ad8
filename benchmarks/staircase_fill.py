"""How the kernel grids fill a table's holes, held against the tables themselves (not a test):

    .venv/bin/python benchmarks/staircase_fill.py

AIConfigurator's attention tables are staircases: at each batch the collector timed contexts up to
what fit its memory. Each batch's largest measured context below the table's last context column (the
frontier) is withheld in turn, its slice's grid of log(measured / baseline) over (batch, tokens) -
the baselines `kvsim` uses: roofline + the slice's floor for decode and context attention, the bare
roofline for MLA decode - filled with it missing, and the fill compared with the measurement:
`kernel_grid.fill_from_below` (the smallest ratio of the nearest measured cells below, along each
axis) against `fill_nearest` (the nearest measured cell in index space). The grids take the fill
that wins on their family: decode attention and MLA decode from below, context attention the nearest.
vLLM's tables of H100, H200, B200 and A100 (MLA: TensorRT-LLM's, the one MLA table); nothing here is
timed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.device.kernel_grid import fill_from_below, fill_nearest
from sim.device.measured_kernels import (
    KV_FORMATS,
    MEASURED_MLA,
    attention_roofline_s,
    context_roofline_s,
    mla_roofline_s,
)
from sim.inputs import catalog
from sim.inputs.kernel_tables import load_tables, with_moe_mla

GPUS = ("h100-sxm", "h200-sxm", "b200", "a100-80gb-sxm")
SLICE = ["kv_dtype", "kv_heads", "head_dim", "window", "heads"]
FILLS = {"from below": fill_from_below, "nearest": fill_nearest}


def _grid(s: pd.DataFrame, baseline_s: np.ndarray) -> np.ndarray:
    lr = np.log(s["latency_s"].to_numpy() / baseline_s)
    return s.assign(lr=lr).pivot_table(index="batch", columns="kv_tokens", values="lr").to_numpy()


def attention_grids(table: pd.DataFrame, roofline, spec) -> list[np.ndarray]:
    grids = []
    for _, s in table[table["window"] == 0].groupby(SLICE):
        d, kvh, hd, _, h = s.iloc[0][SLICE]
        roof = roofline(s["batch"].to_numpy(), s["kv_tokens"].to_numpy(), h, h if kvh == 0 else kvh, hd,
                        KV_FORMATS[d].bytes_per_element, spec.bf16_flop_per_s, spec.hbm_bytes_per_s)
        grids.append(_grid(s, roof + s["latency_s"].min()))
    return grids


def mla_grids(table: pd.DataFrame, spec) -> list[np.ndarray]:
    grids = []
    for (d, h), s in table.groupby(["kv_dtype", "heads"]):
        roof = mla_roofline_s(s["batch"].to_numpy(), s["kv_tokens"].to_numpy(), h, *MEASURED_MLA,
                              KV_FORMATS[d].bytes_per_element, spec.matmul_peak(d)[0], spec.hbm_bytes_per_s)
        grids.append(_grid(s, roof))
    return grids


def frontier_errors(grid: np.ndarray) -> dict[str, list[float]]:
    out = {name: [] for name in FILLS}
    for i in range(1, grid.shape[0]):
        measured = np.flatnonzero(~np.isnan(grid[i]))
        if len(measured) < 2 or measured[-1] == grid.shape[1] - 1:
            continue
        j = measured[-1]
        held = grid.copy()
        held[i, j] = np.nan
        for name, fill in FILLS.items():
            out[name].append(float(np.exp(fill(held)[i, j] - grid[i, j]) - 1))
    return out


def main() -> None:
    families = {"decode attention": [], "context attention": [], "mla decode": []}
    for gpu in GPUS:
        spec, tables = catalog.gpu(gpu), with_moe_mla(load_tables(gpu))
        families["decode attention"] += attention_grids(tables.decode_attention, attention_roofline_s, spec)
        families["context attention"] += attention_grids(tables.context_attention, context_roofline_s, spec)
        families["mla decode"] += mla_grids(tables.mla_decode, spec)
    for family, grids in families.items():
        errors = {name: [] for name in FILLS}
        for grid in grids:
            for name, errs in frontier_errors(grid).items():
                errors[name] += errs
        for name, errs in errors.items():
            a = np.abs(errs)
            print(f"{family:17s} {name:10s} {len(a):5d} frontier cells: median {100 * np.median(a):.1f}%, "
                  f"p90 {100 * np.quantile(a, 0.9):.1f}%, worst {100 * a.max():.0f}%, mean {100 * np.mean(errs):+.1f}%")


if __name__ == "__main__":
    main()
