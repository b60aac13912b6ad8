"""Operator times from measured kernel tables (`sim.inputs.kernel_tables`): a GEMM, one layer's decode
attention, an all-reduce (all-gather, reduce-scatter), one layer's MLA decode attention and its BMMs,
one GPU's fused MoE experts and a DeepEP all-to-all, each as
the table's ratio to a baseline interpolated (`kernel_grid`) times that baseline: the operator's
roofline on the GPU's datasheet peaks, plus (GEMMs, GQA attention, all-reduces) the table's smallest
time as a floor. At a measured point the answer is the
measurement; between points the ratio is interpolated in log coordinates; outside the table the
edge's ratio is held (the datasheet roofline scaled to the table's edge). Every answer says whether
it fell inside the table and which slice it used.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache, partial

import numpy as np

from sim.inputs import catalog
from sim.inputs.catalog import GpuSpec
from sim.inputs.kernel_tables import (
    A2A_SLICE,
    FRAMEWORK,
    GEMM_DTYPES,
    MLA_CONTEXT_TABLE,
    MLA_TABLE,
    MOE_SLICE,
    MOE_TABLE,
    WEIGHT_BYTES,
    KernelTables,
    load_tables,
    moe_curves,
    trtllm_moe_backend,
    with_moe_mla,
)
from sim.model.dtypes import KV_DTYPES as KV_FORMATS
from sim.model.dtypes import WEIGHT_DTYPES
from sim.model.experts import expected_experts_touched, expected_remote_ranks
from sim.model.layers import window_pairs
from sim.model.units import ATTN_MATMULS, FLOP_PER_MAC

from .kernel_grid import LazyGrids, RatioGrid, fill_cold_side, fill_from_below, fill_past_window
from .moe_exchange import A2A_WIRE_BYTES

ACTIVATION_BYTES = 2  # bf16 activations in and out of a GEMM, queries and outputs of attention
# a dtype -> the measured table standing for it
MEASURED_AS = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "int8", "int4": "int4", "nvfp4": "nvfp4"}
MEASURED_MLA = (512, 64)  # kv_lora_rank, qk_rope_head_dim of the MLA table (DeepSeek-V3 shapes)
MEASURED_MLA_CONTEXT = (192, 128)  # q / k head dim (nope 128 + rope 64) and v head dim of the MLA prefill table
MOE_WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int4_wo": 0.5, "w4a16_mxfp4": 0.5,
                    "w4a8_mxfp4_mxfp8": WEIGHT_DTYPES["mxfp4"].packed_bytes_per_element,
                    "nvfp4": WEIGHT_DTYPES["nvfp4"].packed_bytes_per_element}
# a MoE table format -> the weight dtype whose matmul peak it runs at (W8A8 fp8, W4A4 fp4, W4A8 fp8); W4A16: bf16
MOE_COMPUTE_AS = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "nvfp4", "w4a8_mxfp4_mxfp8": "mxfp4"}
EXPERT_MATRICES = 3  # gate, up, down


@dataclass(frozen=True)
class Lookup:
    """Seconds per call at each query point, whether each lay inside the measured table, and the table."""

    seconds: np.ndarray
    inside: np.ndarray
    source: str
    note: str = ""  # a slice that stood in for the one asked (another KV head count, KV dtype, ...)


def gemm_roofline_s(m, n, k, elem_bytes: float, flop_per_s: float, hbm_bytes_per_s: float):
    """max(2 m n k / peak FLOP/s, bytes (m k + n k + m n) x element / HBM bytes/s)."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    return np.maximum(FLOP_PER_MAC * m * n * k / flop_per_s, elem_bytes * (m * k + n * k + m * n) / hbm_bytes_per_s)


def attention_roofline_s(batch, kv_tokens, heads, kv_heads, head_dim, kv_bytes: float, flop_per_s: float,
                         hbm_bytes_per_s: float, window: int = 0):
    """One decode-attention call: max(4 b n H d / FLOP/s, (b n 2 Hkv d x KV bytes + b H d x 2 x 2) / HBM),
    n the cached tokens a sequence attends: min(n, W) under a sliding window of W (0: none)."""
    b, n = np.asarray(batch, dtype=float), windowed_tokens(kv_tokens, window)
    flop = ATTN_MATMULS * FLOP_PER_MAC * b * n * heads * head_dim
    moved = b * n * 2 * kv_heads * head_dim * kv_bytes + b * heads * head_dim * ACTIVATION_BYTES * 2
    return np.maximum(flop / flop_per_s, moved / hbm_bytes_per_s)


def context_roofline_s(batch, prompt_tokens, heads, kv_heads, head_dim, kv_bytes: float, flop_per_s: float,
                       hbm_bytes_per_s: float, window: int = 0):
    """One causal prefill-attention call of b prompts of n tokens: max(4 H d b pairs / FLOP/s,
    b n (2 Hkv d x KV bytes + 2 H d x 2) / HBM) - token i attends i tokens, pairs = n (n + 1) / 2, or
    min(i, W) under a sliding window of W (`window_pairs`); Q read, O written, K/V written."""
    b, n = np.asarray(batch, dtype=float), np.asarray(prompt_tokens, dtype=float)
    flop = ATTN_MATMULS * FLOP_PER_MAC * heads * head_dim * b * window_pairs(n, window)
    moved = b * n * (2 * kv_heads * head_dim * kv_bytes + 2 * heads * head_dim * ACTIVATION_BYTES)
    return np.maximum(flop / flop_per_s, moved / hbm_bytes_per_s)


def windowed_tokens(kv_tokens, window: int):
    """Cached tokens one decode query attends: all n, or the last min(n, W) under a sliding window of W."""
    n = np.asarray(kv_tokens, dtype=float)
    return np.minimum(n, float(window)) if window else n


