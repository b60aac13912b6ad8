"""Effective hardware figures for one scenario: datasheet x default efficiency, or measured.

Every figure carries the source it came from, so a summary can say which numbers were measured
(profile) and which are datasheet defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Generic, TypeVar

from sim.inputs import catalog
from sim.inputs.catalog import EfficiencyDefaults, GpuSpec, LinkSpec
from sim.inputs.kernel_tables import FRAMEWORK, PACKAGE, system_for, tables_available
from sim.inputs.profile import ComputeProfile, CopyCurve, Profile
from sim.model.dtypes import ACTIVATION_BYTES, TENSOR_CORE_PATHS, WEIGHT_DTYPES
from sim.model.units import FLOP_PER_MAC, GB

from .collectives import (
    Protocols,
    gather_bytes,
    nearest_protocols,
    ring_bytes,
    two_protocol_allreduce_s,
    two_protocol_s,
)
from .elementwise import Elementwise, elementwise_for, engine_passes
from .engine_rules import CUSTOM_ALLREDUCE, LaunchRule, engine_allreduce_impl
from .measured_kernels import MeasuredKernels, measured_kernels_for, moe_peak_flop_per_s
from .moe_exchange import MoeExchange
from .moe_fit import MoeFit

T = TypeVar("T")
SCENARIO = "scenario override"  # the source of an overridden figure; sim/outputs/run_folder.py lists them by it
ACTIVATION_BITS = {"fp8": 8, "fp4": 4}  # a low-precision GEMM's quantised inputs, for its W?A? name


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
class Sourced(Generic[T]):
    """A figure and where it came from. `pinned`: set by the scenario, so no measurement replaces it
    (precedence: scenario override, then profile, then datasheet x default efficiency)."""

    value: T
    source: str
    pinned: bool = False

    def override(self, value: T | None, source: str = SCENARIO) -> Sourced[T]:
        """The scenario's value, where it gives one (None keeps this figure)."""
        return self if value is None else Sourced(value, source, pinned=True)

    def measure(self, value: T | None, source: str) -> Sourced[T]:
        """A profile's measurement, unless nothing was measured (None) or the scenario pinned this figure."""
        return self if value is None or self.pinned else Sourced(value, source)


@dataclass(frozen=True)
class GemmIO:
    """A GEMM call's traffic beside streaming its weights once (`physics.weight_gemm_s`), fitted on the
    measured tables where they cover the GPU; zero by default (weights alone, as before the fit had these terms)."""

    activation_bytes: float = 0.0  # bytes an input element streams with the weights (bf16 2, fp8 1, fp4 0.5625)
    output_element_s: float = 0.0  # per output element written (m x n)
    quant_row_s: float = 0.0  # W8A8's dynamic activation quantisation: per row ...
    quant_element_s: float = 0.0  # ... and per input element (m x k)
    # the fitted tiles (`physics.weight_stream_s`, `tile_fills`; fp8 W8A8, and TensorRT-LLM's weight-only
    # kernels without re-read): the share of the weights each further 128-row tile streams again, and the
    # output tiles at which the stream and compute run at half rate (small-M kernels, m <= 64, apart); 0: none
    weight_reread: float = 0.0
    half_tiles: float = 0.0
    half_tiles_decode: float = 0.0


@dataclass(frozen=True)
class LmHeadGemm:
    """The LM head's GEMM where it runs in another precision than the layers' (fp8 W8A8 and nvfp4 W4A4 runs
    keep it in bf16): its floor, weight streaming rate, and FLOP/s by rows (peak x efficiency curve)."""

    floor_s: float
    bytes_per_s: float
    peak_flop_per_s: float
    efficiency_by_rows: tuple[tuple[float, float], ...]

    def flop_per_s(self, rows: int) -> float:
        return self.peak_flop_per_s * interp_log2(list(self.efficiency_by_rows), rows)


@dataclass(frozen=True)
class PrefillKV:
    """One KV dtype's prefill attention (`physics.datasheet_prefill_attention_s`): a call's floor, its FLOP
    rate as a multiple of `Hardware.attention_flop_per_s` (the bf16-KV plateau) at long prompts, the prompt
    length and the query-tile count at which that rate halves (0: no such loss), and the cache write
    of each new token's K/V per KV head (RoPE, quantise, store)."""

    floor_s: float = 0.0
    flop_scale: float = 1.0
    half_tokens: float = 0.0
    half_tiles: float = 0.0
    kv_write_s: float = 0.0
    head_dim_64_scale: float = 1.0  # the rate at head dim 64 (gpt-oss) over head dim 128's, where a table times it
    skips_window: bool = True  # a window fit's: the kernel skips the tiles outside the window, or masks them


@dataclass(frozen=True)
class PrefillShapes:
    """Prefill attention's figures by KV dtype: bf16 (and fp16), and fp8 (int8 KV takes it); an MLA model's
    and a sliding window's on their own fits where one covers the GPU (`mla`, `window`: bf16 and fp8, and
    what each says of its fit)."""

    bf16: PrefillKV = PrefillKV()
    fp8: PrefillKV = PrefillKV()
    mla: tuple[PrefillKV, PrefillKV] | None = None
    mla_said: str = ""
    window: tuple[PrefillKV, PrefillKV] | None = None
    window_said: str = ""

    def of(self, fp8_kv: bool, mla: bool = False, window: bool = False) -> PrefillKV:
        own = self.mla if mla else self.window if window else None
        if own is not None:
            return own[1] if fp8_kv else own[0]
        return self.fp8 if fp8_kv else self.bf16


@dataclass(frozen=True)
class MlaFit:
    """The absorbed MLA decode kernel, fitted on the measured MLA tables (`physics.mla_datasheet_attention_s`)."""

    floor_s: float
    bytes_per_s: float  # bf16 latents streamed
    fp8_bytes_per_s: float
    flop_per_s: float
    half_blocks: float  # thread blocks (batch x ceil(heads / 64)) at half the stream rate


@dataclass(frozen=True)
class AttentionShape:
    """GQA decode attention beyond floor + KV bytes / rate (`physics.gqa_datasheet_attention_s`),
    fitted on the measured tables where they cover the GPU; the defaults are the flat form."""

    fp8_hbm_bytes_per_s: float = 0.0  # fp8 (and int8) KV's streaming rate, dequantising as it reads; 0: the bf16 rate
    half_ctas: float = 0.0  # thread blocks (batch x KV heads) at which the grid streams at half its rate; 0: always full
    per_cta_s: float = 0.0  # each block's serial cost: a long thin grid (large batch, short contexts) pays it
    fp8_floor_s: float | None = None  # fp8 KV's own floor and per-block cost; None: the bf16 ones
    fp8_per_cta_s: float | None = None
    per_cta_head_s: float = 0.0  # XQA's sequence split: each block's further cost per query head it serves
    split_ctas: float = 0.0  # ... the grid XQA splits sequences up to (8 x SMs); 0: no split (stream and blocks overlap)


@dataclass(frozen=True)
class DecodeKernel:
    """A decode kernel on its own datasheet figures - its floor, bf16 KV streaming rate and shape in
    `physics.gqa_datasheet_attention_s`'s form - where the decode fit's do not describe it: TensorRT-LLM's
    MMHA, one thread block per query head (fitted on the tables' multi-head rows, `mha_decode`), and a
    sliding window's kernel (fitted on the tables' window rows at the model's head dim, `window_decode`),
    which also pays a floor and a per-block cost once a sequence is longer than its window."""

    floor_s: float
    hbm_bytes_per_s: float
    shape: AttentionShape
    past_window_floor_s: float = 0.0
    past_window_per_cta_s: float = 0.0


def mha_decode(gpu: GpuSpec, ov, framework: str, fit_from: str | None = None) -> Sourced[DecodeKernel | None]:
    """MMHA's datasheet figures: `framework`'s fit on its tables' one-query-head-per-KV-head rows
    (`catalog.FittedKernels.mha_attention`, the overlapping form, no split); None (the decode fit's figures)
    where no fit covers the GPU or the scenario sets the decode-attention rate or floor."""
    fitted = catalog.fitted_kernels_for(gpu.name, framework, fit_from)
    fit = fitted.mha_attention if fitted else None
    if fit is None or _sets_attention(ov):
        return Sourced(None, "datasheet: the decode fit's figures; no MMHA fit applies")
    kernel = DecodeKernel(fit.floor_s, gpu.hbm_bytes_per_s * fit.hbm_efficiency, _fitted_shape(gpu, fit, 0.0))
    return Sourced(kernel, fit.says("MMHA decode attention"))


