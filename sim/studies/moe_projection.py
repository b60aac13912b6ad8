"""The mixture-of-experts and hybrid projection: the catalog's MoE and layer-kind models on H200 and
B200, each in one weight dtype and on the smallest tensor-parallel group that holds it.

The same machinery as the dense 7B-70B grid (`projection_grid`): one task per (model, GPU, length),
points from `sim.decode.projection.project`, the max batch from `sim.decode.capacity.max_batch`, the
link-bound batch by the same bisection, run by `sim.runner.tasks` (local processes or Ray, with a
result store resumable), results in grid order. What it adds per policy: its projection at its own
max batch and at full_hbm's (the sequences full_hbm holds: what tiering saves and costs there), and
what binds at its own max batch - the host link where it is busy >= LINK_BOTTLENECK_UTILIZATION of
decode time (the dense report's rule), else the largest part of the middle decode step (attention
work grows linearly with the length, so the middle step is the run's mean).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar

import pandas as pd

from sim.decode.capacity import batch_counts, max_batch
from sim.decode.context import build_context
from sim.decode.projection import project, step_time
from sim.device.physics import decode_step_cost
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import Scenario, scenario_from_dict
from sim.model.units import GB
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.runner.options import Execution
from sim.runner.store import NUMBER, OPTIONAL_NUMBER, has_fields
from sim.runner.tasks import run_tasks
from sim.tiering.tiers import T0, T1, T2

from .projection_grid import (
    DEFAULT_POLICIES,
    DEFAULT_PROMPT_TOKENS,
    Cell,
    GpuColumn,
    PolicyVariant,
    cell_rows,
    length_label,
)

# a catalog model MOE_MODELS does not list: the first of these that fits every GPU of the spec
FALLBACK_DTYPES = ("bf16", "fp8", "int4")
CHOOSE = ""  # MoeModel.weight_dtype of such a model: chosen by `choose_dtype`


def formats_label(weight_dtype: str, expert_weight_dtype: str | None) -> str:
    """A model's weight format(s) as a label: 'bf16 + mxfp4 experts' where the experts have their own."""
    return f"{weight_dtype} + {expert_weight_dtype} experts" if expert_weight_dtype else weight_dtype


@dataclass(frozen=True)
class MoeModel:
    """A model of the section: its label, catalog name, the weight format it is projected in and why
    (CHOOSE: the first of FALLBACK_DTYPES that fits, `choose_dtype`)."""

    label: str
    name: str
    weight_dtype: str
    weight_group_size: int = 128
    why: str = ""
    experts: str | None = None  # None: tensor parallelism alone; "ep+dpa": experts and attention data-parallel
    expert_weight_dtype: str | None = None  # the routed experts' own format (None: weight_dtype)

    def formats(self) -> str:
        return formats_label(self.weight_dtype, self.expert_weight_dtype)

    def parallel(self, tp: int) -> dict:
        """The scenario's `parallel:` on `tp` GPUs."""
        return {"tp": tp, "ep": tp, "attention_dp": tp} if self.experts == DPA and tp > 1 else {"tp": tp}


MXFP4 = "the checkpoint's own formats: MXFP4 experts (4.25 bits a weight), bf16 attention and embeddings"
DPA = "ep+dpa"
DPA_WHY = ("the checkpoint's own format; attention data-parallel with the experts split over the group (each GPU "
           "holds its own sequences' latents), vLLM's recommended EP/DP mode for DeepSeek")
