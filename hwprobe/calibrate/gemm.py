"""GEMM throughput at decode shapes, and the peak of large square GEMMs.

Decode multiplies M token rows (M = batch) by each projection weight (N x K). At small M that is
a weight stream - time ~ N*K*bytes / memory bandwidth, far below peak FLOP/s; as M grows it turns
compute-bound. The sweep gives the simulator both: the weight streaming rate (from the smallest M)
and achieved FLOP/s against M. The peak search gives the ceiling on large square GEMMs.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from sim.inputs.profile import GemmPoint
from sim.model.spec import ModelSpec
from sim.model.units import FLOP_PER_MAC

from .operands import DTYPE_BYTES, budget_bytes, random, rotation_count
from .timing import MIN_WINDOW_S, WindowTiming, time_window

SQUARE_OPERANDS = 3  # A, B and the output of a square GEMM
# The peak search stops growing the GEMM once one call takes longer than this: on a slow device
# (a CPU) larger sizes add minutes and no information.
PEAK_MAX_CALL_S = 0.25


def decode_shapes(models: Iterable[ModelSpec]) -> list[tuple[int, int]]:
    """Unique (N, K) of the projections of dense models: q, k, v, o, gate, up, down."""
    shapes: set[tuple[int, int]] = set()
    for m in models:
        h = m.hidden_size
        shapes |= {(m.q_dim, h), (m.kv_dim, h), (h, m.q_dim)}
        if m.intermediate_size:
            shapes |= {(m.intermediate_size, h), (h, m.intermediate_size)}
    return sorted(shapes)


def _point(m: int, n: int, k: int, dtype: str, timing: WindowTiming) -> GemmPoint:
    flop = FLOP_PER_MAC * m * n * k
    return GemmPoint(m=m, n=n, k=k, dtype=dtype, time_s=timing.median_s, flop_per_s=flop / timing.median_s,
                     weight_bytes_per_s=n * k * DTYPE_BYTES[dtype] / timing.median_s,
                     samples=timing.samples, rel_spread=timing.rel_spread,
                     best_flop_per_s=flop / timing.best_s)


def sim_bytes_point(m: int, n: int, k: int, dtype: str, weight_bytes: float, timing: WindowTiming) -> GemmPoint:
    """A point of a quantised weight kernel (activations in bf16): its weight rate counted in the
    simulator's bytes for `dtype` (`weight_bytes`, sim/model/dtypes.py), so the simulator's predicted time for
    the shape is the measured one."""
    p = _point(m, n, k, "bf16", timing)
    return p.model_copy(update={"dtype": dtype, "weight_bytes_per_s": weight_bytes / timing.median_s})


def measure_decode(backend: Any, shapes: list[tuple[int, int]], rows: list[int], *, samples: int,
                   dtype: str = "bf16", min_window_s: float = MIN_WINDOW_S,
                   on_point: Callable[[str], None] = lambda label: None) -> tuple[list[GemmPoint], list[str]]:
    """y = x @ W^T for every (N, K) and M; returns the points and what did not fit in memory."""
    F = backend.torch.nn.functional
    points, skipped = [], []
    for n, k in shapes:
        weight_bytes = n * k * DTYPE_BYTES[dtype]
        copies = rotation_count(weight_bytes, backend.cache_bytes, budget_bytes(backend))
        if copies == 0:
            skipped.append(f"GEMM N={n} K={k}: weights do not fit in free device memory")
            for m in rows:
                on_point(f"GEMM {m}x{n}x{k} (skipped)")
            continue
        weights = [random(backend, (n, k), dtype) for _ in range(copies)]
        for m in rows:
            on_point(f"GEMM {m}x{n}x{k}")
            x = random(backend, (m, k), dtype)
            timing = time_window(backend.window(lambda i: F.linear(x, weights[i % copies]), events=True),
                                 samples=samples, min_window_s=min_window_s)
            points.append(_point(m, n, k, dtype, timing))
        weights = None  # free this shape's operands before the next is made
    return points, skipped


INT4_MAX_ROWS = 8  # weight-only int4 serves small batches; larger M is compute-bound and bf16-like


def measure_decode_int4(backend: Any, shapes: list[tuple[int, int]], rows: list[int], *, samples: int,
                        group: int = 128, min_window_s: float = MIN_WINDOW_S, max_rows: int | None = INT4_MAX_ROWS,
                        on_point: Callable[[str], None] = lambda label: None) -> tuple[list[GemmPoint], list[str]]:
    """The synthetic model's int4 projections (hwprobe/model/qlinear.py: torch's tinygemm kernels)
    at M <= max_rows (None: every row; the weight-kernel sweep goes past INT4_MAX_ROWS on one shape).
    Weight bytes are counted as the simulator counts int4 (4 bits + one 2-byte scale per group,
    sim/model/dtypes.py), so its predicted time for the shape is the measured one."""
    from sim.model.dtypes import WEIGHT_DTYPES

    from ..model.qlinear import Linear, int4_supported

    torch = backend.torch
    points, skipped = [], []
    small = [m for m in rows if max_rows is None or m <= max_rows]
    for n, k in shapes:
        if not small:
            continue
        why = int4_supported(n, k, group)
        sim_bytes = WEIGHT_DTYPES["int4"].bytes_for(n * k, group)
        bf16_bytes = n * k * DTYPE_BYTES["bf16"]  # the float weight exists while it is quantised
        copies = 0 if why else rotation_count(int(sim_bytes), backend.cache_bytes, budget_bytes(backend) - bf16_bytes)
        if copies == 0:
            skipped.append(f"int4 GEMM N={n} K={k}: {why or 'weights do not fit in free device memory'}")
            for m in small:
                on_point(f"int4 GEMM {m}x{n}x{k} (skipped)")
            continue
        try:
            weights = [Linear(random(backend, (n, k), "bf16"), None, "int4", group, torch.bfloat16) for _ in range(copies)]
        except (RuntimeError, AttributeError) as err:  # a torch build without the int4 kernel
            skipped.append(f"int4 GEMM N={n} K={k}: {str(err).splitlines()[0]}")
            for m in small:
                on_point(f"int4 GEMM {m}x{n}x{k} (skipped)")
            continue
        for m in small:
            on_point(f"int4 GEMM {m}x{n}x{k}")
            x = random(backend, (m, k), "bf16")
            timing = time_window(backend.window(lambda i: weights[i % copies](x), events=True),
                                 samples=samples, min_window_s=min_window_s)
            points.append(sim_bytes_point(m, n, k, "int4", sim_bytes, timing))
        weights = None  # free this shape's operands before the next is made
    return points, skipped


def square_gemm(backend: Any, size: int, dtype: str = "bf16") -> Callable[[int], Any] | None:
    """fn(i): one size x size x size GEMM into a preallocated output; None when it does not fit."""
    if SQUARE_OPERANDS * size * size * DTYPE_BYTES[dtype] > budget_bytes(backend):
        return None
    torch = backend.torch
    a, b = random(backend, (size, size), dtype), random(backend, (size, size), dtype)
    out = torch.empty_like(a)
    return lambda i: torch.mm(a, b, out=out)


def measure_square(backend: Any, size: int, *, samples: int, dtype: str = "bf16",
                   min_window_s: float = MIN_WINDOW_S) -> GemmPoint | None:
    fn = square_gemm(backend, size, dtype)
    if fn is None:
        return None
    timing = time_window(backend.window(fn, events=True), samples=samples, min_window_s=min_window_s)
    return _point(size, size, size, dtype, timing)


def measure_peak(backend: Any, sizes: list[int], *, samples: int, dtype: str = "bf16",
                 min_window_s: float = MIN_WINDOW_S,
                 on_point: Callable[[str], None] = lambda label: None) -> tuple[list[GemmPoint], list[str]]:
    """Square GEMMs of growing size; stops early when memory or time runs out."""
    points, skipped = [], []
    for size in sizes:
        on_point(f"peak GEMM {size}^3")
        if points and points[-1].time_s > PEAK_MAX_CALL_S:
            skipped.append(f"peak GEMM {size}^3: {points[-1].m}^3 already took {points[-1].time_s:.2f} s a call")
            continue
        p = measure_square(backend, size, samples=samples, dtype=dtype, min_window_s=min_window_s)
        if p is None:
            skipped.append(f"peak GEMM {size}^3: does not fit in free device memory")
        else:
            points.append(p)
    return points, skipped


def flop_per_s_by_rows(points: list[GemmPoint]) -> list[tuple[int, float]]:
    """(M, best achieved FLOP/s over all shapes at that M), ascending M."""
    best: dict[int, float] = {}
    for p in points:
        best[p.m] = max(best.get(p.m, 0.0), p.flop_per_s)
    return sorted(best.items())


def weight_stream_bytes_per_s(points: list[GemmPoint]) -> float | None:
    """Weight streaming rate: the best rate any shape reached at the smallest M measured.

    The best, not a fit or a mean: the simulator adds per-kernel costs separately
    (layer_overhead_s), so it needs the rate a weight stream reaches once it is under way, and a
    slope fitted through a few noisy shapes can land far above anything measured."""
    if not points:
        return None
    m_min = min(p.m for p in points)
    return max(p.weight_bytes_per_s for p in points if p.m == m_min)
