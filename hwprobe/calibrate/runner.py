"""One calibration run: measure in a fixed order, re-check for drift, assemble the Profile.

Order: device memory in use before anything is allocated, host<->device copies (one direction,
then both at once) while the copy buffers exist, then device memory bandwidth, kernel launch, one
decode layer's fixed cost, GEMMs, each weight dtype's decode kernel across rows, attention, and
finally the drift re-check, so the re-check sees the machine after everything else has warmed it.
NVML is sampled while copies and GEMMs are in flight, because PCIe links downtrain and clocks drop
when idle.
"""

from __future__ import annotations

import contextlib
import math
import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Callable

from sim.inputs.profile import ComputeProfile, CopyCurve, HostProfile, LinkProfile, Profile, StepOverhead

from . import (
    attention,
    checks,
    copies,
    device_copy,
    fmt,
    gemm,
    host_attention,
    host_pack,
    layer_overhead,
    step_overhead,
    weight_kernels,
)
from .env import (
    GpuMonitor,
    NvmlUnavailable,
    driver_versions,
    host_info,
    nvml_session,
    throttle_reason_names,
    torch_info,
)
from .plan import LOAD_WINDOW_S, QUANTISED_KERNELS, Plan, max_copy_bytes

OnStep = Callable[[str], None]

CPU_LINK_WARNING = (
    "cpu mode: the 'link' is torch copy_ between two host-memory buffers (a memcpy), not a bus; "
    "pinned and pageable mean nothing on the CPU, so one measurement is stored as both the pinned "
    "and the pageable curves"
)
CPU_DEVICE_WARNING = "cpu mode: 'device' memory is host memory; compute figures are the CPU's, not a GPU's"


@dataclass
class Measurements:
    """Everything measured, before it is summarised into a Profile."""

    curves: list[CopyCurve] = field(default_factory=list)
    concurrent: list[CopyCurve] = field(default_factory=list)
    device_copy: dict = field(default_factory=dict)
    launch: dict = field(default_factory=dict)
    layer: dict = field(default_factory=dict)
    loop: dict = field(default_factory=dict)
    host_pack: dict = field(default_factory=dict)
    gemm_points: list = field(default_factory=list)
    int4_points: list = field(default_factory=list)
    kernel_points: list = field(default_factory=list)  # the weight-kernel sweep beyond the GEMM sweeps' points
    peak_points: list = field(default_factory=list)
    attention_points: list = field(default_factory=list)
    under_load: dict = field(default_factory=dict)
    drift: dict = field(default_factory=dict)
    attention_fit: attention.AttentionFit | None = None
    host: HostProfile | None = None  # host-side attention, host DRAM, the host path's round trip
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # drift
    notes: list[str] = field(default_factory=list)  # kernels not timed, or timed with a caveat; fits not used


def _open_monitor(stack: contextlib.ExitStack, backend: Any, nvml: Any) -> tuple[GpuMonitor | None, str | None]:
    """NVML for the GPU being measured, or (None, why not). The CPU backend does not use NVML."""
    if backend.device != "cuda":
        return None, "not used for a CPU calibration"
    try:
        lib = stack.enter_context(nvml_session(nvml))
        props = backend.properties()
        return GpuMonitor.find(lib, props.get("uuid"), props.get("name")), None
    except NvmlUnavailable as exc:
        return None, str(exc)
    except Exception as exc:  # an NVML error class of whatever binding is installed
        return None, f"NVML error: {exc or type(exc).__name__}"


def _reps_for_load(time_per_call_s: float) -> int:
    return max(1, math.ceil(LOAD_WINDOW_S / time_per_call_s))