MOE_MODELS: tuple[MoeModel, ...] = (
    MoeModel("DeepSeek-R1", "deepseek-r1", "fp8", 128, "the checkpoint's own format"),
    MoeModel("DeepSeek-R1, DPA+EP", "deepseek-r1", "fp8", 128, DPA_WHY, DPA),
    MoeModel("DeepSeek-V3.2", "deepseek-v3.2", "fp8", 128, "the checkpoint's own format"),
    MoeModel("DeepSeek-V3.2, DPA+EP", "deepseek-v3.2", "fp8", 128, DPA_WHY, DPA),
    MoeModel("gpt-oss-120b", "gpt-oss-120b", "bf16", 128, MXFP4, expert_weight_dtype="mxfp4"),
    MoeModel("gpt-oss-20b", "gpt-oss-20b", "bf16", 128, MXFP4, expert_weight_dtype="mxfp4"),
    MoeModel("Qwen3-235B-A22B", "qwen3-235b-a22b", "fp8", 128, "Qwen's published FP8 checkpoint"),
    MoeModel("Qwen3-30B-A3B", "qwen3-30b-a3b", "bf16", 128, "the checkpoint's own format"),
)


def default_models() -> tuple[MoeModel, ...]:
    """MOE_MODELS, then every other catalog model with experts or layer kinds (one added to the
    catalog later joins the section by itself, its weight format chosen: `choose_dtype`)."""
    listed = {m.name for m in MOE_MODELS}
    extra = tuple(MoeModel(name, name, CHOOSE) for name, spec in catalog.models().items()
                  if name not in listed and (spec.is_moe or spec.layer_kinds))
    return MOE_MODELS + extra


def _policy(key: str) -> PolicyVariant:
    return next(p for p in DEFAULT_POLICIES if p.key == key)


AUTO_POLICY = PolicyVariant(
    key="tiered_auto", label="tiered auto", tiered=True,
    policy={"kind": "tiered", "semantics": "global", "hbm_ratio": "auto", "evict_ratio": 0.0, "compressed_ratio": 0.0,
            "prefetch": "layerwise_async", "pinned": True},
)
MOE_POLICIES: tuple[PolicyVariant, ...] = (_policy("full_hbm"), _policy("tiered_50"), AUTO_POLICY)
# 1 .. 2,048: MoE max batches reach thousands (4,096 sequences of 16K tokens are more than a run holds)
MOE_BATCHES = tuple(2 ** i for i in range(12))


@dataclass(frozen=True)
class MoeGridSpec:
    """What the section sweeps; `models` default to `default_models()` (read from the catalog)."""

    models: tuple[MoeModel, ...] = field(default_factory=default_models)
    gpus: tuple[str, ...] = ("h200-sxm", "b200")
    lengths: tuple[int, ...] = (4096, 16384)
    batches: tuple[int, ...] = MOE_BATCHES
    policies: tuple[PolicyVariant, ...] = MOE_POLICIES
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    tp_options: tuple[int, ...] = (1, 2, 4, 8)


def moe_scenario(model: MoeModel, gpu: str, tp: int, length: int, batch: int, policy: PolicyVariant,
                 prompt_tokens: int) -> Scenario:
    dtype = model.weight_dtype + (f"-{model.expert_weight_dtype}" if model.expert_weight_dtype else "")
    weights = {"weight_dtype": model.weight_dtype, "weight_group_size": model.weight_group_size}
    if model.expert_weight_dtype:
        weights["expert_weight_dtype"] = model.expert_weight_dtype
    data = {
        "name": f"{model.name}-{dtype}-{gpu}-tp{tp}{'-dpa' if model.experts else ''}-{length}-{policy.key}-b{batch}",
        "model": {"name": model.name, **weights},
        "hardware": {"gpu": gpu},
        "parallel": model.parallel(tp),
        "workload": {"batch_size": batch, "prompt_tokens": prompt_tokens, "reasoning_tokens": length},
        "policy": policy.policy,
    }
    return scenario_from_dict(data, "report MoE grid")


@dataclass(frozen=True)
class Placement:
    """Where a model runs on a GPU: the smallest TP of the spec's options that the model's shapes
    allow (`ModelSpec.tp_problem`) and whose full_hbm holds one sequence of the longest length;
    `tp` None where none does. `skipped`: (tp, why) of each smaller option."""

    model: MoeModel
    gpu: str
    tp: int | None
    skipped: tuple[tuple[int, str], ...]
    weights_bytes_per_gpu: float | None = None
    hbm_capacity_bytes: float | None = None
    kv_by_kind: dict = field(default_factory=dict)  # one GPU's shard: ModelSpec.kv_by_kind


