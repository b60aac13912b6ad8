"""Operator-level accuracy on a held-out split of AIConfigurator's measured kernel tables
(`sim.inputs.kernel_tables.split_tables`): every held-out point predicted by kvtier's datasheet
model and by the measured tables with the held-out grid lines removed (so the measured figures test
interpolation across a gap, never a table point itself). Error = predicted / measured - 1.

The domain is what kvtier's step cost asks for: GEMMs of 1-8192 rows with n, k >= 256 (bf16, fp8),
decode attention at head dim 128 without a sliding window over >= 16 cached tokens, prefill
attention at head dim 128 without a window over prompts of >= 16 tokens, both kinds of attention in every
sliding-window slice the tables time (families "window decode / prefill attention"), all-reduces up to 64 MiB
over 2-8 GPUs (custom and NCCL), NCCL's all-gathers and reduce-scatters up to 64 MiB buffers, and
DeepEP's all-to-alls (one node's EP8). Every `STRIDE`-th point of the domain is
kept, in table order, so a run is seconds, not minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pandas as pd

from sim.device.kernels import (
    AllReduce,
    AllToAll,
    DecodeAttention,
    Gather,
    Gemm,
    OpCost,
    Operator,
    PrefillAttention,
    datasheet_cost,
)
from sim.device.measured_kernels import MeasuredKernels
from sim.inputs import catalog
from sim.inputs.kernel_tables import SYSTEMS, load_tables, split_tables

STRIDE = 7
FAMILY = (r"^(gemm|decode attention|prefill attention|window decode attention|window prefill attention|all-reduce|"
          r"all-gather|reduce-scatter|all-to-all)")  # from its name
MAX_ALLREDUCE_BYTES = 64 * 2**20
WINDOWED = {False: "", True: "window "}  # an attention family's name prefix
P95 = 0.95  # the tail quantile `summary` reports beside the worst point
Costing = Callable[[Operator], OpCost]  # one GPU's datasheet cost of an operator


def held_out_points(gpu: str, fit_from: str | None = None) -> tuple[pd.DataFrame, MeasuredKernels]:
    """(one row per held-out point: op, shape, measured_s, datasheet_s, tables_s), and the measured
    kernels built from the tune split alone. `fit_from`: the datasheet model takes that GPU's fitted
    constants (`catalog.fitted_kernels_for`: how well a fit carries over to a sibling)."""
    spec = catalog.gpu(gpu)
    tune, held = split_tables(load_tables(gpu))
    mk = MeasuredKernels(tune, spec, catalog.interconnect(spec.interconnect).bus_bytes_per_s)
    ds = partial(datasheet_cost, gpu, fit_from=fit_from)
    frames = [_gemms(ds, held.gemm, mk), _attention(ds, held.decode_attention, mk),
              _attention(ds, held.decode_attention, mk, windowed=True)]
    if held.context_attention is not None:
        frames += [_prefill(ds, held.context_attention, mk), _prefill(ds, held.context_attention, mk, windowed=True)]
    frames += [_allreduce(ds, impl, t, mk) for impl, t in held.allreduce.items()]
    frames += [_gather(ds, op, t, mk) for op, t in held.gather.items()]
    if held.a2a is not None:
        frames.append(_a2a(ds, held.a2a, mk))
    out = pd.concat([f for f in frames if len(f)], ignore_index=True)
    out["datasheet_err"] = out["datasheet_s"] / out["measured_s"] - 1
    out["tables_err"] = out["tables_s"] / out["measured_s"] - 1
    out.insert(0, "gpu", gpu)
    return out, mk


def _gemms(ds: Costing, g: pd.DataFrame, mk: MeasuredKernels) -> pd.DataFrame:
    g = g[(g["m"] <= 8192) & (g["n"] >= 256) & (g["k"] >= 256)].iloc[::STRIDE]
    rows = []
    for dtype, t in g.groupby("dtype"):
        tables = mk.gemm_s(t["m"], t["n"], t["k"], dtype).seconds
        for (m, n, k, meas), tab in zip(t[["m", "n", "k", "latency_s"]].itertuples(index=False), tables):
            rows.append({"op": f"gemm {dtype}", "shape": f"m{m} n{n} k{k}", "measured_s": meas,
                         "datasheet_s": ds(Gemm(int(m), int(n), int(k), dtype)).seconds,
                         "tables_s": tab})
    return pd.DataFrame(rows)


def _domain(t: pd.DataFrame, windowed: bool) -> pd.DataFrame:
    """An attention table's held-out domain: head dim 128 without a window, or every sliding-window slice
    (`windowed`: gpt-oss's window-128 layers at head dim 64 among them), >= 16 cached / prompt tokens."""
    keep = (t["window"] > 0) if windowed else (t["head_dim"] == 128) & (t["window"] == 0)
    return t[keep & (t["kv_tokens"] >= 15)].iloc[::STRIDE]


def _attention(ds: Costing, a: pd.DataFrame, mk: MeasuredKernels, windowed: bool = False) -> pd.DataFrame:
    rows = []
    for r in _domain(a, windowed).itertuples(index=False):
        shape = (int(r.heads), int(r.kv_heads or r.heads), int(r.head_dim), r.kv_dtype, int(r.window))
        tab = mk.decode_attention_s(r.batch, r.kv_tokens, *shape)
        op = DecodeAttention(int(r.batch), int(r.kv_tokens), *shape)
        rows.append({"op": f"{WINDOWED[windowed]}decode attention kv {r.kv_dtype}", "measured_s": r.latency_s,
                     "datasheet_s": ds(op).seconds, "tables_s": float(tab.seconds[0]), "shape": _shape(r, shape)})
    return pd.DataFrame(rows)


def _prefill(ds: Costing, c: pd.DataFrame, mk: MeasuredKernels, windowed: bool = False) -> pd.DataFrame:
    rows = []
    for r in _domain(c, windowed).itertuples(index=False):
        shape = (int(r.heads), int(r.kv_heads or r.heads), int(r.head_dim), r.kv_dtype, int(r.window))
        op = PrefillAttention(int(r.batch), int(r.kv_tokens), *shape)
        tab = mk.context_attention_s(r.batch, r.kv_tokens, *shape)
        rows.append({"op": f"{WINDOWED[windowed]}prefill attention kv {r.kv_dtype}", "measured_s": r.latency_s,
                     "datasheet_s": ds(op).seconds, "tables_s": float(tab.seconds[0]), "shape": _shape(r, shape)})
    return pd.DataFrame(rows)


def _shape(r, shape: tuple) -> str:
    """An attention point's shape as the table says it: batch, tokens, heads / KV heads (and a window's head
    dim and window)."""
    heads, kv_heads, head_dim, _, window = shape
    return f"b{r.batch} n{r.kv_tokens} H{heads}/{kv_heads}" + (f" d{head_dim} W{window}" if window else "")


def _allreduce(ds: Costing, impl: str, t: pd.DataFrame, mk: MeasuredKernels) -> pd.DataFrame:
    t = t[t["bytes"] <= MAX_ALLREDUCE_BYTES]
    rows = []
    for r in t.itertuples(index=False):
        tab = mk.allreduce_s(r.bytes, int(r.gpus), impl).seconds[0]
        rows.append({"op": f"all-reduce {impl}", "shape": f"{int(r.bytes)} B x{r.gpus}", "measured_s": r.latency_s,
                     "datasheet_s": ds(AllReduce(float(r.bytes), int(r.gpus), impl)).seconds, "tables_s": float(tab)})
    return pd.DataFrame(rows)


def _gather(ds: Costing, op: str, t: pd.DataFrame, mk: MeasuredKernels) -> pd.DataFrame:
    t = t[t["bytes"] <= MAX_ALLREDUCE_BYTES]
    rows = []
    for r in t.itertuples(index=False):
        rows.append({"op": f"{op.replace('_', '-')} nccl", "shape": f"{int(r.bytes)} B x{r.gpus}",
                     "measured_s": r.latency_s, "datasheet_s": ds(Gather(float(r.bytes), int(r.gpus), op)).seconds,
                     "tables_s": float(mk.gather_s(op, r.bytes, int(r.gpus)).seconds[0])})
    return pd.DataFrame(rows)


def _a2a(ds: Costing, a: pd.DataFrame, mk: MeasuredKernels) -> pd.DataFrame:
    rows = []
    for r in a.itertuples(index=False):
        op = AllToAll(int(r.tokens), int(r.hidden), int(r.top_k), int(r.experts), int(r.ep), r.phase, r.backend, r.wire)
        tab = mk.a2a_s(r.backend, r.phase, r.wire, r.tokens, int(r.hidden), int(r.top_k), int(r.experts), int(r.ep))
        rows.append({"op": f"all-to-all deepep {r.backend} {r.phase}", "shape": f"t{r.tokens} h{r.hidden} k{r.top_k} "
                     f"E{r.experts} ep{r.ep}", "measured_s": r.latency_s, "datasheet_s": ds(op).seconds,
                     "tables_s": float(tab.seconds[0])})
    return pd.DataFrame(rows)


def summary(points: pd.DataFrame) -> pd.DataFrame:
    """Per GPU and operator: points, then median / 95th-percentile / worst |error| and the mean signed
    error, for the datasheet model and for the measured tables (negative: predicted too fast). The 95th
    percentile beside the worst says whether a family's tail is broad or a few points that disagree
    with their neighbours in the table (kernels.md)."""
    def stats(e: pd.Series) -> dict:
        a = e.abs()
        return {"median": float(a.median()), "p95": float(a.quantile(P95)), "worst": float(a.max()),
                "mean": float(e.mean())}

    rows = []
    for (gpu, op), p in points.groupby(["gpu", "op"], sort=False):
        d, m = stats(p["datasheet_err"]), stats(p["tables_err"])
        rows.append({"gpu": gpu, "op": op, "points": len(p),
                     **{f"datasheet_{k}": v for k, v in d.items()}, **{f"tables_{k}": v for k, v in m.items()}})
    return pd.DataFrame(rows)


def covered_gpus() -> list[str]:
    return list(SYSTEMS)


def family_summary(points: pd.DataFrame) -> pd.DataFrame:
    """Per operator family (gemm, decode attention, prefill attention, all-reduce) over every GPU."""
    fam = points["op"].str.extract(FAMILY)[0]
    return summary(points.assign(gpu="all", op=fam.to_numpy()))
