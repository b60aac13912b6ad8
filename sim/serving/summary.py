"""The serving summary (`sim/schema.py: ServingSummary`) with swap preemption's figures.

The swap keys sit after `preempted_requests` in summary.json, and only when the run swaps
(`scheduler.preemption: swap`): a recompute run's summary is byte for byte what it was before swap
existed (the golden files pin that).
"""

from __future__ import annotations

from pydantic import model_serializer

from ..schema import ServingSummary as _BaseSummary

AFTER_KEY = "preempted_requests"


class ServingSummary(_BaseSummary):
    """One simulated serving run; with swap preemption also what swapping moved."""

    preemption: str | None = None  # "swap" (absent: recompute)
    swap_space_bytes: float | None = None  # the swap space for T0 copies (None: host memory alone bounds it)
    swaps: int | None = None  # preemptions whose K/V went to the host
    swap_fallbacks: int | None = None  # preemptions recomputed because the host had no room
    swap_out_bytes: float | None = None  # K/V copied device->host by swaps (per GPU)
    swap_in_bytes: float | None = None  # and host->device when they resumed

    @model_serializer(mode="wrap")
    def _swap_keys_in_place(self, handler):
        data = handler(self)
        keys = [k for k in SWAP_KEYS if k in data]
        extra = {k: data.pop(k) for k in keys}
        if self.preemption is None:
            return data
        out = {}
        for k, v in data.items():
            out[k] = v
            if k == AFTER_KEY:
                out |= extra
        return out if AFTER_KEY in data else data | extra


SWAP_KEYS = ("preemption", "swap_space_bytes", "swaps", "swap_fallbacks", "swap_out_bytes", "swap_in_bytes")


def swap_figures(trace) -> dict:
    """The swap keys of a run that swaps (an empty dict for recompute)."""
    if not trace.swap_mode:
        return {}
    return dict(swaps=trace.swaps, swap_fallbacks=trace.swap_fallbacks, swap_out_bytes=trace.swap_out_bytes,
                swap_in_bytes=trace.swap_in_bytes)