def window_decode(gpu: GpuSpec, ov, framework: str, head_dim: int,
                  fit_from: str | None = None) -> Sourced[DecodeKernel | None]:
    """A sliding window's decode kernel at `head_dim`: `framework`'s fit on its tables' window rows of that head
    dim (`catalog.FittedKernels.window_attention`; XQA's sequence split where the fit kept it, over 8 x the
    GPU's SMs); None (the decode fit's figures over the window's tokens) where no fit covers the GPU or that
    head dim, or the scenario sets the decode-attention rate or floor."""
    fitted = catalog.fitted_kernels_for(gpu.name, framework, fit_from)
    fit = (fitted.window_attention or {}).get(head_dim) if fitted else None
    if fit is None or _sets_attention(ov):
        return Sourced(None, f"datasheet: the decode fit's figures over the window's tokens; no window fit at head dim "
                             f"{head_dim} applies")
    split = _xqa_split(gpu, fit, "window decode")
    past = (f"; past the window {fit.past_window_floor_s * 1e6:.3g} us + {fit.past_window_per_cta_s * 1e9:.3g} ns a "
            f"block" + (", XQA's split over the whole sequence" if split else ""))
    return Sourced(DecodeKernel(fit.floor_s, gpu.hbm_bytes_per_s * fit.hbm_efficiency, _fitted_shape(gpu, fit, split),
                                fit.past_window_floor_s, fit.past_window_per_cta_s),
                   fit.says(f"sliding-window decode attention at head dim {head_dim}") + past)


def _xqa_split(gpu: GpuSpec, fit, what: str) -> float:
    """The grid XQA splits sequences up to (8 waves of the GPU's SMs) where a decode fit kept its sequence split
    (`catalog.FittedAttention.sequence_split`), else 0."""
    if fit.sequence_split and not gpu.sm_count:
        raise ValueError(f"{gpu.name}: its {what} fit has XQA's sequence split, which needs gpus.yaml sm_count")
    return 8.0 * gpu.sm_count if fit.sequence_split else 0.0


def _fitted_shape(gpu: GpuSpec, fit, split: float) -> AttentionShape:
    """A fitted decode kernel's shape (`catalog.FittedAttention`): fp8 KV's rate, floor and per-block cost, small
    grids, the bf16 per-block cost, and XQA's split over up to `split` blocks (0: none)."""
    return AttentionShape(gpu.hbm_bytes_per_s * fit.fp8_hbm_efficiency, fit.half_ctas, fit.per_cta_s, fit.fp8_floor_s,
                          fit.fp8_per_cta_s, fit.per_cta_head_s if split else 0.0, split)


@dataclass(frozen=True)
class LinkModel:
    """One direction's copy time: measured curve if profiled, else latency + bytes / bandwidth."""

    per_copy_latency_s: float
    bytes_per_s: float
    bidirectional_bytes_per_s: float
    curve: CopyCurve | None = None
    source: str = ""
    # a shared PCIe switch uplink's share (`behind_switch`): the rate no copy beats; inf: no switch binds
    cap_bytes_per_s: float = math.inf

    def copy_time_s(self, size_bytes: float, both_directions_busy: bool = False) -> float:
        """One copy of `size_bytes`: copies * latency + bytes / bandwidth (DESIGN.md link model).
        While the other direction is busy the bandwidth term uses the bidirectional share. Behind a
        shared switch: max(that, latency + bytes / cap), the cap scaled by the same bidirectional
        share while both directions are busy."""
        if size_bytes <= 0:
            return 0.0
        if self.curve is not None and not both_directions_busy:
            t = self.curve.copy_time_s(size_bytes)
        else:
            bw = self.bidirectional_bytes_per_s if both_directions_busy else self.bytes_per_s
            t = self.per_copy_latency_s + size_bytes / bw
        if self.cap_bytes_per_s < math.inf:
            share = self.bidirectional_bytes_per_s / self.bytes_per_s if both_directions_busy else 1.0
            t = max(t, self.per_copy_latency_s + size_bytes / (self.cap_bytes_per_s * share))
        return t

    def transfer_time_s(self, total_bytes: float, copies: int, both_directions_busy: bool = False) -> float:
        """`copies` equal copies moving `total_bytes` in all."""
        if total_bytes <= 0 or copies <= 0:
            return 0.0
        return copies * self.copy_time_s(total_bytes / copies, both_directions_busy)


def gpus_sharing_uplink(tp: int, gpus_per_switch: int) -> int:
    """GPUs of one tensor-parallel group that stream through one switch at once: the group moves
    its KV shards in lockstep (every GPU runs the same step), packed onto as few switches as it
    fills: min(tp, gpus_per_switch). Data-parallel replicas are not in lockstep: not counted."""
    return max(1, min(tp, gpus_per_switch))


def switch_share_bytes_per_s(link_bytes_per_s: float, uplink_bytes_per_s: float, gpus_sharing: int) -> float:
    """Per-GPU host-link bandwidth (one direction) while `gpus_sharing` GPUs behind one PCIe switch
    copy at once: each gets its own link's rate or an equal share of the uplink, whichever is less:
    min(link, uplink / gpus_sharing)."""
    return min(link_bytes_per_s, uplink_bytes_per_s / gpus_sharing)


def behind_switch(link: LinkModel, uplink_bytes_per_s: float, gpus_sharing: int) -> LinkModel:
    """`link` with its copies capped at `switch_share_bytes_per_s`; the link itself where the share
    does not bind (so one GPU per switch with an uplink as fast as its link changes nothing)."""
    share = switch_share_bytes_per_s(link.bytes_per_s, uplink_bytes_per_s, gpus_sharing)
    if share >= link.bytes_per_s:
        return link
    return replace(link, cap_bytes_per_s=share)


@dataclass(frozen=True)
class HostCpu:
    """The host socket that attends T1/T2 where they live (policy.access host_attention / split)."""

    name: str
    dram_bytes_per_s: float  # K/V bytes per second the attention kernel streams, with the DRAM to itself
    flop_per_s: float  # achieved FP32 FLOP/s of the attention kernel on its vector units
    dispatch_s: float  # waking the thread pool and joining it, once per layer
    # the socket's DRAM bandwidth (bytes read + written per second), shared by the attention stream and
    # the link's DMA in flight (`host_pipeline.dram_speeds`); None: the attention's own rate
    memory_bytes_per_s: float | None = None

    def stream_s(self, kv_bytes: float, flop: float) -> float:
        """max(KV bytes / DRAM bandwidth, FLOP / FLOP/s): the roofline of a batched GEMV over the
        host-resident K/V, with the DRAM to itself."""
        return max(kv_bytes / self.dram_bytes_per_s, flop / self.flop_per_s)

    def attention_s(self, kv_bytes: float, flop: float) -> float:
        """`stream_s` + dispatch: the roofline plus the thread pool's fixed cost (0 with nothing to attend)."""
        if kv_bytes <= 0:
            return 0.0
        return self.stream_s(kv_bytes, flop) + self.dispatch_s

    @property
    def shared_bytes_per_s(self) -> float:
        """The DRAM bandwidth the attention stream and DMA share: the socket's, never below what the
        stream alone reaches (so a stream with the DRAM to itself keeps its own rate)."""
        return max(self.memory_bytes_per_s or 0.0, self.dram_bytes_per_s)


