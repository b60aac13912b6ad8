"""Operator times from measured kernel tables (`sim.inputs.kernel_tables`): a GEMM, one layer's decode
attention and an all-reduce, each as the table's roofline ratio interpolated (`kernel_grid`) times
the operator's roofline on the GPU's datasheet peaks. At a measured point the answer is the
measurement; between points the ratio is interpolated in log coordinates; outside the table the
edge's ratio is held (the datasheet roofline scaled to the table's edge). Every answer says whether
it fell inside the table and which slice it used.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from sim.inputs import catalog
from sim.inputs.catalog import GpuSpec
from sim.inputs.kernel_tables import GEMM_DTYPES, KernelTables, load_tables
from sim.model.dtypes import KV_DTYPES as KV_FORMATS
from sim.model.units import ATTN_MATMULS, FLOP_PER_MAC

from .kernel_grid import RatioGrid

ACTIVATION_BYTES = 2  # bf16 activations in and out of a GEMM, queries and outputs of attention
MEASURED_AS = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8"}  # a dtype -> the measured table standing for it


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
                         hbm_bytes_per_s: float):
    """One decode-attention call: max(4 b n H d / FLOP/s, (b n 2 Hkv d x KV bytes + b H d x 2 x 2) / HBM)."""
    b, n = np.asarray(batch, dtype=float), np.asarray(kv_tokens, dtype=float)
    flop = ATTN_MATMULS * FLOP_PER_MAC * b * n * heads * head_dim
    moved = b * n * 2 * kv_heads * head_dim * kv_bytes + b * heads * head_dim * ACTIVATION_BYTES * 2
    return np.maximum(flop / flop_per_s, moved / hbm_bytes_per_s)


def allreduce_roofline_s(nbytes, gpus: int, bus_bytes_per_s: float):
    """Ring all-reduce bandwidth term: 2 (N - 1) / N x bytes / bus bytes/s."""
    return 2 * (gpus - 1) / gpus * np.asarray(nbytes, dtype=float) / bus_bytes_per_s


class MeasuredKernels:
    def __init__(self, tables: KernelTables, gpu: GpuSpec, bus_bytes_per_s: float):
        self.tables, self.gpu, self.bus_bytes_per_s = tables, gpu, bus_bytes_per_s
        self._slice_of: dict[tuple, tuple[tuple, str]] = {}  # _attention_slice's answers: every step asks again

    def _peak(self, dtype: str) -> float:
        return self.gpu.fp8_flop_per_s if dtype == "fp8" and self.gpu.fp8_flop_per_s else self.gpu.bf16_flop_per_s

    # ---- GEMM -------------------------------------------------------------------------------------
    def gemm_dtypes(self) -> set[str]:
        return {d for d, m in MEASURED_AS.items() if m in self._gemm_grids}

    @cached_property
    def _gemm_grids(self) -> dict[str, RatioGrid]:
        grids = {}
        for dtype, t in self.tables.gemm.groupby("dtype"):
            roof = gemm_roofline_s(t["m"], t["n"], t["k"], _gemm_bytes(dtype), self._peak(dtype), self.gpu.hbm_bytes_per_s)
            grids[dtype] = RatioGrid.from_points(t[["m", "n", "k"]].to_numpy(), t["latency_s"].to_numpy() / roof)
        return grids

    def gemm_s(self, m, n, k, dtype: str = "bf16") -> Lookup:
        """One `x[m, k] @ W[n, k]^T` call; `dtype` a weight dtype the table measured (`gemm_dtypes`)."""
        key = MEASURED_AS.get(dtype)
        if key not in self._gemm_grids:
            raise KeyError(f"no measured {dtype} GEMM table for {self.tables.system}")
        m, n, k = np.broadcast_arrays(*(np.atleast_1d(np.asarray(x, dtype=float)) for x in (m, n, k)))
        ratio, inside = self._gemm_grids[key](np.column_stack([m, n, k]))
        roof = gemm_roofline_s(m, n, k, _gemm_bytes(key), self._peak(key), self.gpu.hbm_bytes_per_s)
        return Lookup(roof * ratio, inside, self.tables.source(f"gemm {GEMM_DTYPES[key]}"))

    # ---- decode attention -------------------------------------------------------------------------
    @cached_property
    def _attention_slices(self) -> dict[tuple, RatioGrid]:
        grids = {}
        a = self.tables.decode_attention
        for (kv_dtype, kv_heads, head_dim, window), t in a.groupby(["kv_dtype", "kv_heads", "head_dim", "window"]):
            hkv = np.where(kv_heads == 0, t["heads"], kv_heads)
            roof = attention_roofline_s(t["batch"], t["kv_tokens"], t["heads"].to_numpy(), hkv, head_dim,
                                        KV_FORMATS[kv_dtype].bytes_per_element, self.gpu.bf16_flop_per_s,
                                        self.gpu.hbm_bytes_per_s)
            grids[(kv_dtype, int(kv_heads), int(head_dim), int(window))] = RatioGrid.from_points(
                t[["heads", "batch", "kv_tokens"]].to_numpy(), t["latency_s"].to_numpy() / roof)
        return grids

    def decode_attention_s(self, batch, kv_tokens, heads: int, kv_heads: int, head_dim: int, kv_dtype: str = "bf16",
                           window: int = 0) -> Lookup:
        """One layer's decode attention: `batch` sequences each attending `kv_tokens` cached tokens."""
        key, note = self._attention_slice(heads, kv_heads, head_dim, kv_dtype, window)
        b, n = np.broadcast_arrays(np.atleast_1d(np.asarray(batch, dtype=float)), np.atleast_1d(np.asarray(kv_tokens, dtype=float)))
        n = np.maximum(n, 1.0)
        ratio, inside = self._attention_slices[key](np.column_stack([np.full(len(b), float(heads)), b, n]))
        kv_bytes = KV_FORMATS[kv_dtype].bytes_per_element
        roof = attention_roofline_s(b, n, heads, kv_heads, head_dim, kv_bytes, self.gpu.bf16_flop_per_s, self.gpu.hbm_bytes_per_s)
        return Lookup(roof * ratio, inside & (note == ""), self.tables.source("generation_attention"), note)

    def decode_attention_one_s(self, batch: float, kv_tokens: float, heads: int, kv_heads: int, head_dim: int,
                               kv_dtype: str = "bf16", window: int = 0) -> float:
        """`decode_attention_s(...).seconds[0]` for one query: the same operations in the same order on
        scalars (a serving step asks one at a time; the array machinery cost more than the lookup)."""
        key, _ = self._attention_slice(heads, kv_heads, head_dim, kv_dtype, window)
        b, n = float(batch), max(float(kv_tokens), 1.0)
        ratio, _ = self._attention_slices[key]._at(np.array([float(heads), b, n]))
        kv_bytes = KV_FORMATS[kv_dtype].bytes_per_element
        flop = ATTN_MATMULS * FLOP_PER_MAC * b * n * heads * head_dim
        moved = b * n * 2 * kv_heads * head_dim * kv_bytes + b * heads * head_dim * ACTIVATION_BYTES * 2
        roof = max(flop / self.gpu.bf16_flop_per_s, moved / self.gpu.hbm_bytes_per_s)
        return roof * ratio

    def _attention_slice(self, heads, kv_heads, head_dim, kv_dtype, window) -> tuple[tuple, str]:
        """The measured slice for these shapes; where the table lacks it, the one nearest in log
        distance (its roofline ratio carries over), with a note saying which."""
        asked = (heads, kv_heads, head_dim, kv_dtype, window)
        if asked not in self._slice_of:
            self._slice_of[asked] = self._find_attention_slice(*asked)
        return self._slice_of[asked]

    def _find_attention_slice(self, heads, kv_heads, head_dim, kv_dtype, window) -> tuple[tuple, str]:
        measured_dtype = MEASURED_AS.get(kv_dtype)
        want = (measured_dtype or "bf16", 0 if kv_heads == heads else int(kv_heads), int(head_dim), int(window))
        if measured_dtype and want in self._attention_slices:
            return want, ""

        def distance(s):
            return ((s[0] != want[0]) * 10 + abs(np.log2(max(s[1], 0.5) / max(want[1], 0.5)))
                    + abs(np.log2(s[2] / want[2])) + (s[3] != want[3]) * 5)

        best = min(self._attention_slices, key=distance)
        asked = f"kv {kv_dtype}, {kv_heads} KV heads, head dim {head_dim}, window {window}"
        used = f"kv {best[0]}, {best[1] or 'MHA'} KV heads, head dim {best[2]}, window {best[3]}"
        return best, f"not measured ({asked}): the ratio of ({used})"

    # ---- all-reduce -------------------------------------------------------------------------------
    def allreduce_impls(self) -> list[str]:
        return list(self.tables.allreduce)

    @cached_property
    def _allreduce_curves(self) -> dict[tuple[str, int], RatioGrid]:
        curves = {}
        for impl, t in self.tables.allreduce.items():
            for gpus, c in t.groupby("gpus"):
                roof = allreduce_roofline_s(c["bytes"], int(gpus), self.bus_bytes_per_s)
                curves[(impl, int(gpus))] = RatioGrid.from_points(c[["bytes"]].to_numpy(), c["latency_s"].to_numpy() / roof)
        return curves

    def allreduce_s(self, nbytes, gpus: int, impl: str = "custom") -> Lookup:
        """One all-reduce of `nbytes` over `gpus`; `impl` custom (the engine's one-shot/two-shot kernel)
        or nccl. 0 on one GPU."""
        nbytes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        if gpus <= 1:
            return Lookup(np.zeros(len(nbytes)), np.ones(len(nbytes), dtype=bool), "one GPU: no all-reduce")
        note = ""
        if impl not in self.tables.allreduce:
            impl, note = "nccl", f"no {impl} all-reduce table: nccl's"
        measured = sorted(g for i, g in self._allreduce_curves if i == impl)
        use = min(measured, key=lambda g: abs(np.log2(g / gpus)))
        if use != gpus:
            note = (note + "; " if note else "") + f"{gpus} GPUs not measured: the ratio of {use}"
        ratio, inside = self._allreduce_curves[(impl, use)](nbytes[:, None])
        table = "nccl all_reduce" if impl == "nccl" else "custom_allreduce"
        return Lookup(allreduce_roofline_s(nbytes, gpus, self.bus_bytes_per_s) * ratio, inside & (note == ""),
                      self.tables.source(table), note)


@lru_cache(maxsize=16)
def measured_kernels_for(gpu: str) -> MeasuredKernels:
    """The measured kernels of a catalog GPU, built once per process (its grids are built on first use
    and kept); a ConfigError where no table covers the GPU or the `.[measured]` extra is missing."""
    spec = catalog.gpu(gpu)
    return MeasuredKernels(load_tables(spec.name), spec, catalog.interconnect(spec.interconnect).bus_bytes_per_s)


def _gemm_bytes(dtype: str) -> float:
    return 1.0 if dtype == "fp8" else 2.0