def _measure_copies(backend: Any, plan: Plan, monitor: GpuMonitor | None, out: Measurements, on_step: OnStep) -> None:
    memories = ("pinned", "pageable") if backend.device == "cuda" else ("pageable",)
    bufs = copies.allocate(backend, max(plan.copy_sizes_bytes), memories)
    for memory in memories:
        for direction in ("h2d", "d2h"):
            out.curves.append(copies.measure_curve(backend, bufs, direction, memory, list(plan.copy_sizes_bytes),
                                                   samples=plan.samples, min_window_s=plan.min_window_s,
                                                   on_point=on_step))
    on_step(f"host packing of strided K/V ({fmt.size(plan.drift_copy_bytes)})")
    out.host_pack = host_pack.measure_host_pack(backend, plan.drift_copy_bytes, samples=plan.samples,
                                                min_window_s=plan.min_window_s)
    on_step("link state under load")
    if monitor is not None:
        largest = max(plan.copy_sizes_bytes)
        dst, src, ref = bufs.endpoints("h2d", memories[0], largest)
        reps = _reps_for_load(out.curves[0].copy_time_s(largest))
        out.under_load["h2d_copy"] = backend.under_load(lambda i: backend.copy(dst, src, non_blocking=True),
                                                         reps, monitor.sample)
        copies.verify(backend.torch, dst, ref, "h2d", memories[0])
    out.concurrent += copies.measure_concurrent_curves(backend, bufs, memories[0], list(plan.concurrent_sizes_bytes),
                                                       samples=plan.samples, min_window_s=plan.min_window_s,
                                                       on_point=on_step)


def _measure_compute(backend: Any, plan: Plan, monitor: GpuMonitor | None, out: Measurements, on_step: OnStep) -> None:
    kw = dict(samples=plan.samples, min_window_s=plan.min_window_s)
    on_step(f"device-to-device copy {fmt.size(plan.device_copy_bytes)}")
    out.device_copy = device_copy.measure_device_copy(backend, plan.device_copy_bytes, **kw)
    on_step("kernel launch")
    out.launch = device_copy.measure_kernel_launch(backend, **kw)
    on_step("layer overhead (one synthetic layer, tiny shapes)")
    out.layer = layer_overhead.measure_layer_overhead(backend, **kw)
    on_step("step overheads (tiny decode steps, by prefetch mode)")
    out.loop = step_overhead.measure_step_overheads(backend, retier_interval=plan.loop_retier_interval, **kw)
    out.gemm_points, skipped = gemm.measure_decode(backend, list(plan.gemm_shapes), list(plan.gemm_rows),
                                                   on_point=on_step, **kw)
    out.skipped += skipped
    out.int4_points, skipped = gemm.measure_decode_int4(backend, list(plan.gemm_shapes), list(plan.gemm_rows),
                                                        on_point=on_step, **kw)
    out.skipped += skipped
    _measure_weight_kernels(backend, plan, out, on_step)
    out.peak_points, skipped = gemm.measure_peak(backend, list(plan.peak_sizes), on_point=on_step, **kw)
    out.skipped += skipped
    on_step("clocks under GEMM load")
    if monitor is not None and out.peak_points:
        biggest = max(out.peak_points, key=lambda p: p.m)
        fn = gemm.square_gemm(backend, biggest.m)
        if fn is not None:
            out.under_load["gemm"] = backend.under_load(fn, _reps_for_load(biggest.time_s), monitor.sample)
    out.attention_points, skipped = attention.measure_sweep(
        backend, list(plan.attention_shapes), list(plan.attention_batches), list(plan.attention_contexts),
        on_point=on_step, **kw)
    out.skipped += skipped
    out.attention_fit = attention.fit_kv_stream(out.attention_points)
    if out.attention_fit is not None and out.attention_fit.unsound:
        out.notes.append(f"attention fit not used ({out.attention_fit.unsound}): K/V streaming is the best point's "
                         "rate and no attention latency is recorded")
    _measure_host(backend, plan, out, on_step)


