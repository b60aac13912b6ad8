"""Host<->device copy time against copy size, one direction or both at once, with data checks.

Buffers are allocated once at the largest size, outside every timed region, and each size copies
a prefix of them. Before a size is timed its destination is filled with the bitwise complement of
the source, so every byte the copy fails to write differs; after timing, the destination is
compared with a copy of the source pattern that lives on the destination's own device (comparing
there needs no second transfer that could hide a fault). A mismatch raises CopyIntegrityError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

from sim.inputs.profile import CopyCurve, CopyPoint

from . import fmt
from .fit import fit_latency_bandwidth
from .timing import MIN_WINDOW_S, WARMUP_CALLS, time_window, time_window_pair

Direction = Literal["h2d", "d2h"]
Memory = Literal["pinned", "pageable"]
# A prime period: a copy that lands shifted by any power-of-two offset cannot match by accident.
PATTERN_PERIOD_BYTES = 251
PATTERN_MULTIPLIER = 97  # spreads consecutive bytes over the whole 0..255 range


class CopyIntegrityError(RuntimeError):
    """A copy delivered wrong data: the size and direction are in the message."""

    def __init__(self, direction: str, memory: str, size_bytes: int, mismatched: int, first_offset: int):
        self.direction, self.memory, self.size_bytes = direction, memory, size_bytes
        super().__init__(
            f"{direction} {memory} copy of {fmt.size(size_bytes)} ({size_bytes} bytes): "
            f"{mismatched} bytes differ from the source, first at byte {first_offset}"
        )


def pattern(torch: Any, nbytes: int, device: str) -> Any:
    """Deterministic bytes, identical on every device: ((i mod P) * 97) mod 256."""
    base = (torch.arange(PATTERN_PERIOD_BYTES, dtype=torch.int32, device=device) * PATTERN_MULTIPLIER) % 256
    base = base.to(torch.uint8)
    return base.repeat(math.ceil(nbytes / PATTERN_PERIOD_BYTES))[:nbytes].contiguous()


def verify(torch: Any, dst: Any, ref: Any, direction: str, memory: str) -> None:
    """Raise CopyIntegrityError unless `dst` equals `ref` byte for byte."""
    if torch.equal(dst, ref):
        return
    diff = dst != ref
    first = int(diff.nonzero()[0, 0]) if bool(diff.any()) else -1
    raise CopyIntegrityError(direction, memory, dst.numel(), int(diff.sum()), first)


@dataclass
class CopyBuffers:
    """Sources hold the pattern and are never written; destinations are overwritten per size."""

    max_bytes: int
    dev_src: Any
    dev_dst: Any
    host_src: dict[str, Any]  # by memory kind
    host_dst: dict[str, Any]

    def endpoints(self, direction: Direction, memory: Memory, nbytes: int) -> tuple[Any, Any, Any]:
        """(destination, source, reference on the destination's device) for one copy size."""
        if direction == "h2d":
            return self.dev_dst[:nbytes], self.host_src[memory][:nbytes], self.dev_src[:nbytes]
        return self.host_dst[memory][:nbytes], self.dev_src[:nbytes], self.host_src[memory][:nbytes]


def allocate(backend: Any, max_bytes: int, memories: tuple[Memory, ...]) -> CopyBuffers:
    """All copy buffers at the largest size, filled with the pattern, before any timing."""
    torch = backend.torch
    host_pattern = pattern(torch, max_bytes, "cpu")
    dev_src = pattern(torch, max_bytes, backend.tensor_device)
    host_src, host_dst = {}, {}
    for memory in memories:
        pinned = memory == "pinned"
        host_src[memory] = backend.host_buffer(max_bytes, pinned=pinned)
        host_src[memory].copy_(host_pattern)
        host_dst[memory] = backend.host_buffer(max_bytes, pinned=pinned)
    del host_pattern
    backend.sync()
    return CopyBuffers(max_bytes, dev_src, backend.device_buffer(max_bytes), host_src, host_dst)


def _prefill(backend: Any, dst: Any, ref: Any) -> None:
    """Destination := bitwise complement of the source pattern, finished before timing starts."""
    backend.torch.bitwise_not(ref, out=dst)
    backend.sync()


def _asynchronous(backend: Any, memory: Memory) -> bool:
    """Only pinned copies on a GPU are asynchronous and timed by events; the rest by wall clock."""
    return backend.device == "cuda" and memory == "pinned"


def _point(nbytes: int, timing: Any) -> CopyPoint:
    return CopyPoint(size_bytes=nbytes, time_s=timing.median_s, bytes_per_s=nbytes / timing.median_s,
                     samples=timing.samples, rel_spread=timing.rel_spread, verified=True)


def measure_point(backend: Any, bufs: CopyBuffers, direction: Direction, memory: Memory, nbytes: int, *,
                  samples: int, min_window_s: float = MIN_WINDOW_S, warmup: int = WARMUP_CALLS) -> CopyPoint:
    """Median time of one copy of `nbytes`, verified afterwards."""
    dst, src, ref = bufs.endpoints(direction, memory, nbytes)
    _prefill(backend, dst, ref)
    asynchronous = _asynchronous(backend, memory)
    window = backend.window(lambda i: backend.copy(dst, src, non_blocking=asynchronous), events=asynchronous)
    timing = time_window(window, samples=samples, min_window_s=min_window_s, warmup=warmup)
    backend.sync()  # a non_blocking device->host result must not be read before this
    verify(backend.torch, dst, ref, direction, memory)
    return _point(nbytes, timing)


def curve_from_points(direction: Direction, memory: Memory, points: list[CopyPoint],
                      concurrent: bool = False) -> CopyCurve:
    fit = fit_latency_bandwidth([p.size_bytes for p in points], [p.time_s for p in points])
    return CopyCurve(direction=direction, memory=memory, concurrent=concurrent, points=points,
                     fit_per_copy_latency_s=fit.per_copy_latency_s, fit_bytes_per_s=fit.bytes_per_s)


def measure_curve(backend: Any, bufs: CopyBuffers, direction: Direction, memory: Memory, sizes: list[int], *,
                  samples: int, min_window_s: float = MIN_WINDOW_S,
                  on_point: Callable[[str], None] = lambda label: None) -> CopyCurve:
    points = []
    for nbytes in sizes:
        on_point(f"{direction} {memory} {fmt.size(nbytes)}")
        points.append(measure_point(backend, bufs, direction, memory, nbytes, samples=samples,
                                    min_window_s=min_window_s))
    return curve_from_points(direction, memory, points)


def measure_concurrent_point(backend: Any, bufs: CopyBuffers, memory: Memory, nbytes: int, *, samples: int,
                             min_window_s: float = MIN_WINDOW_S) -> tuple[CopyPoint, CopyPoint]:
    """Host->device and device->host started together, each timed in its own window."""
    h2d_dst, h2d_src, h2d_ref = bufs.endpoints("h2d", memory, nbytes)
    d2h_dst, d2h_src, d2h_ref = bufs.endpoints("d2h", memory, nbytes)
    _prefill(backend, h2d_dst, h2d_ref)
    _prefill(backend, d2h_dst, d2h_ref)
    asynchronous = _asynchronous(backend, memory)
    window = backend.pair_window(lambda i: backend.copy(h2d_dst, h2d_src, non_blocking=asynchronous),
                                 lambda i: backend.copy(d2h_dst, d2h_src, non_blocking=asynchronous))
    t_h2d, t_d2h = time_window_pair(window, samples=samples, min_window_s=min_window_s)
    backend.sync()
    verify(backend.torch, h2d_dst, h2d_ref, "h2d", memory + " (concurrent)")
    verify(backend.torch, d2h_dst, d2h_ref, "d2h", memory + " (concurrent)")
    return _point(nbytes, t_h2d), _point(nbytes, t_d2h)


def measure_concurrent_curves(backend: Any, bufs: CopyBuffers, memory: Memory, sizes: list[int], *,
                              samples: int, min_window_s: float = MIN_WINDOW_S,
                              on_point: Callable[[str], None] = lambda label: None) -> tuple[CopyCurve, CopyCurve]:
    h2d, d2h = [], []
    for nbytes in sizes:
        on_point(f"both directions {memory} {fmt.size(nbytes)}")
        a, b = measure_concurrent_point(backend, bufs, memory, nbytes, samples=samples, min_window_s=min_window_s)
        h2d.append(a)
        d2h.append(b)
    return (curve_from_points("h2d", memory, h2d, concurrent=True),
            curve_from_points("d2h", memory, d2h, concurrent=True))


def bidirectional_bytes_per_s(curve: CopyCurve) -> float:
    """Per-direction bandwidth while both directions copy: the largest copies' rate."""
    return max(curve.points, key=lambda p: p.size_bytes).bytes_per_s
