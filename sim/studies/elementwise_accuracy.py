"""A decoder layer's elementwise operators held against Microsoft Vidur's operator profiles
(sim/catalog/vidur_elementwise_ops.csv: Llama-2-7B and -70B on A100 and H100, TP 1 and 4, 1-4,096
tokens). Measured: the layer's two RMSNorms, rotary embedding, SiLU-and-mul and residual add, each
once, as Vidur's own layer time counts them. Predicted: what kvtier charges a layer beyond its GEMMs,
attention and collectives - `Hardware.layer_overhead_s`, one flat figure whatever the rows (issue #20
item 3 asks for these passes by bytes; not modelled yet). Error = predicted / measured - 1. No
measured kernel table times these operators (AIConfigurator has none), so there is no tables column.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np
import pandas as pd

from sim.device.kernels import datasheet_hardware

FILE = "vidur_elementwise_ops.csv"
GPUS = {"h100": "h100-sxm", "a100": "a100-80gb-sxm"}  # Vidur's system names -> kvtier's catalog GPUs
OPS_MS = ("input_layernorm_ms", "attn_rope_ms", "post_attention_layernorm_ms", "mlp_act_ms", "add_ms")
MS = 1e-3
FAMILY = "elementwise (per layer)"


@lru_cache(maxsize=1)
def profiles() -> pd.DataFrame:
    """The committed profile rows, one per (gpu, model, tp, tokens)."""
    return pd.read_csv(resources.files("sim").joinpath("catalog", FILE), comment="#")


def points() -> pd.DataFrame:
    """One row per profile: gpu (kvtier's), op, shape, measured_s (the layer's passes), datasheet_s
    (kvtier's per-layer charge), tables_s (NaN: no table), and the errors."""
    p = profiles()
    measured = p[list(OPS_MS)].sum(axis=1) * MS
    per_gpu = {g: datasheet_hardware(name).layer_overhead_s for g, name in GPUS.items()}
    out = pd.DataFrame({"gpu": p["gpu"].map(GPUS), "op": FAMILY,
                        "shape": p["model"] + " tp" + p["tp"].astype(str) + " t" + p["num_tokens"].astype(str),
                        "measured_s": measured, "datasheet_s": p["gpu"].map(per_gpu), "tables_s": np.nan})
    out["datasheet_err"] = out["datasheet_s"] / out["measured_s"] - 1
    out["tables_err"] = np.nan
    return out