def _measure_host(backend: Any, plan: Plan, out: Measurements, on_step: OnStep) -> None:
    """The host CPU attending host-resident K/V with the cache's own routine, on a 7B-shaped layer."""
    from sim.inputs import catalog

    from .plan import QUICK_MODEL

    m7 = catalog.model(QUICK_MODEL)
    free = backend.free_host_bytes()  # 0 where unknown
    dram_bytes = min(plan.host_dram_bytes, free // 4) if free else plan.host_dram_bytes  # source + destination
    out.host = host_attention.measure(
        backend, batch=plan.host_attention_batch, tokens=list(plan.host_attention_tokens), kv_heads=m7.num_kv_heads,
        head_dim=m7.head_dim, dram_bytes=dram_bytes, samples=plan.samples, min_window_s=plan.min_window_s,
        on_step=on_step)


def _measure_weight_kernels(backend: Any, plan: Plan, out: Measurements, on_step: OnStep) -> None:
    """Every weight dtype's decode kernel on the plan's layer-shaped matrix across rows. bf16 and int4
    at the GEMM sweeps' rows are already measured; this adds int4 at more rows, then int8 and fp8."""
    kw = dict(samples=plan.samples, min_window_s=plan.min_window_s, on_point=on_step)
    shape = plan.weight_kernel_shape
    points, skipped = gemm.measure_decode_int4(backend, [shape], list(plan.int4_kernel_rows), max_rows=None, **kw)
    out.kernel_points += points
    out.skipped += skipped
    for dtype in QUANTISED_KERNELS:
        points, skipped, notes = weight_kernels.measure(backend, dtype, shape, list(plan.weight_kernel_rows), **kw)
        out.kernel_points += points
        out.skipped += skipped
        out.notes += notes


def _retime_gemm(backend: Any, plan: Plan, point: Any) -> Any:
    """The same GEMM measured again: a square one from the peak search, or a decode one."""
    kw = dict(samples=plan.samples, min_window_s=plan.min_window_s)
    if point.m == point.n == point.k:
        return gemm.measure_square(backend, point.m, **kw)
    points, _ = gemm.measure_decode(backend, [(point.n, point.k)], [point.m], **kw)
    return points[0] if points else None


def _recheck_drift(backend: Any, plan: Plan, out: Measurements, on_step: OnStep) -> None:
    """Re-time one H2D copy size and one GEMM measured earlier; warn when either moved > 10%."""
    first = out.curves[0]  # h2d from the first memory kind: pinned on a GPU
    size = plan.drift_copy_bytes
    on_step(f"drift re-check: h2d {fmt.size(size)}")
    before = next(p for p in first.points if p.size_bytes == size)
    bufs = copies.allocate(backend, size, (first.memory,))
    after = copies.measure_point(backend, bufs, "h2d", first.memory, size, samples=plan.samples,
                                 min_window_s=plan.min_window_s)
    out.drift["copy"] = {"label": f"h2d {first.memory} copy of {fmt.size(size)}",
                         "before_s": before.time_s, "after_s": after.time_s}
    on_step("drift re-check: GEMM")
    reference = (out.peak_points or out.gemm_points or [None])[0]
    again = _retime_gemm(backend, plan, reference) if reference is not None else None
    if again is not None:
        out.drift["gemm"] = {"label": f"GEMM {reference.m}x{reference.n}x{reference.k}",
                             "before_s": reference.time_s, "after_s": again.time_s}
    for entry in out.drift.values():
        msg = checks.drift(entry["label"], entry["before_s"], entry["after_s"])
        entry["warned"] = msg is not None
        if msg:
            out.warnings.append(msg)


def _versions(monitor: GpuMonitor | None, torch: Any) -> dict[str, str]:
    def dist(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None
    v = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None,
        "nvidia-ml-py": dist("nvidia-ml-py"),
        "kvtier": dist("kvtier"),
    }
    if monitor is not None:
        v |= driver_versions(monitor.nvml)
    return {k: str(val) for k, val in v.items() if val is not None}


def _with_cpu_labels(curves: list[CopyCurve]) -> list[CopyCurve]:
    """On the CPU one memcpy measurement stands for both kinds of host memory."""
    return [c for curve in curves for c in (curve.model_copy(update={"memory": "pinned"}), curve)]


def _device_memory(backend: Any, host: dict) -> tuple[int | None, int | None]:
    """(total, free) device memory, taken before calibration allocates anything. On a GPU: the total
    it reports and what is free to this process (the driver's free memory plus torch's unused cache).
    On the CPU the "device" is host memory: its total, and free left None by design - the simulator
    reads total - free as memory other tenants hold on the device for a whole run (its runtime
    reserve), and on the CPU that would be every other process's host memory of the moment, neither
    a device tenant nor steady. The host's available memory stays in environment.host."""
    if backend.device == "cuda":
        return int(backend.props.total_memory), int(backend.free_device_bytes())
    return host.get("memory_total_bytes"), None


def _assemble(backend: Any, plan: Plan, quick: bool, out: Measurements, env: dict, monitor: GpuMonitor | None,
              bounds: tuple[Any, Any], created_utc: str, memory: tuple[int | None, int | None]) -> Profile:
    cpu = backend.device == "cpu"
    curves = _with_cpu_labels(out.curves) if cpu else out.curves
    concurrent = _with_cpu_labels(out.concurrent) if cpu else out.concurrent
    by_direction = {c.direction: c for c in out.concurrent}
    link = LinkProfile(
        curves=curves + concurrent,
        bidirectional_h2d_bytes_per_s=copies.bidirectional_bytes_per_s(by_direction["h2d"]),
        bidirectional_d2h_bytes_per_s=copies.bidirectional_bytes_per_s(by_direction["d2h"]),
        host_pack_bytes_per_s=out.host_pack.get("bytes_per_s"),
    )
    all_gemms = out.gemm_points + out.peak_points
    launch_s = out.launch.get("kernel_launch_s")
    kernel_curves = weight_kernels.curves(out.gemm_points + out.int4_points + out.kernel_points,
                                          plan.weight_kernel_shape, list(plan.weight_kernel_rows))
    kernel_names = weight_kernels.kernel_names(backend)
    fit = out.attention_fit if out.attention_fit is not None and out.attention_fit.unsound is None else None
    compute = ComputeProfile(
        device_copy_bytes_per_s=out.device_copy.get("read_plus_written_bytes_per_s"),
        weight_hbm_bytes_per_s={dtype: w for dtype, points in (("bf16", out.gemm_points), ("int4", out.int4_points))
                                if (w := gemm.weight_stream_bytes_per_s(points))},
        weight_kernel_bytes_per_s_by_rows=kernel_curves,
        weight_kernels={dtype: kernel_names[dtype] for dtype in kernel_curves},
        attention_hbm_bytes_per_s=fit.bytes_per_s if fit else attention.kv_stream_bytes_per_s(out.attention_points),
        attention_latency_s=fit.latency_s if fit else None,
        peak_flop_per_s={"bf16": max(p.flop_per_s for p in all_gemms)} if all_gemms else {},
        gemm_flop_per_s_by_rows=gemm.flop_per_s_by_rows(out.gemm_points),
        layer_overhead_s=out.layer.get("layer_overhead_s"),
        kernel_launch_s=launch_s,
        step_overheads={mode: StepOverhead(layer_s=v["layer_s"], step_s=v["step_s"])
                        for mode, v in out.loop.get("by_prefetch", {}).items()},
        attention_backend=attention.backend_summary(out.attention_points),
        gemm_points=all_gemms + out.int4_points + out.kernel_points,
        attention_points=out.attention_points,
    )
    host = env["host"]
    device_memory, device_free = memory
    profile = Profile(
        device=backend.device, device_name=backend.name, machine=host.get("hostname", "unknown"),
        created_utc=created_utc, versions=_versions(monitor, backend.torch), environment=env,
        device_memory_bytes=device_memory or None, device_memory_free_bytes=device_free,
        host_memory_bytes=host.get("memory_total_bytes"),
        copy_engines=backend.copy_engines(), link=link, compute=compute, host=out.host, quick=quick,
    )
    return profile.model_copy(update={"warnings": _warnings(backend, profile, monitor, out, env, bounds)})


def _bounds(backend: Any, monitor: GpuMonitor | None) -> tuple[Any, Any]:
    """(catalog GPU, link peak) the measured figures are checked against; (None, None) on the CPU."""
    if backend.device != "cuda":
        return None, None
    gpu = checks.match_gpu(backend.name)
    static = monitor.static if monitor is not None else {}
    return gpu, checks.link_peak(gpu, static.get("pcie_gen_max"), static.get("pcie_width_max"))


def _warnings(backend: Any, profile: Profile, monitor: GpuMonitor | None, out: Measurements, env: dict,
              bounds: tuple[Any, Any]) -> list[str]:
    found = [CPU_LINK_WARNING, CPU_DEVICE_WARNING] if backend.device == "cpu" else []
    if backend.device == "cuda" and monitor is None:
        found.append(f"no NVML: clocks, PCIe link state and throttling were not recorded ({env['nvml']['reason']})")
    found += checks.implausible(profile, *bounds)
    found += checks.downtrained(monitor.static if monitor else {}, out.under_load.get("h2d_copy"))
    found += checks.throttling(monitor.throttle_bits_seen if monitor else None)
    found += out.warnings  # drift
    found += out.notes
    found += checks.high_variance(profile)
    found += [f"skipped: {s}" for s in out.skipped]
    return found


def calibrate(backend: Any, plan: Plan, *, quick: bool, nvml: Any = None, on_step: OnStep = lambda label: None) -> Profile:
    """Measure the machine behind `backend` following `plan` and return its Profile."""
    created_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with contextlib.ExitStack() as stack:
        monitor, nvml_reason = _open_monitor(stack, backend, nvml)
        env: dict[str, Any] = {"host": host_info(), "torch": torch_info(), "device": backend.properties()}
        env["nvml"] = {"available": monitor is not None} | ({"reason": nvml_reason} if nvml_reason else {})
        if monitor is not None:
            env["gpu"] = monitor.static
        memory = _device_memory(backend, env["host"])  # before anything below allocates
        plan = plan.capped(max_copy_bytes(backend.free_device_bytes(), backend.free_host_bytes(), backend.device))
        env["plan"] = plan.summary()
        out = Measurements()
        _measure_copies(backend, plan, monitor, out, on_step)
        _measure_compute(backend, plan, monitor, out, on_step)
        _recheck_drift(backend, plan, out, on_step)
        if monitor is not None:
            env["end_state"] = monitor.sample()
            env["throttle_reasons_seen"] = throttle_reason_names(monitor.throttle_bits_seen)
        env["under_load"] = out.under_load
        env["device_copy"] = out.device_copy
        env["kernel_launch"] = out.launch
        env["layer_overhead"] = out.layer | {"kernel_launch_s": out.launch.get("kernel_launch_s")}
        env["step_overhead"] = out.loop
        env["host_pack"] = out.host_pack
        env["drift"] = out.drift
        env["attention_fit"] = asdict(out.attention_fit) if out.attention_fit else None
        env["weight_kernels"] = {"shape_nk": list(plan.weight_kernel_shape), "rows": list(plan.weight_kernel_rows),
                                 "group_size": weight_kernels.WEIGHT_GROUP, "kernels": weight_kernels.kernel_names(backend)}
        env["conventions"] = {
            "copy_point_bytes_per_s": "copy size / median time of one copy",
            "device_copy_bytes_per_s": "bytes read + bytes written per second",
            "gemm": "y = x @ W^T, x (M, K), W (N, K), random bf16, weights rotated past 2x the last-level cache",
            "attention": "decode SDPA: q (B, H, 1, d) against K, V (B, Hkv, n, d), bf16, enable_gqa",
            "attention_fit": "time = latency + K/V bytes / bandwidth, least squares on relative residuals, latency >= 0",
            "host_dram_bytes_per_s": "bytes read + bytes written per second, torch copy_ of a large float32 host buffer",
            "host_attention": "one layer's host-resident T1 K/V (bf16 as stored) attended by the cache's host routine "
                              "on its worker thread; fit time = dispatch + K/V bytes / bandwidth as attention_fit",
            "weight_kernel_bytes_per_s": "weight bytes as the simulator counts them (sim/model/dtypes.py, groups of "
                                         "group_size) / median kernel time; activations bf16 (fp8: e4m3, not timed)",
        }
        gpu, peak = bounds = _bounds(backend, monitor)
        env["catalog_gpu"] = gpu.name if gpu else None
        env["link_peak"] = {"name": peak.name, "theoretical_bytes_per_s": peak.bytes_per_s} if peak else None
        return _assemble(backend, plan, quick, out, env, monitor, bounds, created_utc, memory)