def place(model: MoeModel, gpu: str, spec: MoeGridSpec) -> Placement:
    """`Placement` of `model` on `gpu`: TP options tried from the smallest."""
    shapes = catalog.model(model.name)
    skipped = []
    for tp in spec.tp_options:
        problem = shapes.parallel_problem(*(model.parallel(tp).get(k, 1) for k in ("tp", "ep", "attention_dp")))
        if problem:
            skipped.append((tp, problem[1]))
            continue
        sc = moe_scenario(model, gpu, tp, max(spec.lengths), 1, _policy("full_hbm"), spec.prompt_tokens)
        ctx = build_context(sc)
        if max_batch(ctx) >= 1:
            return Placement(model, gpu, tp, tuple(skipped), ctx.weights_bytes, ctx.hw.memory_bytes,
                             ctx.model.kv_by_kind(sc.model.kv_dtype))
        skipped.append((tp, f"weights {ctx.weights_bytes / GB:,.1f} GB/GPU + one sequence > {ctx.hw.memory_bytes / GB:,.1f} GB"))
    return Placement(model, gpu, None, tuple(skipped))


# ---- one task: a (model, GPU, length) ---------------------------------------------------------

# a policy's projection (ProjectionSummary fields) at its own max batch (at_max_<key>) and at
# full_hbm's max batch, the sequences full_hbm holds (at_full_max_<key>)
AT_KEYS = ("throughput_tok_per_s", "h2d_utilization", "hbm_peak_bytes", "hbm_saved_bytes", "stall_share")
# the middle decode step at the max batch, in parts (`step_parts`), and the words naming each when it binds
BINDING_WORDS = {"mid_step_stall_share": "host link (GPU waits on copies)", "mid_step_gemm_share": "GPU weight GEMMs",
                 "mid_step_attention_share": "GPU attention over the KV",
                 "mid_step_collective_share": "TP all-reduce (NVLink)",
                 "mid_step_other_share": "GPU kernel overheads and launches"}
PART_KEYS = tuple(BINDING_WORDS)
EXTRA_FIELDS = {"model": str, "weights": str, "gpu": str, "length": str, "policy": str, "tp": int,
                "full_hbm_max_batch": int, "binds": str,
                **{f"{at}_{k}": OPTIONAL_NUMBER for at in ("at_max", "at_full_max") for k in AT_KEYS},
                **dict.fromkeys(PART_KEYS, NUMBER)}


@dataclass(frozen=True)
class MoeCell(Cell):
    """A dense `Cell` whose scenarios carry the model's weight group size and TP; its result adds
    one `extras` row per policy (EXTRA_FIELDS)."""

    kind: ClassVar[str] = "moe projection cell"
    tp: int = 1
    weight_group_size: int = 128
    experts: str | None = None  # MoeModel.experts
    expert_weight_dtype: str | None = None  # MoeModel.expert_weight_dtype

    @property
    def weights_label(self) -> str:
        return formats_label(self.weight_dtype, self.expert_weight_dtype)

    def scenario(self, batch: int, policy: PolicyVariant) -> Scenario:
        m = MoeModel(self.model_label, self.model, self.weight_dtype, self.weight_group_size, experts=self.experts,
                     expert_weight_dtype=self.expert_weight_dtype)
        return moe_scenario(m, self.gpu.base_gpu, self.tp, self.length, batch, policy, self.prompt_tokens)

    def run(self) -> dict[str, list[dict]]:
        points, limits = cell_rows(self)
        return {"points": points, "limits": limits, "extras": extra_rows(self, points, limits)}

    def accepts(self, result: Any) -> bool:
        if not (isinstance(result, dict) and set(result) == {"points", "limits", "extras"}):
            return False
        dense = {"points": result["points"], "limits": result["limits"]}
        extras = result["extras"]
        return (super().accepts(dense) and isinstance(extras, list) and len(extras) == len(self.policies)
                and all(has_fields(r, EXTRA_FIELDS) for r in extras))


