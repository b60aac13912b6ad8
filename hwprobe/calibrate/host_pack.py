"""Host packing rate: making a strided K (or V) half of token-major rows contiguous in host memory.

The paper's prototype concatenates its CPU-resident tokens before each step's copies, and hwprobe's
emulation of it packs the K and V halves of its [tokens, batch, 2 * Hkv * d] rows before copying them
apart: a host memcpy in ~1 KiB pieces. The simulator costs it as bytes / this rate
(sim/device/physics.py `host_pack_s`). Timed on the wall clock: it is host work on every backend.
"""

from __future__ import annotations

import time
from typing import Any

from .timing import MIN_WINDOW_S, time_window

KV_HEADS, HEAD_DIM = 4, 128  # the 7B's K half of a row: 4 x 128 bf16 values = 1 KiB pieces
ROW_HALF_ELEMS = KV_HEADS * HEAD_DIM
BATCH = 8
METHOD = ("median wall time of x[..., :half].contiguous() on pageable host memory, x [tokens, batch, 2 x half] "
          f"bf16 with half = {ROW_HALF_ELEMS} values; rate = bytes of the packed half / time")


def measure_host_pack(backend: Any, nbytes: int, *, samples: int, min_window_s: float = MIN_WINDOW_S) -> dict:
    """{"bytes_per_s", "bytes", method, spread} for packing `nbytes` (rounded to whole rows)."""
    torch = backend.torch
    row_bytes = BATCH * ROW_HALF_ELEMS * 2  # one token's K half for the batch, bf16
    tokens = max(1, nbytes // row_bytes)
    rows = torch.randn(tokens, BATCH, 2 * ROW_HALF_ELEMS).to(torch.bfloat16)
    half = rows[..., :ROW_HALF_ELEMS]
    packed = half.numel() * half.element_size()

    def window(reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            half.contiguous()
        return time.perf_counter() - t0

    timing = time_window(window, samples=samples, min_window_s=min_window_s)
    return {"bytes_per_s": packed / timing.median_s, "bytes": packed, "method": METHOD, "samples": timing.samples,
            "rel_spread": timing.rel_spread}
