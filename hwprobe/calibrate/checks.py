"""Warnings a calibration attaches to its profile instead of silently accepting its numbers.

Implausible figures (faster than the link's theoretical peak or the GPU's datasheet), high
variance, throttling, a downtrained PCIe link and drift between the start and the end of the run.
Every check is a pure function of measured figures, so each can be tested on synthetic profiles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sim.inputs import catalog
from sim.inputs.catalog import GpuSpec
from sim.inputs.errors import ConfigError
from sim.inputs.profile import Profile

from . import fmt
from .env import THROTTLING_BITS, throttle_reason_names

HIGH_SPREAD = 0.20  # a point whose samples spread more than this is flagged
DRIFT_TOLERANCE = 0.10  # a re-measured figure more than this far off is flagged
FULL_PCIE_WIDTH = 16  # the catalog's PCIe links are x16; narrower links scale their peak


@dataclass(frozen=True)
class LinkPeak:
    name: str
    bytes_per_s: float  # theoretical, per direction


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def match_gpu(device_name: str) -> GpuSpec | None:
    """The catalog GPU whose name or alias equals a run of consecutive words of `device_name`
    ("NVIDIA H200" -> h200-sxm, "NVIDIA GeForce RTX 4090" -> rtx-4090); the longest match wins,
    so "NVIDIA GH200 480GB" is a GH200, not an H200."""
    words = _tokens(device_name)
    runs = {"".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)}
    best: tuple[int, GpuSpec] | None = None
    for spec in catalog.gpus().values():
        for alias in (spec.name, *spec.aliases):
            key = "".join(_tokens(alias))
            if key in runs and (best is None or len(key) > best[0]):
                best = (len(key), spec)
    return best[1] if best else None


def link_peak(gpu: GpuSpec | None, pcie_gen_max: int | None, pcie_width_max: int | None) -> LinkPeak | None:
    """The host link's theoretical peak per direction. A non-PCIe catalog link (NVLink-C2C) wins;
    otherwise the PCIe generation NVML reports (scaled to its width), else the GPU's catalog link."""
    if gpu is not None and not gpu.link.startswith("pcie"):
        spec = catalog.link(gpu.link)
        return LinkPeak(spec.name, spec.theoretical_bytes_per_s)
    if pcie_gen_max:
        try:
            spec = catalog.link(f"pcie-gen{int(pcie_gen_max)}-x{FULL_PCIE_WIDTH}")
        except ConfigError:
            spec = None
        if spec is not None:
            width = int(pcie_width_max) if pcie_width_max else FULL_PCIE_WIDTH
            return LinkPeak(f"pcie-gen{int(pcie_gen_max)}-x{width}", spec.theoretical_bytes_per_s * width / FULL_PCIE_WIDTH)
    if gpu is not None:
        spec = catalog.link(gpu.link)
        return LinkPeak(spec.name, spec.theoretical_bytes_per_s)
    return None


def _over(label: str, measured: float, limit: float, limit_name: str, show: Any = fmt.rate) -> str:
    return f"implausible: {label} measured {show(measured)}, above the {limit_name} {show(limit)}"


