"""Streams, events and timing marks: real on CUDA, no-ops on the CPU.

One code path runs on both devices, so CI on a CPU exercises the same prefetch ordering a GPU uses.
On CUDA host->device copies run on a copy stream and re-tier offloads (device->host) on an offload
stream of their own, so an offload overlaps the next steps' prefetches; host attention's queries go
device->host on a small stream of theirs (host_attention.py); the streams order each other
with events and `wait_stream` (never `record_stream`), so a buffer is rewritten only after the
kernels that read it have run. On the CPU copies are plain synchronous copies, every event has
completed when it is queried, and a timing mark is `time.perf_counter()`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

S_PER_MS = 1e-3  # torch.cuda.Event.elapsed_time returns milliseconds
# the streams a timing mark can be recorded on
COMPUTE, COPY, OFFLOAD, HOST_PATH = "compute", "copy", "offload", "host_path"


class _NullEvent:
    """Stands in for a CUDA event on the CPU, where every operation has finished when it returns."""

    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class Runtime:
    """The device, its compute stream and one side stream for copies, plus timing marks.

    `trace`, when a list, receives every event operation (op, id(event)) and the staging ring's
    fill / acquire / release, so tests can check the ordering on a machine without a GPU.
    """

    def __init__(self, device="cpu", trace: list | None = None):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.trace = trace
        if self.is_cuda:
            if self.device.index is not None:
                torch.cuda.set_device(self.device)
            self.compute_stream = torch.cuda.current_stream(self.device)
            self.copy_stream = torch.cuda.Stream(self.device)
            self.offload_stream = torch.cuda.Stream(self.device)
            self.host_path_stream = torch.cuda.Stream(self.device)  # host attention's query copies
        else:
            self.compute_stream = self.copy_stream = self.offload_stream = self.host_path_stream = None

    # ---- ordering -------------------------------------------------------------------------
    def event(self):
        return self.torch.cuda.Event() if self.is_cuda else _NullEvent()

    def on_copy_stream(self):
        """Context in which copies are issued on the side stream."""
        return self.torch.cuda.stream(self.copy_stream) if self.is_cuda else nullcontext()

    def on_offload_stream(self):
        """Context in which a re-tier's offload (gather and device->host copy) is issued."""
        return self.torch.cuda.stream(self.offload_stream) if self.is_cuda else nullcontext()

    def on_host_path_stream(self):
        """Context in which host attention's queries are copied device->host."""
        return self.torch.cuda.stream(self.host_path_stream) if self.is_cuda else nullcontext()

    def host_path_waits_for_compute(self) -> None:
        """The query copy issued next reads what the compute stream has queued so far."""
        if self.is_cuda:
            self.host_path_stream.wait_stream(self.compute_stream)

    def record_host_path(self, event) -> None:
        self.note("record_host_path", id(event))
        if self.is_cuda:
            event.record(self.host_path_stream)

    def record_offload(self, event) -> None:
        self.note("record_offload", id(event))
        if self.is_cuda:
            event.record(self.offload_stream)

    def offload_waits_for_compute(self) -> None:
        """The offload issued next reads what the compute stream has queued so far."""
        if self.is_cuda:
            self.offload_stream.wait_stream(self.compute_stream)

    def event_done(self, event) -> bool:
        """Has the work before `event` finished? Never blocks (always true on the CPU)."""
        self.note("query", id(event))
        return bool(event.query()) if self.is_cuda else True

    def wait_host(self, event) -> None:
        """The host blocks until `event` has completed."""
        self.note("host_waits", id(event))
        if self.is_cuda:
            event.synchronize()

    def record_compute(self, event) -> None:
        self.note("record_compute", id(event))
        if self.is_cuda:
            event.record(self.compute_stream)

    def record_copy(self, event) -> None:
        self.note("record_copy", id(event))
        if self.is_cuda:
            event.record(self.copy_stream)

    def copy_waits_for(self, event) -> None:
        self.note("copy_waits", id(event))
        if self.is_cuda:
            self.copy_stream.wait_event(event)

    def compute_waits_for(self, event) -> None:
        self.note("compute_waits", id(event))
        if self.is_cuda:
            self.compute_stream.wait_event(event)

    def copy_waits_for_compute(self) -> None:
        """Copies issued next see everything the compute stream has queued so far."""
        if self.is_cuda:
            self.copy_stream.wait_stream(self.compute_stream)

    def compute_waits_for_copies(self) -> None:
        if self.is_cuda:
            self.compute_stream.wait_stream(self.copy_stream)

    def synchronize(self) -> None:
        if self.is_cuda:
            self.torch.cuda.synchronize(self.device)

    def note(self, *item) -> None:
        if self.trace is not None:
            self.trace.append(item)

    # ---- timing ---------------------------------------------------------------------------
    def mark(self, on: str = COMPUTE):
        """A point in time on one stream (compute, copy, offload or host path): a timing CUDA event, or
        perf_counter on the CPU."""
        if not self.is_cuda:
            return time.perf_counter()
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record({COMPUTE: self.compute_stream, COPY: self.copy_stream, OFFLOAD: self.offload_stream,
                   HOST_PATH: self.host_path_stream}[on])
        return ev

    @contextmanager
    def exposed(self, stalls: list):
        """Time the work inside as a stall: on CUDA compute-stream marks around it (what compute
        waits for, or host-blocking work it idles through), on the CPU the wall clock of the
        synchronous work. Appends (mark, mark) to `stalls`."""
        start = self.mark()
        yield
        stalls.append((start, self.mark()))

    def elapsed_s(self, a, b) -> float:
        """Seconds from mark a to mark b. On CUDA only valid once both events have completed."""
        if not self.is_cuda:
            return b - a
        return a.elapsed_time(b) * S_PER_MS

    @property
    def timing_label(self) -> str:
        return "cuda_events" if self.is_cuda else "cpu_wall_clock"

    # ---- memory ---------------------------------------------------------------------------
    def device_zeros(self, shape, dtype):
        return self.torch.zeros(shape, dtype=dtype, device=self.device)

    def host_zeros(self, shape, dtype, pinned: bool):
        """Host memory; page-locked only when it is a CUDA device's copy source or target."""
        return self.torch.zeros(shape, dtype=dtype, pin_memory=bool(pinned and self.is_cuda))

    def host_empty(self, shape, dtype, pinned: bool):
        return self.torch.empty(shape, dtype=dtype, pin_memory=bool(pinned and self.is_cuda))

    def device_empty(self, shape, dtype):
        return self.torch.empty(shape, dtype=dtype, device=self.device)
