"""The projection sweep: models x weight dtypes x GPUs x reasoning lengths x policies x batches.

Every point comes from `sim.decode.projection.project` (fast, analytic); the max batch is computed once
per (model, dtype, GPU, length, policy) with `sim.decode.capacity.max_batch`, because that search is the
expensive part. Work is split into one task (`Cell`) per (model, dtype, GPU, length), run by the
sweep machinery (`sim.runner.tasks`): local processes or Ray, and with a result store, resumable;
results are reassembled in grid order, so the output does not depend on scheduling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar

import pandas as pd

from sim.decode.capacity import batch_memory_trace, full_hbm_peak_bytes, max_batch
from sim.decode.context import build_context
from sim.decode.projection import project
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.profile import Profile
from sim.inputs.scenario import Scenario, scenario_from_dict
from sim.model.units import PERCENT
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.runner.options import Execution
from sim.runner.store import NUMBER, OPTIONAL_NUMBER, digest, has_fields, result_key
from sim.runner.tasks import run_tasks

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
class Cell:
    """One (model, dtype, GPU, length) of the grid as a task (`sim.runner.tasks`): every policy's
    points and limits, keyed in a store by the batch-1 scenario of each policy, the batches, the
    measured profile's contents and the labels the rows carry."""

    kind: ClassVar[str] = "projection cell"
    model_label: str
    model: str
    weight_dtype: str
    gpu: GpuColumn
    length: int
    batches: tuple[int, ...]
    policies: tuple[PolicyVariant, ...]
    prompt_tokens: int

    def scenario(self, batch: int, policy: PolicyVariant) -> Scenario:
        return grid_scenario(self.model, self.weight_dtype, self.gpu.base_gpu, self.length, batch, policy, self.prompt_tokens)

    @property
    def weights_label(self) -> str:
        """The `weights` label of the cell's rows: its weight dtype."""
        return self.weight_dtype

    def inputs(self) -> dict[str, Any]:
        prof = self.gpu.profile
        return {"labels": {"model": self.model_label, "gpu": self.gpu.key}, "batches": list(self.batches),
                "policies": [asdict(p) for p in self.policies],
                "scenarios": [self.scenario(1, p).model_dump(mode="json") for p in self.policies],
                "profile_sha256": digest(prof.model_dump(mode="json")) if prof else None}

    @property
    def key(self) -> str:
        return result_key(self.kind, self.inputs())

    def run(self) -> dict[str, list[dict]]:
        points, limits = cell_rows(self)
        return {"points": points, "limits": limits}

    def accepts(self, result: Any) -> bool:
        """A stored result is this cell's rows: cell_rows' points and limits, labelled as this cell."""
        if not (isinstance(result, dict) and set(result) == {"points", "limits"}
                and isinstance(result["points"], list) and isinstance(result["limits"], list)):
            return False
        labels = {"model": self.model_label, "weights": self.weights_label, "gpu": self.gpu.key,
                  "length": length_label(self.length)}
        policies = {p.key for p in self.policies}
        rows = [(r, POINT_FIELDS) for r in result["points"]] + [(r, LIMIT_FIELDS) for r in result["limits"]]
        return all(has_fields(r, fields) and all(r[k] == v for k, v in labels.items()) and r["policy"] in policies
                   for r, fields in rows)


# the fields of sim.outputs.schema.ProjectionSummary a point keeps
POINT_KEYS = ("fits", "throughput_tok_per_s", "hbm_peak_bytes", "hbm_saved_bytes", "hbm_capacity_bytes",
              "h2d_utilization", "transfer_share", "stall_share")
# a cell's rows as cell_rows gives them (Cell.accepts)
_LABELS = {"model": str, "weights": str, "gpu": str, "length": str, "policy": str}
POINT_FIELDS = {**_LABELS, "batch": int, "wall_point": bool, "fits": bool,
                **{k: OPTIONAL_NUMBER for k in POINT_KEYS if k != "fits"}}
LIMIT_FIELDS = {**_LABELS, "max_batch": int, "max_batch_limit": int, "link_bound_batch": (int, type(None)),
                "hbm_capacity_bytes": NUMBER}


def _memory_only(sc: Scenario, profile: Profile | None) -> dict:
    """A batch past the OOM wall: only the memory figures mean anything, and they are cheap."""
    ctx = build_context(sc, profile)
    trace = batch_memory_trace(ctx, sc.workload.batch_size)
    out = dict.fromkeys(POINT_KEYS)
    out.update(fits=False, hbm_peak_bytes=trace.hbm_peak_bytes, hbm_capacity_bytes=ctx.hw.memory_bytes,
               hbm_saved_bytes=full_hbm_peak_bytes(ctx) - trace.hbm_peak_bytes)
    return out