def resolve_host(name: str, profile: Profile | None = None) -> tuple[HostCpu, dict[str, str]]:
    """A catalog host CPU with the default attention-kernel figures, and their sources; a profile's
    host section (`hwprobe calibrate`) replaces what it measured: the host attention kernel's achieved
    K/V streaming rate as the stream's DRAM rate, the fit's intercept as the dispatch cost, and the
    large host copy's rate as the socket's shared DRAM bandwidth. The FLOP/s stays the catalog's
    (not measured)."""
    spec, d = catalog.host(name), catalog.host_defaults()
    cpu = HostCpu(spec.name, spec.achieved_memory_bytes_per_s, spec.fp32_flop_per_s * d.host_attention_flop_efficiency,
                  d.host_attention_dispatch_s, spec.achieved_memory_bytes_per_s)
    achieved = (f"catalog {spec.name}: {spec.theoretical_memory_bytes_per_s / 1e9:g} GB/s theoretical "
                f"x {spec.achieved_memory_fraction:g} (assumed)")
    sources = {
        "host_dram_bytes_per_s": achieved,
        "host_flop_per_s": f"catalog {spec.name}: FP32 peak x {d.host_attention_flop_efficiency:g} (assumed)",
        "host_memory_bytes_per_s": f"{achieved}; shared by host attention and the link's DMA",
    }
    host = profile.host if profile is not None else None
    if host is None:
        return cpu, sources
    label = (f"profile: {host.cpu_name} ({host.threads} threads, {profile.created_utc[:10]}), host attention "
             f"fit over {len(host.attention_points)} points")
    if host.attention_bytes_per_s is not None:
        cpu = replace(cpu, name=host.cpu_name, dram_bytes_per_s=host.attention_bytes_per_s)
        sources["host_dram_bytes_per_s"] = f"{label}: K/V bytes / time"
    if host.attention_dispatch_s is not None:
        cpu = replace(cpu, name=host.cpu_name, dispatch_s=host.attention_dispatch_s)
        sources["host_dispatch_s"] = f"{label}: intercept"
    if host.dram_bytes_per_s is not None:
        cpu = replace(cpu, name=host.cpu_name, memory_bytes_per_s=host.dram_bytes_per_s)
        sources["host_memory_bytes_per_s"] = (f"profile: {host.cpu_name} ({profile.created_utc[:10]}), large host copy "
                                              "(bytes read + written); shared by host attention and the link's DMA")
    return cpu, sources


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
    # an engine's rule for which steps replay a CUDA graph (scenario engine:; engine_rules.host_launch_s gives a
    # step's host time by batch); None: host_layer_s / host_step_s for every step
    launch: LaunchRule | None = field(default=None, compare=False)
    host_pack_bytes_per_s: float = float("inf")  # packing strided K/V on the host before a copy
    weight_kernel: str = "bf16 GEMM"  # how the layer's weights are multiplied (dtype path), for people
    dequant_ops_per_weight: float = 0.0  # CUDA-core lane operations per weight (weight-only kernels)
    dequant_op_per_s: float = float("inf")  # CUDA-core lane operations per second (FP32 rate / 2)
    attention_latency_s: float = 0.0  # floor of one decode-attention call (its time = this + bytes / rate)
    attention_shape: AttentionShape = AttentionShape()  # GQA decode attention's fitted shape (flat by default)
    mla_fit: MlaFit | None = None  # absorbed MLA decode, fitted; None: the generic `attention_s`
    moe_fits: tuple[tuple[str, MoeFit], ...] = ()  # fused routed experts by table weight format, fitted
    moe_power_law_fits: tuple[tuple[str, MoeFit], ...] = ()  # the same fitted on the tables' power-law routings
    prefill_attention_shape: PrefillShapes = PrefillShapes()  # datasheet prefill attention by KV dtype (flat: no floor)
    gemm_floor_s: float = 0.0  # floor of one GEMM call, added to its roofline time
    gemm_io: GemmIO = GemmIO()  # a GEMM call's activation traffic (fitted; none by default)
    lm_head_gemm: LmHeadGemm | None = None  # the LM head in bf16 where the layers run W8A8 / W4A4; None: the layers'
    held_activation_bytes: float = 0.0  # activations an engine holds whatever the step (scenario engine:)
    # measured (rows, weight bytes / kernel time) of this weight dtype's kernel: replaces the model
    weight_kernel_bytes_per_s_by_rows: list[tuple[float, float]] | None = None
    host_cpu: HostCpu | None = None  # attends T1/T2 on the host (policy.access host_attention / split)
    tp: int = 1  # GPUs in the tensor-parallel group
    interconnect_bytes_per_s: float = float("inf")  # NCCL all-reduce busbw between them (catalog fabric)
    interconnect_hop_s: float = 0.0
    # the all-reduce fitted on measured tables, per group size (collectives.Protocols); () : the fabric's ring
    allreduce_protocols: tuple[Protocols, ...] = ()
    # which all-reduce the engine runs over the TP group (`engine_rules.engine_allreduce_impl`): custom or nccl
    allreduce_impl: str = CUSTOM_ALLREDUCE
    # NCCL's all_gather and reduce_scatter fitted on measured tables: (op, protocols per group size); () : the ring
    gather_protocols: tuple[tuple[str, tuple[Protocols, ...]], ...] = ()
    moe_exchange: MoeExchange = MoeExchange()  # how an attention-DP group's tokens reach their experts
    # DeepEP fitted on measured tables: ((kernel, phase, floor s, bytes/s), ...); () : the catalog fabric's figures
    alltoall_fits: tuple[tuple[str, str, float, float], ...] = ()
    # absorbed MLA's BMMs fitted on the engine's tables: ((dtype, floor s, FLOP eff, HBM eff), ...); () : none (a GEMM)
    mla_bmm_fits: tuple[tuple[str, float, float, float], ...] = ()
    fitted_framework: str = FRAMEWORK  # whose tables the datasheet constants were fitted on (the engine's)
    fit_from: str | None = None  # whose fit instead of the GPU's own or its sibling's (`catalog.fitted_kernels_for`)
    alltoall_bytes_per_s: float = float("inf")  # expert-parallel dispatch/combine, bytes one GPU sends per second
    alltoall_floor_s: float = 0.0  # per dispatch or combine call
    kernels: MeasuredKernels | None = field(default=None, compare=False)  # hardware.kernels: measured
    # a layer's elementwise passes by bytes (`device.elementwise`); None: layer_overhead_s flat per layer
    elementwise: Elementwise | None = None
    # chunked layers decode one thread block per query head (TensorRT-LLM's MMHA below compute capability 10.x:
    # `engine_rules.trtllm_chunked_decode_on_mmha`); False: the GQA kernel, one read of each KV head's cache
    chunked_decode_per_query_head: bool = False
    mha_decode: DecodeKernel | None = None  # ... their datasheet kernel, fitted on the MHA rows (None: the decode's)
    # window layers' datasheet decode kernel, fitted on the tables' window rows at the model's head dim
    # (`window_decode`); None: the decode fit's figures over the window's tokens
    window_decode: DecodeKernel | None = None

    def allreduce_s(self, nbytes: float, gpus: int | None = None) -> float:
        """All-reduce of `nbytes` over the TP group (or `gpus` of it). With measured kernels the table of
        the all-reduce the engine runs over this group (`allreduce_impl`); where a fit of that table covers
        the GPU, its two protocols at the nearest measured group size (`collectives`); else the catalog
        fabric's ring, 2(N-1)/N x bytes / busbw + 2(N-1) x per-hop latency. 0 on one GPU. The
        implementation is the TP group's (an attention-data-parallel subgroup takes the same one)."""
        n = self.tp if gpus is None else gpus
        if n <= 1 or nbytes <= 0:
            return 0.0
        if self.kernels is not None:
            return _measured_allreduce_s(self.kernels, float(nbytes), n, self.allreduce_impl)
        if self.allreduce_protocols:
            return two_protocol_allreduce_s(nbytes, n, *nearest_protocols(self.allreduce_protocols, n)[1:])
        return ring_bytes(nbytes, n) / self.interconnect_bytes_per_s + 2 * (n - 1) * self.interconnect_hop_s

    def gather_s(self, op: str, nbytes: float, gpus: int | None = None) -> float:
        """One NCCL all_gather or reduce_scatter (`op`) of a whole buffer of `nbytes` over the TP group (or
        `gpus` of it): the measured table; else its fit at the nearest measured group size; else the
        fabric's ring, (N - 1) / N x bytes / busbw + (N - 1) x per-hop latency. 0 on one GPU."""
        n = self.tp if gpus is None else gpus
        if n <= 1 or nbytes <= 0:
            return 0.0
        if self.kernels is not None and self.kernels.has_gather():
            return float(self.kernels.gather_s(op, float(nbytes), n).seconds[0])
        fitted = next((p for o, p in self.gather_protocols if o == op), None)
        if fitted:
            return two_protocol_s(gather_bytes(nbytes, n), *nearest_protocols(fitted, n)[1:])
        return gather_bytes(nbytes, n) / self.interconnect_bytes_per_s + (n - 1) * self.interconnect_hop_s

    def alltoall_s(self, nbytes_out: float, kernel: str = "", phase: str = "") -> float:
        """One expert-parallel dispatch or combine over the TP group, each GPU sending `nbytes_out` to
        the others (and receiving as much): floor + bytes / rate - DeepEP's `kernel` (ht, ll) and `phase`
        as fitted on the measured tables where a fit covers the GPU, else the catalog fabric's all-to-all
        figures (interconnects.yaml); 0 on one GPU."""
        if self.tp <= 1 or nbytes_out <= 0:
            return 0.0
        fit = next(((f, r) for k, p, f, r in self.alltoall_fits if (k, p) == (kernel, phase)), None)
        floor, rate = fit or (self.alltoall_floor_s, self.alltoall_bytes_per_s)
        return floor + nbytes_out / rate

    def measured_weight_kernel_s(self, weight_bytes: float, rows: int) -> float | None:
        """Weight bytes / the measured kernel rate at `rows`, or None where not profiled."""
        if not self.weight_kernel_bytes_per_s_by_rows:
            return None
        return weight_bytes / interp_log2(self.weight_kernel_bytes_per_s_by_rows, rows)

    def gemm_flop_per_s(self, rows: int) -> float:
        """Achieved GEMM FLOP/s with `rows` tokens (= batch in decode)."""
        if self.gemm_flop_per_s_by_rows:
            return interp_log2(self.gemm_flop_per_s_by_rows, rows)
        return self.peak_flop_per_s * interp_log2(self.gemm_flop_efficiency_by_rows, rows)




