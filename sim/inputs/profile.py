"""Measured machine profile: the schema `hwprobe calibrate` writes and `kvsim run --profile` reads.

Raw points are kept next to the fits so any derived figure can be re-checked. Every figure is in
decimal SI units named in the field. `device` says what was measured: a CUDA GPU, or the CPU
standing in for one (host memcpy as "link"); CPU profiles are labelled and never passed off as GPU.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError
from .limits import MAX_BATCH, MAX_BYTES, MAX_BYTES_PER_S, MAX_FLOP_PER_S, MAX_SECONDS, MIN_BYTES_PER_S, MIN_FLOP_PER_S
from .reader import read_yaml
from .scenario import validation_error_line

PROFILE_SCHEMA_VERSION = 1
MAX_ROWS = 2**20  # GEMM rows (tokens in one step)
MAX_DIM = 2**24  # a GEMM dimension
MAX_SAMPLES = 10**6
MAX_COPY_ENGINES = 64

# Measured figures: positive, finite (the loader refuses NaN and infinities anywhere) and bounded.
BytesPerS = Annotated[float, Field(ge=MIN_BYTES_PER_S, le=MAX_BYTES_PER_S)]
FlopPerS = Annotated[float, Field(ge=MIN_FLOP_PER_S, le=MAX_FLOP_PER_S)]
# a raw measured point: positive (the figures fitted from the points carry the lower bounds above)
PointBytesPerS = Annotated[float, Field(gt=0, le=MAX_BYTES_PER_S)]
PointFlopPerS = Annotated[float, Field(gt=0, le=MAX_FLOP_PER_S)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
Rows = Annotated[int, Field(gt=0, le=MAX_ROWS)]


def _pair(value):
    """YAML has no tuples: a (rows, rate) pair is read back as a two-item list."""
    return tuple(value) if isinstance(value, list) else value


RowsBytesPerS = Annotated[tuple[Rows, BytesPerS], BeforeValidator(_pair)]
RowsFlopPerS = Annotated[tuple[Rows, FlopPerS], BeforeValidator(_pair)]


class _P(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CopyPoint(_P):
    """One copy size: median time of one copy of `size_bytes`, over `samples` timed repeats."""

    size_bytes: int = Field(gt=0, le=MAX_BYTES)
    time_s: Seconds
    bytes_per_s: PointBytesPerS
    samples: int = Field(1, ge=1, le=MAX_SAMPLES)
    rel_spread: float = Field(0.0, ge=0)  # (max - min) / median over samples
    verified: bool = True  # destination compared against source after the copy


class CopyCurve(_P):
    """Copies in one direction from one kind of host memory. Fit: time = latency + bytes / bandwidth."""

    direction: Literal["h2d", "d2h"]
    memory: Literal["pinned", "pageable"]
    concurrent: bool = False  # measured while the other direction was busy
    points: list[CopyPoint]
    fit_per_copy_latency_s: float = Field(ge=0, le=MAX_SECONDS)
    fit_bytes_per_s: BytesPerS

    def copy_time_s(self, size_bytes: float) -> float:
        """Time of one copy: log-log interpolation of measured points inside their range, the
        linear fit (latency + bytes / bandwidth) outside it."""
        pts = sorted(self.points, key=lambda p: p.size_bytes)
        if size_bytes <= 0:
            return 0.0
        if len(pts) < 2 or size_bytes < pts[0].size_bytes or size_bytes > pts[-1].size_bytes:
            return self.fit_per_copy_latency_s + size_bytes / self.fit_bytes_per_s
        x = math.log(size_bytes)
        for lo, hi in zip(pts, pts[1:]):
            if lo.size_bytes <= size_bytes <= hi.size_bytes:
                x0, x1 = math.log(lo.size_bytes), math.log(hi.size_bytes)
                y0, y1 = math.log(lo.time_s), math.log(hi.time_s)
                f = 0.0 if x1 == x0 else (x - x0) / (x1 - x0)
                return math.exp(y0 + f * (y1 - y0))
        raise AssertionError("unreachable")


class LinkProfile(_P):
    curves: list[CopyCurve]
    # Per-direction bandwidth while both directions copy at once (large copies).
    bidirectional_h2d_bytes_per_s: BytesPerS | None = None
    bidirectional_d2h_bytes_per_s: BytesPerS | None = None
    # Host memory packing a strided K/V half into a contiguous block (bytes out per second).
    host_pack_bytes_per_s: BytesPerS | None = None

    def curve(self, direction: str, memory: str) -> CopyCurve | None:
        for c in self.curves:
            if c.direction == direction and c.memory == memory and not c.concurrent:
                return c
        return None


class GemmPoint(_P):
    m: int = Field(gt=0, le=MAX_DIM)
    n: int = Field(gt=0, le=MAX_DIM)
    k: int = Field(gt=0, le=MAX_DIM)
    dtype: str
    time_s: Seconds
    flop_per_s: PointFlopPerS
    weight_bytes_per_s: PointBytesPerS  # n*k*bytes / time: weight streaming rate
    samples: int = Field(1, ge=1, le=MAX_SAMPLES)
    rel_spread: float = Field(0.0, ge=0)  # (max - min) / median over samples
    best_flop_per_s: PointFlopPerS | None = None  # from the fastest sample (time_s is the median)


class AttentionPoint(_P):
    batch: int = Field(gt=0, le=MAX_BATCH)
    context_tokens: int = Field(gt=0, le=MAX_DIM)
    num_heads: int = Field(gt=0, le=MAX_DIM)
    num_kv_heads: int = Field(gt=0, le=MAX_DIM)
    head_dim: int = Field(gt=0, le=MAX_DIM)
    dtype: str
    time_s: Seconds
    kv_bytes_per_s: PointBytesPerS
    backend: str
    samples: int = Field(1, ge=1, le=MAX_SAMPLES)
    rel_spread: float = Field(0.0, ge=0)  # (max - min) / median over samples


class StepOverhead(_P):
    """Fixed costs of hwprobe's decode loop for one way of staging T1/T2 ("none", or a prefetch
    mode), from tiny-dimension steps at two depths: on a GPU the host's enqueue time."""

    layer_s: float = Field(ge=0, le=MAX_SECONDS)
    step_s: float = Field(ge=0, le=MAX_SECONDS)


