"""A decoder layer's elementwise operators held against Microsoft Vidur's operator profiles
(sim/catalog/vidur_elementwise_ops.csv: Llama-2-7B and -70B on A100 and H100, TP 1 and 4, 1-4,096
tokens). Measured: the layer's two RMSNorms, rotary embedding, SiLU-and-mul and residual add, each
once, as Vidur's own layer time counts them. Predicted: those five passes by bytes
(`device.elementwise`), with the constants scripts/fit_elementwise.py fitted on Llama-2-7B's rows - so
the points are Llama-2-70B's, held out (other widths, GQA). Error = predicted / measured - 1. No
measured kernel table times these operators (AIConfigurator has none), so there is no tables column.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np
import pandas as pd

from sim.device.elementwise import (
    ADD,
    FITTED,
    RMSNORM,
    ROPE,
    SILU_MUL,
    VIDUR_PASSES,
    Elementwise,
    elementwise_for,
    layer_passes_s,
)
from sim.inputs import catalog

FILE = "vidur_elementwise_ops.csv"
GPUS = {"h100": "h100-sxm", "a100": "a100-80gb-sxm"}  # Vidur's system names -> kvtier's catalog GPUs
OPS_MS = ("input_layernorm_ms", "attn_rope_ms", "post_attention_layernorm_ms", "mlp_act_ms", "add_ms")
MS = 1e-3
FAMILY = "elementwise (per layer)"
TUNE, HELD_OUT = "Llama-2-7b-hf", "Llama-2-70b-hf"  # scripts/fit_elementwise.py fits on TUNE's rows


@lru_cache(maxsize=1)
def profiles() -> pd.DataFrame:
    """The committed profile rows, one per (gpu, model, tp, tokens)."""
    return pd.read_csv(resources.files("sim").joinpath("catalog", FILE), comment="#")


def widths(p: pd.DataFrame) -> dict[str, pd.Series]:
    """Each fitted pass's width a row on one GPU, from the profile rows' shapes: RMSNorm and the add over
    the hidden size, rope over the query and key heads / tp, SiLU-and-mul over the intermediate / tp."""
    head = p["n_embd"] / p["n_head"]
    return {RMSNORM: p["n_embd"], ADD: p["n_embd"], ROPE: (p["n_head"] + p["n_kv_head"]) * head / p["tp"],
            SILU_MUL: p["n_expanded_embd"] / p["tp"]}


def vidur_layer_s(ew: Elementwise, p: pd.DataFrame, hbm_bytes_per_s: float) -> np.ndarray:
    """A layer of Vidur's five passes (`VIDUR_PASSES`) per profile row, by `ew`'s constants."""
    w = widths(p)
    return np.array([layer_passes_s(ew, rows, {k: ((float(w[k].iloc[i]), 1.0),) for k in FITTED}, hbm_bytes_per_s,
                                    VIDUR_PASSES) for i, rows in enumerate(p["num_tokens"])])


def points() -> pd.DataFrame:
    """One row per held-out profile (HELD_OUT's): gpu (kvtier's), op, shape, measured_s (the layer's
    passes), datasheet_s (the fitted passes), tables_s (NaN: no table), and the errors."""
    p = profiles()
    p = p[p["model"] == HELD_OUT].reset_index(drop=True)
    predicted = np.zeros(len(p))
    for vidur_gpu, gpu in GPUS.items():
        mine = (p["gpu"] == vidur_gpu).to_numpy()
        predicted[mine] = vidur_layer_s(elementwise_for(gpu, None), p[mine], catalog.gpu(gpu).hbm_bytes_per_s)
    out = pd.DataFrame({"gpu": p["gpu"].map(GPUS), "op": FAMILY,
                        "shape": p["model"] + " tp" + p["tp"].astype(str) + " t" + p["num_tokens"].astype(str),
                        "measured_s": p[list(OPS_MS)].sum(axis=1) * MS, "datasheet_s": predicted, "tables_s": np.nan})
    out["datasheet_err"] = out["datasheet_s"] / out["measured_s"] - 1
    out["tables_err"] = np.nan
    return out
