"""Least-squares fit of transfer time against size: time = per_copy_latency_s + bytes / bandwidth.

The simulator's link model is exactly this line (DESIGN.md), so the fit gives it a latency and a
bandwidth while the raw points stay in the profile for interpolation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class LatencyBandwidthFit:
    per_copy_latency_s: float
    bytes_per_s: float


def _through_origin(x: np.ndarray, t: np.ndarray, w: np.ndarray) -> LatencyBandwidthFit:
    """Weighted least squares of t = x * s with no intercept: s = sum(w^2 x t) / sum(w^2 x^2)."""
    w2 = w * w
    seconds_per_byte = float(np.sum(w2 * x * t) / np.sum(w2 * x * x))
    return LatencyBandwidthFit(0.0, 1.0 / seconds_per_byte)


def fit_latency_bandwidth(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> LatencyBandwidthFit:
    """Fit time = latency + bytes / bandwidth, minimising relative residuals (t_i - model_i) / t_i.

    Relative weighting matters because sizes span five orders of magnitude: in absolute seconds
    the largest copies would decide everything and the small copies, which carry the latency,
    would not count. A negative intercept (noise at small sizes) or a non-increasing line falls
    back to a line through the origin, which always has a positive bandwidth.
    """
    x = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if x.shape != t.shape or x.size == 0:
        raise ValueError("fit needs the same, non-zero number of sizes and times")
    if np.any(x <= 0) or np.any(t <= 0) or not np.all(np.isfinite(x)) or not np.all(np.isfinite(t)):
        raise ValueError("fit needs positive, finite sizes and times")
    w = 1.0 / t
    if np.unique(x).size < 2:
        return _through_origin(x, t, w)
    design = np.column_stack([np.ones_like(x), x]) * w[:, None]
    (latency_s, seconds_per_byte), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if latency_s < 0 or seconds_per_byte <= 0:
        return _through_origin(x, t, w)
    return LatencyBandwidthFit(float(latency_s), float(1.0 / seconds_per_byte))
