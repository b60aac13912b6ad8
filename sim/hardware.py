"""Effective hardware figures for one scenario: datasheet x default efficiency, or measured.

Every figure carries the source it came from, so a summary can say which numbers were measured
(profile) and which are datasheet defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import catalog
from .catalog import EfficiencyDefaults, GpuSpec, LinkSpec
from .dtypes import FP8_COMPUTE_WEIGHT_DTYPES
from .profile import CopyCurve, Profile


def interp_log2(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear interpolation of y against log2(x), clamped at both ends."""
    pts = sorted(points)
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    lx = math.log2(x)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            f = (lx - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + f * (y1 - y0)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class LinkModel:
    """One direction's copy time: measured curve if profiled, else latency + bytes / bandwidth."""

    per_copy_latency_s: float
    bytes_per_s: float
    bidirectional_bytes_per_s: float
    curve: CopyCurve | None = None
    source: str = ""

    def copy_time_s(self, size_bytes: float, both_directions_busy: bool = False) -> float:
        """One copy of `size_bytes`: copies * latency + bytes / bandwidth (DESIGN.md link model).
        While the other direction is busy the bandwidth term uses the bidirectional share."""
        if size_bytes <= 0:
            return 0.0
        if self.curve is not None and not both_directions_busy:
            return self.curve.copy_time_s(size_bytes)
        bw = self.bidirectional_bytes_per_s if both_directions_busy else self.bytes_per_s
        return self.per_copy_latency_s + size_bytes / bw

    def transfer_time_s(self, total_bytes: float, copies: int, both_directions_busy: bool = False) -> float:
        """`copies` equal copies moving `total_bytes` in all."""
        if total_bytes <= 0 or copies <= 0:
            return 0.0
        return copies * self.copy_time_s(total_bytes / copies, both_directions_busy)


@dataclass(frozen=True)
class Hardware:
    gpu: GpuSpec
    link_spec: LinkSpec
    memory_bytes: float
    host_memory_bytes: float
    weight_hbm_bytes_per_s: float
    attention_hbm_bytes_per_s: float
    peak_flop_per_s: float
    gemm_flop_efficiency_by_rows: list[tuple[float, float]]  # (rows, fraction of peak)
    gemm_flop_per_s_by_rows: list[tuple[float, float]] | None  # measured (rows, FLOP/s) if profiled
    attention_flop_per_s: float
    layer_overhead_s: float  # device-side fixed cost per layer (launch gaps): adds to its work
    step_overhead_s: float
    runtime_reserve_bytes: float
    copy_engines: int
    h2d: LinkModel
    d2h: LinkModel
    sources: dict[str, str] = field(default_factory=dict)
    host_layer_s: float = 0.0  # host time to enqueue a layer; a layer takes max(device work, this)
    host_step_s: float = 0.0  # the same for the rest of a step (embedding, LM head, sampling, bookkeeping)
    host_pack_bytes_per_s: float = float("inf")  # packing strided K/V on the host before a copy

    def gemm_flop_per_s(self, rows: int) -> float:
        """Achieved GEMM FLOP/s with `rows` tokens (= batch in decode)."""
        if self.gemm_flop_per_s_by_rows:
            return interp_log2(self.gemm_flop_per_s_by_rows, rows)
        return self.peak_flop_per_s * interp_log2(self.gemm_flop_efficiency_by_rows, rows)


def _link_model(spec: LinkSpec, direction: str, pinned: bool, profile: Profile | None) -> LinkModel:
    memory = "pinned" if pinned else "pageable"
    bw = getattr(spec, f"{memory}_{direction}_bytes_per_s")
    latency = spec.per_copy_latency_s if pinned else spec.pageable_per_copy_latency_s
    bidir = min(bw, spec.bidirectional_bytes_per_s)
    source = f"datasheet: {spec.name} ({memory})"
    curve = None
    if profile is not None and profile.link is not None:
        curve = profile.link.curve(direction, memory)
        if curve is not None:
            bw, latency = curve.fit_bytes_per_s, curve.fit_per_copy_latency_s
            measured_bidir = getattr(profile.link, f"bidirectional_{direction}_bytes_per_s")
            bidir = min(bw, measured_bidir) if measured_bidir else bw * spec.bidirectional_bytes_per_s / getattr(spec, f"pinned_{direction}_bytes_per_s")
            source = f"profile: {profile.device_name} ({memory} curve)"
    return LinkModel(latency, bw, bidir, curve, source)


def resolve_hardware(hw_cfg, weight_dtype: str, pinned: bool, profile: Profile | None = None,
                     staging: str = "none") -> Hardware:
    """Datasheet figures x default efficiencies, scenario overrides, then profile measurements.
    `staging`: how T1/T2 reach attention ("none", or the prefetch mode), which picks the measured
    fixed costs of the decode loop."""
    gpu = catalog.gpu(hw_cfg.gpu)
    link_spec = catalog.link(hw_cfg.link or gpu.link)
    eff: EfficiencyDefaults = catalog.efficiency_defaults()
    ov = hw_cfg.efficiency
    src: dict[str, str] = {}

    def pick(name: str, override, default, default_src: str):
        if override is not None:
            src[name] = "scenario override"
            return override
        src[name] = default_src
        return default

    fp8 = weight_dtype in FP8_COMPUTE_WEIGHT_DTYPES and gpu.fp8_flop_per_s
    peak = gpu.fp8_flop_per_s if fp8 else gpu.bf16_flop_per_s
    w_eff = pick("weight_hbm_efficiency", ov.weight_hbm_efficiency, eff.weight_hbm_efficiency[weight_dtype], "default efficiency")
    weight_bw = gpu.hbm_bytes_per_s * w_eff
    src["weight_hbm_bytes_per_s"] = f"datasheet {gpu.name} x {w_eff:g} ({src['weight_hbm_efficiency']})"
    a_eff = pick("attention_hbm_efficiency", ov.attention_hbm_efficiency, eff.attention_hbm_efficiency, "default efficiency")
    attn_bw = gpu.hbm_bytes_per_s * a_eff
    src["attention_hbm_bytes_per_s"] = f"datasheet {gpu.name} x {a_eff:g} ({src['attention_hbm_efficiency']})"
    gemm_curve = eff.gemm_flop_efficiency_by_rows
    if ov.gemm_flop_efficiency is not None:
        gemm_curve = [(1.0, ov.gemm_flop_efficiency)]
    src["gemm_flop_per_s"] = f"datasheet {gpu.name} {'fp8' if fp8 else 'bf16'} peak x " + (
        "scenario override" if ov.gemm_flop_efficiency is not None else "default efficiency by rows")
    attn_flop = gpu.bf16_flop_per_s * pick("attention_flop_efficiency", ov.attention_flop_efficiency, eff.attention_flop_efficiency, "default efficiency")
    layer_over = pick("layer_overhead_s", ov.layer_overhead_s, eff.layer_overhead_s, "default")
    host_layer = pick("host_layer_s", ov.host_layer_s, 0.0, "default: 0 (launches hidden, e.g. CUDA graphs)")
    host_step = pick("host_step_s", ov.host_step_s, 0.0, "default: 0 (launches hidden, e.g. CUDA graphs)")
    step_over = pick("step_overhead_s", ov.step_overhead_s, eff.step_overhead_s, "default")
    pack = pick("host_pack_bytes_per_s", ov.host_pack_bytes_per_s, eff.host_pack_bytes_per_s, "default (assumed)")
    reserve = pick("runtime_reserve_bytes", ov.runtime_reserve_bytes, eff.runtime_reserve_bytes, "default")
    memory = gpu.memory_bytes
    src["memory_bytes"] = f"datasheet {gpu.name}"
    host = hw_cfg.host_memory_bytes or gpu.host_memory_bytes or eff.default_host_memory_bytes
    src["host_memory_bytes"] = "scenario" if hw_cfg.host_memory_bytes else ("datasheet" if gpu.host_memory_bytes else "default")
    engines = hw_cfg.copy_engines or gpu.copy_engines
    measured_gemm = None

    if profile is not None:
        c = profile.compute
        label = f"profile: {profile.device_name} ({profile.device}, {profile.created_utc[:10]})"
        if profile.device_memory_bytes:
            memory, src["memory_bytes"] = profile.device_memory_bytes, label
        if profile.host_memory_bytes and not hw_cfg.host_memory_bytes:
            host, src["host_memory_bytes"] = profile.host_memory_bytes, label
        if profile.copy_engines and not hw_cfg.copy_engines:
            engines = profile.copy_engines
        measured_w = c.weight_hbm_bytes_per_s.get(weight_dtype)
        if measured_w is None and "bf16" in c.weight_hbm_bytes_per_s and ov.weight_hbm_efficiency is None:
            # scale the measured bf16 rate by the default dtype ratio (dequantising kernels are slower)
            ratio = eff.weight_hbm_efficiency[weight_dtype] / eff.weight_hbm_efficiency["bf16"]
            measured_w = c.weight_hbm_bytes_per_s["bf16"] * ratio
            src["weight_hbm_bytes_per_s"] = f"{label}, bf16 x default {weight_dtype}/bf16 ratio {ratio:.3g}"
        elif measured_w is not None:
            src["weight_hbm_bytes_per_s"] = label
        if measured_w is not None and ov.weight_hbm_efficiency is None:
            weight_bw = measured_w
        if c.attention_hbm_bytes_per_s and ov.attention_hbm_efficiency is None:
            attn_bw, src["attention_hbm_bytes_per_s"] = c.attention_hbm_bytes_per_s, label
        dtype_key = "fp8" if fp8 else "bf16"
        if c.peak_flop_per_s.get(dtype_key):
            peak = c.peak_flop_per_s[dtype_key]
            attn_flop = peak * (attn_flop / gpu.bf16_flop_per_s)
            src["gemm_flop_per_s"] = f"{label}, peak x default efficiency by rows"
        if c.gemm_flop_per_s_by_rows and not fp8 and ov.gemm_flop_efficiency is None:
            measured_gemm = [(float(m), f) for m, f in c.gemm_flop_per_s_by_rows]
            src["gemm_flop_per_s"] = f"{label}, measured by rows"
        if profile.link is not None and profile.link.host_pack_bytes_per_s and ov.host_pack_bytes_per_s is None:
            pack, src["host_pack_bytes_per_s"] = profile.link.host_pack_bytes_per_s, label
        loop = c.step_overheads.get(staging)
        how = f"{label}, tiny decode steps, staging {staging}"
        if loop is not None and profile.device == "cuda":
            # timed at tiny dimensions on an asynchronous device: the host's enqueue time, by max
            if ov.host_layer_s is None:
                host_layer, src["host_layer_s"] = loop.layer_s, how + " (host-bound)"
            if ov.host_step_s is None:
                host_step, src["host_step_s"] = loop.step_s, how + " (host-bound)"
        elif loop is not None:
            # a synchronous device: the host's time is the device's, and adds up
            if ov.layer_overhead_s is None:
                layer_over, src["layer_overhead_s"] = loop.layer_s, how
            if ov.step_overhead_s is None:
                step_over, src["step_overhead_s"] = loop.step_s, how
        elif c.layer_overhead_s is not None and profile.device == "cuda" and ov.host_layer_s is None:
            host_layer, src["host_layer_s"] = c.layer_overhead_s, f"{label}, tiny-layer time (host-bound)"
        elif c.layer_overhead_s is not None and ov.layer_overhead_s is None:
            layer_over, src["layer_overhead_s"] = c.layer_overhead_s, label

    h2d = _link_model(link_spec, "h2d", pinned, profile)
    d2h = _link_model(link_spec, "d2h", pinned, profile)
    src["h2d"], src["d2h"] = h2d.source, d2h.source
    return Hardware(
        gpu=gpu, link_spec=link_spec, memory_bytes=memory, host_memory_bytes=host,
        weight_hbm_bytes_per_s=weight_bw, attention_hbm_bytes_per_s=attn_bw, peak_flop_per_s=peak,
        gemm_flop_efficiency_by_rows=gemm_curve, gemm_flop_per_s_by_rows=measured_gemm,
        attention_flop_per_s=attn_flop, layer_overhead_s=layer_over, step_overhead_s=step_over,
        runtime_reserve_bytes=reserve, copy_engines=engines, h2d=h2d, d2h=d2h, sources=src, host_layer_s=host_layer,
        host_step_s=host_step, host_pack_bytes_per_s=pack,
    )