def resolve_hardware(hw_cfg, weight_dtype: str, pinned: bool, profile: Profile | None = None,
                     staging: str = "none", with_host: bool = False, tp: int = 1,
                     framework: str = FRAMEWORK, engine: str = "vllm", fit_from: str | None = None) -> Hardware:
    """Datasheet figures x default efficiencies, scenario overrides, then profile measurements.
    `staging`: how T1/T2 reach attention ("none", or the prefetch mode), which picks the measured
    fixed costs of the decode loop. `with_host`: also the host CPU that attends T1/T2 (an access
    strategy other than prefetch). `framework`: whose measured tables apply (the scenario engine's,
    `EngineCfg.kernel_framework`; vLLM's without one). `engine`: whose rule picks the TP all-reduce
    (`engine_rules.engine_allreduce_impl`; the scenario engine's name, vLLM's without one). `fit_from`:
    the GPU whose fitted constants to take (`catalog.fitted_kernels_for`; a study of how fits carry over)."""
    gpu = catalog.gpu(hw_cfg.gpu)
    link_spec = catalog.link(hw_cfg.link or gpu.link)
    eff = catalog.efficiency_defaults()
    figs = _datasheet_figures(gpu, hw_cfg, weight_dtype, eff, framework, fit_from)
    if profile is not None:
        figs = _measured_figures(figs, profile, gpu, hw_cfg, weight_dtype, eff, staging)
    h2d = _link_model(link_spec, "h2d", pinned, profile)
    d2h = _link_model(link_spec, "d2h", pinned, profile)
    hw = replace(_assemble(gpu, link_spec, figs, h2d, d2h), fitted_framework=framework, fit_from=fit_from)
    fit = catalog.fitted_kernels_for(gpu.name, framework, fit_from)
    if figs.precision != "bf16" and profile is None and not _sets_gemm(hw_cfg.efficiency):
        hw = _bf16_lm_head(hw, fit, eff)
    if fit is not None and fit.mla_bmm and profile is None and not _sets_gemm(hw_cfg.efficiency):
        hw = replace(hw, mla_bmm_fits=tuple((d, f.floor_s, f.flop_efficiency, f.hbm_efficiency)
                                            for d, f in sorted(fit.mla_bmm.items())))
    if tp > 1:
        hw = _with_interconnect(hw, gpu, tp, engine)
    if figs.layer_overhead_s.source == "default" and engine_passes(engine):  # no figure given; passes known
        hw = with_elementwise(hw, engine)
    if getattr(hw_cfg, "pcie_switch", None) is not None:
        hw = _shared_switch(hw, hw_cfg.pcie_switch, link_spec, tp)
    kernels = getattr(hw_cfg, "kernels", "datasheet")
    covered = system_for(gpu.name) is not None and tables_available()
    if kernels == "measured" or (kernels == "auto" and covered and profile is None):  # a profile: your own GPU, measured
        hw = with_measured_kernels(hw, framework)
    if not with_host:
        return hw
    cpu, host_sources = resolve_host(hw_cfg.host or gpu.host, profile)
    return replace(hw, host_cpu=cpu, sources={**hw.sources, **host_sources})


def with_elementwise(hw: Hardware, engine: str | None) -> Hardware:
    """`hw` costing a layer's elementwise passes by bytes as `engine` runs them (`device.elementwise`)
    instead of the flat default layer_overhead_s (0 then: the passes are what it stood for)."""
    ew = elementwise_for(hw.gpu.name, engine)
    return replace(hw, elementwise=ew, layer_overhead_s=0.0, sources={**hw.sources, "layer_overhead_s": ew.source})


def _with_interconnect(hw: Hardware, gpu: GpuSpec, tp: int, engine: str = "vllm") -> Hardware:
    """The TP group's all-reduce: the one `engine` runs on this fabric (`engine_allreduce_impl`: its
    custom kernel, or NCCL over PCIe beyond its limit), as `with_allreduce` costs it."""
    fabric = catalog.interconnect(gpu.interconnect)
    impl = engine_allreduce_impl(engine, tp, fabric.nvlink)
    # (its source is named where a run uses it: sim/decode/context.py, attention data parallelism)
    hw = replace(hw, tp=tp, alltoall_bytes_per_s=fabric.alltoall_bytes_per_s, alltoall_floor_s=fabric.alltoall_floor_s)
    return with_allreduce(hw, impl)


def with_allreduce(hw: Hardware, impl: str) -> Hardware:
    """`hw` running the all-reduce `impl` (custom or nccl): fitted on the measured tables of that
    implementation where they cover the GPU (the custom fit where that one has none), per group size;
    else the catalog fabric's NCCL ring figures."""
    gpu = hw.gpu
    fabric = catalog.interconnect(gpu.interconnect)
    fit = catalog.fitted_kernels_for(gpu.name, hw.fitted_framework, hw.fit_from)
    ar = (fit.allreduce.get(impl) or fit.allreduce.get(CUSTOM_ALLREDUCE)) if fit else None
    gather = fit.gather if fit and fit.gather else {}
    alltoall = fit.alltoall if fit and fit.alltoall else {}
    a2a = tuple((k, p, f.floor_s, f.bytes_per_s) for k, phases in sorted(alltoall.items()) for p, f in sorted(phases.items()))
    # the fabric's ring figures cost what no fit covers (an all-gather or reduce-scatter without one)
    hw = replace(hw, allreduce_impl=impl, interconnect_bytes_per_s=fabric.bus_bytes_per_s,
                 interconnect_hop_s=fabric.per_hop_latency_s, alltoall_fits=a2a, gather_protocols=tuple(
                     (op, tuple((n, *p.as_tuple()) for n, p in sorted(g.by_gpus.items()))) for op, g in sorted(gather.items())))
    if ar is None:
        return replace(hw, allreduce_protocols=(), sources={**hw.sources, "interconnect": f"catalog {fabric.name}: {fabric.source}"})
    fitted_on = ("custom all-reduces (vLLM)" if impl == CUSTOM_ALLREDUCE else
                 "NCCL all-reduces (over PCIe the engine runs NCCL's: engine_rules.engine_allreduce_impl)")
    protocols = tuple((n, *p.as_tuple()) for n, p in sorted(ar.by_gpus.items()))
    said = (f"{ar.says(fitted_on)}; the faster of a latency and a bandwidth protocol per group size "
            f"({', '.join(str(n) for n, *_ in protocols)} GPUs measured; another size takes the nearest)")
    return replace(hw, allreduce_protocols=protocols, sources={**hw.sources, "interconnect": said})


WARM_TABLE_NAMES = {"gemm": "GEMM", "generation_attention": "decode-attention"}


def with_measured_kernels(hw: Hardware, framework: str = FRAMEWORK) -> Hardware:
    """`hw` with AIConfigurator's measured tables (as `framework` runs them) for its GPU's GEMMs, decode
    attention and all-reduce (`physics` asks them where they apply; everything else stays datasheet)."""
    kernels = measured_kernels_for(hw.gpu.name, framework)
    return replace(hw, kernels=kernels, sources={**hw.sources, "kernels": measured_kernels_line(hw, kernels)})


