"""The output documents, defined once: the per-step table, the run summary, the validation table.

`kvsim run`, the projection, `hwprobe run`, `hwprobe validate` and the report all read and write
these shapes through this module, so a key or column is spelled in one place.
"""

from __future__ import annotations

import math

import numpy as np

# ---- per-step table (steps.csv) --------------------------------------------------------------
STEP_COLUMNS = ["step", "t_s", "step_s", "compute_s", "stall_s", "h2d_bytes", "d2h_bytes",
                "tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3", "hbm_bytes", "host_bytes", "batch_active"]
TIMING_COLUMNS = ["t_s", "step_s", "compute_s", "stall_s", "h2d_bytes", "d2h_bytes"]  # empty when a run does not fit

# ---- run summary (summary.json) ------------------------------------------------------------
P50, P99 = 50, 99
LINK_BOTTLENECK_UTILIZATION = 0.9  # a direction busy this share of decode time is the bottleneck


def tpot_percentiles_s(step_s: np.ndarray) -> tuple[float, float]:
    """(p50, p99) of the time per output token: the decode step times of a batch."""
    return float(np.percentile(step_s, P50)), float(np.percentile(step_s, P99))


# ---- validation table ----------------------------------------------------------------------
def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured; None where undefined: a value missing or NaN, or measured 0
    while predicted is not (0 when both are 0)."""
    if predicted is None or measured is None:
        return None
    p, m = float(predicted), float(measured)
    if math.isnan(p) or math.isnan(m):
        return None
    if m == 0.0:
        return 0.0 if p == 0.0 else None
    return (p - m) / m
