"""What one decode step moved and waited for, as raw timing marks resolved after the run.

Marks are CUDA events on a GPU (resolving them needs the device to have finished) and
perf_counter floats on the CPU, so the loop never synchronises just to time itself.
Definitions follow the simulator: a stall is time the compute stream (on the CPU: the thread)
waits for link transfers, so compute = step - stall; link busy intervals per direction, whose
union over decode time is the transfer share.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepCounters:
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    h2d_copies: int = 0  # copy calls, to compare with sim/device/physics.py's copy counts
    d2h_copies: int = 0
    stalls: list = field(default_factory=list)  # (mark, mark): compute waiting on link transfers
    h2d_busy: list = field(default_factory=list)  # (mark, mark) on the copy stream
    d2h_busy: list = field(default_factory=list)  # (mark, mark) on the offload stream
    host_busy_s: float = 0.0  # host worker attending T1/T2 (access host_attention / split), wall clock
    retier_span: tuple | None = None  # (mark, mark) of this step's whole re-tier (scales with depth)
    offloaded_tokens: int = 0
    evicted_tokens: int = 0