def measured_kernels_line(hw: Hardware, kernels, mla_prefill: bool = False) -> str:
    """What `sources.kernels` says of a run on measured tables: which operators they cost and which stay
    datasheet (`mla_prefill`: the run's MLA prefill takes TensorRT-LLM's context-MLA table)."""
    tables = kernels.tables
    borrowed = "".join(f" ({table} {said})" for table, said in tables.table_sources.items())
    measured = [d for d in ("bf16", "fp8", "nvfp4", "int8", "int4") if d in kernels.gemm_dtypes()]
    weight_only = "" if {"int8", "int4"} <= set(measured) else "weight-only GEMMs, "
    context = tables.context_attention is not None and len(tables.context_attention) > 0
    allreduce = "custom" if hw.allreduce_impl == CUSTOM_ALLREDUCE else f"NCCL {tables.nccl_version}"
    what = (f"measured: {PACKAGE} {tables.package_version} {tables.system} ({tables.device}) "
            f"{tables.framework} {tables.framework_version}{borrowed}: dense GEMMs ({', '.join(measured)}), GQA decode "
            f"{'and prefill ' if context else ''}attention, {allreduce} all-reduce, and MoE experts and MLA decode"
            f"{' and prefill' if mla_prefill else ''} where their tables hold the format; datasheet: "
            f"{'' if context else 'prefill attention, '}{'' if mla_prefill else 'MLA prefill, '}linear-attention "
            f"layers, {weight_only}per-layer overheads")
    if tables.cache_served:  # points the collector timed from a warm L2 (kernel_tables.cache_served)
        what += "; dropped as served from a warm L2: " + " and ".join(
            f"{n:,} {WARM_TABLE_NAMES.get(t, t)} points" for t, n in tables.cache_served.items())
    return what


@lru_cache(maxsize=4096)
def _measured_allreduce_s(kernels: MeasuredKernels, nbytes: float, gpus: int, impl: str = CUSTOM_ALLREDUCE) -> float:
    return float(kernels.allreduce_s(nbytes, gpus, impl).seconds[0])


def _shared_switch(hw: Hardware, cfg, link_spec: LinkSpec, tp: int) -> Hardware:
    """Both link directions behind a PCIe switch shared by the TP group (`behind_switch`); the
    catalog default (interconnects.yaml `pcie_switch`) fills what the scenario leaves out: the uplink
    is one link of the GPU's own kind, at its pinned rate per direction (the measured rate where a
    profile's is faster), so it never binds for one GPU alone."""
    default = catalog._read_catalog("interconnects.yaml")["pcie_switch"]
    per_switch = cfg.gpus_per_switch or default["gpus_per_switch"]
    n = gpus_sharing_uplink(tp, per_switch)
    up_h2d = cfg.uplink_bytes_per_s or max(link_spec.pinned_h2d_bytes_per_s, hw.h2d.bytes_per_s)
    up_d2h = cfg.uplink_bytes_per_s or max(link_spec.pinned_d2h_bytes_per_s, hw.d2h.bytes_per_s)
    h2d, d2h = behind_switch(hw.h2d, up_h2d, n), behind_switch(hw.d2h, up_d2h, n)
    share_h2d = switch_share_bytes_per_s(hw.h2d.bytes_per_s, up_h2d, n)
    share_d2h = switch_share_bytes_per_s(hw.d2h.bytes_per_s, up_d2h, n)
    text = (f"{per_switch} GPUs per switch ({'scenario' if cfg.gpus_per_switch else 'catalog default, assumed'}), "
            f"{n} of the TP group's {tp} through one uplink of {up_h2d / GB:g} H2D / {up_d2h / GB:g} D2H GB/s "
            f"({'scenario' if cfg.uplink_bytes_per_s else f'one {link_spec.name} link, assumed'}): per GPU "
            f"min(link, uplink / {n}) = {share_h2d / GB:g} / {share_d2h / GB:g} GB/s, "
            + ("binds" if (h2d is not hw.h2d or d2h is not hw.d2h) else "does not bind"))
    return replace(hw, h2d=h2d, d2h=d2h, sources={**hw.sources, "pcie_switch": text})


@dataclass(frozen=True)
class _Gemm:
    """GEMM speed: peak x fraction of peak by rows, or the measured FLOP/s by rows where profiled."""

    peak_flop_per_s: float
    efficiency_by_rows: list[tuple[float, float]]
    measured_by_rows: list[tuple[float, float]] | None = None


@dataclass(frozen=True)
class _Figures:
    """One scenario's figures while they are resolved. The Sourced fields, in this order, are the
    keys of `Hardware.sources` (summary.json keeps that order)."""

    weight_hbm_efficiency: Sourced[float]
    weight_hbm_bytes_per_s: Sourced[float]
    attention_hbm_efficiency: Sourced[float]
    attention_hbm_bytes_per_s: Sourced[float]
    gemm_flop_per_s: Sourced[_Gemm]
    gemm_floor_s: Sourced[float]
    gemm_io: Sourced[GemmIO]
    attention_flop_efficiency: Sourced[float]
    attention_latency_s: Sourced[float]
    attention_shape: Sourced[AttentionShape]
    mla_fit: Sourced[MlaFit | None]
    moe_fits: Sourced[tuple]
    moe_power_law_fits: Sourced[tuple]
    prefill_attention_shape: Sourced[PrefillShapes]
    dequant_ops_per_weight: Sourced[float]
    weight_kernel: Sourced[str]
    weight_kernel_by_rows: Sourced[list | None]
    layer_overhead_s: Sourced[float]
    host_layer_s: Sourced[float]
    host_step_s: Sourced[float]
    step_overhead_s: Sourced[float]
    host_pack_bytes_per_s: Sourced[float]
    runtime_reserve_bytes: Sourced[float]
    memory_bytes: Sourced[float]
    host_memory_bytes: Sourced[float]
    attention_flop_per_s: float  # sourced by attention_flop_efficiency
    copy_engines: int
    precision: str  # the GEMMs' tensor-core precision: fp8 (W8A8) or fp4 (W4A4) where the GPU has that peak, else bf16

    def sources(self) -> dict[str, str]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: v.source for name, v in values.items() if isinstance(v, Sourced)}


def _prefill_figures(fit, eff: EfficiencyDefaults, ov) -> tuple[Sourced, Sourced]:
    """(attention FLOP efficiency - the bf16-KV prefill plateau, `Hardware.attention_flop_per_s` - and the
    prefill-attention shape by KV dtype): fitted on the measured context-attention tables where they
    cover the GPU, the catalog default (one floor, flat) elsewhere; the efficiency overridable (an
    override is flat too: the fitted floor, nothing by length, tiles or written token)."""
    pf = fit.prefill_attention if fit else None
    bf = pf.get("bf16") if pf else None
    f_eff = (Sourced(bf.flop_efficiency, bf.says("prefill attention")) if bf else
             Sourced(eff.attention_flop_efficiency, "default efficiency")).override(ov.attention_flop_efficiency)
    if not bf:
        flat = PrefillKV(floor_s=eff.prefill_attention_floor_s)
        return f_eff, Sourced(PrefillShapes(flat, flat), "default (derived): one floor, one efficiency at every length")
    if ov.attention_flop_efficiency is not None:
        flat = PrefillKV(floor_s=bf.floor_s)
        return f_eff, Sourced(PrefillShapes(flat, flat), f"flat: {SCENARIO} sets the attention FLOP efficiency; the "
                                                         f"floor {bf.says('prefill attention')}", pinned=True)

    def kv(p) -> PrefillKV:
        return PrefillKV(p.floor_s, p.flop_efficiency / bf.flop_efficiency, p.half_tokens, p.half_tiles, p.kv_write_s,
                         p.head_dim_64_flop_scale, p.skips_window)

    f8 = pf.get("fp8", bf)
    said = (f"{bf.says('prefill attention')} (bf16 KV); fp8 KV "
            + (f"held-out median {f8.held_out.median:.1%}" if f8 is not bf else "takes bf16's (no fp8 KV timed)"))
    mla, win = fit.mla_prefill or {}, fit.window_prefill or {}
    m16, m8 = mla.get("bf16"), mla.get("fp8", mla.get("bf16"))
    mla_said = (f"MLA prefill on its own fit, {m16.says('MLA prefill (TensorRT-LLM context-MLA)')} (bf16 KV); fp8 KV "
                f"held-out median {m8.held_out.median:.1%}") if m16 else ""
    w16, w8 = win.get("bf16"), win.get("fp8", win.get("bf16"))
    window_said = (f"window layers on their own fit, {w16.says('sliding-window prefill attention')} (bf16 KV); "
                   f"fp8 KV held-out median {w8.held_out.median:.1%}") if w16 else ""
    shapes = PrefillShapes(kv(bf), kv(f8), (kv(m16), kv(m8)) if m16 else None, mla_said,
                           (kv(w16), kv(w8)) if w16 else None, window_said)
    return f_eff, Sourced(shapes, said)


