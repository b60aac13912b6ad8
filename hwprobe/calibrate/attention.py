"""Decode attention time against context length, with the catalog models' GQA shapes.

One decode step's attention reads every cached K and V once: q (B, H, 1, d) against K, V
(B, Hkv, n, d). It is a memory stream with a fixed cost per call, so the points over batch and
context are fitted with the simulator's model: time = latency + K/V bytes / bandwidth.
torch's scaled_dot_product_attention picks a kernel itself; to know which one ran, backends are
forced one at a time in this order and the first that accepts the shapes is the one measured.
"""

from __future__ import annotations

import contextlib
import statistics
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from sim.inputs.profile import AttentionPoint
from sim.model.spec import ModelSpec
from sim.model.units import KV_TENSORS

from .fit import fit_latency_bandwidth
from .operands import DTYPE_BYTES, budget_bytes, random, rotation_count
from .timing import MIN_WINDOW_S, time_window

SDPA_BACKEND_ORDER = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
UNKNOWN_BACKEND = "sdpa (backend unknown)"

Shape = tuple[int, int, int]  # (heads, kv heads, head dim)


def attention_shapes(models: Iterable[ModelSpec]) -> list[Shape]:
    return sorted({(m.num_heads, m.num_kv_heads, m.head_dim) for m in models})


def _sdpa(torch: Any) -> Callable[..., Any]:
    return torch.nn.functional.scaled_dot_product_attention


def select_backend(torch: Any, device: str, q: Any, k: Any, v: Any) -> tuple[str, Callable[[], Any]]:
    """(label, context factory) of the first SDPA backend that runs these shapes with GQA."""
    sdpa = _sdpa(torch)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return UNKNOWN_BACKEND, contextlib.nullcontext
    for name in SDPA_BACKEND_ORDER:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with warnings.catch_warnings(), sdpa_kernel([backend]):
                warnings.simplefilter("ignore")
                sdpa(q, k, v, enable_gqa=True)
        except (RuntimeError, TypeError, ValueError):
            continue
        return f"{name.lower()} ({device})", lambda backend=backend: sdpa_kernel([backend])
    return UNKNOWN_BACKEND, contextlib.nullcontext


def kv_bytes(batch: int, kv_heads: int, context: int, head_dim: int, dtype: str) -> int:
    """K and V of every attended token: 2 * B * Hkv * n * d * bytes."""
    return KV_TENSORS * batch * kv_heads * context * head_dim * DTYPE_BYTES[dtype]


def measure_point(backend: Any, shape: Shape, batch: int, context: int, *, samples: int, dtype: str = "bf16",
                  min_window_s: float = MIN_WINDOW_S) -> AttentionPoint | None:
    """One decode attention (one query token per sequence); None when K/V do not fit."""
    heads, kv_heads, head_dim = shape
    nbytes = kv_bytes(batch, kv_heads, context, head_dim, dtype)
    copies = rotation_count(nbytes, backend.cache_bytes, budget_bytes(backend))
    if copies == 0:
        return None
    q = random(backend, (batch, heads, 1, head_dim), dtype)
    kv = [(random(backend, (batch, kv_heads, context, head_dim), dtype),
           random(backend, (batch, kv_heads, context, head_dim), dtype)) for _ in range(copies)]
    label, forced = select_backend(backend.torch, backend.device, q, *kv[0])
    sdpa = _sdpa(backend.torch)
    with forced():
        timing = time_window(backend.window(lambda i: sdpa(q, *kv[i % copies], enable_gqa=True), events=True),
                             samples=samples, min_window_s=min_window_s)
    return AttentionPoint(batch=batch, context_tokens=context, num_heads=heads, num_kv_heads=kv_heads,
                          head_dim=head_dim, dtype=dtype, time_s=timing.median_s,
                          kv_bytes_per_s=nbytes / timing.median_s, backend=label,
                          samples=timing.samples, rel_spread=timing.rel_spread)


def measure_sweep(backend: Any, shapes: list[Shape], batches: list[int], contexts: list[int], *, samples: int,
                  dtype: str = "bf16", min_window_s: float = MIN_WINDOW_S,
                  on_point: Callable[[str], None] = lambda label: None) -> tuple[list[AttentionPoint], list[str]]:
    points, skipped = [], []
    for shape in shapes:
        for batch in batches:
            for context in contexts:
                label = f"attention H={shape[0]} Hkv={shape[1]} B={batch} n={context}"
                on_point(label)
                p = measure_point(backend, shape, batch, context, samples=samples, dtype=dtype,
                                  min_window_s=min_window_s)
                if p is None:
                    skipped.append(f"{label}: K/V do not fit in free device memory")
                else:
                    points.append(p)
    return points, skipped


def kv_stream_bytes_per_s(points: list[AttentionPoint]) -> float | None:
    """K/V streaming rate: the best rate any point reached (long contexts, where the fixed cost
    per call no longer matters). The fallback when the fit below is not sound."""
    return max((p.kv_bytes_per_s for p in points), default=None)


FIT_MIN_SIZES = 3  # distinct K/V sizes: two points always lie on a line
FIT_MIN_SPAN = 4.0  # largest / smallest K/V bytes: short contexts carry the latency, long ones the slope
FIT_MAX_MEDIAN_RESIDUAL = 0.25  # median |t - fit| / t: a line that misses most points is not a model of them


@dataclass(frozen=True)
class AttentionFit:
    """time = latency_s + K/V bytes / bytes_per_s over the decode attention points (sim/device/physics.py
    attention_s is this line); `unsound` says why it should not replace the best point's rate."""

    latency_s: float
    bytes_per_s: float
    points: int
    median_rel_residual: float
    unsound: str | None


def point_kv_bytes(p: AttentionPoint) -> int:
    return kv_bytes(p.batch, p.num_kv_heads, p.context_tokens, p.head_dim, p.dtype)


def fit_kv_stream(points: list[AttentionPoint]) -> AttentionFit | None:
    """Least squares of time against K/V bytes (relative residuals, latency clamped at >= 0: fit.py,
    the copies' fit); None without points."""
    if not points:
        return None
    sizes = [point_kv_bytes(p) for p in points]
    times = [p.time_s for p in points]
    fit = fit_latency_bandwidth(sizes, times)
    residuals = [abs(t - (fit.per_copy_latency_s + b / fit.bytes_per_s)) / t for b, t in zip(sizes, times)]
    median = statistics.median(residuals)
    distinct = len(set(sizes))
    unsound = None
    if distinct < FIT_MIN_SIZES:
        unsound = f"{distinct} distinct K/V sizes, fewer than {FIT_MIN_SIZES}"
    elif max(sizes) < FIT_MIN_SPAN * min(sizes):
        unsound = f"K/V sizes span {max(sizes) / min(sizes):.1f}x, less than {FIT_MIN_SPAN:g}x"
    elif median > FIT_MAX_MEDIAN_RESIDUAL:
        unsound = f"the line misses the points by {median:.0%} (median), more than {FIT_MAX_MEDIAN_RESIDUAL:.0%}"
    return AttentionFit(fit.per_copy_latency_s, fit.bytes_per_s, len(points), median, unsound)


def backend_summary(points: list[AttentionPoint]) -> str | None:
    """The backend that ran, or all of them when shapes needed different ones."""
    names = sorted({p.backend for p in points})
    return ", ".join(names) if names else None