def _link_bound_batch(cell: Cell, policy: PolicyVariant, util: dict[int, float], limit: int) -> int | None:
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
        if project(cell.scenario(mid, policy), cell.gpu.profile, with_max_batch=False).h2d_utilization >= LINK_BOTTLENECK_UTILIZATION:
            hi = mid
        else:
            lo = mid
    return hi


def cell_rows(cell: Cell) -> tuple[list[dict], list[dict]]:
    """All points and limits of one (model, dtype, GPU, length) cell."""
    points, limits = [], []
    base = {"model": cell.model_label, "weights": cell.weights_label, "gpu": cell.gpu.key, "length": length_label(cell.length)}
    for pol in cell.policies:
        ctx = build_context(cell.scenario(1, pol), cell.gpu.profile)
        mb = max_batch(ctx)
        batches = sorted(set(cell.batches) | ({mb} if 1 <= mb < max(cell.batches) else set()))
        util: dict[int, float] = {}
        for b in batches:
            sc = cell.scenario(b, pol)
            if b <= mb:
                r = project(sc, cell.gpu.profile, with_max_batch=False)
                figures = {k: getattr(r, k) for k in POINT_KEYS}
                if r.fits:
                    util[b] = r.h2d_utilization
            else:
                figures = _memory_only(sc, cell.gpu.profile)
            points.append({**base, "policy": pol.key, "batch": b, "wall_point": b == mb and b not in cell.batches,
                           **figures})
        link_b = _link_bound_batch(cell, pol, util, mb) if pol.tiered else None
        limits.append({**base, "policy": pol.key, "max_batch": mb, "max_batch_limit": ctx.scenario.sim.max_batch_limit,
                       "link_bound_batch": link_b, "hbm_capacity_bytes": ctx.hw.memory_bytes})
    return points, limits


@dataclass
class GridResult:
    spec: GridSpec
    gpus: list[GpuColumn]
    points: pd.DataFrame  # one row per (model, weights, gpu, length, policy, batch)
    limits: pd.DataFrame  # one row per (model, weights, gpu, length, policy)
    computed: int = 0  # cells computed by this run
    stored: int = 0  # cells found in the result store
    damaged: int = 0  # entries the store held but could not verify: computed again


def cells_for(spec: GridSpec, gpus: list[GpuColumn]) -> list[Cell]:
    return [Cell(label, name, wd, g, n, spec.batches, spec.policies, spec.prompt_tokens)
            for label, name in spec.models for wd in spec.weight_dtypes for g in gpus for n in spec.lengths]


def check_spec(spec: GridSpec) -> None:
    """Fail early (one line) on names the catalog does not know."""
    for _, name in spec.models:
        catalog.model(name)
    for g in spec.gpus:
        catalog.gpu(g)
    if not spec.batches or min(spec.batches) < 1:
        raise ConfigError("report grid: batches must be positive integers")


RAY_BATCH = 4  # cells per Ray task (a cell takes 10-200 ms)


def run_grid(spec: GridSpec, profiles: list[Profile] | None = None, *, execution: Execution | None = None,
             workers: int | None = None, on_task_done: Callable[[], None] | None = None,
             meanwhile: Callable[[], None] | None = None) -> GridResult:
    """Sweep the grid with `execution` (default: local processes, one per CPU core, or `workers`;
    no store); `meanwhile()`: other work for this process while the workers compute
    (sim.runner.tasks.run_tasks). Longest cells (longest sequences) go first, so no worker is left
    with a long one at the end."""
    check_spec(spec)
    execution = execution or Execution(workers=workers)
    gpus = gpu_columns(spec, profiles or [])
    cells = cells_for(spec, gpus)
    order = sorted(range(len(cells)), key=lambda i: -cells[i].length)  # stable: grid order within a length

    def advance(n: int) -> None:
        for _ in range(n if on_task_done else 0):
            on_task_done()

    done = run_tasks([cells[i] for i in order], execution.runner(), store=execution.store(),
                     batch=RAY_BATCH if execution.executor == "ray" else 1, advance=advance, meanwhile=meanwhile)
    results: list[Any] = [None] * len(cells)
    for i, res in zip(order, done.results):
        results[i] = res
    points = pd.DataFrame([p for res in results for p in res["points"]])
    limits = pd.DataFrame([lim for res in results for lim in res["limits"]])
    return GridResult(spec=spec, gpus=gpus, points=points, limits=limits, computed=done.computed,
                      stored=done.stored_before, damaged=done.damaged)