def _datasheet_figures(gpu: GpuSpec, hw_cfg, weight_dtype: str, eff: EfficiencyDefaults,
                       framework: str = FRAMEWORK, fit_from: str | None = None) -> _Figures:
    """Datasheet x efficiency - fitted on `framework`'s measured kernel tables where they cover the GPU
    or its sibling (`catalog.fitted_kernels_for`), the default elsewhere - or the scenario's override of each."""
    ov = hw_cfg.efficiency
    peak, peak_name = gpu.matmul_peak(weight_dtype)
    fit = catalog.fitted_kernels_for(gpu.name, framework, fit_from)
    # each weight dtype its own fit where the tables time its kernel (fp8 W8A8, nvfp4 W4A4, TensorRT-LLM's
    # weight-only int8/int4), else its peak's (a weight-only kernel's: bf16's, a bf16 MMA)
    name = weight_dtype if fit and weight_dtype in fit.gemm else peak_name
    g, a = (fit.gemm.get(name), fit.attention) if fit else (None, None)
    w_eff = (Sourced(g.weight_hbm_efficiency, g.says(f"{name} GEMMs")) if g else
             Sourced(eff.weight_hbm_efficiency[weight_dtype], "default efficiency")).override(ov.weight_hbm_efficiency)
    a_eff = (Sourced(a.hbm_efficiency, a.says("decode attention")) if a else
             Sourced(eff.attention_hbm_efficiency, "default efficiency")).override(ov.attention_hbm_efficiency)
    f_eff, p_shape = _prefill_figures(fit, eff, ov)
    gemm = _gemm_curve(gpu, g, peak, (peak_name, name), eff, ov)
    floor = Sourced(g.floor_s, g.says(f"{name} GEMMs")) if g else Sourced(eff.gemm_floor_s, "default (derived)")
    latency = Sourced(a.floor_s, a.says("decode attention")) if a else Sourced(eff.attention_latency_s, "default (derived)")
    host_memory = (Sourced(gpu.host_memory_bytes, "datasheet") if gpu.host_memory_bytes else
                   Sourced(eff.default_host_memory_bytes, "default"))
    hidden = "default: 0 (launches hidden, e.g. CUDA graphs)"
    kernel, dequant = _weight_kernel(gpu, weight_dtype, peak_name, eff)
    return _Figures(
        weight_hbm_efficiency=w_eff,
        weight_hbm_bytes_per_s=_hbm_rate(gpu, w_eff),
        attention_hbm_efficiency=a_eff,
        attention_hbm_bytes_per_s=_hbm_rate(gpu, a_eff),
        gemm_flop_per_s=gemm,
        gemm_floor_s=floor.override(ov.gemm_floor_s),
        gemm_io=_gemm_io(gpu, g, peak_name, ov, name),
        attention_flop_efficiency=f_eff,
        attention_latency_s=latency.override(ov.attention_latency_s),
        attention_shape=_attention_shape(gpu, a, ov),
        mla_fit=_mla_fit(gpu, fit.mla_attention if fit else None, ov),
        moe_fits=_moe_fits(gpu, fit.moe if fit else None, ov),
        moe_power_law_fits=_moe_fits(gpu, fit.moe_power_law if fit else None, ov, power_law=True),
        prefill_attention_shape=p_shape,
        dequant_ops_per_weight=dequant.override(ov.dequant_ops_per_weight),
        weight_kernel=kernel,
        weight_kernel_by_rows=Sourced(None, "modelled: weight streaming vs dequantisation + MMA"),
        layer_overhead_s=Sourced(eff.layer_overhead_s, "default").override(ov.layer_overhead_s),
        host_layer_s=Sourced(0.0, hidden).override(ov.host_layer_s),
        host_step_s=Sourced(0.0, hidden).override(ov.host_step_s),
        step_overhead_s=Sourced(eff.step_overhead_s, "default").override(ov.step_overhead_s),
        host_pack_bytes_per_s=Sourced(eff.host_pack_bytes_per_s, "default (assumed)")
        .override(ov.host_pack_bytes_per_s),
        runtime_reserve_bytes=Sourced(eff.runtime_reserve_bytes, "default").override(ov.runtime_reserve_bytes),
        memory_bytes=Sourced(gpu.memory_bytes, f"catalog {gpu.name}: {gpu.memory_source}"),
        host_memory_bytes=host_memory.override(hw_cfg.host_memory_bytes, "scenario"),
        attention_flop_per_s=gpu.bf16_flop_per_s * f_eff.value,
        copy_engines=hw_cfg.copy_engines or gpu.copy_engines,
        precision=peak_name,
    )


def _gemm_curve(gpu: GpuSpec, g, peak: float, names: tuple[str, str], eff: EfficiencyDefaults, ov) -> Sourced[_Gemm]:
    """GEMM FLOP/s by rows: the default curve's shape, scaled to the fitted plateau where a fit covers the
    GPU (`names`: the peak's dtype, the fit's), else the default curve; one scenario fraction at every row count."""
    peak_name, name = names
    if ov.gemm_flop_efficiency is not None:
        return Sourced(_Gemm(peak, [(1.0, ov.gemm_flop_efficiency)]), f"datasheet {gpu.name} {peak_name} peak x {SCENARIO}",
                       pinned=True)
    if g is None:
        return Sourced(_Gemm(peak, eff.gemm_flop_efficiency_by_rows),
                       f"datasheet {gpu.name} {peak_name} peak x default efficiency by rows")
    return Sourced(_Gemm(peak, _scaled_curve(eff, g.flop_efficiency)),
                   f"datasheet {gpu.name} {peak_name} peak x the default curve by rows, its plateau " + g.says(f"{name} GEMMs"))


def _scaled_curve(eff: EfficiencyDefaults, plateau: float) -> list[tuple[float, float]]:
    """The default GEMM efficiency-by-rows curve, its shape scaled to a fitted `plateau`."""
    top = max(e for _, e in eff.gemm_flop_efficiency_by_rows)
    return [(r, e * plateau / top) for r, e in eff.gemm_flop_efficiency_by_rows]


def _bf16_lm_head(hw: Hardware, fit, eff: EfficiencyDefaults) -> Hardware:
    """An fp8 W8A8 or nvfp4 W4A4 run's LM head stays bf16 - engines leave it unquantised (ModelOpt's FP8 and
    NVFP4 configs disable the lm_head quantiser; vLLM's ParallelLMHead takes no quantised method) - so its GEMM
    takes the bf16 fit's floor, streaming rate and FLOP plateau at the bf16 peak, not the layers' figures."""
    g = fit.gemm.get("bf16") if fit else None
    curve = _scaled_curve(eff, g.flop_efficiency) if g else eff.gemm_flop_efficiency_by_rows
    head = LmHeadGemm(g.floor_s if g else eff.gemm_floor_s,
                      hw.gpu.hbm_bytes_per_s * (g.weight_hbm_efficiency if g else eff.weight_hbm_efficiency["bf16"]),
                      hw.gpu.bf16_flop_per_s, tuple(tuple(p) for p in curve))
    said = "bf16 (engines leave the LM head unquantised): " + (g.says("bf16 GEMMs") if g else "default efficiency")
    return replace(hw, lm_head_gemm=head, sources={**hw.sources, "lm_head": said})


def _sets_gemm(ov) -> bool:
    """The scenario sets a GEMM figure: the fitted shapes beyond it (activations, MoE experts) stand down."""
    return any(v is not None for v in (ov.weight_hbm_efficiency, ov.gemm_flop_efficiency, ov.gemm_floor_s))


def _sets_attention(ov) -> bool:
    """The scenario sets the decode-attention rate or floor: the fitted attention shapes stand down."""
    return ov.attention_hbm_efficiency is not None or ov.attention_latency_s is not None