def implausible(profile: Profile, gpu: GpuSpec | None, link: LinkPeak | None) -> list[str]:
    """Figures faster than physics allows: a timing or accounting error, not a fast machine."""
    out: list[str] = []
    if link is not None and profile.link is not None:
        peak_name = f"{link.name} theoretical"
        for c in profile.link.curves:
            kind = f"{c.direction} {c.memory}{' (both directions busy)' if c.concurrent else ''}"
            fastest = max(c.points, key=lambda p: p.bytes_per_s)
            if fastest.bytes_per_s > link.bytes_per_s:
                out.append(_over(f"{kind} copy of {fmt.size(fastest.size_bytes)}", fastest.bytes_per_s,
                                 link.bytes_per_s, peak_name))
            if c.fit_bytes_per_s > link.bytes_per_s:
                out.append(_over(f"{kind} fitted bandwidth", c.fit_bytes_per_s, link.bytes_per_s, peak_name))
        for direction in ("h2d", "d2h"):
            bidir = getattr(profile.link, f"bidirectional_{direction}_bytes_per_s")
            if bidir and bidir > link.bytes_per_s:
                out.append(_over(f"{direction} while both directions copy", bidir, link.bytes_per_s, peak_name))
    if gpu is None:
        return out
    c = profile.compute
    sheet = f"{gpu.name} datasheet"
    for p in c.gemm_points:  # fp8 GEMMs run on the fp8 tensor cores, everything else at most at the bf16 rate
        limit, limit_name = ((gpu.fp8_flop_per_s, "fp8") if p.dtype == "fp8" and gpu.fp8_flop_per_s
                             else (gpu.bf16_flop_per_s, "bf16"))
        if p.flop_per_s > limit:
            out.append(_over(f"GEMM {p.m}x{p.n}x{p.k} {p.dtype}", p.flop_per_s, limit, f"{sheet} {limit_name}",
                             fmt.flops))
    peak = c.peak_flop_per_s.get("bf16")
    if peak and peak > gpu.bf16_flop_per_s:
        out.append(_over("peak bf16 GEMM", peak, gpu.bf16_flop_per_s, f"{sheet} bf16", fmt.flops))
    hbm = gpu.hbm_bytes_per_s
    rates = [("device-to-device copy (read + written)", c.device_copy_bytes_per_s),
             ("weight streaming (bf16)", c.weight_hbm_bytes_per_s.get("bf16")),
             ("weight streaming (int4, simulator bytes)", c.weight_hbm_bytes_per_s.get("int4")),
             ("attention K/V streaming", c.attention_hbm_bytes_per_s)]
    rates += [(f"weight kernel {dtype} (simulator bytes)", max(rate for _, rate in curve))
              for dtype, curve in c.weight_kernel_bytes_per_s_by_rows.items() if curve]
    out += [_over(label, r, hbm, f"{sheet} memory bandwidth") for label, r in rates if r and r > hbm]
    return out


def high_variance(profile: Profile, threshold: float = HIGH_SPREAD) -> list[str]:
    """One line per group of points whose samples spread more than `threshold`."""
    groups: list[tuple[str, list[tuple[float, str]]]] = []
    if profile.link is not None:
        # A CPU profile stores one measurement under both memory names: report it once.
        memories: dict[tuple, list[str]] = {}
        for c in profile.link.curves:
            memories.setdefault((c.direction, c.concurrent, tuple(c.points)), []).append(c.memory)
        for (direction, concurrent, points), names in memories.items():
            kind = f"{direction} {'/'.join(names)} copies{' (both directions busy)' if concurrent else ''}"
            groups.append((kind, [(p.rel_spread, fmt.size(p.size_bytes)) for p in points]))
    groups.append(("GEMMs", [(p.rel_spread, f"{p.m}x{p.n}x{p.k}") for p in profile.compute.gemm_points]))
    groups.append(("attention", [(p.rel_spread, f"B={p.batch} n={p.context_tokens}")
                                 for p in profile.compute.attention_points]))
    out = []
    for kind, spreads in groups:
        noisy = [s for s in spreads if s[0] > threshold]
        if noisy:
            worst = max(noisy, key=lambda s: s[0])
            out.append(f"high variance: {kind}: {len(noisy)} of {len(spreads)} points spread more than "
                       f"{fmt.pct(threshold)} between samples (worst {fmt.pct(worst[0])} at {worst[1]})")
    return out


def throttling(bits_seen: int | None) -> list[str]:
    bad = (bits_seen or 0) & THROTTLING_BITS
    if not bad:
        return []
    return [f"throttling seen during the run: {', '.join(throttle_reason_names(bad))} "
            "(clocks were held down; compute figures may be low)"]


def downtrained(gpu_static: dict, under_load: dict | None) -> list[str]:
    """PCIe links drop generation and width when idle; under load they must be at their maximum."""
    if not under_load:
        return []
    gen, gen_max = under_load.get("pcie_gen_current"), gpu_static.get("pcie_gen_max")
    width, width_max = under_load.get("pcie_width_current"), gpu_static.get("pcie_width_max")
    slow = (gen and gen_max and gen < gen_max) or (width and width_max and width < width_max)
    if not slow:
        return []
    return [f"downtrained link: PCIe gen {gen} x{width} under load, but the GPU and slot support "
            f"gen {gen_max} x{width_max} (check the slot, riser and BIOS settings)"]


def drift(label: str, before_s: float, after_s: float, tolerance: float = DRIFT_TOLERANCE) -> str | None:
    """A warning when a re-measured time is more than `tolerance` away from the first one."""
    change = (after_s - before_s) / before_s
    if abs(change) <= tolerance:
        return None
    return (f"drift: {label} time changed by {change:+.0%} between the start and the end of the run "
            "(the machine was not steady; figures may not be repeatable)")
