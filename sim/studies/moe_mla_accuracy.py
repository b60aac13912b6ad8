"""MLA decode and prefill attention and MoE experts held against AIConfigurator's measured tables (issue #22
item 6): every point of the held-out split (`kernel_tables.split_tables`, the lines operator_accuracy
holds out) predicted by the datasheet model kvtier uses today and by the measured tables with the
held-out lines removed. Error = predicted / measured - 1 (negative: kvtier too fast, optimistic).

- MLA decode (`kernel_tables` generation_mla, TensorRT-LLM's absorbed MLA kernel, DeepSeek-V3 shapes):
  the datasheet call is what `physics.kinds_attention_s` makes for an MLA layer - of
  `kind_attention_flop_per_token(MLA)` x attended tokens and (attended + new) latents x
  `kind_kv_bytes_per_token_layer(MLA)`: `mla_datasheet_attention_s` where the GPU has an MLA fit (on
  the tune split of these tables), else `attention_s` - on deepseek-r1 sharded to the row's heads
  per GPU (every row is R1 at TP 128 / heads).
- MLA prefill (`kernel_tables` context_mla, TensorRT-LLM's kernel not absorbed, whole prompts): the
  datasheet call is `physics.prefill_attention_s` for deepseek-r1 sharded to the row's heads per GPU.
- MoE (vLLM's fused experts): the datasheet call is `moe_fit.datasheet_moe_s` where the GPU has a fit
  for the row's format (on the tune split of these tables), else `physics.weight_gemm_s` of the routed
  experts' terms of `ModelSpec.layer_weight_bytes_read` / `layer_linear_params_read` /
  `active_linear_params_layer` for the row's shape: experts touched x 3 h I/tp x bytes per weight
  (uniform routing: `expected_experts_touched`; under EP the busiest GPU's,
  `busiest_rank_experts_touched`), FLOP 2 x T x k / ep x 3 h I/tp, over rows = T tokens, two of the
  layer's four GEMM floors (gate_up and down). No router, shared expert or communication: the
  table has none. Every shape of the table is held, those of a catalog model named (`model`).
  kvtier's routing (uniform, independent tokens) is not the benchmark's: 'balanced' rows spread
  each token's picks a stride ceil(E/k) apart (collector/helper.py `balanced_logits`), touching
  min(E, T k) experts where uniform routing touches E (1 - (1 - k/E)^T). So balanced rows also get
  `datasheet_routed_s`: the same datasheet kernel at the experts and routed pairs the benchmark put
  on the GPU it timed (rank 0: experts 0 .. E/ep - 1), which separates kvtier's kernel model from
  its routing model. Power-law rows draw their routing at random: their datasheet call is the fit on
  the tables' power-law rows at the draw's expected load (`sim.model.power_law`), and no such column.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from sim.device.kernels import MlaBmm, datasheet_cost, datasheet_hardware
from sim.device.measured_kernels import MeasuredKernels
from sim.device.moe_op import QUANT_AS, datasheet_moe_op_s, experts_kernel_s
from sim.device.physics import (
    attention_s,
    kind_attention_flop_per_token,
    mla_datasheet_attention_s,
    prefill_attention_s,
)
from sim.inputs import catalog
from sim.inputs.kernel_tables import MOE_SLICE, SYSTEMS, load_tables, split_tables, with_moe_mla
from sim.model.dtypes import WEIGHT_DTYPES
from sim.model.layers import MLA
from sim.model.spec import MLP_MATRICES, ModelSpec

MLA_MODEL = "deepseek-r1"  # the table's shapes: 128 heads, kv_lora_rank 512 + rope 64
MLA_BINS = (0, 2**14, 2**20, np.inf)  # latents one call reads (batch x tokens): floor-bound, middle, streaming
MOE_BINS = (0, 16, 256, 2048, np.inf)  # tokens: decode batches, large decode, prefill chunks


def covered_gpus() -> list[str]:
    return list(SYSTEMS)


def held_out_points(gpu: str) -> tuple[pd.DataFrame, MeasuredKernels]:
    """(one row per held-out point: op, family, shape, model (the catalog models of that shape, or
    ""), layout, size, measured_s, datasheet_s, tables_s, datasheet_routed_s, the errors of each and
    below_hbm), and the measured kernels built from the tune split alone."""
    spec = catalog.gpu(gpu)
    tune, held = split_tables(with_moe_mla(load_tables(gpu)))
    mk = MeasuredKernels(tune, spec, catalog.interconnect(spec.interconnect).bus_bytes_per_s)
    frames = [f for f in (_mla(gpu, held.mla_decode, mk), _moe(gpu, held.moe, mk), _bmm(gpu, held.mla_bmm, mk),
                          _mla_prefill(gpu, held.mla_context, mk)) if len(f)]
    out = pd.concat(frames, ignore_index=True)
    out["datasheet_err"] = out["datasheet_s"] / out["measured_s"] - 1
    out["tables_err"] = out["tables_s"] / out["measured_s"] - 1
    out["routed_err"] = out["datasheet_routed_s"] / out["measured_s"] - 1 if "datasheet_routed_s" in out else np.nan
    out.insert(0, "gpu", gpu)
    return out, mk


# ---- MLA decode --------------------------------------------------------------------------------
@lru_cache(maxsize=16)
def _mla_model(heads: int) -> ModelSpec:
    """deepseek-r1 as one GPU of the tensor-parallel group that leaves it `heads` query heads."""
    model = catalog.model(MLA_MODEL)
    return model.shard(model.num_heads // heads)


def mla_datasheet_s(gpu: str, batch: int, kv_tokens: int, heads: int, kv_dtype: str) -> float:
    """kvtier's datasheet MLA decode call (`physics.kinds_attention_s`, an MLA layer): `batch`
    sequences each attending `kv_tokens` latents (the new one included), reading them all and
    writing the new ones."""
    model = _mla_model(heads)
    flop = kind_attention_flop_per_token(model, MLA) * batch * kv_tokens
    kv_bytes = (batch * kv_tokens + batch) * model.kind_kv_bytes_per_token_layer(MLA, kv_dtype)
    hw = datasheet_hardware(gpu)
    if hw.mla_fit is not None:  # fitted on the tune split of these tables (scripts/fit_datasheet.py)
        return mla_datasheet_attention_s(hw, batch, heads, flop, kv_bytes, kv_dtype in ("fp8", "int8"))
    return attention_s(flop, kv_bytes, hw)


def _mla(gpu: str, m: pd.DataFrame, mk: MeasuredKernels) -> pd.DataFrame:
    rows, hbm = [], catalog.gpu(gpu).hbm_bytes_per_s
    for (kv_dtype, heads), t in m.groupby(["kv_dtype", "heads"]):
        tables = mk.mla_decode_s(t["batch"].to_numpy(), t["kv_tokens"].to_numpy(), int(heads), kv_dtype).seconds
        tp = catalog.model(MLA_MODEL).num_heads // int(heads)
        latent = _mla_model(int(heads)).kind_kv_bytes_per_token_layer(MLA, kv_dtype)
        for (b, n, meas), tab in zip(t[["batch", "kv_tokens", "latency_s"]].itertuples(index=False), tables):
            rows.append({"op": f"mla decode kv {kv_dtype}", "family": "mla decode", "shape": f"b{b} n{n} H{heads}",
                         "model": MLA_MODEL, "layout": f"TP{tp}", "size": b * n, "measured_s": meas,
                         "datasheet_s": mla_datasheet_s(gpu, int(b), int(n), int(heads), kv_dtype), "tables_s": tab,
                         "below_hbm": meas < b * n * latent / hbm})
    return pd.DataFrame(rows)


def mla_prefill_datasheet_s(gpu: str, batch: int, tokens: int, heads: int, kv_dtype: str) -> float:
    """kvtier's datasheet MLA prefill call (`physics.prefill_attention_s` for deepseek-r1 sharded to
    `heads` query heads a GPU): `batch` whole prompts of `tokens`."""
    model = _mla_model(heads)
    pos = batch * tokens * (tokens + 1) / 2
    return prefill_attention_s(model, datasheet_hardware(gpu), pos, batch * tokens,
                               model.kv_bytes_per_token_layer(kv_dtype), seqs=batch, new_tokens=batch * tokens)


def _mla_prefill(gpu: str, c: pd.DataFrame | None, mk: MeasuredKernels) -> pd.DataFrame:
    """MLA prefill (TensorRT-LLM's context-MLA kernel) by KV dtype: the datasheet call and the tables'."""
    rows = []
    for r in (c.itertuples(index=False) if c is not None else ()):
        heads, tp = int(r.heads), catalog.model(MLA_MODEL).num_heads // int(r.heads)
        shape = f"b{r.batch} n{r.tokens} H{heads}"
        rows.append({"op": f"mla prefill kv {r.kv_dtype}", "family": "mla prefill", "shape": shape,
                     "model": MLA_MODEL, "layout": f"TP{tp}", "size": r.batch * r.tokens, "measured_s": r.latency_s,
                     "datasheet_s": mla_prefill_datasheet_s(gpu, int(r.batch), int(r.tokens), heads, r.kv_dtype),
                     "tables_s": mk.mla_context_one_s(r.batch, r.tokens, heads, r.kv_dtype), "below_hbm": False})
    return pd.DataFrame(rows)


def _bmm(gpu: str, b: pd.DataFrame | None, mk: MeasuredKernels) -> pd.DataFrame:
    """Absorbed MLA's BMMs (the engine's mla_bmm table), pre and post, by dtype: its fit (`kernels.MlaBmm`)."""
    rows = []
    for r in (b.itertuples(index=False) if b is not None else ()):
        d = datasheet_cost(gpu, MlaBmm(int(r.tokens), int(r.heads), r.op, r.dtype))
        if d.seconds is None:
            continue
        rows.append({"op": f"mla bmm {r.dtype}", "family": "mla bmm", "shape": f"{r.op} t{r.tokens} H{r.heads}",
                     "model": MLA_MODEL, "layout": "", "size": r.tokens * r.heads, "measured_s": r.latency_s,
                     "datasheet_s": d.seconds, "tables_s": mk.mla_bmm_one_s(r.op, r.dtype, r.tokens, int(r.heads)),
                     "below_hbm": False})
    return pd.DataFrame(rows)


# ---- MoE ---------------------------------------------------------------------------------------
def moe_datasheet_s(gpu: str, tokens: int, experts: int, top_k: int, hidden: int, inter: int, tp: int, ep: int,
                    quant: str, routing: str = "balanced") -> float:
    """kvtier's datasheet cost of one GPU's routed experts for `tokens` tokens at `routing`
    (`moe_op.datasheet_moe_op_s`, as `kvsim ops moe` prices it) on the GPU's datasheet hardware in the format's
    dtype."""
    return datasheet_moe_op_s(datasheet_hardware(gpu, QUANT_AS[quant][0]), quant, tokens, experts, top_k, hidden, inter,
                              tp, ep, routing)


@lru_cache(maxsize=4096)
def balanced_rank0(tokens: int, experts: int, top_k: int, ep: int) -> tuple[int, int]:
    """(distinct experts, token-expert pairs) the 'balanced' routing puts on EP rank 0, which holds
    experts 0 .. E/ep - 1: token i picks (i + j s) mod E, s = ceil(E / k), j < k, or, with fewer
    tokens than s, trunc(i s / T + j s) mod E (AIConfigurator collector/helper.py `balanced_logits`)."""
    stride = -(-experts // top_k)
    i, j = np.arange(tokens)[:, None], np.arange(top_k)[None, :]
    picks = (i + j * stride) % experts if tokens >= stride else np.trunc(i * stride / tokens + j * stride) % experts
    local = picks[picks < experts // ep]
    return len(np.unique(local)), int(local.size)


def moe_routed_datasheet_s(gpu: str, tokens: int, experts: int, top_k: int, hidden: int, inter: int, tp: int, ep: int,
                           quant: str) -> tuple[float, float]:
    """(`moe_datasheet_s`'s kernel at the 'balanced' benchmark's own routing on the GPU it timed
    (`balanced_rank0`): touched experts and FLOP 2 x routed pairs x expert params; and the time just
    to stream those experts' weights at the datasheet HBM peak, a bound no kernel beats)."""
    weight_dtype, group = QUANT_AS[quant]
    touched, pairs = balanced_rank0(tokens, experts, top_k, ep)
    routed = experts_kernel_s(datasheet_hardware(gpu, weight_dtype), quant, touched, pairs, tokens, hidden, inter // tp)
    w_bytes = touched * WEIGHT_DTYPES[weight_dtype].bytes_for(MLP_MATRICES * hidden * (inter // tp), group)
    return routed, w_bytes / catalog.gpu(gpu).hbm_bytes_per_s


@lru_cache(maxsize=1)
def kvtier_moe_shapes() -> dict[tuple[int, int, int, int], str]:
    """(experts, top-k, hidden, moe inter) -> the catalog models with that MoE shape."""
    shapes: dict[tuple[int, int, int, int], list[str]] = {}
    for name, m in catalog.models().items():
        if m.is_moe:
            key = (m.num_experts, m.experts_per_token, m.hidden_size, m.moe_intermediate_size)
            shapes.setdefault(key, []).append(name)
    return {k: "/".join(v) for k, v in shapes.items()}


def _moe(gpu: str, e: pd.DataFrame, mk: MeasuredKernels) -> pd.DataFrame:
    rows = []
    for key, t in e.groupby(MOE_SLICE):
        quant, dist, experts, top_k, hidden, inter, tp, ep = (key[0], key[1], *(int(x) for x in key[2:]))
        tables = mk.moe_s(t["tokens"].to_numpy(), experts, top_k, hidden, inter, tp, ep, quant, dist).seconds
        model = kvtier_moe_shapes().get((experts, top_k, hidden, inter), "")
        layout = f"TP{tp}" if ep == 1 else f"EP{ep}"
        shape = (experts, top_k, hidden, inter, tp, ep, quant)
        for (n, meas), tab in zip(t[["tokens", "latency_s"]].itertuples(index=False), tables):
            routed, stream = moe_routed_datasheet_s(gpu, int(n), *shape) if dist == "balanced" else (np.nan, 0.0)
            rows.append({"op": f"moe {quant} {dist}", "family": f"moe {dist}",
                         "shape": f"T{n} E{experts} k{top_k} h{hidden} I{inter} {layout}",
                         "model": model, "layout": layout, "size": n, "measured_s": meas,
                         "datasheet_s": moe_datasheet_s(gpu, int(n), *shape, dist), "tables_s": tab,
                         "datasheet_routed_s": routed, "below_hbm": meas < stream})
    return pd.DataFrame(rows)


# ---- summaries ---------------------------------------------------------------------------------
def _stats(p: pd.DataFrame) -> dict:
    d, m, r = p["datasheet_err"], p["tables_err"], p["routed_err"].dropna()
    return {"points": len(p), "datasheet_median": float(d.abs().median()), "datasheet_p90": float(d.abs().quantile(0.9)),
            "datasheet_worst": float(d.abs().max()), "datasheet_mean": float(d.mean()), "optimistic": float((d < 0).mean()),
            "routed_median": float(r.abs().median()) if len(r) else np.nan,
            "routed_mean": float(r.mean()) if len(r) else np.nan,
            "tables_median": float(m.abs().median()), "tables_worst": float(m.abs().max()),
            "below_hbm": int(p["below_hbm"].sum())}


def summary(points: pd.DataFrame, by: tuple[str, ...] = ("gpu", "family")) -> pd.DataFrame:
    """Per group: points; median / 90th-percentile / worst |error| and mean signed error of the
    datasheet model, the share of points where it is optimistic (predicted faster than measured);
    median |error| and mean signed error of its kernel at the benchmark's own routing (balanced MoE
    rows only); median / worst |error| of the measured tables across the held-out gap; and how many
    measurements are faster than streaming what they must read at the datasheet HBM peak (MLA: the
    latents; balanced MoE: the experts its routing touches) - physically doubtful points."""
    return pd.DataFrame([{**dict(zip(by, k if isinstance(k, tuple) else (k,))), **_stats(p)}
                         for k, p in points.groupby(list(by), sort=False)])


def kvtier_summary(points: pd.DataFrame, layouts: tuple[str, ...] | None = None) -> pd.DataFrame:
    """`summary` of the points whose shape a catalog model runs, per GPU, op, model and layout (TP n:
    every expert / the heads split n ways; EP n: the experts split whole), `layouts` only if given."""
    p = points[points["model"] != ""]
    if layouts is not None:
        p = p[p["layout"].isin(layouts)]
    return summary(p, ("gpu", "op", "model", "layout"))


def deepseek_summary(points: pd.DataFrame) -> pd.DataFrame:
    """`kvtier_summary` of DeepSeek-R1 as kvtier runs it on 8 GPUs: MLA decode at TP8 (16 heads per
    GPU), its fp8 (block-scaled) experts at TP8 and at EP8, balanced and power-law 1.01 routing."""
    p = points[points["model"].str.startswith(MLA_MODEL) & points["layout"].isin(("TP8", "EP8"))]
    p = p[(p["family"] == "mla decode") | p["op"].isin(("moe fp8_block balanced", "moe fp8_block power_law_1.01"))]
    return summary(p, ("gpu", "op", "layout"))


def sign_pattern(points: pd.DataFrame) -> pd.DataFrame:
    """Where the datasheet model is optimistic: per GPU and family, by size regime (MLA: latents a
    call reads, batch x tokens; MoE: tokens), the median signed error and the optimistic share."""
    is_mla = points["family"] == "mla decode"
    regime = pd.Series("", index=points.index)
    regime[is_mla] = pd.cut(points.loc[is_mla, "size"], MLA_BINS, right=False,
                            labels=["b x n < 16K", "16K-1M", ">= 1M"]).astype(str)
    regime[~is_mla] = pd.cut(points.loc[~is_mla, "size"], MOE_BINS, right=False,
                             labels=["T < 16", "16-255", "256-2047", ">= 2048"]).astype(str)
    rows = []
    for (gpu, fam, reg), p in points.assign(regime=regime).groupby(["gpu", "family", "regime"], sort=False):
        d = p["datasheet_err"]
        rows.append({"gpu": gpu, "family": fam, "regime": reg, "points": len(p), "datasheet_median_signed": float(d.median()),
                     "optimistic": float((d < 0).mean())})
    return pd.DataFrame(rows)
