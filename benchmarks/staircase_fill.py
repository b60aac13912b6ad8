"""How the kernel grids fill a table's holes, held against the tables themselves (not a test):

    .venv/bin/python benchmarks/staircase_fill.py

AIConfigurator's decode-attention tables are staircases: at each batch the collector timed contexts up
to what fit its memory. Each batch's largest measured context below the table's last context column
(the frontier) is withheld in turn, its (heads, batch) slice's grid of log(measured / (roofline +
floor)) filled with it missing, and the fill compared with the measurement: `kernel_grid._fill_holes`
(the smallest ratio of the nearest measured cells below, along each axis) against `_fill_nearest` (the
nearest measured cell in index space, the rule before 2026-12-05). vLLM's tables of H100, H200, B200
and A100; nothing here is timed.
"""

from __future__ import annotations

import numpy as np

from sim.device.kernel_grid import _fill_holes, _fill_nearest
from sim.device.measured_kernels import KV_FORMATS, attention_roofline_s
from sim.inputs import catalog
from sim.inputs.kernel_tables import load_tables

GPUS = ("h100-sxm", "h200-sxm", "b200", "a100-80gb-sxm")
SLICE = ["kv_dtype", "kv_heads", "head_dim", "window", "heads"]


def log_ratio_grid(s, spec) -> np.ndarray:
    d, kvh, hd, _, h = s.iloc[0][SLICE]
    kv = h if kvh == 0 else kvh
    roof = attention_roofline_s(s["batch"].to_numpy(), s["kv_tokens"].to_numpy(), h, kv, hd,
                                KV_FORMATS[d].bytes_per_element, spec.bf16_flop_per_s, spec.hbm_bytes_per_s)
    s = s.assign(lr=np.log(s["latency_s"].to_numpy() / (roof + s["latency_s"].min())))
    return s.pivot_table(index="batch", columns="kv_tokens", values="lr").to_numpy()


def frontier_errors(grid: np.ndarray) -> dict[str, list[float]]:
    out = {"holes": [], "nearest": []}
    for i in range(1, grid.shape[0]):
        measured = np.flatnonzero(~np.isnan(grid[i]))
        if len(measured) < 2 or measured[-1] == grid.shape[1] - 1:
            continue
        j = measured[-1]
        held = grid.copy()
        held[i, j] = np.nan
        for name, fill in (("holes", _fill_holes), ("nearest", _fill_nearest)):
            out[name].append(float(np.exp(fill(held)[i, j] - grid[i, j]) - 1))
    return out


def main() -> None:
    errors = {"holes": [], "nearest": []}
    for gpu in GPUS:
        spec, table = catalog.gpu(gpu), load_tables(gpu).decode_attention
        for _, s in table[table["window"] == 0].groupby(SLICE):
            grid = log_ratio_grid(s, spec)
            for name, errs in frontier_errors(grid).items():
                errors[name] += errs
    for name, errs in errors.items():
        a = np.abs(errs)
        print(f"{name:8s} {len(a)} frontier cells: median {100 * np.median(a):.1f}%, p90 {100 * np.quantile(a, 0.9):.1f}%, "
              f"worst {100 * a.max():.0f}%, mean {100 * np.mean(errs):+.1f}%")


if __name__ == "__main__":
    main()