def mla_roofline_s(batch, kv_tokens, heads, kv_lora_rank: int, rope_dim: int, kv_bytes: float, flop_per_s: float,
                   hbm_bytes_per_s: float):
    """One absorbed MLA decode call, Dl = kv_lora_rank + rope (QK^T over the latent) and Dc =
    kv_lora_rank (PV): max(2 b n H (Dl + Dc) / FLOP/s, (b n Dl x KV bytes + b H (Dl + Dc) x 2) / HBM) -
    each latent read once for every head, the queries in and the latent outputs out in bf16."""
    b, n = np.asarray(batch, dtype=float), np.asarray(kv_tokens, dtype=float)
    latent, per_head = kv_lora_rank + rope_dim, 2 * kv_lora_rank + rope_dim
    flop = FLOP_PER_MAC * b * n * heads * per_head
    moved = b * n * latent * kv_bytes + b * heads * per_head * ACTIVATION_BYTES
    return np.maximum(flop / flop_per_s, moved / hbm_bytes_per_s)


def mla_context_roofline_s(batch, tokens, heads, qk_dim: int, v_dim: int, flop_per_s: float, hbm_bytes_per_s: float):
    """One MLA prefill call, not absorbed (each head's q and k of qk_dim = nope + rope, v of v_dim, as
    GQA with one KV head per query head), causal over whole prompts of n:
    max(2 b H n (n + 1) / 2 (qk + v) / FLOP/s, b n H (2 qk + 2 v) x 2 / HBM) - q, k, v in and the output
    out in bf16 (the FMHA's dtype)."""
    b, n = np.asarray(batch, dtype=float), np.asarray(tokens, dtype=float)
    flop = FLOP_PER_MAC * b * heads * n * (n + 1) / 2 * (qk_dim + v_dim)
    moved = b * n * heads * (2 * qk_dim + 2 * v_dim) * ACTIVATION_BYTES
    return np.maximum(flop / flop_per_s, moved / hbm_bytes_per_s)