class ComputeProfile(_P):
    """Achieved figures the simulator uses, derived from the raw points below."""

    device_copy_bytes_per_s: BytesPerS | None = None
    device_copy_convention: str = "bytes read + bytes written per second"
    weight_hbm_bytes_per_s: dict[str, BytesPerS] = {}  # by weight dtype, from small-M GEMMs
    # by weight dtype: (rows, weight bytes / kernel time) of the dtype's decode kernel on a layer-shaped
    # matrix, dequantisation and MMA included; replaces the modelled weight kernel where present
    weight_kernel_bytes_per_s_by_rows: dict[str, list[RowsBytesPerS]] = {}
    weight_kernels: dict[str, str] = {}  # by weight dtype: the kernel those points timed
    attention_hbm_bytes_per_s: BytesPerS | None = None
    attention_latency_s: float | None = Field(None, ge=0, le=MAX_SECONDS)  # intercept of decode attention time against KV bytes
    peak_flop_per_s: dict[str, FlopPerS] = {}  # by dtype, from the peak search
    gemm_flop_per_s_by_rows: list[RowsFlopPerS] = []  # (M, achieved FLOP/s), bf16
    layer_overhead_s: float | None = Field(None, ge=0, le=MAX_SECONDS)
    kernel_launch_s: Seconds | None = None  # one small kernel, back to back (eager)
    step_overheads: dict[str, StepOverhead] = {}  # by prefetch mode ("none": nothing staged)
    attention_backend: str | None = None
    gemm_points: list[GemmPoint] = []
    attention_points: list[AttentionPoint] = []

    @model_validator(mode="after")
    def _distinct_rows(self):
        """A row count appears once per curve: two figures for one row count mean nothing."""
        curves = {"gemm_flop_per_s_by_rows": self.gemm_flop_per_s_by_rows,
                  **{f"weight_kernel_bytes_per_s_by_rows.{k}": v for k, v in self.weight_kernel_bytes_per_s_by_rows.items()}}
        for name, points in curves.items():
            rows = [r for r, _ in points]
            if len(set(rows)) != len(rows):
                raise ValueError(f"{name}: a row count appears twice ({sorted(rows)})")
        return self


