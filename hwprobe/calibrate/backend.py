"""Where measurements run: a CUDA GPU, or the CPU standing in for one.

A backend owns buffers, the copy function, clocks and streams, so the measurement modules are
written once for both. On CUDA, asynchronous work is timed with a pair of CUDA events around many
calls on a dedicated non-default stream; synchronous work (pageable copies) with the wall clock
plus synchronize. On the CPU everything is wall clock: there is no device to wait for.
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path
from typing import Any, Callable

from sim.model.units import MS, KiB, MiB

from .env import cpu_model, cuda_unavailable_reason, host_memory_available_bytes, import_torch
from .timing import PairWindow, Window

DEFAULT_CPU_CACHE_BYTES = 32 * MiB  # when sysfs does not say how large the last-level cache is
# Holds both streams of a bidirectional measurement until all its copies are enqueued, so they
# start together: ~25 ms at a 2 GHz SM clock, longer than enqueueing a window of copies takes.
GATE_SLEEP_CYCLES = 50_000_000
CUDA_DEV_ATTR_ASYNC_ENGINE_COUNT = 40  # cudaDevAttrAsyncEngineCount (cuda_runtime_api.h)
_CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")

CallFn = Callable[[int], Any]  # fn(i): the i-th call of a timed loop


class BackendUnavailable(Exception):
    """The requested device cannot be measured; the message says why."""


def _require_torch() -> Any:
    torch = import_torch()
    if torch is None:
        raise BackendUnavailable("torch is not installed (pip install 'kvtier[hwprobe]')")
    return torch


def _cpu_cache_bytes() -> int:
    """Largest cache of cpu0 from sysfs ("32768K"), or a default."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip()
            unit = {"K": KiB, "M": MiB}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KM")) * unit)
        except (OSError, ValueError):
            continue
    return max(sizes, default=DEFAULT_CPU_CACHE_BYTES)


class CpuBackend:
    """The CPU as a stand-in device: "device" and "host" buffers are both host memory."""

    device = "cpu"

    def __init__(self) -> None:
        self.torch = _require_torch()
        self.name = cpu_model()
        self.cache_bytes = _cpu_cache_bytes()

    @property
    def tensor_device(self) -> str:
        return "cpu"

    def host_buffer(self, nbytes: int, pinned: bool = False) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8)

    def device_buffer(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8)

    def copy(self, dst: Any, src: Any, non_blocking: bool = False) -> None:
        """The one copy function every copy measurement goes through (tests inject faults here)."""
        dst.copy_(src, non_blocking=non_blocking)

    def sync(self) -> None:
        pass

    def window(self, fn: CallFn, events: bool = False) -> Window:
        def run(reps: int) -> float:
            t0 = time.perf_counter()
            for i in range(reps):
                fn(i)
            return time.perf_counter() - t0
        return run

    def pair_window(self, fn_a: CallFn, fn_b: CallFn) -> PairWindow:
        """Two threads released by one barrier, each timing its own loop."""
        def run(reps: int) -> tuple[float, float]:
            barrier = threading.Barrier(2)
            elapsed = [0.0, 0.0]
            errors: list[BaseException] = []

            def loop(slot: int, fn: CallFn) -> None:
                try:
                    barrier.wait()
                    t0 = time.perf_counter()
                    for i in range(reps):
                        fn(i)
                    elapsed[slot] = time.perf_counter() - t0
                except BaseException as exc:  # re-raised in the calling thread
                    errors.append(exc)
                    barrier.abort()

            other = threading.Thread(target=loop, args=(1, fn_b))
            other.start()
            loop(0, fn_a)
            other.join()
            if errors:
                raise errors[0]
            return elapsed[0], elapsed[1]
        return run

    def under_load(self, fn: CallFn, reps: int, sample: Callable[[], Any]) -> Any:
        """Nothing to observe asynchronously on the CPU: just take the sample."""
        return sample()

    def free_device_bytes(self) -> int:
        return host_memory_available_bytes() or 0

    def free_host_bytes(self) -> int:
        return host_memory_available_bytes() or 0

    def copy_engines(self) -> int | None:
        return None

    def properties(self) -> dict[str, Any]:
        return {"name": self.name, "threads": self.torch.get_num_threads(), "cache_bytes": self.cache_bytes}


