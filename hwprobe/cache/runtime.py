"""Streams, events and timing marks: real on CUDA, no-ops on the CPU.

One code path runs on both devices, so CI on a CPU exercises the same prefetch ordering a GPU uses.
On CUDA every host<->device copy runs on one side stream; the compute stream and the side stream
order each other with events and `wait_stream` (never `record_stream`), so a buffer is rewritten
only after the kernels that read it have run. On the CPU copies are plain synchronous copies and a
timing mark is `time.perf_counter()`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

S_PER_MS = 1e-3  # torch.cuda.Event.elapsed_time returns milliseconds


class _NullEvent:
    """Stands in for a CUDA event on the CPU, where every operation has finished when it returns."""

    def record(self, stream=None) -> None:
        pass

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
        else:
            self.compute_stream = self.copy_stream = None

    # ---- ordering -------------------------------------------------------------------------
    def event(self):
        return self.torch.cuda.Event() if self.is_cuda else _NullEvent()

    def on_copy_stream(self):
        """Context in which copies are issued on the side stream."""
        return self.torch.cuda.stream(self.copy_stream) if self.is_cuda else nullcontext()

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
    def mark(self, on_copy: bool = False):
        """A point in time on one stream: a timing CUDA event, or perf_counter on the CPU."""
        if not self.is_cuda:
            return time.perf_counter()
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record(self.copy_stream if on_copy else self.compute_stream)
        return ev

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

    # ---- copies ---------------------------------------------------------------------------
    def to_device(self, x):
        """Host -> device on the side stream (a real copy on the CPU too). Synchronise before use
        on the host side; compute must `compute_waits_for_copies` before reading it."""
        if not self.is_cuda:
            return x.clone()
        src = x if x.is_pinned() else x.pin_memory()
        # allocated on the compute stream (where it is used and freed); the copy stream first waits
        # for compute, since a reused block may still be read by queued kernels
        out = self.torch.empty(tuple(x.shape), dtype=x.dtype, device=self.device)
        self.copy_waits_for_compute()
        with self.on_copy_stream():
            out.copy_(src, non_blocking=True)
        return out

    def copy_to_host(self, dst, src) -> None:
        """Device -> an existing host view (e.g. a slice of a pinned store), on the side stream after
        everything compute has queued; valid after `synchronize()`. Keep `src` alive until then."""
        self.copy_waits_for_compute()
        with self.on_copy_stream():
            dst.copy_(src, non_blocking=self.is_cuda)

    def to_host(self, x, pinned: bool = True):
        """Device -> host on the side stream, after everything compute has queued. The result is
        valid only after `synchronize()` (reading a non_blocking D2H result early gives wrong data)."""
        out = self.host_empty(tuple(x.shape), x.dtype, pinned)
        self.copy_waits_for_compute()
        with self.on_copy_stream():
            out.copy_(x, non_blocking=self.is_cuda)
        return out