def _gemm_io(gpu: GpuSpec, g, peak_name: str, ov, name: str | None = None) -> Sourced[GemmIO]:
    """The fitted GEMM's activation traffic (input streamed, output written, W8A8's quantisation pass);
    none where no fit covers the GPU or the scenario sets a GEMM figure (its figures stand alone)."""
    if g is None:
        return Sourced(GemmIO(), "default: weights alone (no measured table to fit activations on)")
    if _sets_gemm(ov):
        return Sourced(GemmIO(), f"weights alone: {SCENARIO} sets a GEMM figure", pinned=True)
    hbm = gpu.hbm_bytes_per_s
    io = GemmIO(ACTIVATION_BYTES[peak_name], 1 / (hbm * g.output_hbm_efficiency), g.quant_row_s,
                1 / (hbm * g.quant_hbm_efficiency) if g.quant_hbm_efficiency else 0.0,
                g.weight_reread, g.half_tiles, g.half_tiles_decode)
    quant = (f", quantising activations {g.quant_row_s * 1e9:.3g} ns a row + an m x k pass at "
             f"{g.quant_hbm_efficiency:g} of HBM" if g.quant_hbm_efficiency else "")
    reread = f"; each further 128-row tile re-reads {g.weight_reread:.2g} of the weights" if g.weight_reread else ""
    tiles = (f"{reread}; a grid at half rate at {g.half_tiles:.3g} output tiles ({g.half_tiles_decode:.3g} up to 64 "
             f"rows)" if g.half_tiles else "")
    return Sourced(io, g.says(f"{name or peak_name} GEMMs") + f" (output at {g.output_hbm_efficiency:g} of HBM{quant}{tiles})")


def _moe_fits(gpu: GpuSpec, moe, ov, power_law: bool = False) -> Sourced[tuple]:
    """The fused routed experts fitted per weight format on the measured MoE tables' balanced rows (or, with
    `power_law`, their power-law rows); none (the dense GEMM model for the experts) where none covers the GPU
    or the scenario sets a GEMM figure."""
    if not moe:
        return Sourced((), "default: the experts as dense GEMMs (no measured MoE table to fit on)")
    if _sets_gemm(ov):
        return Sourced((), f"the experts as dense GEMMs: {SCENARIO} sets a GEMM figure", pinned=True)
    hbm = gpu.hbm_bytes_per_s
    fits = tuple((quant, MoeFit(m.floor_s, m.per_expert_s, hbm * m.weight_hbm_efficiency,
                                moe_peak_flop_per_s(gpu, quant) * m.flop_efficiency, m.half_rows,
                                hbm * m.pair_hbm_efficiency, hbm * m.token_hbm_efficiency))
                 for quant, m in sorted(moe.items()))
    said = "; ".join(f"{q} median {m.held_out.median:.1%}" for q, m in sorted(moe.items()))
    file = next(iter(moe.values())).file  # fitted_kernels.yaml (vLLM's) or fitted_kernels.<engine>.yaml
    kernel = "vLLM fused_experts" if file == catalog.fitted_kernels_file() else f"{file.split('.')[1]} fused experts"
    routing = "power-law routings, at their draw's load" if power_law else "balanced routing"
    return Sourced(fits, f"fitted on measured fused routed experts ({kernel}, {routing}; {file}), "
                         f"held-out |error|: {said}")


def _mla_fit(gpu: GpuSpec, m, ov) -> Sourced[MlaFit | None]:
    """The absorbed MLA decode kernel fitted on the measured MLA tables; None (the generic `attention_s`)
    where none covers the GPU or the scenario sets the decode-attention rate or floor."""
    if m is None:
        return Sourced(None, "default: the generic decode-attention form (no measured MLA table to fit on)")
    if _sets_attention(ov):
        return Sourced(None, f"the generic decode-attention form: {SCENARIO} sets its rate or floor", pinned=True)
    hbm = gpu.hbm_bytes_per_s
    fitted = MlaFit(m.floor_s, hbm * m.hbm_efficiency, hbm * m.fp8_hbm_efficiency, gpu.bf16_flop_per_s * m.flop_efficiency,
                    m.half_blocks)
    return Sourced(fitted, m.says("MLA decode attention (TensorRT-LLM's generation_mla, DeepSeek-V3's latent)"))


def _attention_shape(gpu: GpuSpec, a, ov) -> Sourced[AttentionShape]:
    """The fitted decode-attention shape (fp8 KV's rate, small grids, the per-block cost); flat where no
    fit covers the GPU or the scenario sets the decode-attention rate or floor (its figures stand alone)."""
    if a is None:
        return Sourced(AttentionShape(), "default: flat (no measured table to fit it on)")
    if _sets_attention(ov):
        return Sourced(AttentionShape(), f"flat: {SCENARIO} sets the decode-attention rate or floor", pinned=True)
    split = _xqa_split(gpu, a, "decode-attention")
    shape = _fitted_shape(gpu, a, split)
    fp8 = (f", floor {a.fp8_floor_s * 1e6:.3g} us, {a.fp8_per_cta_s * 1e9:.3g} ns a block"
           if a.fp8_floor_s is not None and a.fp8_per_cta_s is not None else "")
    xqa = (f"; XQA's sequence split over up to {split:.0f} blocks (8 x {gpu.sm_count} SMs), stream and blocks "
           f"added, {a.per_cta_head_s * 1e9:.3g} ns a block per query head" if split else "")
    return Sourced(shape, a.says("decode attention") + f" (half rate at {a.half_ctas:.3g} blocks; bf16 KV "
                          f"{a.per_cta_s * 1e9:.3g} ns a block; fp8 KV at {a.fp8_hbm_efficiency:g} of HBM{fp8}{xqa})")


def _weight_kernel(gpu: GpuSpec, weight_dtype: str, precision: str,
                   eff: EfficiencyDefaults) -> tuple[Sourced[str], Sourced[float]]:
    """How a layer's weights are multiplied, and the CUDA-core work per weight that takes: bf16 and
    fp16 weights feed the tensor cores as they are; fp8 runs as a W8A8 GEMM at the fp8 peak where the
    GPU has fp8 tensor cores, nvfp4 as a W4A4 GEMM at the fp4 peak where it has FP4 tensor cores
    (Blackwell); int8, int4 (and fp8 / nvfp4 without those tensor cores: vLLM's Marlin W4A16 for
    NVFP4 checkpoints before Blackwell) run weight-only kernels that dequantise every weight to bf16
    on the CUDA cores before the MMA."""
    dequant_src = "default (derived: instruction count of the published conversion, efficiency.yaml)"
    def path(text: str) -> Sourced[str]:  # the summary's sources name the path a run assumed
        return Sourced(text, text)

    if precision != "bf16":
        form = f"W{WEIGHT_DTYPES[weight_dtype].bits}A{ACTIVATION_BITS[precision]}"  # W8A8, W4A4, W4A8
        return (path(f"{weight_dtype} {form} GEMM at the {gpu.name} {precision} tensor-core peak"),
                Sourced(0.0, f"{precision} tensor cores: no dequantisation"))
    if weight_dtype not in eff.dequant_ops_per_weight:
        return path(f"{weight_dtype} GEMM on the tensor cores"), Sourced(0.0, "no dequantisation")
    needs = TENSOR_CORE_PATHS.get(weight_dtype, (None,))[0]
    why = f"; {gpu.name} has no {needs} tensor cores (datasheet)" if needs else ""
    kernel = f"{weight_dtype} weight-only (W{WEIGHT_DTYPES[weight_dtype].bits}A16): dequantised on CUDA cores, bf16 MMA{why}"
    return path(kernel), Sourced(eff.dequant_ops_per_weight[weight_dtype], dequant_src)


def _hbm_rate(gpu: GpuSpec, efficiency: Sourced[float]) -> Sourced[float]:
    """Datasheet HBM bandwidth x `efficiency`; pinned with it, so that a scenario's efficiency
    keeps its rate against a measured one."""
    source = f"datasheet {gpu.name} x {efficiency.value:g} ({efficiency.source})"
    return Sourced(gpu.hbm_bytes_per_s * efficiency.value, source, efficiency.pinned)


