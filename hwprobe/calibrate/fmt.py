"""Human-readable sizes and rates for messages. Copy sizes are powers of two, so binary units
(KiB, MiB, GiB) name them exactly; rates are decimal (GB/s, TFLOP/s) like every datasheet."""

from __future__ import annotations

from sim.model.units import GB, TFLOP, GiB, KiB, MiB

GFLOP = 1e9


def size(nbytes: float) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit:
            return f"{nbytes / unit:g} {name}"
    return f"{nbytes:g} B"


def rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / GB:.1f} GB/s"


def rates_by_rows(curve: list[tuple[int, float]]) -> str:
    """"M=1 3205, M=8 3101, ..., M=256 0.123" in GB/s: whole numbers from 100, else three digits."""
    return ", ".join(f"M={m} {r:.0f}" if (r := bytes_per_s / GB) >= 100 else f"M={m} {r:.3g}"
                     for m, bytes_per_s in curve)


def flops(flop_per_s: float) -> str:
    """TFLOP/s for GPUs; GFLOP/s when below one TFLOP/s (CPUs), so small figures do not read 0.00."""
    if flop_per_s < TFLOP:
        return f"{flop_per_s / GFLOP:.1f} GFLOP/s"
    return f"{flop_per_s / TFLOP:.2f} TFLOP/s"


def pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"