def step_parts(sc: Scenario) -> dict[str, float]:
    """Shares of the middle decode step of `sc`'s batch: waiting on the host link (stall), weight
    GEMMs, attention, the layer's collectives (TP all-reduces), the rest (kernel overheads, LM head,
    host launch time beyond the device's)."""
    ctx = build_context(sc)
    c = batch_counts(ctx, sc.workload.batch_size)
    mid = len(c.active) // 2
    t0, t1, t2 = (int(x) for x in c.attended[mid, [T0, T1, T2]])
    batch = int(c.active[mid])
    st = step_time(ctx, batch, t0, t1, t2)
    m, p = sc.model, sc.policy
    cost = decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, p.prefetch, batch, t0, t1, t2,
                            ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer,
                            ctx.policy.tiering and p.prefetch != "per_interval", p.access, p.staging_buffers)
    n, layer = cost.num_layers, cost.layer
    stall, gemm = st.step_s - st.compute_s, n * layer.gemm_s
    attention, collective = n * layer.attention_s, n * layer.allreduce_s
    other = max(0.0, st.step_s - stall - gemm - attention - collective)
    return {k: v / st.step_s for k, v in zip(PART_KEYS, (stall, gemm, attention, collective, other))}


def binding(h2d_utilization: float, parts: dict[str, float]) -> str:
    """The host link where it is busy >= LINK_BOTTLENECK_UTILIZATION of decode time (the dense
    report's bottleneck rule), else the largest part of the middle step (`step_parts`)."""
    if h2d_utilization >= LINK_BOTTLENECK_UTILIZATION:
        return f"host link (H2D busy >= {LINK_BOTTLENECK_UTILIZATION:.0%})"
    top = max(parts, key=lambda k: (parts[k], k))
    return f"{BINDING_WORDS[top]}, {parts[top]:.0%} of a step"


def _at_batch(cell: MoeCell, pol: PolicyVariant, batch: int, points: list[dict]) -> dict:
    """AT_KEYS of `batch` sequences: the cell's point where it has one (every swept batch up to the
    max batch, and the max batch itself below the largest swept one), else projected here; None
    where nothing fits."""
    if batch < 1:
        return dict.fromkeys(AT_KEYS)
    for p in points:
        if p["policy"] == pol.key and p["batch"] == batch:
            return {k: p[k] for k in AT_KEYS}
    r = project(cell.scenario(batch, pol), cell.gpu.profile, with_max_batch=False)
    return {k: getattr(r, k) for k in AT_KEYS}


def extra_rows(cell: MoeCell, points: list[dict], limits: list[dict]) -> list[dict]:
    """Per policy: its projection at its own max batch and at full_hbm's, and what binds at its own."""
    full_mb = next(lim["max_batch"] for lim in limits if lim["policy"] == "full_hbm")
    rows = []
    for pol, lim in zip(cell.policies, limits):
        mb = lim["max_batch"]
        at, at_full = _at_batch(cell, pol, mb, points), _at_batch(cell, pol, full_mb, points)
        parts, binds = dict.fromkeys(PART_KEYS, 0.0), "does not fit"
        if mb >= 1:
            parts = step_parts(cell.scenario(mb, pol))
            binds = binding(at["h2d_utilization"], parts)
        rows.append({**{k: lim[k] for k in ("model", "weights", "gpu", "length", "policy")}, "tp": cell.tp,
                     "full_hbm_max_batch": full_mb, "binds": binds, **{f"at_max_{k}": at[k] for k in AT_KEYS},
                     **{f"at_full_max_{k}": at_full[k] for k in AT_KEYS}, **parts})
    return rows


# ---- the grid -----------------------------------------------------------------------------------

@dataclass
class MoeResult:
    spec: MoeGridSpec
    placements: list[Placement]
    points: pd.DataFrame  # one row per (model, gpu, length, policy, batch), as the dense grid's
    limits: pd.DataFrame  # one row per (model, gpu, length, policy): the dense limits + EXTRA_FIELDS
    computed: int = 0
    stored: int = 0
    damaged: int = 0