def _measured_figures(figs: _Figures, profile: Profile, gpu: GpuSpec, hw_cfg, weight_dtype: str,
                      eff: EfficiencyDefaults, staging: str) -> _Figures:
    """The profile's measurements on top of the datasheet; a scenario's override still wins."""
    label = f"profile: {profile.device_name} ({profile.device}, {profile.created_utc[:10]})"
    c = profile.compute
    figs = replace(
        figs,
        memory_bytes=figs.memory_bytes.measure(profile.device_memory_bytes, label),
        host_memory_bytes=figs.host_memory_bytes.measure(profile.host_memory_bytes, label),
        copy_engines=hw_cfg.copy_engines or profile.copy_engines or figs.copy_engines,
        weight_hbm_bytes_per_s=_measured_weight_rate(figs.weight_hbm_bytes_per_s, c.weight_hbm_bytes_per_s,
                                                     weight_dtype, eff, label),
        attention_hbm_bytes_per_s=figs.attention_hbm_bytes_per_s.measure(c.attention_hbm_bytes_per_s, label),
        attention_latency_s=figs.attention_latency_s.measure(c.attention_latency_s, f"{label}, fit over context"),
        attention_shape=figs.attention_shape.measure(
            AttentionShape() if c.attention_hbm_bytes_per_s is not None else None,
            f"{label}: flat, one rate and floor over context"),
        mla_fit=(figs.mla_fit if c.attention_hbm_bytes_per_s is None or figs.mla_fit.pinned else
                 Sourced(None, f"{label}: the generic decode-attention form at its measured rate")),
        host_pack_bytes_per_s=figs.host_pack_bytes_per_s.measure(
            profile.link.host_pack_bytes_per_s if profile.link is not None else None, label),
        runtime_reserve_bytes=_measured_reserve(figs.runtime_reserve_bytes, profile, label),
    )
    curve = c.weight_kernel_bytes_per_s_by_rows.get(weight_dtype)
    if curve and not figs.weight_hbm_bytes_per_s.pinned:  # a scenario's weight efficiency keeps the model
        kernel = c.weight_kernels.get(weight_dtype, f"{weight_dtype} kernel")
        figs = replace(figs, weight_kernel_by_rows=Sourced([(float(r), b) for r, b in curve],
                                                           f"{label}, {kernel} measured by rows"))
    figs = _measured_flops(figs, c, gpu, label)
    return _measured_loop_costs(figs, profile, staging, label)


def _measured_reserve(reserve: Sourced[float], profile: Profile, label: str) -> Sourced[float]:
    """Memory already in use on the device when calibration started (its CUDA context, other
    processes) raises the reserve to at least that; the default covers a bare context."""
    if profile.device_memory_bytes is None or profile.device_memory_free_bytes is None:
        return reserve
    in_use = profile.device_memory_bytes - profile.device_memory_free_bytes
    if in_use <= reserve.value:
        return reserve
    return reserve.measure(in_use, f"{label}, in use on the device at calibration")


def _measured_weight_rate(rate: Sourced[float], measured: dict[str, float], weight_dtype: str,
                          eff: EfficiencyDefaults, label: str) -> Sourced[float]:
    """The measured weight-streaming rate of this dtype, else the measured bf16 rate scaled by the
    default dtype ratio (dequantising kernels are slower)."""
    if rate.pinned:  # the scenario's efficiency wins over any measurement
        return rate
    if measured.get(weight_dtype) is not None:
        return Sourced(measured[weight_dtype], label)
    if "bf16" in measured:
        ratio = eff.weight_hbm_efficiency[weight_dtype] / eff.weight_hbm_efficiency["bf16"]
        return Sourced(measured["bf16"] * ratio, f"{label}, bf16 x default {weight_dtype}/bf16 ratio {ratio:.3g}")
    return rate


def _measured_flops(figs: _Figures, c: ComputeProfile, gpu: GpuSpec, label: str) -> _Figures:
    """A measured peak replaces the datasheet's (GEMM and attention keep their fractions of it);
    bf16 GEMM FLOP/s measured by rows replaces peak x fraction."""
    gemm, attention_flop = figs.gemm_flop_per_s, figs.attention_flop_per_s
    peak = c.peak_flop_per_s.get(figs.precision)
    if peak:
        fraction = SCENARIO if gemm.pinned else "default efficiency by rows"
        gemm = Sourced(replace(gemm.value, peak_flop_per_s=peak), f"{label}, peak x {fraction}", gemm.pinned)
        attention_flop = peak * (attention_flop / gpu.bf16_flop_per_s)
    if c.gemm_flop_per_s_by_rows and figs.precision == "bf16":
        by_rows = [(float(m), f) for m, f in c.gemm_flop_per_s_by_rows]
        gemm = gemm.measure(replace(gemm.value, measured_by_rows=by_rows), f"{label}, measured by rows")
    return replace(figs, gemm_flop_per_s=gemm, attention_flop_per_s=attention_flop)


def _measured_loop_costs(figs: _Figures, profile: Profile, staging: str, label: str) -> _Figures:
    """Fixed costs of the decode loop, timed at tiny dimensions. On an asynchronous device (cuda)
    that time is the host's enqueue, which composes with device work by max; on a synchronous one
    the host's time is the device's, and adds up."""
    c = profile.compute
    cuda = profile.device == "cuda"
    loop = c.step_overheads.get(staging)
    if loop is not None:
        how = f"{label}, tiny decode steps, staging {staging}"
        if cuda:
            return replace(figs, host_layer_s=figs.host_layer_s.measure(loop.layer_s, how + " (host-bound)"),
                           host_step_s=figs.host_step_s.measure(loop.step_s, how + " (host-bound)"))
        return replace(figs, layer_overhead_s=figs.layer_overhead_s.measure(loop.layer_s, how),
                       step_overhead_s=figs.step_overhead_s.measure(loop.step_s, how))
    if c.layer_overhead_s is None:
        return figs
    # no loop timed with this staging: fall back to one tiny layer's time
    if cuda:  # host-bound: the host's time per layer, unless the scenario set it
        return replace(figs, host_layer_s=figs.host_layer_s.measure(c.layer_overhead_s,
                                                                    f"{label}, tiny-layer time (host-bound)"))
    return replace(figs, layer_overhead_s=figs.layer_overhead_s.measure(c.layer_overhead_s, label))


def _link_model(spec: LinkSpec, direction: str, pinned: bool, profile: Profile | None) -> LinkModel:
    """One direction of the host link: the profile's measured curve for this kind of host memory,
    else the datasheet's latency and bandwidth."""
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
            # not measured: the measured rate x the datasheet's bidirectional/pinned ratio
            pinned_bw = getattr(spec, f"pinned_{direction}_bytes_per_s")
            bidir = min(bw, measured_bidir) if measured_bidir else bw * spec.bidirectional_bytes_per_s / pinned_bw
            source = f"profile: {profile.device_name} ({memory} curve)"
    return LinkModel(latency, bw, bidir, curve, source)


def _assemble(gpu: GpuSpec, link_spec: LinkSpec, figs: _Figures, h2d: LinkModel, d2h: LinkModel) -> Hardware:
    gemm = figs.gemm_flop_per_s.value
    return Hardware(
        gpu=gpu, link_spec=link_spec,
        memory_bytes=figs.memory_bytes.value, host_memory_bytes=figs.host_memory_bytes.value,
        weight_hbm_bytes_per_s=figs.weight_hbm_bytes_per_s.value,
        attention_hbm_bytes_per_s=figs.attention_hbm_bytes_per_s.value,
        peak_flop_per_s=gemm.peak_flop_per_s, gemm_flop_efficiency_by_rows=gemm.efficiency_by_rows,
        gemm_flop_per_s_by_rows=gemm.measured_by_rows, attention_flop_per_s=figs.attention_flop_per_s,
        layer_overhead_s=figs.layer_overhead_s.value, step_overhead_s=figs.step_overhead_s.value,
        runtime_reserve_bytes=figs.runtime_reserve_bytes.value, copy_engines=figs.copy_engines, h2d=h2d, d2h=d2h,
        sources={**figs.sources(), "h2d": h2d.source, "d2h": d2h.source},
        host_layer_s=figs.host_layer_s.value, host_step_s=figs.host_step_s.value,
        host_pack_bytes_per_s=figs.host_pack_bytes_per_s.value,
        weight_kernel=figs.weight_kernel.value, dequant_ops_per_weight=figs.dequant_ops_per_weight.value,
        weight_kernel_bytes_per_s_by_rows=figs.weight_kernel_by_rows.value,
        dequant_op_per_s=gpu.fp32_flop_per_s / FLOP_PER_MAC, attention_latency_s=figs.attention_latency_s.value,
        attention_shape=figs.attention_shape.value, mla_fit=figs.mla_fit.value, moe_fits=figs.moe_fits.value,
        moe_power_law_fits=figs.moe_power_law_fits.value,
        gemm_floor_s=figs.gemm_floor_s.value, gemm_io=figs.gemm_io.value,
        prefill_attention_shape=figs.prefill_attention_shape.value,
    )
