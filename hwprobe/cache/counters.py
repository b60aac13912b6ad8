"""What one decode step moved and waited for, as raw timing marks resolved after the run.

Marks are CUDA events on a GPU (resolving them needs the device to have finished) and
perf_counter floats on the CPU, so the loop never synchronises just to time itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepCounters:
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    stalls: list = field(default_factory=list)  # (mark, mark): compute waiting on a copy or a re-tier
    h2d_busy: list = field(default_factory=list)  # (mark, mark) on the copy stream
    d2h_busy: list = field(default_factory=list)
    retier_span: tuple | None = None  # (mark, mark) of this step's re-tier, also in `stalls`
    offloaded_tokens: int = 0
    evicted_tokens: int = 0
