"""Device memory bandwidth (a device-to-device copy) and the cost of launching one small kernel
(kept beside the per-layer overhead, which layer_overhead.py measures on a real layer).

Convention for the copy: bytes read + bytes written per second (a copy of n bytes moves 2n),
the same convention as DESIGN.md's HBM figures and the device_copy_convention profile field.
"""

from __future__ import annotations

from typing import Any

from .copies import pattern, verify
from .timing import MIN_WINDOW_S, time_window

DEVICE_COPY_TRAFFIC = 2  # a copy reads every byte once and writes it once


def measure_device_copy(backend: Any, nbytes: int, *, samples: int, min_window_s: float = MIN_WINDOW_S) -> dict:
    """Time of one device-to-device copy of `nbytes`, verified; rates in read + written bytes/s."""
    torch = backend.torch
    src = pattern(torch, nbytes, backend.tensor_device)
    dst = backend.device_buffer(nbytes)
    torch.bitwise_not(src, out=dst)
    backend.sync()
    timing = time_window(backend.window(lambda i: dst.copy_(src), events=True), samples=samples,
                         min_window_s=min_window_s)
    backend.sync()
    verify(torch, dst, src, "d2d", "device")
    return {
        "size_bytes": nbytes,
        "time_s": timing.median_s,
        "read_plus_written_bytes_per_s": DEVICE_COPY_TRAFFIC * nbytes / timing.median_s,
        "samples": timing.samples,
        "rel_spread": timing.rel_spread,
    }


def measure_kernel_launch(backend: Any, *, samples: int, min_window_s: float = MIN_WINDOW_S) -> dict:
    """Back-to-back launches of a one-element add (eager PyTorch): the fixed cost per kernel."""
    x = backend.torch.zeros(1, device=backend.tensor_device)
    timing = time_window(backend.window(lambda i: x.add_(1.0), events=True), samples=samples,
                         min_window_s=min_window_s)
    return {"kernel_launch_s": timing.median_s, "samples": timing.samples, "rel_spread": timing.rel_spread}
