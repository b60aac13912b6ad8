"""Measured machine profile: the schema `hwprobe calibrate` writes and `kvsim run --profile` reads.

Raw points are kept next to the fits so any derived figure can be re-checked. Every figure is in
decimal SI units named in the field. `device` says what was measured: a CUDA GPU, or the CPU
standing in for one (host memcpy as "link"); CPU profiles are labelled and never passed off as GPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigError

PROFILE_SCHEMA_VERSION = 1


class _P(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CopyPoint(_P):
    """One copy size: median time of one copy of `size_bytes`, over `samples` timed repeats."""

    size_bytes: int = Field(gt=0)
    time_s: float = Field(gt=0)
    bytes_per_s: float = Field(gt=0)
    samples: int = Field(1, ge=1)
    rel_spread: float = Field(0.0, ge=0)  # (max - min) / median over samples
    verified: bool = True  # destination compared against source after the copy


class CopyCurve(_P):
    """Copies in one direction from one kind of host memory. Fit: time = latency + bytes / bandwidth."""

    direction: Literal["h2d", "d2h"]
    memory: Literal["pinned", "pageable"]
    concurrent: bool = False  # measured while the other direction was busy
    points: list[CopyPoint]
    fit_per_copy_latency_s: float = Field(ge=0)
    fit_bytes_per_s: float = Field(gt=0)

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
    bidirectional_h2d_bytes_per_s: float | None = Field(None, gt=0)
    bidirectional_d2h_bytes_per_s: float | None = Field(None, gt=0)
    # Host memory packing a strided K/V half into a contiguous block (bytes out per second).
    host_pack_bytes_per_s: float | None = Field(None, gt=0)

    def curve(self, direction: str, memory: str) -> CopyCurve | None:
        for c in self.curves:
            if c.direction == direction and c.memory == memory and not c.concurrent:
                return c
        return None


class GemmPoint(_P):
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    dtype: str
    time_s: float = Field(gt=0)
    flop_per_s: float = Field(gt=0)
    weight_bytes_per_s: float = Field(gt=0)  # n*k*bytes / time: weight streaming rate
    samples: int = Field(1, ge=1)
    rel_spread: float = Field(0.0, ge=0)  # (max - min) / median over samples
    best_flop_per_s: float | None = Field(None, gt=0)  # from the fastest sample (time_s is the median)


class AttentionPoint(_P):
    batch: int = Field(gt=0)
    context_tokens: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype: str
    time_s: float = Field(gt=0)
    kv_bytes_per_s: float = Field(gt=0)
    backend: str
    samples: int = Field(1, ge=1)
    rel_spread: float = Field(0.0, ge=0)  # (max - min) / median over samples


class StepOverhead(_P):
    """Fixed costs of hwprobe's decode loop for one way of staging T1/T2 ("none", or a prefetch
    mode), from tiny-dimension steps at two depths: on a GPU the host's enqueue time."""

    layer_s: float = Field(ge=0)
    step_s: float = Field(ge=0)


class ComputeProfile(_P):
    """Achieved figures the simulator uses, derived from the raw points below."""

    device_copy_bytes_per_s: float | None = Field(None, gt=0)
    device_copy_convention: str = "bytes read + bytes written per second"
    weight_hbm_bytes_per_s: dict[str, float] = {}  # by weight dtype, from small-M GEMMs
    # by weight dtype: (rows, weight bytes / kernel time) of the dtype's decode kernel on a layer-shaped
    # matrix, dequantisation and MMA included; replaces the modelled weight kernel where present
    weight_kernel_bytes_per_s_by_rows: dict[str, list[tuple[int, float]]] = {}
    weight_kernels: dict[str, str] = {}  # by weight dtype: the kernel those points timed
    attention_hbm_bytes_per_s: float | None = Field(None, gt=0)
    attention_latency_s: float | None = Field(None, ge=0)  # intercept of decode attention time against KV bytes
    peak_flop_per_s: dict[str, float] = {}  # by dtype, from the peak search
    gemm_flop_per_s_by_rows: list[tuple[int, float]] = []  # (M, achieved FLOP/s), bf16
    layer_overhead_s: float | None = Field(None, ge=0)
    kernel_launch_s: float | None = Field(None, gt=0)  # one small kernel, back to back (eager)
    step_overheads: dict[str, StepOverhead] = {}  # by prefetch mode ("none": nothing staged)
    attention_backend: str | None = None
    gemm_points: list[GemmPoint] = []
    attention_points: list[AttentionPoint] = []


class Profile(_P):
    schema_version: int = PROFILE_SCHEMA_VERSION
    kind: Literal["measured"] = "measured"
    device: Literal["cuda", "cpu"]
    device_name: str
    machine: str  # hostname or a label for the machine
    created_utc: str  # ISO 8601
    versions: dict[str, str] = {}  # torch, cuda, driver, python, kvtier
    environment: dict = {}  # clocks, PCIe link state, throttle reasons, host CPU, ...
    device_memory_bytes: float | None = Field(None, gt=0)  # the device's total, as it reports it
    device_memory_free_bytes: float | None = Field(None, ge=0)  # free when calibration started
    host_memory_bytes: float | None = Field(None, gt=0)
    copy_engines: int | None = Field(None, ge=1)
    link: LinkProfile | None = None
    compute: ComputeProfile = ComputeProfile()
    warnings: list[str] = []
    quick: bool = False


def load_profile(path: str | Path) -> Profile:
    from .scenario import read_yaml, validation_error_line

    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", source=str(path))
    version = data.get("schema_version")
    if version != PROFILE_SCHEMA_VERSION:
        raise ConfigError(
            f"unsupported profile schema_version {version!r}, expected {PROFILE_SCHEMA_VERSION}",
            source=str(path), field="schema_version",
        )
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise validation_error_line(err, str(path)) from None


def profile_to_yaml(profile: Profile) -> str:
    return yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False)