class HostAttentionPoint(_P):
    """One token count of host-side attention: median time of one layer's call over `kv_bytes` of K/V."""

    batch: int = Field(gt=0, le=MAX_BATCH)
    tokens: int = Field(gt=0, le=MAX_DIM)  # host-resident tokens per sequence
    kv_bytes: float = Field(gt=0, le=MAX_BYTES)  # K and V bytes as stored, over the batch
    time_s: Seconds
    samples: int = Field(1, ge=1, le=MAX_SAMPLES)
    rel_spread: float = Field(0.0, ge=0)  # (max - min) / median over samples


class HostProfile(_P):
    """The host CPU that attends T1/T2 where they live (policy.access host_attention / split).
    Fit: time = attention_dispatch_s + kv_bytes / attention_bytes_per_s over `attention_points`."""

    cpu_name: str
    threads: int = Field(ge=1, le=2**16)  # torch intra-op threads during the measurement
    dram_bytes_per_s: BytesPerS | None = None  # STREAM-like large copy: bytes read + bytes written per second
    dram_convention: str = "bytes read + bytes written per second (torch copy_ of a large float32 buffer)"
    attention_kernel: str = ""  # what was timed
    attention_points: list[HostAttentionPoint] = []
    attention_bytes_per_s: BytesPerS | None = None
    attention_dispatch_s: float | None = Field(None, ge=0, le=MAX_SECONDS)
    round_trip_s: Seconds | None = None  # query D2H + partials H2D of one layer (tiny copies); None on the CPU


class Profile(_P):
    schema_version: int = PROFILE_SCHEMA_VERSION
    kind: Literal["measured"] = "measured"
    device: Literal["cuda", "cpu"]
    device_name: str
    machine: str  # hostname or a label for the machine
    created_utc: str  # ISO 8601
    versions: dict[str, str] = {}  # torch, cuda, driver, python, kvtier
    environment: dict = {}  # clocks, PCIe link state, throttle reasons, host CPU, ...
    device_memory_bytes: float | None = Field(None, gt=0, le=MAX_BYTES)  # the device's total, as it reports it
    device_memory_free_bytes: float | None = Field(None, ge=0, le=MAX_BYTES)  # free when calibration started
    host_memory_bytes: float | None = Field(None, gt=0, le=MAX_BYTES)
    copy_engines: int | None = Field(None, ge=1, le=MAX_COPY_ENGINES)
    link: LinkProfile | None = None
    compute: ComputeProfile = ComputeProfile()
    host: HostProfile | None = None  # host-side attention (hwprobe calibrate); None in older profiles
    warnings: list[str] = []
    quick: bool = False


def load_profile(path: str | Path) -> Profile:
    """A profile file, size-capped and validated strictly (no YAML `true` as 1, no NaN or
    infinity, measured figures positive and bounded); any failure a ConfigError."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", source=str(path))
    version = data.get("schema_version")
    if type(version) is not int or version != PROFILE_SCHEMA_VERSION:
        raise ConfigError(
            f"unsupported profile schema_version {version!r}, expected {PROFILE_SCHEMA_VERSION}",
            source=str(path), field="schema_version",
        )
    try:
        profile = Profile.model_validate(data, strict=True)
    except ValidationError as err:
        raise validation_error_line(err, str(path)) from None
    total, free = profile.device_memory_bytes, profile.device_memory_free_bytes
    if total is not None and free is not None and free > total:
        raise ConfigError(f"{free:g} is more than device_memory_bytes {total:g}", source=str(path),
                          field="device_memory_free_bytes")
    return profile


def _compact(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def measured_device(profile: Profile) -> str:
    """What a profile's figures describe, for people: `cuda (NVIDIA H200)`, `cpu (AMD EPYC 9654)`."""
    return f"{profile.device} ({profile.device_name})"


def device_mismatch(profile: Profile, gpu) -> str | None:
    """One line when the profile did not measure the scenario's GPU (`gpu`, a catalog GpuSpec): a CPU
    profile, or a GPU whose name matches none of the catalog entry's names; None when it did."""
    if profile.device != "cuda":
        return (f"the profile measured the {measured_device(profile)}, not a GPU: its figures describe that "
                f"CPU, not {gpu.name}")
    device = _compact(profile.device_name)
    if not any(_compact(n) in device for n in (gpu.name, *gpu.aliases)):
        return (f"the profile measured {profile.device_name}, the scenario's GPU is {gpu.name}: measured figures "
                f"describe {profile.device_name}")
    return None


def profile_to_yaml(profile: Profile) -> str:
    return yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False)
