"""A layer's elementwise passes by bytes, fitted on Microsoft Vidur's operator profiles (not a test; not
used by the step cost yet - issue #20 item 3 asks for it, docs/accuracy.md says why it waits):

    .venv/bin/python benchmarks/elementwise_fit.py

Each pass of sim/catalog/vidur_elementwise_ops.csv is costed max(floor, rows x bytes a row / (HBM x
efficiency)), the bytes those of bf16 activations on one GPU of the TP group:
  RMSNorm         reads and writes h                    4 h
  rotary          reads and writes q and k per GPU      4 (q + k) / tp
  SiLU-and-mul    reads 2 I / tp, writes I / tp         6 I / tp
  residual add    reads 2 h, writes h                   6 h
(h hidden, I the MLP's intermediate width; RMSNorm and the add are not split by TP). Fitted per GPU and
pass on Llama-2-7B's rows (h 4,096, I 11,008), held out on Llama-2-70B's (h 8,192, I 28,672, GQA 8 KV
heads); a layer is the sum of its passes, each once, as Vidur counts them. Needs scipy (the
`.[measured]` extra brings it). Prints the constants and |error| per GPU: the fit's, and the flat
per-layer figure kvtier charges today (`layer_overhead_s`), on both splits.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from sim.inputs import catalog
from sim.studies.elementwise_accuracy import GPUS, MS, profiles

BF16 = 2
TUNE, HELD = "Llama-2-7b-hf", "Llama-2-70b-hf"


def pass_bytes(p: pd.DataFrame) -> dict[str, pd.Series]:
    """Bytes a row of each measured pass moves (column -> bytes), from the row's shape."""
    h, tp = p["n_embd"], p["tp"]
    head = h / p["n_head"]
    qk = (p["n_head"] + p["n_kv_head"]) * head / tp
    norm = 2 * h * BF16
    return {"input_layernorm_ms": norm, "post_attention_layernorm_ms": norm, "attn_rope_ms": 2 * qk * BF16,
            "mlp_act_ms": 3 * p["n_expanded_embd"] / tp * BF16, "add_ms": 3 * h * BF16}


def pass_s(floor_s: float, efficiency: float, rows, nbytes, hbm_bytes_per_s: float):
    return np.maximum(floor_s, rows * nbytes / (hbm_bytes_per_s * efficiency))


def fit_gpu(p: pd.DataFrame, hbm: float) -> dict[str, tuple[float, float]]:
    """(floor_s, efficiency) per pass, least squares on log time over the tune rows."""
    def log_error(x, nbytes, measured_s):
        return np.log(pass_s(x[0], x[1], p["num_tokens"], nbytes, hbm) / measured_s)

    fits = {}
    for col, nbytes in pass_bytes(p).items():
        res = least_squares(log_error, [3e-6, 0.5], bounds=([0.0, 0.01], [1e-4, 2.0]), args=(nbytes, p[col] * MS))
        fits[col] = (float(res.x[0]), float(res.x[1]))
    return fits


def layer_s(p: pd.DataFrame, fits: dict, hbm: float) -> pd.Series:
    nbytes = pass_bytes(p)
    return sum(pass_s(*fits[col], p["num_tokens"], nbytes[col], hbm) for col in fits)


def _stats(err: pd.Series) -> str:
    a = err.abs()
    return f"median {100 * a.median():5.1f}%  worst {100 * a.max():5.1f}%  mean {100 * err.mean():+6.1f}%"


def main() -> None:
    p = profiles()
    for vidur_gpu, gpu in GPUS.items():
        hbm = catalog.gpu(gpu).hbm_bytes_per_s
        flat = catalog.efficiency_defaults().layer_overhead_s
        g = p[p["gpu"] == vidur_gpu]
        tune, held = g[g["model"] == TUNE], g[g["model"] == HELD]
        fits = fit_gpu(tune, hbm)
        print(f"{gpu} (HBM {hbm / 1e12:.2f} TB/s):")
        for col, (floor, eff) in fits.items():
            print(f"  {col.removesuffix('_ms'):28s} floor {floor * 1e6:4.1f} us  {eff:.2f} of HBM")
        for name, part in (("tune (7B)", tune), ("held out (70B)", held)):
            measured = part[list(fits)].sum(axis=1) * MS
            print(f"  layer, {name:15s} by bytes: {_stats(layer_s(part, fits, hbm) / measured - 1)}")
            print(f"  layer, {name:15s} flat {flat * 1e6:.0f} us: {_stats(flat / measured - 1)}")


if __name__ == "__main__":
    main()
