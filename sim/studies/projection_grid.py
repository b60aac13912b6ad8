"""The projection sweep: models x weight dtypes x GPUs x reasoning lengths x policies x batches.

Every point comes from `sim.projection.project` (fast, analytic); the max batch is computed once
per (model, dtype, GPU, length, policy) with `sim.capacity.max_batch`, because that search is the
expensive part. Work is split into one task per (model, dtype, GPU, length) and spread over worker
processes; results are reassembled in task order, so the output does not depend on scheduling.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from .. import catalog
from ..capacity import batch_memory_trace, full_hbm_peak_bytes, max_batch
from ..context import build_context
from ..errors import ConfigError
from ..profile import Profile
from ..projection import project
from ..schema import LINK_BOTTLENECK_UTILIZATION
from ..scenario import Scenario, scenario_from_dict
from ..units import PERCENT

DEFAULT_PROMPT_TOKENS = 512  # a typical reasoning prompt; protected (never leaves HBM)
EVICT_RATIO = 0.1  # the paper's evicted share, used by evict_only and the tiered rows
FALLBACK_BASE_GPU = "h100-sxm"  # datasheet base for a measured profile whose device is not in the catalog
MEASURED_KEY_PREFIX = "measured:"  # GPU keys of profile columns, distinct from catalog names


@dataclass(frozen=True)
class PolicyVariant:
    """One policy row of the report: a key, a label for people, the scenario `policy:` mapping."""

    key: str
    label: str
    policy: dict
    tiered: bool = False


def _tiered(hbm_ratio: float) -> PolicyVariant:
    pct = round(hbm_ratio * PERCENT)
    return PolicyVariant(
        key=f"tiered_{pct}", label=f"tiered {pct}% HBM", tiered=True,
        policy={"kind": "tiered", "semantics": "global", "hbm_ratio": hbm_ratio, "evict_ratio": EVICT_RATIO,
                "compressed_ratio": 0.0, "prefetch": "layerwise_async", "pinned": True},
    )


DEFAULT_POLICIES: tuple[PolicyVariant, ...] = (
    PolicyVariant("full_hbm", "full_hbm", {"kind": "full_hbm"}),
    PolicyVariant("evict_only", f"evict_only (evict {round(EVICT_RATIO * PERCENT)}%)",
                  {"kind": "evict_only", "evict_ratio": EVICT_RATIO}),
    _tiered(0.25), _tiered(0.5), _tiered(0.75),
)


@dataclass(frozen=True)
class GpuColumn:
    """A GPU of the sweep: a catalog GPU, or a measured profile on top of its datasheet base."""

    key: str
    label: str
    base_gpu: str
    profile: Profile | None = None


@dataclass(frozen=True)
class GridSpec:
    """What the projection sweeps. `models` are (label, catalog name) pairs."""

    models: tuple[tuple[str, str], ...] = (
        ("7B", "deepseek-r1-distill-qwen-7b"), ("8B", "llama-3.1-8b"), ("14B", "deepseek-r1-distill-qwen-14b"),
        ("32B", "deepseek-r1-distill-qwen-32b"), ("70B", "deepseek-r1-distill-llama-70b"),
    )
    weight_dtypes: tuple[str, ...] = ("bf16", "int4")
    gpus: tuple[str, ...] = ("rtx-5080", "rtx-4090", "l40s", "a100-80gb-sxm", "h100-sxm", "h200-sxm")
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    lengths: tuple[int, ...] = (2048, 4096, 8192, 16384)
    policies: tuple[PolicyVariant, ...] = DEFAULT_POLICIES
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    default_selection: dict = field(default_factory=lambda: {"model": "7B", "weights": "bf16", "gpu": "rtx-4090", "length": "8K"})


DEFAULT_GRID = GridSpec()


def length_label(tokens: int) -> str:
    """2048 -> '2K' (reasoning lengths are powers of two in the sweep)."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def profile_base_gpu(profile: Profile) -> str:
    """The catalog GPU whose datasheet fills what the profile did not measure (matched by name)."""
    norm = "".join(ch for ch in profile.device_name.lower() if ch.isalnum())
    best, found = "", FALLBACK_BASE_GPU
    for spec in catalog.gpus().values():
        for name in (spec.name, *spec.aliases):
            n = "".join(ch for ch in name.lower() if ch.isalnum())
            if n and n in norm and len(n) > len(best):
                best, found = n, spec.name
    return found


def gpu_columns(spec: GridSpec, profiles: list[Profile]) -> list[GpuColumn]:
    cols = [GpuColumn(key=g, label=catalog.gpu(g).name, base_gpu=catalog.gpu(g).name) for g in spec.gpus]
    for i, prof in enumerate(profiles):
        kind = "measured" if prof.device == "cuda" else "measured, CPU stand-in"
        cols.append(GpuColumn(key=f"{MEASURED_KEY_PREFIX}{i}", label=f"{prof.device_name} ({kind})",
                              base_gpu=profile_base_gpu(prof), profile=prof))
    return cols


def grid_scenario(model: str, weight_dtype: str, gpu: str, length: int, batch: int, policy: PolicyVariant,
                  prompt_tokens: int) -> Scenario:
    data = {
        "name": f"{model}-{weight_dtype}-{gpu}-{length}-{policy.key}-b{batch}",
        "model": {"name": model, "weight_dtype": weight_dtype},
        "hardware": {"gpu": gpu},
        "workload": {"batch_size": batch, "prompt_tokens": prompt_tokens, "reasoning_tokens": length},
        "policy": policy.policy,
    }
    return scenario_from_dict(data, "report grid")