def moe_roofline_s(tokens, experts: int, top_k: int, hidden: int, inter: int, tp: int, ep: int, weight_bytes: float,
                   flop_per_s: float, hbm_bytes_per_s: float):
    """One GPU's fused-experts call (I/tp of every expert's width, E/ep experts):
    max(2 T k/ep 3 h I/tp / FLOP/s, (touched x 3 h I/tp x weight bytes + 2 T h x 2) / HBM), touched =
    E/ep (1 - (1 - k/E)^T), the GPU's experts some token routes to under uniform routing
    (`sim.model.experts.expected_experts_touched`); tokens in and out in bf16."""
    t = np.asarray(tokens, dtype=float)
    expert = EXPERT_MATRICES * hidden * inter / tp
    flop = FLOP_PER_MAC * t * top_k / ep * expert
    touched = expected_experts_touched(experts, top_k, t, experts // ep)
    moved = touched * expert * weight_bytes + 2 * t * hidden * ACTIVATION_BYTES
    return np.maximum(flop / flop_per_s, moved / hbm_bytes_per_s)


MLA_BMM_WIDTHS = (128, 512)  # each head's qk_nope / v width and kv_lora_rank (DeepSeek-V3's, the BMM tables')


def mla_bmm_work(tokens, heads, elem_bytes: float):
    """(FLOP, bytes) of one absorbed-MLA BMM (pre or post) over `tokens` x `heads`: 2 x tokens x heads x 128 x
    512, and the heads' 128 x 512 weights x element bytes + tokens x heads x (128 + 512) x 2 B in and out."""
    d, r = MLA_BMM_WIDTHS
    return FLOP_PER_MAC * tokens * heads * d * r, heads * d * r * elem_bytes + tokens * heads * (d + r) * ACTIVATION_BYTES


def mla_bmm_roofline_s(tokens, heads: int, elem_bytes: float, flop_per_s: float, hbm_bytes_per_s: float):
    """One absorbed-MLA BMM: max(FLOP / peak, bytes / HBM) of `mla_bmm_work`."""
    flop, nbytes = mla_bmm_work(np.asarray(tokens, dtype=float), heads, elem_bytes)
    return np.maximum(flop / flop_per_s, nbytes / hbm_bytes_per_s)


def allreduce_roofline_s(nbytes, gpus: int, bus_bytes_per_s: float):
    """Ring all-reduce bandwidth term: 2 (N - 1) / N x bytes / bus bytes/s."""
    return 2 * (gpus - 1) / gpus * np.asarray(nbytes, dtype=float) / bus_bytes_per_s


def a2a_roofline_s(tokens, hidden: int, top_k: int, experts: int, ep: int, wire_bytes: float, bytes_per_s: float):
    """One dispatch or combine of `tokens` per rank: tokens x the remote ranks a token reaches x hidden x
    wire bytes / the fabric's all-to-all rate (`expected_remote_ranks`)."""
    remote = expected_remote_ranks(experts, top_k, ep)
    return np.asarray(tokens, dtype=float) * remote * hidden * wire_bytes / bytes_per_s


def gather_roofline_s(nbytes, gpus: int, bus_bytes_per_s: float):
    """All-gather / reduce-scatter of a whole buffer of `nbytes`: (N - 1) / N x bytes / bus bytes/s."""
    return (gpus - 1) / gpus * np.asarray(nbytes, dtype=float) / bus_bytes_per_s


class MeasuredKernels:
    def __init__(self, tables: KernelTables, gpu: GpuSpec, bus_bytes_per_s: float):
        self.tables, self.gpu, self.bus_bytes_per_s = tables, gpu, bus_bytes_per_s
        self._slice_of: dict[tuple, tuple[tuple, str]] = {}  # _attention_slice's answers: every step asks again
        self._moe_grids: dict[tuple, RatioGrid] = {}  # `_moe_curve`'s, built per slice on first use
        self._a2a_grids: dict[tuple, RatioGrid] = {}  # `_a2a_grid`'s, likewise
        self._moe_slice_of: dict[tuple, tuple[tuple, str]] = {}  # `_moe_slice`'s answers for unmeasured shapes

    def _peak(self, dtype: str) -> float:
        return self.gpu.matmul_peak(dtype)[0]

    # ---- GEMM -------------------------------------------------------------------------------------
    def gemm_dtypes(self) -> frozenset[str]:
        return self._gemm_dtypes

    @cached_property
    def _gemm_dtypes(self) -> frozenset[str]:  # (asked every step)
        return frozenset(d for d, m in MEASURED_AS.items() if m in self._gemm_grids)

    @cached_property
    def _gemm_grids(self) -> LazyGrids:
        def build(part):
            dtype, t = part
            roof = gemm_roofline_s(t["m"], t["n"], t["k"], _gemm_bytes(dtype), self._peak(dtype), self.gpu.hbm_bytes_per_s)
            return RatioGrid.floored(t[["m", "n", "k"]].to_numpy(), t["latency_s"].to_numpy(), roof)

        return LazyGrids(build, {dtype: (dtype, t) for dtype, t in self.tables.gemm.groupby("dtype")})

    def gemm_s(self, m, n, k, dtype: str = "bf16") -> Lookup:
        """One `x[m, k] @ W[n, k]^T` call; `dtype` a weight dtype the table measured (`gemm_dtypes`)."""
        key = MEASURED_AS.get(dtype)
        if key not in self._gemm_grids:
            raise KeyError(f"no measured {dtype} GEMM table for {self.tables.system}")
        m, n, k = np.broadcast_arrays(*(np.atleast_1d(np.asarray(x, dtype=float)) for x in (m, n, k)))
        grid = self._gemm_grids[key]
        ratio, inside = grid(np.column_stack([m, n, k]))
        roof = gemm_roofline_s(m, n, k, _gemm_bytes(key), self._peak(key), self.gpu.hbm_bytes_per_s)
        return Lookup((roof + grid.floor_s) * ratio, inside, self.tables.source(f"gemm {GEMM_DTYPES[key]}"))

    # ---- decode attention -------------------------------------------------------------------------
    @cached_property
    def _attention_slices(self) -> LazyGrids:
        return self._slice_grids(self.tables.decode_attention, attention_roofline_s, fill_cold_side)

    def _slice_grids(self, table, roofline, fill=None) -> LazyGrids:
        """An attention table (decode or context) as grids of measured / `roofline` over (heads, batch,
        tokens), one per (KV dtype, KV heads, head dim, window) slice, each built on first use; `fill`
        the grids' hole fill (`RatioGrid.from_points`)."""
        def build(part):
            (kv_dtype, kv_heads, head_dim, window), t = part
            hkv = np.where(kv_heads == 0, t["heads"], kv_heads)
            roof = roofline(t["batch"], t["kv_tokens"], t["heads"].to_numpy(), hkv, head_dim,
                            KV_FORMATS[kv_dtype].bytes_per_element, self.gpu.bf16_flop_per_s, self.gpu.hbm_bytes_per_s,
                            window=window)
            holes = fill
            if window and fill is fill_cold_side:  # a window's decode rows (cached tokens run 2^k - 1: W - 1 is W)
                index = int(np.searchsorted(np.unique(t["kv_tokens"]), window - 1))
                holes = partial(fill_past_window, window_index=index)
            return RatioGrid.floored(t[["heads", "batch", "kv_tokens"]].to_numpy(), t["latency_s"].to_numpy(), roof,
                                     holes)

        parts = table.groupby(["kv_dtype", "kv_heads", "head_dim", "window"])
        return LazyGrids(build, {(d, int(h), int(hd), int(w)): ((d, h, hd, w), t) for (d, h, hd, w), t in parts})

    def decode_attention_s(self, batch, kv_tokens, heads: int, kv_heads: int, head_dim: int, kv_dtype: str = "bf16",
                           window: int = 0) -> Lookup:
        """One layer's decode attention: `batch` sequences each attending `kv_tokens` cached tokens."""
        key, note = self._attention_slice(heads, kv_heads, head_dim, kv_dtype, window)
        b, n = np.broadcast_arrays(np.atleast_1d(np.asarray(batch, dtype=float)), np.atleast_1d(np.asarray(kv_tokens, dtype=float)))
        n = np.maximum(n, 1.0)
        grid = self._attention_slices[key]
        ratio, inside = grid(np.column_stack([np.full(len(b), float(heads)), b, n]))
        kv_bytes = KV_FORMATS[kv_dtype].bytes_per_element
        roof = attention_roofline_s(b, n, heads, kv_heads, head_dim, kv_bytes, self.gpu.bf16_flop_per_s,
                                    self.gpu.hbm_bytes_per_s, window=window)
        return Lookup((roof + grid.floor_s) * ratio, inside & (note == ""), self.tables.source("generation_attention"), note)

    def decode_attention_one_s(self, batch: float, kv_tokens: float, heads: int, kv_heads: int, head_dim: int,
                               kv_dtype: str = "bf16", window: int = 0) -> float:
        """`decode_attention_s(...).seconds[0]` for one query: the same operations in the same order on
        scalars (a serving step asks one at a time; the array machinery cost more than the lookup)."""
        key, _ = self._attention_slice(heads, kv_heads, head_dim, kv_dtype, window)
        b, n = float(batch), max(float(kv_tokens), 1.0)
        grid = self._attention_slices[key]
        ratio, _ = grid._at((float(heads), b, n))
        kv_bytes = KV_FORMATS[kv_dtype].bytes_per_element
        if window:  # the window's tokens (`attention_roofline_s`)
            n = min(n, float(window))
        flop = ATTN_MATMULS * FLOP_PER_MAC * b * n * heads * head_dim
        moved = b * n * 2 * kv_heads * head_dim * kv_bytes + b * heads * head_dim * ACTIVATION_BYTES * 2
        roof = max(flop / self.gpu.bf16_flop_per_s, moved / self.gpu.hbm_bytes_per_s)
        return (roof + grid.floor_s) * ratio

    def has_decode_slice(self, heads: int, kv_heads: int, head_dim: int, kv_dtype: str, window: int) -> bool:
        """Whether the decode-attention table times exactly this slice (`has_context_slice`'s rule)."""
        return self._attention_slice(heads, kv_heads, head_dim, kv_dtype, window)[1] == ""

    def _attention_slice(self, heads, kv_heads, head_dim, kv_dtype, window) -> tuple[tuple, str]:
        """The measured slice for these shapes; where the table lacks it, the one nearest in log
        distance (its roofline ratio carries over), with a note saying which."""
        asked = (heads, kv_heads, head_dim, kv_dtype, window)
        if asked not in self._slice_of:
            self._slice_of[asked] = self._find_attention_slice(*asked)
        return self._slice_of[asked]

    def _find_attention_slice(self, heads, kv_heads, head_dim, kv_dtype, window, slices=None) -> tuple[tuple, str]:
        slices = self._attention_slices if slices is None else slices
        measured_dtype = MEASURED_AS.get(kv_dtype)
        want = (measured_dtype or "bf16", 0 if kv_heads == heads else int(kv_heads), int(head_dim), int(window))
        if measured_dtype and want in slices:
            return want, ""

        def distance(s):
            return ((s[0] != want[0]) * 10 + abs(np.log2(max(s[1], 0.5) / max(want[1], 0.5)))
                    + abs(np.log2(s[2] / want[2])) + (s[3] != want[3]) * 5)

        best = min(slices, key=distance)
        asked = f"kv {kv_dtype}, {kv_heads} KV heads, head dim {head_dim}, window {window}"
        used = f"kv {best[0]}, {best[1] or 'MHA'} KV heads, head dim {best[2]}, window {best[3]}"
        return best, f"not measured ({asked}): the ratio of ({used})"

    # ---- prefill (context) attention --------------------------------------------------------------
    @cached_property
    def _context_slices(self) -> LazyGrids:
        """The context-attention table as grids of measured / `context_roofline_s` over (heads, batch,
        prompt tokens), per (KV dtype, KV heads, head dim, window); empty where the tables have none."""
        c = self.tables.context_attention
        return LazyGrids(None, {}) if c is None else self._slice_grids(c, context_roofline_s)

    def has_context_attention(self) -> bool:
        return bool(self._context_slices)

    def context_attention_s(self, batch, prompt_tokens, heads: int, kv_heads: int, head_dim: int,
                            kv_dtype: str = "bf16", window: int = 0) -> Lookup:
        """`context_attention_one_s` over arrays of (batch, prompt tokens), with whether each lay inside."""
        key, note = self._context_key(heads, kv_heads, head_dim, kv_dtype, window)
        b, n = np.broadcast_arrays(np.atleast_1d(np.asarray(batch, dtype=float)),
                                   np.atleast_1d(np.asarray(prompt_tokens, dtype=float)))
        b, n = np.maximum(b, 1.0), np.maximum(n, 1.0)
        grid = self._context_slices[key]
        ratio, inside = grid(np.column_stack([np.full(len(b), float(heads)), b, n]))
        roof = context_roofline_s(b, n, heads, kv_heads, head_dim, KV_FORMATS[kv_dtype].bytes_per_element,
                                  self.gpu.bf16_flop_per_s, self.gpu.hbm_bytes_per_s, window=window)
        return Lookup((roof + grid.floor_s) * ratio, inside & (note == ""), self.tables.source("context_attention"), note)

    def _context_key(self, heads, kv_heads, head_dim, kv_dtype, window: int = 0) -> tuple[tuple, str]:
        asked = ("context", heads, kv_heads, head_dim, kv_dtype, window)
        if asked not in self._slice_of:
            self._slice_of[asked] = self._find_attention_slice(heads, kv_heads, head_dim, kv_dtype, window,
                                                               self._context_slices)
        return self._slice_of[asked]

    def has_context_slice(self, heads: int, kv_heads: int, head_dim: int, kv_dtype: str, window: int) -> bool:
        """Whether the context-attention table times exactly this slice (a sliding window's prefill needs
        its own window's rows: another window's ratio does not carry over)."""
        return bool(self._context_slices) and self._context_key(heads, kv_heads, head_dim, kv_dtype, window)[1] == ""

    def context_attention_one_s(self, batch: float, prompt_tokens: float, heads: int, kv_heads: int, head_dim: int,
                                kv_dtype: str = "bf16", window: int = 0) -> float:
        """One layer's causal prefill attention of `batch` prompts of `prompt_tokens` tokens each (the
        table's query; a step's chunks come as their equivalent, `physics.prefill_attention_s`), each
        token attending at most the last `window` (0: all): the table's ratio to `context_roofline_s` (of the
        window's pairs), interpolated log-log, at the edge's ratio outside it; a slice standing in for a
        window the table lacks lends its ratio to the asked window's roofline."""
        key = self._context_key(heads, kv_heads, head_dim, kv_dtype, window)[0]
        b, n = max(float(batch), 1.0), max(float(prompt_tokens), 1.0)
        grid = self._context_slices[key]
        ratio, _ = grid._at((float(heads), b, n))
        roof = context_roofline_s(b, n, heads, kv_heads, head_dim, KV_FORMATS[kv_dtype].bytes_per_element,
                                  self.gpu.bf16_flop_per_s, self.gpu.hbm_bytes_per_s, window=window)
        return (float(roof) + grid.floor_s) * ratio

    # ---- all-reduce -------------------------------------------------------------------------------
    def allreduce_impls(self) -> list[str]:
        return list(self.tables.allreduce)

    @cached_property
    def _allreduce_curves(self) -> dict[tuple[str, int], RatioGrid]:
        curves = {}
        for impl, t in self.tables.allreduce.items():
            for gpus, c in t.groupby("gpus"):
                roof = allreduce_roofline_s(c["bytes"], int(gpus), self.bus_bytes_per_s)
                curves[(impl, int(gpus))] = RatioGrid.floored(c[["bytes"]].to_numpy(), c["latency_s"].to_numpy(), roof)
        return curves

    def allreduce_s(self, nbytes, gpus: int, impl: str = "custom") -> Lookup:
        """One all-reduce of `nbytes` over `gpus`; `impl` custom (the engine's one-shot/two-shot kernel)
        or nccl. 0 on one GPU."""
        nbytes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        if gpus <= 1:
            return Lookup(np.zeros(len(nbytes)), np.ones(len(nbytes), dtype=bool), "one GPU: no all-reduce")
        note = ""
        if impl not in self.tables.allreduce:
            other = next(i for i in ("nccl", "custom") if i in self.tables.allreduce)
            impl, note = other, f"no {impl} all-reduce table: {other}'s"
        measured = sorted(g for i, g in self._allreduce_curves if i == impl)
        use = min(measured, key=lambda g: abs(np.log2(g / gpus)))
        if use != gpus:
            note = (note + "; " if note else "") + f"{gpus} GPUs not measured: the ratio of {use}"
        curve = self._allreduce_curves[(impl, use)]
        ratio, inside = curve(nbytes[:, None])
        table = "nccl all_reduce" if impl == "nccl" else "custom_allreduce"
        return Lookup((allreduce_roofline_s(nbytes, gpus, self.bus_bytes_per_s) + curve.floor_s) * ratio, inside & (note == ""),
                      self.tables.source(table), note)

    @cached_property
    def _gather_curves(self) -> dict[tuple[str, int], RatioGrid]:
        return {(op, int(gpus)): RatioGrid.floored(c[["bytes"]].to_numpy(), c["latency_s"].to_numpy(),
                                                  gather_roofline_s(c["bytes"], int(gpus), self.bus_bytes_per_s))
                for op, t in self.tables.gather.items() for gpus, c in t.groupby("gpus")}

    def has_gather(self) -> bool:
        return bool(self.tables.gather)

    def gather_s(self, op: str, nbytes, gpus: int) -> Lookup:
        """One NCCL all_gather or reduce_scatter (`op`) of a whole buffer of `nbytes` over `gpus`, as
        `allreduce_s` interpolates its table (a group size not measured takes the nearest's ratio)."""
        nbytes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        if gpus <= 1:
            return Lookup(np.zeros(len(nbytes)), np.ones(len(nbytes), dtype=bool), f"one GPU: no {op}")
        use = min((g for o, g in self._gather_curves if o == op), key=lambda g: abs(np.log2(g / gpus)))
        note = f"{gpus} GPUs not measured: the ratio of {use}" if use != gpus else ""
        curve = self._gather_curves[(op, use)]
        ratio, inside = curve(nbytes[:, None])
        return Lookup((gather_roofline_s(nbytes, gpus, self.bus_bytes_per_s) + curve.floor_s) * ratio,
                      inside & (note == ""), self.tables.source(f"nccl {op}"), note)

    # ---- absorbed MLA's BMMs (read on first use, with the MLA tables) ------------------------------
    def mla_bmm_dtypes(self) -> set[str]:
        """The BMM dtypes (bf16, fp8) the engine's MLA BMM table times; empty: none."""
        return {k[1] for k in self._mla_bmm_slices}

    @cached_property
    def _mla_bmm_slices(self) -> dict[tuple, RatioGrid]:
        b = self._moe_mla_tables.mla_bmm
        if b is None or not len(b):
            return {}
        out = {}
        for (op, dtype, heads), t in b.groupby(["op", "dtype", "heads"]):
            roof = mla_bmm_roofline_s(t["tokens"], int(heads), _gemm_bytes(dtype), self._peak(dtype), self.gpu.hbm_bytes_per_s)
            out[(op, dtype, int(heads))] = RatioGrid.from_points(t[["tokens"]].to_numpy(dtype=float),
                                                                 t["latency_s"].to_numpy() / roof)
        return out

    def mla_bmm_one_s(self, op: str, dtype: str, tokens: float, heads: int) -> float:
        """One absorbed-MLA BMM (`op` pre or post) of `tokens` tokens and `heads` heads on one GPU, its
        table's ratio to `mla_bmm_roofline_s` over tokens (a head count not timed: the nearest's, log2)."""
        use = min((h for o, d, h in self._mla_bmm_slices if (o, d) == (op, dtype)), key=lambda h: abs(np.log2(h / heads)))
        t = max(float(tokens), 1.0)
        ratio, _ = self._mla_bmm_slices[(op, dtype, use)]._at(np.array([t]))
        return float(mla_bmm_roofline_s(t, heads, _gemm_bytes(dtype), self._peak(dtype), self.gpu.hbm_bytes_per_s)) * ratio

    # ---- DeepEP all-to-all (the engines' opt-in exchange) ------------------------------------------
    def a2a_slices(self) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
        """(backend, phase, wire, ep, hidden, top-k, experts) -> its (tokens, seconds) curve; empty: no table."""
        return self._a2a_slices

    @cached_property
    def _a2a_slices(self) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
        a = self.tables.a2a
        if a is None:
            return {}
        return {(k[0], k[1], k[2], *(int(x) for x in k[3:])): (t["tokens"].to_numpy(dtype=float), t["latency_s"].to_numpy())
                for k, t in a.groupby(A2A_SLICE)}

    @cached_property
    def _a2a_rate(self) -> float:
        return catalog.interconnect(self.gpu.interconnect).alltoall_bytes_per_s

    def _a2a_grid(self, key: tuple) -> RatioGrid:
        if key not in self._a2a_grids:
            t_axis, seconds = self._a2a_slices[key]
            roof = a2a_roofline_s(t_axis, *key[4:6], key[6], key[3], A2A_WIRE_BYTES[key[2]], self._a2a_rate)
            self._a2a_grids[key] = RatioGrid.from_points(t_axis[:, None], seconds / roof)
        return self._a2a_grids[key]

    def a2a_s(self, backend: str, phase: str, wire: str, tokens, hidden: int, top_k: int, experts: int,
              ep: int) -> Lookup:
        """One DeepEP dispatch or combine (`phase`) of `tokens` per rank, `backend` ht or ll, `wire` bf16 /
        fp8 (TensorRT-LLM's) or default (vLLM's): the slice's ratio to `a2a_roofline_s` over tokens; a
        shape (or wire) the table lacks takes the nearest measured one's (log distance) and says so."""
        same = [k for k in self._a2a_slices if k[:2] == (backend, phase)]
        if not same:
            raise KeyError(f"no measured DeepEP {backend} {phase} table for {self.tables.system}")
        asked = (wire, ep, hidden, top_k, experts)
        key = min(same, key=lambda k: (k[2] != wire, sum(abs(np.log2(a / b)) for a, b in zip(k[3:], asked[1:]))))
        note = "" if key[2:] == asked else (f"not measured ({wire}, ep {ep}, hidden {hidden}, top-k {top_k}, {experts} "
                                            f"experts): the ratio of ({', '.join(str(x) for x in key[2:])})")
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        ratio, inside = self._a2a_grid(key)(t[:, None])
        roof = a2a_roofline_s(t, hidden, top_k, experts, ep, A2A_WIRE_BYTES[wire], self._a2a_rate)
        return Lookup(roof * ratio, inside & (note == ""), self.tables.source(f"moe_a2a DeepEP {backend} {phase}"), note)

    # ---- MLA decode and MoE (their tables read on first use: `kernel_tables.with_moe_mla`) ----------
    @cached_property
    def _moe_mla_tables(self) -> KernelTables:
        return with_moe_mla(self.tables)

    def mla_kv_dtypes(self) -> set[str]:
        """KV dtypes the MLA decode table measured (bf16, fp16 as bf16, fp8); empty: no table."""
        return {d for d, m in MEASURED_AS.items() if m in self._mla_grids}

    @cached_property
    def _mla_grids(self) -> dict[str, RatioGrid]:
        return _grids_by_kv_dtype(self._moe_mla_tables.mla_decode, "kv_tokens", lambda t, kv_dtype: mla_roofline_s(
            t["batch"], t["kv_tokens"], t["heads"].to_numpy(), *MEASURED_MLA, KV_FORMATS[kv_dtype].bytes_per_element,
            self._peak(kv_dtype), self.gpu.hbm_bytes_per_s))

    def mla_decode_s(self, batch, kv_tokens, heads: int, kv_dtype: str = "bf16", kv_lora_rank: int = 512,
                     qk_rope_head_dim: int = 64) -> Lookup:
        """One layer's absorbed MLA decode attention on one GPU: `batch` sequences each attending
        `kv_tokens` latents (its new one included, as `kernels.DecodeAttention.kv_tokens`), `heads`
        query heads per GPU (H / tp; the latent is one head, replicated). The kernel alone: the W_UK /
        W_UV BMMs and the projections are not in it. A KV dtype or latent shape the table lacks takes
        the ratio of what it has (bf16 KV; DeepSeek's 512 + 64) and says so."""
        if not self._mla_grids:
            raise KeyError(f"no measured MLA decode table for {self.tables.system}")
        key, note = MEASURED_AS.get(kv_dtype), ""
        if key not in self._mla_grids:
            key = "bf16" if "bf16" in self._mla_grids else next(iter(self._mla_grids))
            note = f"not measured (kv {kv_dtype}): the ratio of kv {key}"
        if (kv_lora_rank, qk_rope_head_dim) != MEASURED_MLA:
            note = (note + "; " if note else "") + (f"latent {kv_lora_rank} + {qk_rope_head_dim} not measured: the "
                                                    f"ratio of {MEASURED_MLA[0]} + {MEASURED_MLA[1]}")
        b, n = np.broadcast_arrays(np.atleast_1d(np.asarray(batch, dtype=float)), np.atleast_1d(np.asarray(kv_tokens, dtype=float)))
        n = np.maximum(n, 1.0)
        ratio, inside = self._mla_grids[key](np.column_stack([np.full(len(b), float(heads)), b, n]))
        roof = mla_roofline_s(b, n, heads, kv_lora_rank, qk_rope_head_dim, KV_FORMATS[kv_dtype].bytes_per_element,
                              self._peak(key), self.gpu.hbm_bytes_per_s)
        return Lookup(roof * ratio, inside & (note == ""), self._moe_mla_tables.source(MLA_TABLE), note)

    def mla_decode_one_s(self, batch: float, kv_tokens: float, heads: int, kv_dtype: str = "bf16") -> float:
        """`mla_decode_s(...).seconds[0]` for one query of DeepSeek's latent (a step asks one at a time;
        the array machinery costs more than the lookup): the same operations on scalars."""
        key = MEASURED_AS.get(kv_dtype)
        if key not in self._mla_grids:
            return float(self.mla_decode_s(batch, kv_tokens, heads, kv_dtype).seconds[0])
        b, n = float(batch), max(float(kv_tokens), 1.0)
        ratio, _ = self._mla_grids[key]._at((float(heads), b, n))
        roof = mla_roofline_s(b, n, heads, *MEASURED_MLA, KV_FORMATS[kv_dtype].bytes_per_element, self._peak(key),
                              self.gpu.hbm_bytes_per_s)
        return float(roof) * ratio

    def mla_context_source(self) -> str:
        """Where the MLA prefill costs come from (`KernelTables.source` of the context-MLA table)."""
        return self._moe_mla_tables.source(MLA_CONTEXT_TABLE)

    def mla_context_kv_dtypes(self) -> set[str]:
        """KV dtypes the MLA prefill table measured (bf16, fp16 as bf16, fp8); empty: no table."""
        return {d for d, m in MEASURED_AS.items() if m in self._mla_context_grids}

    @cached_property
    def _mla_context_grids(self) -> dict[str, RatioGrid]:
        return _grids_by_kv_dtype(self._moe_mla_tables.mla_context, "tokens", lambda t, _: mla_context_roofline_s(
            t["batch"], t["tokens"], t["heads"].to_numpy(), *MEASURED_MLA_CONTEXT, self._peak("bf16"),
            self.gpu.hbm_bytes_per_s))

    def mla_context_one_s(self, batch: float, tokens: float, heads: int, kv_dtype: str = "bf16") -> float:
        """One layer's MLA prefill attention on one GPU (TensorRT-LLM's context kernel, DeepSeek's 128 + 64
        / 128 heads): `batch` whole prompts of `tokens`, `heads` query heads per GPU; a KV dtype the table
        lacks takes bf16's ratio."""
        key = MEASURED_AS.get(kv_dtype)
        if key not in self._mla_context_grids:
            key = "bf16"
        b, n = max(float(batch), 1.0), max(float(tokens), 1.0)
        ratio, _ = self._mla_context_grids[key]._at((float(heads), b, n))
        roof = mla_context_roofline_s(b, n, heads, *MEASURED_MLA_CONTEXT, self._peak("bf16"), self.gpu.hbm_bytes_per_s)
        return float(roof) * ratio

    def moe_table(self) -> str:
        """Whose fused-experts table the MoE costs come from ("vllm 0.24.0", "trtllm 1.3.0rc20", ...)."""
        return self._moe_mla_tables.table_sources.get(MOE_TABLE, "")

    def moe_backends(self, experts: int, top_k: int, hidden: int, inter: int, tp: int, ep: int, quant: str,
                     sm100: bool, distribution: str = "balanced") -> tuple[str, ...]:
        """The TensorRT-LLM MoE backends (`kernel_tables.trtllm_moe_backend`) whose kernels timed the slice
        `moe_s` reads for this shape (its nearest where the table lacks it), sorted; empty where the
        table is another engine's or its lane names none."""
        if not self.moe_table().startswith("trtllm"):
            return ()
        rows = self._moe_slice_rows(quant, distribution, experts, top_k, hidden, inter, tp, ep)
        named = {trtllm_moe_backend(k, quant, sm100) for k in rows["kernel"].unique()}
        return tuple(sorted(b for b in named if b))

    def moe_twin_points(self, experts: int, top_k: int, hidden: int, inter: int, tp: int, ep: int, quant: str,
                        distribution: str = "balanced") -> tuple[int, int]:
        """(points that took the die twin's time, points) of the slice `moe_s` reads for this shape
        (`kernel_tables.twin_checked_moe`)."""
        rows = self._moe_slice_rows(quant, distribution, experts, top_k, hidden, inter, tp, ep)
        return int(rows["from_twin"].sum()) if "from_twin" in rows else 0, len(rows)

    def _moe_slice_rows(self, quant: str, distribution: str, *shape):
        """The table's rows of the slice `moe_s` reads for this shape (`_moe_slice`)."""
        key, _ = self._moe_slice(quant, distribution, *shape)
        moe = self._moe_mla_tables.moe
        return moe[np.logical_and.reduce([moe[c] == v for c, v in zip(MOE_SLICE, key)])]

    def moe_quants(self) -> set[str]:
        """The MoE weight formats the table measured (`kernel_tables.MOE_QUANTS`; `moe_quant_for`)."""
        return {k[0] for k in self._moe_slices}

    def moe_routings(self) -> set[str]:
        """The routings the MoE table timed (`inputs.moe_routing.MOE_ROUTINGS`)."""
        return {k[1] for k in self._moe_slices}

    @cached_property
    def _moe_slices(self) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
        """(quant, distribution, experts, top-k, hidden, inter, tp, ep) -> its (tokens, seconds) curve."""
        return moe_curves(self._moe_mla_tables.moe)

    def _moe_curve(self, key: tuple) -> RatioGrid:
        """One slice's ratio curve over tokens, built on its first use (a table holds ~2,000 slices)."""
        if key not in self._moe_grids:
            tokens, seconds = self._moe_slices[key]
            quant, _, experts, top_k, hidden, inter, tp, ep = key
            roof = moe_roofline_s(tokens, experts, top_k, hidden, inter, tp, ep, MOE_WEIGHT_BYTES[quant],
                                  self._moe_peak(quant), self.gpu.hbm_bytes_per_s)
            self._moe_grids[key] = RatioGrid.from_points(tokens[:, None], seconds / roof)
        return self._moe_grids[key]

    def _moe_peak(self, quant: str) -> float:
        return moe_peak_flop_per_s(self.gpu, quant)

    def moe_s(self, tokens, experts: int, top_k: int, hidden: int, inter: int, tp: int = 1, ep: int = 1,
              quant: str = "bfloat16", distribution: str = "balanced") -> Lookup:
        """One GPU's fused MoE experts (vLLM's fused_experts: both grouped GEMMs and the activation;
        no router, no all-reduce or all-to-all) for `tokens` tokens entering the layer, each routed to
        `top_k` of `experts`; `inter` one expert's full width, split `tp` ways (moe tp), the experts
        split whole `ep` ways; `quant` a table weight format (`moe_quants`, `kernel_tables.moe_quant_for`),
        `distribution` its routing ('balanced', 'power_law_1.01', 'power_law_1.2'). A shape the table
        lacks takes the ratio of the nearest measured one (log distance) and says so."""
        key, note = self._moe_slice(quant, distribution, experts, top_k, hidden, inter, tp, ep)
        t = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)
        ratio, inside = self._moe_curve(key)(t[:, None])
        roof = moe_roofline_s(t, experts, top_k, hidden, inter, tp, ep, MOE_WEIGHT_BYTES[quant], self._moe_peak(quant),
                              self.gpu.hbm_bytes_per_s)
        return Lookup(roof * ratio, inside & (note == ""), self._moe_mla_tables.source(MOE_TABLE) + f" {quant}", note)

    def moe_one_s(self, tokens: float, experts: int, top_k: int, hidden: int, inter: int, tp: int = 1, ep: int = 1,
                  quant: str = "bfloat16", distribution: str = "balanced") -> float:
        """`moe_s(...).seconds[0]` for one query: the same operations on scalars."""
        key, _ = self._moe_slice(quant, distribution, experts, top_k, hidden, inter, tp, ep)
        t = max(float(tokens), 1.0)
        ratio, _ = self._moe_curve(key)._at(np.array([t]))
        roof = moe_roofline_s(t, experts, top_k, hidden, inter, tp, ep, MOE_WEIGHT_BYTES[quant], self._moe_peak(quant),
                              self.gpu.hbm_bytes_per_s)
        return float(roof) * ratio

    def _moe_slice(self, quant, distribution, *shape) -> tuple[tuple, str]:
        """The measured slice for this shape; where the table lacks it, the nearest of the same weight
        format and routing in log distance over (experts, top-k, hidden, inter, tp, ep), with a note."""
        asked = (quant, distribution, *(int(x) for x in shape))
        if asked in self._moe_slices:
            return asked, ""
        if asked not in self._moe_slice_of:
            self._moe_slice_of[asked] = self._nearest_moe_slice(asked)
        return self._moe_slice_of[asked]

    def _nearest_moe_slice(self, asked: tuple) -> tuple[tuple, str]:
        quant, distribution = asked[:2]
        same = [k for k in self._moe_slices if k[:2] == asked[:2]]
        if not same:
            raise KeyError(f"no measured {quant} MoE table with {distribution} routing for {self.tables.system}")
        best = min(same, key=lambda k: sum(abs(np.log2(a / b)) for a, b in zip(k[2:], asked[2:])))
        names = ("experts", "top-k", "hidden", "inter", "tp", "ep")
        said = ", ".join(f"{n} {v}" for n, v in zip(names, best[2:]))
        return best, f"not measured ({', '.join(f'{n} {v}' for n, v in zip(names, asked[2:]))}): the ratio of ({said})"