class CudaBackend:
    """One CUDA GPU; work runs on a dedicated non-default stream (a second one for bidirectional)."""

    device = "cuda"

    def __init__(self, index: int = 0) -> None:
        torch = _require_torch()
        reason = cuda_unavailable_reason(torch)
        if reason is not None:
            raise BackendUnavailable(reason)
        self.torch = torch
        self.index = index
        torch.cuda.set_device(index)
        self.props = torch.cuda.get_device_properties(index)
        self.name = self.props.name
        self.cache_bytes = int(getattr(self.props, "L2_cache_size", 0) or DEFAULT_CPU_CACHE_BYTES)
        self.stream = torch.cuda.Stream()
        self.stream2 = torch.cuda.Stream()
        self.gate_stream = torch.cuda.Stream()

    @property
    def tensor_device(self) -> str:
        return f"cuda:{self.index}"

    def host_buffer(self, nbytes: int, pinned: bool = False) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=pinned)

    def device_buffer(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.tensor_device)

    def copy(self, dst: Any, src: Any, non_blocking: bool = False) -> None:
        dst.copy_(src, non_blocking=non_blocking)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def window(self, fn: CallFn, events: bool = True) -> Window:
        """Events around the loop on the dedicated stream, or wall clock + synchronize."""
        torch = self.torch

        def by_events(reps: int) -> float:
            torch.cuda.synchronize()  # operands made on the default stream are ready; not timed
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self.stream):
                start.record(self.stream)
                for i in range(reps):
                    fn(i)
                end.record(self.stream)
            end.synchronize()
            return start.elapsed_time(end) * MS

        def by_wall(reps: int) -> float:
            torch.cuda.synchronize()
            with torch.cuda.stream(self.stream):
                t0 = time.perf_counter()
                for i in range(reps):
                    fn(i)
                torch.cuda.synchronize()
                return time.perf_counter() - t0

        return by_events if events else by_wall

    def pair_window(self, fn_a: CallFn, fn_b: CallFn) -> PairWindow:
        """Both streams wait on one gate event, so their copies start together; each is timed
        by its own pair of events."""
        torch = self.torch

        def run(reps: int) -> tuple[float, float]:
            torch.cuda.synchronize()
            gate = torch.cuda.Event()
            with torch.cuda.stream(self.gate_stream):
                if hasattr(torch.cuda, "_sleep"):
                    torch.cuda._sleep(GATE_SLEEP_CYCLES)
                gate.record(self.gate_stream)
            events = []
            for stream in (self.stream, self.stream2):
                stream.wait_event(gate)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                events.append((start, end))
            for i in range(reps):
                with torch.cuda.stream(self.stream):
                    fn_a(i)
                with torch.cuda.stream(self.stream2):
                    fn_b(i)
            for stream, (_, end) in zip((self.stream, self.stream2), events):
                end.record(stream)
            for _, end in events:
                end.synchronize()
            (sa, ea), (sb, eb) = events
            return sa.elapsed_time(ea) * MS, sb.elapsed_time(eb) * MS

        return run

    def under_load(self, fn: CallFn, reps: int, sample: Callable[[], Any]) -> Any:
        """Enqueue `reps` calls, take `sample()` while the GPU works through them, then wait."""
        self.torch.cuda.synchronize()
        with self.torch.cuda.stream(self.stream):
            for i in range(reps):
                fn(i)
        try:
            return sample()
        finally:
            self.stream.synchronize()

    def free_device_bytes(self) -> int:
        """Free to the driver plus what torch's caching allocator holds but no tensor uses."""
        cuda = self.torch.cuda
        cached_unused = cuda.memory_reserved(self.index) - cuda.memory_allocated(self.index)
        return int(cuda.mem_get_info(self.index)[0] + cached_unused)

    def free_host_bytes(self) -> int:
        return host_memory_available_bytes() or 0

    def copy_engines(self) -> int | None:
        """Async copy engines: torch's property if it has one, else the CUDA runtime attribute."""
        count = getattr(self.props, "async_engine_count", None)
        if count:
            return int(count)
        for lib in _CUDART_NAMES:
            try:
                cudart = ctypes.CDLL(lib)
                value = ctypes.c_int(0)
                rc = cudart.cudaDeviceGetAttribute(ctypes.byref(value), CUDA_DEV_ATTR_ASYNC_ENGINE_COUNT, self.index)
            except (OSError, AttributeError):
                continue
            if rc == 0 and value.value > 0:
                return value.value
        return None

    def properties(self) -> dict[str, Any]:
        p = self.props
        info = {
            "name": p.name,
            "compute_capability": f"{p.major}.{p.minor}",
            "multi_processor_count": p.multi_processor_count,
            "total_memory_bytes": int(p.total_memory),
            "l2_cache_bytes": self.cache_bytes,
            "uuid": str(getattr(p, "uuid", "")) or None,
        }
        return {k: v for k, v in info.items() if v is not None}


def make_backend(device: str) -> CpuBackend | CudaBackend:
    if device == "cuda":
        return CudaBackend()
    if device == "cpu":
        return CpuBackend()
    raise ValueError(f"unknown device {device!r}")