@dataclass(frozen=True)
class Task:
    model_label: str
    model: str
    weight_dtype: str
    gpu: GpuColumn
    length: int
    batches: tuple[int, ...]
    policies: tuple[PolicyVariant, ...]
    prompt_tokens: int


# the fields of sim.schema.ProjectionSummary a point keeps
POINT_KEYS = ("fits", "throughput_tok_per_s", "hbm_peak_bytes", "hbm_saved_bytes", "hbm_capacity_bytes",
              "h2d_utilization", "transfer_share", "stall_share")


def _memory_only(sc: Scenario, profile: Profile | None) -> dict:
    """A batch past the OOM wall: only the memory figures mean anything, and they are cheap."""
    ctx = build_context(sc, profile)
    trace = batch_memory_trace(ctx, sc.workload.batch_size)
    out = dict.fromkeys(POINT_KEYS)
    out.update(fits=False, hbm_peak_bytes=trace.hbm_peak_bytes, hbm_capacity_bytes=ctx.hw.memory_bytes,
               hbm_saved_bytes=full_hbm_peak_bytes(ctx) - trace.hbm_peak_bytes)
    return out


def _link_bound_batch(task: Task, policy: PolicyVariant, util: dict[int, float], limit: int) -> int | None:
    """Smallest batch <= `limit` whose H2D utilisation reaches the bottleneck threshold: the first
    swept batch that does, refined by bisection against the previous swept batch."""
    hits = [b for b in sorted(util) if b <= limit and util[b] >= LINK_BOTTLENECK_UTILIZATION]
    if not hits:
        return None
    hi = hits[0]
    lower = [b for b in sorted(util) if b < hi]
    lo = lower[-1] if lower else 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        sc = grid_scenario(task.model, task.weight_dtype, task.gpu.base_gpu, task.length, mid, policy, task.prompt_tokens)
        if project(sc, task.gpu.profile, with_max_batch=False).h2d_utilization >= LINK_BOTTLENECK_UTILIZATION:
            hi = mid
        else:
            lo = mid
    return hi


def run_task(task: Task) -> tuple[list[dict], list[dict]]:
    """All points and limits of one (model, dtype, GPU, length) cell."""
    points, limits = [], []
    base = {"model": task.model_label, "weights": task.weight_dtype, "gpu": task.gpu.key, "length": length_label(task.length)}
    for pol in task.policies:
        sc1 = grid_scenario(task.model, task.weight_dtype, task.gpu.base_gpu, task.length, 1, pol, task.prompt_tokens)
        ctx = build_context(sc1, task.gpu.profile)
        mb = max_batch(ctx)
        batches = sorted(set(task.batches) | ({mb} if 1 <= mb < max(task.batches) else set()))
        util: dict[int, float] = {}
        for b in batches:
            sc = grid_scenario(task.model, task.weight_dtype, task.gpu.base_gpu, task.length, b, pol, task.prompt_tokens)
            if b <= mb:
                r = project(sc, task.gpu.profile, with_max_batch=False)
                figures = {k: getattr(r, k) for k in POINT_KEYS}
                if r.fits:
                    util[b] = r.h2d_utilization
            else:
                figures = _memory_only(sc, task.gpu.profile)
            points.append({**base, "policy": pol.key, "batch": b, "wall_point": b == mb and b not in task.batches,
                           **figures})
        link_b = _link_bound_batch(task, pol, util, mb) if pol.tiered else None
        limits.append({**base, "policy": pol.key, "max_batch": mb, "max_batch_limit": ctx.scenario.sim.max_batch_limit,
                       "link_bound_batch": link_b, "hbm_capacity_bytes": ctx.hw.memory_bytes})
    return points, limits


@dataclass
class GridResult:
    spec: GridSpec
    gpus: list[GpuColumn]
    points: pd.DataFrame  # one row per (model, weights, gpu, length, policy, batch)
    limits: pd.DataFrame  # one row per (model, weights, gpu, length, policy)


def tasks_for(spec: GridSpec, gpus: list[GpuColumn]) -> list[Task]:
    return [Task(label, name, wd, g, n, spec.batches, spec.policies, spec.prompt_tokens)
            for label, name in spec.models for wd in spec.weight_dtypes for g in gpus for n in spec.lengths]


def check_spec(spec: GridSpec) -> None:
    """Fail early (one line) on names the catalog does not know."""
    for _, name in spec.models:
        catalog.model(name)
    for g in spec.gpus:
        catalog.gpu(g)
    if not spec.batches or min(spec.batches) < 1:
        raise ConfigError("report grid: batches must be positive integers")


def _mp_context():
    """fork where the platform has it (fast, no re-import of __main__); spawn elsewhere. The caller
    keeps no threads running while the pool starts (the progress bar refreshes on demand)."""
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def run_grid(spec: GridSpec, profiles: list[Profile] | None = None, *, workers: int | None = None,
             on_task_done: Callable[[], None] | None = None) -> GridResult:
    """Sweep the grid. `workers` > 1 uses that many processes (default: one per CPU core)."""
    check_spec(spec)
    gpus = gpu_columns(spec, profiles or [])
    tasks = tasks_for(spec, gpus)
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    results = []
    if workers <= 1:
        for t in tasks:
            results.append(run_task(t))
            if on_task_done:
                on_task_done()
    else:
        with _mp_context().Pool(workers) as pool:
            for res in pool.imap(run_task, tasks, chunksize=1):  # imap keeps task order
                results.append(res)
                if on_task_done:
                    on_task_done()
    points = pd.DataFrame([p for pts, _ in results for p in pts])
    limits = pd.DataFrame([lim for _, lims in results for lim in lims])
    return GridResult(spec=spec, gpus=gpus, points=points, limits=limits)