def check_moe_spec(spec: MoeGridSpec) -> None:
    """Fail early (one line) on names the catalog does not know or a dtype it has no bytes for."""
    for m in spec.models:
        catalog.model(m.name)
        checked = m if m.weight_dtype != CHOOSE else replace(m, weight_dtype=FALLBACK_DTYPES[0])
        moe_scenario(checked, spec.gpus[0] if spec.gpus else "h200-sxm", 1, 1, 1, spec.policies[0], spec.prompt_tokens)
    for g in spec.gpus:
        catalog.gpu(g)
    if not spec.batches or min(spec.batches) < 1 or not spec.lengths:
        raise ConfigError("report MoE grid: batches and lengths must be positive integers")


def moe_cells(spec: MoeGridSpec, placements: list[Placement]) -> list[MoeCell]:
    cells = []
    for pl in placements:
        if pl.tp is None:
            continue
        gpu = GpuColumn(key=pl.gpu, label=catalog.gpu(pl.gpu).name, base_gpu=catalog.gpu(pl.gpu).name)
        cells += [MoeCell(pl.model.label, pl.model.name, pl.model.weight_dtype, gpu, n, spec.batches, spec.policies,
                          spec.prompt_tokens, tp=pl.tp, weight_group_size=pl.model.weight_group_size,
                          experts=pl.model.experts, expert_weight_dtype=pl.model.expert_weight_dtype)
                  for n in spec.lengths]
    return cells


def choose_dtype(model: MoeModel, spec: MoeGridSpec) -> list[Placement]:
    """`model` on every GPU of the spec in its weight format, or - CHOOSE - in the first of
    FALLBACK_DTYPES with which it fits every GPU (the last one tried where none does)."""
    if model.weight_dtype != CHOOSE:
        return [place(model, g, spec) for g in spec.gpus]
    tried = []
    for dtype in FALLBACK_DTYPES:
        why = (f"not chosen by hand: the first of {', '.join(FALLBACK_DTYPES)} that fits every GPU here" +
               (f" ({', '.join(tried)} {'does' if len(tried) == 1 else 'do'} not)" if tried else ""))
        placed = [place(replace(model, weight_dtype=dtype, why=why), g, spec) for g in spec.gpus]
        if all(pl.tp is not None for pl in placed):
            break
        tried.append(dtype)
    return placed


def placements_for(spec: MoeGridSpec) -> list[Placement]:
    """Every (model, GPU) placed, in section order (model, then GPU)."""
    check_moe_spec(spec)
    return [pl for m in spec.models for pl in choose_dtype(m, spec)]


def run_moe_grid(spec: MoeGridSpec, *, execution: Execution | None = None, workers: int | None = None,
                 on_task_done: Callable[[], None] | None = None,
                 placements: list[Placement] | None = None) -> MoeResult:
    """Place every model, then sweep its cells as `projection_grid.run_grid` sweeps the dense grid
    (longest lengths first; results in grid order, whatever the scheduling)."""
    placements = placements if placements is not None else placements_for(spec)
    execution = execution or Execution(workers=workers)
    cells = moe_cells(spec, placements)
    order = sorted(range(len(cells)), key=lambda i: -cells[i].length)

    def advance(n: int) -> None:
        for _ in range(n if on_task_done else 0):
            on_task_done()

    done = run_tasks([cells[i] for i in order], execution.runner(), store=execution.store(), advance=advance)
    results: list[Any] = [None] * len(cells)
    for i, res in zip(order, done.results):
        results[i] = res
    points = pd.DataFrame([p for res in results for p in res["points"]])
    limits = pd.DataFrame([{**lim, **ext} for res in results for lim, ext in zip(res["limits"], res["extras"])])
    return MoeResult(spec=spec, placements=placements, points=points, limits=limits, computed=done.computed,
                     stored=done.stored_before, damaged=done.damaged)


def length_labels(spec: MoeGridSpec) -> list[str]:
    return [length_label(n) for n in spec.lengths]