def _grids_by_kv_dtype(table, tokens: str, roof) -> dict[str, RatioGrid]:
    """One ratio grid over (heads, batch, `tokens`) per KV dtype of an MLA table: its latency over
    `roof(rows, kv_dtype)`, the cold side filled from below."""
    return {kv_dtype: RatioGrid.from_points(t[["heads", "batch", tokens]].to_numpy(dtype=float),
                                            t["latency_s"].to_numpy() / roof(t, kv_dtype), fill=fill_from_below)
            for kv_dtype, t in table.groupby("kv_dtype")}


@lru_cache(maxsize=32)
def measured_kernels_for(gpu: str, framework: str = FRAMEWORK) -> MeasuredKernels:
    """The measured kernels of a catalog GPU under `framework` (`kernel_tables.FRAMEWORKS`), built once
    per process (its grids are built on first use and kept); a ConfigError where no table covers the
    GPU or the `.[measured]` extra is missing."""
    spec = catalog.gpu(gpu)
    return MeasuredKernels(load_tables(spec.name, framework), spec, catalog.interconnect(spec.interconnect).bus_bytes_per_s)


def _gemm_bytes(dtype: str) -> float:
    """Bytes per weight element of the roofline the measured ratio is taken over (activations are
    counted at the same width: the ratio carries the difference)."""
    return WEIGHT_BYTES.get(dtype, 2.0)


def moe_peak_flop_per_s(gpu: GpuSpec, quant: str) -> float:
    """The tensor-core peak a MoE table format's experts multiply at (`MOE_COMPUTE_AS`; bf16's otherwise)."""
    return gpu.matmul_peak(MOE_COMPUTE_AS.get(quant, "bf16"))[0]
