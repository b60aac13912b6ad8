"""What a calibration run sweeps: copy sizes, GEMM shapes and rows, weight kernels, attention contexts, samples.

Four sizes of plan: `full` (every catalog shape; under fifteen minutes on an H200), `quick`
(shorter sweeps, fewer samples; about two minutes on an H200), the CPU variants of both (small
enough for a laptop-class CPU) and `tiny` (seconds; for tests). Shapes come from the model
catalog, so the GEMMs measured are the projections the simulator will cost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.inputs import catalog
from sim.model.units import GiB, KiB, MiB

from .attention import Shape, attention_shapes
from .gemm import decode_shapes
from .timing import MIN_WINDOW_S

QUICK_MODEL = "deepseek-r1-distill-qwen-7b"  # the reference paper's model
DRIFT_COPY_BYTES = 64 * MiB  # the drift re-check re-times the largest sweep size up to this
LOAD_WINDOW_S = 0.2  # how long the GPU is kept busy while NVML samples the link and clocks
TINY_MIN_WINDOW_S = 0.5e-3  # tests only: shorter windows, noisier but fast
# Buffers of the largest copy size that coexist: device src + dst (+ a pattern while filling);
# host src + dst for pinned and for pageable (+ a pattern while filling).
DEVICE_COPY_BUFFERS = 4
HOST_COPY_BUFFERS = 8


def powers_of_two(lo: int, hi: int, factor: int = 2) -> tuple[int, ...]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return tuple(sizes)


@dataclass(frozen=True)
class Plan:
    name: str
    samples: int
    min_window_s: float
    copy_sizes_bytes: tuple[int, ...]
    concurrent_sizes_bytes: tuple[int, ...]
    device_copy_bytes: int
    gemm_shapes: tuple[tuple[int, int], ...]
    gemm_rows: tuple[int, ...]
    peak_sizes: tuple[int, ...]
    attention_shapes: tuple[Shape, ...]
    attention_batches: tuple[int, ...]
    attention_contexts: tuple[int, ...]
    # Every weight dtype's decode kernel on one layer-shaped (N, K) across rows (weight_kernels.py). The
    # shape and rows are among the GEMM sweep's, whose bf16 points are the bf16 kernel's.
    weight_kernel_shape: tuple[int, int]
    weight_kernel_rows: tuple[int, ...]
    loop_retier_interval: int = 256  # tiny decode-loop runs of step_overhead.py: warm-up steps, timed-step room
    # Host-side attention (host_attention.py): the cache's host routine over one 7B-shaped layer
    # (batch x 4 KV heads x tokens x 128), at these token counts; and a STREAM-like copy of this size.
    host_attention_batch: int = 1
    host_attention_tokens: tuple[int, ...] = (64, 256, 1024)
    host_dram_bytes: int = 4 * MiB

    def __post_init__(self) -> None:
        if self.weight_kernel_shape not in self.gemm_shapes or not set(self.weight_kernel_rows) <= set(self.gemm_rows):
            raise ValueError(f"plan {self.name}: the weight-kernel shape and rows must be among the GEMM sweep's")

    @property
    def drift_copy_bytes(self) -> int:
        fitting = [s for s in self.copy_sizes_bytes if s <= DRIFT_COPY_BYTES]
        return max(fitting) if fitting else min(self.copy_sizes_bytes)

    def capped(self, max_copy_bytes: int) -> Plan:
        """The same plan with copies no larger than `max_copy_bytes` (free memory)."""
        keep = lambda sizes: tuple(s for s in sizes if s <= max_copy_bytes) or (min(sizes),)  # noqa: E731
        return replace(self, copy_sizes_bytes=keep(self.copy_sizes_bytes),
                       concurrent_sizes_bytes=keep(self.concurrent_sizes_bytes),
                       device_copy_bytes=min(self.device_copy_bytes, max(max_copy_bytes, min(self.copy_sizes_bytes))))

    def copy_curves(self, device: str) -> int:
        """One-direction curves: h2d and d2h, from pinned and pageable memory on a GPU; the CPU
        has one kind of memory."""
        return 4 if device == "cuda" else 2

    def total_steps(self, device: str) -> int:
        """Progress steps: one per measured point, plus the fixed ones (device copy, launch,
        layer overhead, step overheads, host packing, two under-load samples, two drift re-checks).
        The weight-kernel sweep adds int4 past its usual rows, and int8 and fp8 at every row."""
        fixed = 11  # + host DRAM bandwidth and the host path's round trip
        return (self.copy_curves(device) * len(self.copy_sizes_bytes) + len(self.concurrent_sizes_bytes)
                + len(self.gemm_shapes) * (len(self.gemm_rows) + len(self.int4_rows)) + len(self.peak_sizes)
                + len(self.int4_kernel_rows) + len(QUANTISED_KERNELS) * len(self.weight_kernel_rows)
                + len(self.attention_shapes) * len(self.attention_batches) * len(self.attention_contexts)
                + len(self.host_attention_tokens) + fixed)

    @property
    def int4_rows(self) -> tuple[int, ...]:
        """Rows of the int4 weight-only GEMMs (gemm.INT4_MAX_ROWS and below)."""
        from .gemm import INT4_MAX_ROWS

        return tuple(m for m in self.gemm_rows if m <= INT4_MAX_ROWS)

    @property
    def int4_kernel_rows(self) -> tuple[int, ...]:
        """Rows of the int4 weight kernel beyond `int4_rows` (the sweep's own rows cover the rest)."""
        return tuple(m for m in self.weight_kernel_rows if m not in self.int4_rows)

    def summary(self) -> dict:
        return {
            "name": self.name, "samples": self.samples, "min_window_s": self.min_window_s,
            "copy_sizes_bytes": list(self.copy_sizes_bytes),
            "concurrent_sizes_bytes": list(self.concurrent_sizes_bytes),
            "gemm_shapes_nk": [list(s) for s in self.gemm_shapes], "gemm_rows": list(self.gemm_rows),
            "peak_sizes": list(self.peak_sizes),
            "attention_shapes": [list(s) for s in self.attention_shapes],
            "attention_batches": list(self.attention_batches),
            "attention_contexts": list(self.attention_contexts),
            "weight_kernel_shape_nk": list(self.weight_kernel_shape),
            "weight_kernel_rows": list(self.weight_kernel_rows),
            "host_attention_batch": self.host_attention_batch,
            "host_attention_tokens": list(self.host_attention_tokens),
            "host_dram_bytes": self.host_dram_bytes,
        }


DECODE_ROWS = powers_of_two(1, 256)  # M = 1, 2, 4, ..., 256: batch sizes of decode
QUANTISED_KERNELS = ("int8", "fp8")  # timed by weight_kernels.measure; bf16 and int4 come from the GEMM sweeps
# host-side attention sweeps (tiny: the Plan defaults)
QUICK_HOST = dict(host_attention_batch=4, host_attention_tokens=(256, 1024, 4096, 16384), host_dram_bytes=256 * MiB)
CPU_QUICK_HOST = dict(host_attention_batch=4, host_attention_tokens=(256, 1024, 4096), host_dram_bytes=256 * MiB)
FULL_HOST = dict(host_attention_batch=8, host_attention_tokens=(256, 1024, 4096, 16384), host_dram_bytes=1 * GiB)


def make_plan(device: str, quick: bool = False, tiny: bool = False) -> Plan:
    # the decode shapes of dense GQA models (the synthetic decoder's kind); MoE and MLA shapes are not swept
    models = [m for m in catalog.models().values() if m.uniform and not m.is_moe]
    m7 = catalog.model(QUICK_MODEL)
    h, inter = m7.hidden_size, m7.intermediate_size
    m7_attention = (m7.num_heads, m7.num_kv_heads, m7.head_dim)
    up = (inter, h)  # the 7B's gate/up projection: one of the two largest matrices of its layer
    if tiny:
        return Plan(
            name="tiny", samples=3, min_window_s=TINY_MIN_WINDOW_S,
            copy_sizes_bytes=powers_of_two(4 * KiB, 256 * KiB, 4), concurrent_sizes_bytes=(64 * KiB, 256 * KiB),
            device_copy_bytes=1 * MiB, gemm_shapes=((m7.kv_dim, h),), gemm_rows=(1, 8), peak_sizes=(256,),
            attention_shapes=(m7_attention,), attention_batches=(1,), attention_contexts=(64, 256, 1024),
            weight_kernel_shape=(m7.kv_dim, h), weight_kernel_rows=(1, 8), loop_retier_interval=24)
    if device == "cuda" and quick:
        return Plan(
            name="quick", samples=3, min_window_s=MIN_WINDOW_S,
            copy_sizes_bytes=powers_of_two(4 * KiB, 256 * MiB, 4),
            concurrent_sizes_bytes=powers_of_two(64 * KiB, 256 * MiB, 16),
            device_copy_bytes=256 * MiB, gemm_shapes=((m7.q_dim, h), (inter, h), (h, inter)),
            gemm_rows=DECODE_ROWS, peak_sizes=(8192,), attention_shapes=(m7_attention,),
            attention_batches=(1, 8), attention_contexts=powers_of_two(1024, 65536, 4),
            weight_kernel_shape=up, weight_kernel_rows=DECODE_ROWS, **QUICK_HOST)
    if device == "cuda":
        return Plan(
            name="full", samples=5, min_window_s=MIN_WINDOW_S,
            copy_sizes_bytes=powers_of_two(4 * KiB, 1 * GiB), concurrent_sizes_bytes=powers_of_two(4 * KiB, 1 * GiB, 4),
            device_copy_bytes=1 * GiB, gemm_shapes=tuple(decode_shapes(models)), gemm_rows=DECODE_ROWS,
            peak_sizes=(4096, 8192, 16384), attention_shapes=tuple(attention_shapes(models)),
            attention_batches=(1, 8), attention_contexts=powers_of_two(512, 65536),
            weight_kernel_shape=up, weight_kernel_rows=DECODE_ROWS, **FULL_HOST)
    if quick:
        return Plan(
            name="cpu-quick", samples=3, min_window_s=MIN_WINDOW_S,
            copy_sizes_bytes=powers_of_two(4 * KiB, 64 * MiB, 4), concurrent_sizes_bytes=(64 * KiB, 1 * MiB, 16 * MiB),
            device_copy_bytes=64 * MiB, gemm_shapes=((m7.kv_dim, h),), gemm_rows=DECODE_ROWS,
            peak_sizes=(256, 512, 1024), attention_shapes=(m7_attention,), attention_batches=(1,),
            attention_contexts=(256, 1024, 4096), weight_kernel_shape=(m7.kv_dim, h), weight_kernel_rows=(1, 4, 16, 64),
            **CPU_QUICK_HOST)
    return Plan(
        name="cpu-full", samples=5, min_window_s=MIN_WINDOW_S,
        copy_sizes_bytes=powers_of_two(4 * KiB, 256 * MiB), concurrent_sizes_bytes=powers_of_two(4 * KiB, 256 * MiB, 4),
        device_copy_bytes=256 * MiB, gemm_shapes=tuple(decode_shapes([m7])), gemm_rows=DECODE_ROWS,
        peak_sizes=(512, 1024, 2048), attention_shapes=tuple(attention_shapes([m7])), attention_batches=(1, 4),
        attention_contexts=powers_of_two(256, 8192), weight_kernel_shape=(m7.q_dim, h),
        weight_kernel_rows=powers_of_two(1, 128), **FULL_HOST)


def max_copy_bytes(free_device_bytes: int, free_host_bytes: int, device: str) -> int:
    """Largest copy size whose buffers fit: on the CPU "device" buffers are host memory too."""
    host_buffers = HOST_COPY_BUFFERS + (DEVICE_COPY_BUFFERS if device == "cpu" else 0)
    limits = [free_host_bytes // host_buffers]
    if device == "cuda":
        limits.append(free_device_bytes // DEVICE_COPY_BUFFERS)
    return max(0, min(limits))
