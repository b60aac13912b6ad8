"""The few figures of a profile a person wants to see after a calibration, as (label, value) rows."""

from __future__ import annotations

from sim.inputs.profile import Profile
from sim.model.units import US

from . import fmt


def summary_rows(profile: Profile) -> list[tuple[str, str]]:
    rows = [("device", f"{profile.device}: {profile.device_name}")]
    if profile.device_memory_bytes:
        free = (f"{fmt.size(profile.device_memory_free_bytes)} free at the start"
                if profile.device_memory_free_bytes is not None else "free not recorded (host memory)")
        rows.append(("device memory", f"{fmt.size(profile.device_memory_bytes)}, {free}"))
    if profile.link is not None:
        for c in profile.link.curves:
            if not c.concurrent:
                rows.append((f"{c.direction} {c.memory}",
                             f"{fmt.rate(c.fit_bytes_per_s)} + {c.fit_per_copy_latency_s / US:.1f} us per copy "
                             f"(largest: {fmt.rate(max(c.points, key=lambda p: p.size_bytes).bytes_per_s)})"))
        for d in ("h2d", "d2h"):
            bidir = getattr(profile.link, f"bidirectional_{d}_bytes_per_s")
            if bidir:
                rows.append((f"{d} while both directions copy", fmt.rate(bidir)))
        if profile.link.host_pack_bytes_per_s:
            rows.append(("host packing of strided K/V", fmt.rate(profile.link.host_pack_bytes_per_s)))
    c = profile.compute
    if c.device_copy_bytes_per_s:
        rows.append(("device copy (read + written)", fmt.rate(c.device_copy_bytes_per_s)))
    for dtype, rate in c.weight_hbm_bytes_per_s.items():
        rows.append((f"weight streaming {dtype} (small M)", fmt.rate(rate)))
    if "bf16" in c.peak_flop_per_s:
        rows.append(("peak GEMM bf16", fmt.flops(c.peak_flop_per_s["bf16"])))
    for m, flop_per_s in c.gemm_flop_per_s_by_rows:
        rows.append((f"GEMM bf16 at M={m}", fmt.flops(flop_per_s)))
    for dtype, curve in c.weight_kernel_bytes_per_s_by_rows.items():
        rows.append((f"weight kernel {dtype}, GB/s by M", f"{fmt.rates_by_rows(curve)} ({c.weight_kernels.get(dtype)})"))
    if c.attention_hbm_bytes_per_s:
        latency = f" + {c.attention_latency_s / US:.1f} us per call" if c.attention_latency_s is not None else ""
        rows.append(("attention K/V streaming",
                     f"{fmt.rate(c.attention_hbm_bytes_per_s)}{latency} ({c.attention_backend})"))
    if c.kernel_launch_s:
        rows.append(("kernel launch", f"{c.kernel_launch_s / US:.2f} us"))
    if c.layer_overhead_s is not None:
        rows.append(("layer overhead", f"{c.layer_overhead_s / US:.1f} us (one synthetic layer at tiny shapes)"))
    for mode, o in c.step_overheads.items():
        rows.append((f"decode loop, staging {mode}", f"{o.layer_s / US:.1f} us per layer + {o.step_s / US:.1f} us per step"))
    h = profile.host
    if h is not None:
        if h.attention_bytes_per_s:
            rows.append(("host attention K/V streaming",
                         f"{fmt.rate(h.attention_bytes_per_s)} + {(h.attention_dispatch_s or 0) / US:.1f} us per layer "
                         f"({h.threads} threads, {h.cpu_name})"))
        if h.dram_bytes_per_s:
            rows.append(("host DRAM copy (read + written)", fmt.rate(h.dram_bytes_per_s)))
        if h.round_trip_s is not None:
            rows.append(("host path round trip (query + partials)", f"{h.round_trip_s / US:.1f} us per layer"))
    if profile.copy_engines:
        rows.append(("copy engines", str(profile.copy_engines)))
    return rows
