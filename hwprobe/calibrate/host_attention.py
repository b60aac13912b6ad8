"""The host CPU that attends host-resident T1/T2 (policy.access host_attention / split).

Three figures, all on the wall clock (host work on every backend):

* attention: the real cache's worker routine (hwprobe/cache/host_attention.py `HostAttention._attend`,
  submitted to its one-thread pool and joined, as the cache's `launch` / `collect` do) over one
  layer's T1 span of `tokens` slots, K/V stored bf16 as the cache stores them, attended in float32.
  Points (tokens, K/V bytes as stored, time) and a fit time = dispatch + bytes / bandwidth (fit.py);
* DRAM: a STREAM-like large copy (torch copy_ between two float32 host buffers), bytes read +
  bytes written per second;
* round trip (CUDA only): the layer's query device->host then its partials host->device, tiny copies
  each waited for, as the host path pays them per layer.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Callable

from sim.inputs.profile import HostAttentionPoint, HostProfile

from .fit import fit_latency_bandwidth
from .timing import MIN_WINDOW_S, time_window

KERNEL = ("hwprobe HostAttention._attend on its worker thread (submit + join): T1 slots bf16 -> float32, "
          "partial_softmax_attention (QK^T, exact softmax + LSE, PV) in float32, one layer")
HEADS_PER_KV = 7  # the 7B's query heads per KV head (28 / 4)


def _attention_call(batch: int, kv_heads: int, head_dim: int, tokens: int) -> tuple[Callable[[], Any], float, Any]:
    """(one call, K/V bytes as stored, closer) of the real cache's host attention over `tokens` T1 slots."""
    import torch

    from hwprobe.cache.host_attention import HostAttention, HostSpan
    from hwprobe.cache.runtime import Runtime
    from hwprobe.cache.store import CacheGeometry
    from sim.tiering.tiers import T1

    geom = CacheGeometry(1, batch, kv_heads, head_dim)
    g = torch.Generator().manual_seed(0)
    t1 = torch.randn((1, tokens, batch, geom.row_elems), generator=g).to(torch.bfloat16)
    stores = SimpleNamespace(geom=geom, t1=t1)
    ha = HostAttention(Runtime("cpu"), stores, torch.bfloat16, head_dim ** -0.5, layers=1, scoring=False,
                       score_columns=0)
    q = torch.randn((batch, kv_heads, HEADS_PER_KV, head_dim), generator=g).to(torch.bfloat16)
    ha._allocate(q)
    ha.q_host.copy_(q)
    spans = (HostSpan(T1, 0, tokens, 0),)

    def call():
        return ha.pool.submit(ha._attend, 0, spans, None).result()

    return call, float(t1.numel() * t1.element_size()), ha.close


def measure_attention(batch: int, tokens_list: list[int], kv_heads: int, head_dim: int, *, samples: int,
                      min_window_s: float = MIN_WINDOW_S, on_point: Callable[[str], None] = lambda s: None
                      ) -> list[HostAttentionPoint]:
    points = []
    for tokens in tokens_list:
        on_point(f"host attention {tokens} tokens x batch {batch}")
        call, kv_bytes, close = _attention_call(batch, kv_heads, head_dim, tokens)
        try:
            def window(reps: int) -> float:
                t0 = time.perf_counter()
                for _ in range(reps):
                    call()
                return time.perf_counter() - t0

            timing = time_window(window, samples=samples, min_window_s=min_window_s)
        finally:
            close()
        points.append(HostAttentionPoint(batch=batch, tokens=tokens, kv_bytes=kv_bytes, time_s=timing.median_s,
                                         samples=timing.samples, rel_spread=timing.rel_spread))
    return points


def measure_dram(nbytes: int, *, samples: int, min_window_s: float = MIN_WINDOW_S) -> float:
    """Bytes read + bytes written per second of a large float32 host copy."""
    import torch

    n = max(1, nbytes // 4)
    src, dst = torch.ones(n, dtype=torch.float32), torch.empty(n, dtype=torch.float32)

    def window(reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src)
        return time.perf_counter() - t0

    timing = time_window(window, samples=samples, min_window_s=min_window_s)
    return 2 * n * 4 / timing.median_s


def measure_round_trip(backend: Any, batch: int, heads: int, head_dim: int, *, samples: int,
                       min_window_s: float = MIN_WINDOW_S) -> float:
    """One layer's query (B x H x d bf16) device->host, then its partials (B x H x (d + 1) float32)
    host->device, each waited for: pinned host buffers, as the cache's."""
    q_bytes, p_bytes = batch * heads * head_dim * 2, batch * heads * (head_dim + 1) * 4
    q_dev, q_host = backend.device_buffer(q_bytes), backend.host_buffer(q_bytes, pinned=True)
    p_dev, p_host = backend.device_buffer(p_bytes), backend.host_buffer(p_bytes, pinned=True)

    def one(i: int) -> None:
        backend.copy(q_host, q_dev, non_blocking=True)
        backend.sync()
        backend.copy(p_dev, p_host, non_blocking=True)
        backend.sync()

    return time_window(backend.window(one, events=False), samples=samples, min_window_s=min_window_s).median_s


def host_figures(points: list[HostAttentionPoint]) -> tuple[float | None, float | None]:
    """(attention bytes/s, dispatch s) from the points: time = dispatch + K/V bytes / bandwidth."""
    if not points:
        return None, None
    fit = fit_latency_bandwidth([p.kv_bytes for p in points], [p.time_s for p in points])
    return fit.bytes_per_s, fit.per_copy_latency_s


def measure(backend: Any, *, batch: int, tokens: list[int], kv_heads: int, head_dim: int, dram_bytes: int,
            samples: int, min_window_s: float = MIN_WINDOW_S, on_step: Callable[[str], None] = lambda s: None
            ) -> HostProfile:
    import torch

    from .env import cpu_model

    kw = dict(samples=samples, min_window_s=min_window_s)
    points = measure_attention(batch, tokens, kv_heads, head_dim, on_point=on_step, **kw)
    on_step(f"host DRAM bandwidth (copy of {dram_bytes} bytes)")
    dram = measure_dram(dram_bytes, **kw)
    on_step("host path round trip (query d2h + partials h2d)")
    round_trip = (measure_round_trip(backend, batch, kv_heads * HEADS_PER_KV, head_dim, **kw)
                  if backend.device == "cuda" else None)
    bytes_per_s, dispatch_s = host_figures(points)
    return HostProfile(cpu_name=cpu_model(), threads=torch.get_num_threads(), dram_bytes_per_s=dram,
                       attention_kernel=KERNEL, attention_points=points, attention_bytes_per_s=bytes_per_s,
                       attention_dispatch_s=dispatch_s, round_trip_s=round_trip)
