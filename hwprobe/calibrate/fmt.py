"""Human-readable sizes and rates for messages. Copy sizes are powers of two, so binary units
(KiB, MiB, GiB) name them exactly; rates are decimal (GB/s, TFLOP/s) like every datasheet."""

from __future__ import annotations

from sim.units import GB, TFLOP, GiB, KiB, MiB

GFLOP = 1e9


def size(nbytes: float) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit:
            return f"{nbytes / unit:g} {name}"
    return f"{nbytes:g} B"


def rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / GB:.1f} GB/s"


def flops(flop_per_s: float) -> str:
    """TFLOP/s for GPUs; GFLOP/s when below one TFLOP/s (CPUs), so small figures do not read 0.00."""
    if flop_per_s < TFLOP:
        return f"{flop_per_s / GFLOP:.1f} GFLOP/s"
    return f"{flop_per_s / TFLOP:.2f} TFLOP/s"


def pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"
