"""`hwprobe run`'s measurement: a synthetic model with the scenario's shapes decodes through the
real tiered KV cache; every step is timed (CUDA events on a GPU, perf_counter on the CPU) and
reported with the simulator's summary keys and per-step columns, so the two can be compared.
The definitions are the simulator's: stall_s = time compute waits for link transfers, compute_s =
step_s - stall_s, decode time = the sum of step times, transfer share = the union of both
directions' link-busy time over decode time.

A model too large for the device runs a subset of its layers; per-layer time, bytes and memory are
then scaled to the full depth and the summary says so (`layers_run`, `layer_scale`).
"""

from __future__ import annotations

import gc
import os
import platform
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.decode.context import build_context
from sim.device.intervals import busy_union_s
from sim.device.memory import ACTIVATION_BUFFERS, activation_bytes, staging_bytes
from sim.inputs.catalog import resolve_model
from sim.inputs.errors import ConfigError
from sim.inputs.lengths import draw_lengths
from sim.inputs.scenario import Scenario
from sim.model.units import GB, KV_TENSORS, MS
from sim.outputs.schema import P50, STEP_COLUMNS, MeasuredSummary, tpot_percentiles_s
from sim.tiering.pressure import resolve
from sim.tiering.tier_plan import sequence_tiers
from sim.tiering.tiers import T0, T1, T2, T3, TIERS, TierPolicy

from .cache import CacheGeometry, CacheOptions, Runtime, TieredKVCache
from .cache.host_attention import simulator_split_rule
from .cache.peaks import TierPeaks, batch_peaks
from .model import ModelShapes, SyntheticTransformer
from .model.qlinear import QUANTISED_WEIGHTS, int4_supported
from .model.synthetic import GATE_UP

MEMORY_HEADROOM = 0.85  # share of free device memory a run may plan to use (allocator slack, workspace)
# Widest-activation buffers the real decode holds beyond the simulator's model (sim/device/memory.py
# ACTIVATION_BUFFERS: residual + scratch): the qkv and gate/up outputs are alive too. A margin on the
# simulator's formula, not a second one: planning layers with too small a figure risks running out.
EXTRA_ACTIVATION_BUFFERS = 2
PREFILL_MODES = ("random", "model")
# attention: re-tier on this cache's own attention scores (the design); simulator: replay the
# simulator's seeded decisions, so both move the same tokens and a comparison isolates timing
SCORE_SOURCES = ("attention", "simulator")
RUN_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "float32": "float32"}
SEED_MODEL, SEED_PROMPT, SEED_KV = 11, 12, 13  # offsets into the scenario seed, one per random stream
HOST_BOUND_SHARE = 0.9  # host time to enqueue a step >= this share of its GPU time: launch-bound


@dataclass(frozen=True)
class RunOptions:
    device: str = "cuda"
    layers: int | None = None  # cap on layers run (default: all that fit)
    attention: str = "merged"
    prefill: str = "random"  # random: seeded K/V for the prompt (fast); model: real prefill forward
    dtype: str | None = None  # bf16 | fp16 | float32; default the scenario's kv_dtype (bf16 if not a float type)
    cpu_threads: int | None = None  # torch intra-op threads on the CPU (tiny shapes run fastest on 1)
    scores: str = "attention"  # see SCORE_SOURCES
    # policy.access split: share of each layer's host slots attended on the host; None: the
    # simulator's choice for each step's tier counts (cache/host_attention.py simulator_split_rule)
    host_fraction: float | None = None


@dataclass
class Measurement:
    summary: MeasuredSummary
    steps: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def _torch_dtype(torch, name: str):
    return getattr(torch, RUN_DTYPES[name])


def check_supported(scenario: Scenario, spec) -> None:
    """What the real cache does not implement is a one-line input error, not a traceback."""
    p = scenario.policy
    if p.kind == "tiered" and p.compressed_ratio > 0 and p.compressed_dtype != "int8":
        raise ConfigError(f"hwprobe implements int8 T2 only, got {p.compressed_dtype!r}", field="policy.compressed_dtype")
    if spec.is_moe:
        raise ConfigError("mixture-of-experts models are not supported by hwprobe run", field="model")
    group = min(p.compressed_group_size, spec.head_dim)
    if spec.head_dim % group:
        raise ConfigError(f"group size {group} must divide head_dim {spec.head_dim}", field="policy.compressed_group_size")
    if spec.num_heads % spec.num_kv_heads:
        raise ConfigError("num_heads must be a multiple of num_kv_heads", field="model")


def _run_dtype_name(scenario: Scenario, opts: RunOptions) -> str:
    if opts.dtype:
        if opts.dtype not in RUN_DTYPES:
            raise ConfigError(f"--dtype: expected one of {', '.join(RUN_DTYPES)}, got {opts.dtype!r}")
        return opts.dtype
    return scenario.model.kv_dtype if scenario.model.kv_dtype in ("bf16", "fp16") else "bf16"


def _weight_dtype(scenario: Scenario, shapes: ModelShapes, run_dtype: str) -> tuple[str, int]:
    """(weight dtype the synthetic model runs, group): int4 where the scenario asks for it and
    every projection's shape suits the kernel, else the activation dtype."""
    want, group = scenario.model.weight_dtype, scenario.model.weight_group_size
    if want not in QUANTISED_WEIGHTS:
        return run_dtype, group
    s = shapes
    for out_f, in_f in ((s.q_dim + 2 * s.kv_dim, s.hidden), (s.hidden, s.q_dim), (GATE_UP * s.intermediate, s.hidden),
                        (s.hidden, s.intermediate)):
        why = int4_supported(out_f, in_f, group)
        if why:
            raise ConfigError(f"int4 weights for a {out_f} x {in_f} projection: {why}", field="model.weight_group_size")
    return want, group


def _available_bytes(rt) -> float:
    if rt.is_cuda:
        free, _ = rt.torch.cuda.mem_get_info(rt.device)
        return float(free)
    return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def estimate_device_bytes(shapes: ModelShapes, layers: int, batch: int, peaks: TierPeaks, itemsize: int,
                          staging_buffers: int, prefetch: str, layer_weight_bytes: float | None = None,
                          access: str = "prefetch") -> float:
    """Weights + T0 + staging + activations for `layers` layers, to pick a subset that fits.
    layer_weight_bytes: one layer's weights (default: its parameters at `itemsize`).
    Staging and activations are the simulator's formulas (sim/device/memory.py) at the run's itemsize, plus
    the attention workspace (one more staged layer) and EXTRA_ACTIVATION_BUFFERS; T2 counts at full
    precision, an upper bound. host_attention stages nothing."""
    row = KV_TENSORS * shapes.kv_dim * itemsize  # one token, one layer
    staged_layer = 0 if access == "host_attention" else batch * (peaks.t1 + peaks.t2) * row
    weights = shapes.layer_params() * itemsize if layer_weight_bytes is None else layer_weight_bytes
    per_layer = weights + batch * peaks.t0 * row
    activations = activation_bytes(shapes.spec, batch, itemsize=itemsize,
                                   buffers=ACTIVATION_BUFFERS + EXTRA_ACTIVATION_BUFFERS)
    fixed = (shapes.non_layer_params() * itemsize + activations
             + staging_bytes(prefetch, staging_buffers, layers, staged_layer) + staged_layer)
    return fixed + layers * per_layer


def choose_layers(rt, shapes: ModelShapes, requested: int | None, batch: int, peaks: TierPeaks, itemsize: int,
                  policy_cfg, layer_weight_bytes: float | None = None) -> int:
    total = shapes.layers
    if requested is not None:
        if requested < 1:
            raise ConfigError(f"--layers: expected at least 1, got {requested}")
        return min(requested, total)
    budget = MEMORY_HEADROOM * _available_bytes(rt)

    def need(n: int) -> float:
        return estimate_device_bytes(shapes, n, batch, peaks, itemsize, policy_cfg.staging_buffers,
                                     policy_cfg.prefetch, layer_weight_bytes, policy_cfg.access)

    for n in range(total, 0, -1):
        if need(n) <= budget:
            return n
    need = need(1)
    raise ConfigError(f"does not fit on {rt.device}: one layer alone needs {need / GB:.2f} GB, "
                      f"{budget / GB:.2f} GB usable")


def _warm_up(rt, model, batch: int, dtype) -> None:
    """One decode step through a throwaway cache: cuBLAS handles, kernel selection, allocator pools."""
    s = model.shapes
    geom = CacheGeometry(s.layers, batch, s.kv_heads, s.head_dim)
    cache = TieredKVCache(rt, geom, TierPolicy(kind="full_hbm"), CacheOptions(), 1, [1] * batch, dtype)
    tokens = rt.torch.zeros(batch, dtype=rt.torch.long, device=rt.device)
    cache.begin_step()
    model.decode_step(tokens, cache).argmax(-1)
    cache.end_step()
    rt.synchronize()


def measure_run(scenario: Scenario, opts: RunOptions) -> Measurement:
    import torch

    spec = resolve_model(scenario.model)
    check_supported(scenario, spec)
    if opts.prefill not in PREFILL_MODES:
        raise ConfigError(f"--prefill: expected one of {', '.join(PREFILL_MODES)}, got {opts.prefill!r}")
    if opts.scores not in SCORE_SOURCES:
        raise ConfigError(f"--scores: expected one of {', '.join(SCORE_SOURCES)}, got {opts.scores!r}")
    w, p = scenario.workload, scenario.policy
    check_access_options(p, opts.host_fraction, opts.attention)
    dtype_name = _run_dtype_name(scenario, opts)
    dtype = _torch_dtype(torch, dtype_name)
    itemsize = torch.empty((), dtype=dtype).element_size()
    rt = Runtime(opts.device)
    if rt.is_cuda:  # a previous run in this process (validate) may hold cached blocks: free them first
        gc.collect()
        torch.cuda.empty_cache()
    elif opts.cpu_threads:
        torch.set_num_threads(opts.cpu_threads)
    lengths = draw_lengths(w, w.batch_size)
    # hbm_ratio auto: the shares the simulator's memory pressure sets for this batch (datasheet HBM)
    policy = resolve(build_context(scenario), lengths, TierPolicy.from_config(p))
    peaks = batch_peaks(policy, w.prompt_tokens, lengths) if policy.tiering else TierPeaks(
        w.prompt_tokens + int(lengths.max()), 0, 0)
    full = ModelShapes.from_spec(spec)
    weight_dtype, group = _weight_dtype(scenario, full, dtype_name)
    layer_weights = spec.layer_weight_bytes(weight_dtype, group) if weight_dtype in QUANTISED_WEIGHTS else None
    n_layers = choose_layers(rt, full, opts.layers, w.batch_size, peaks, itemsize, p, layer_weights)
    shapes = ModelShapes.from_spec(spec, n_layers)
    scale = full.layers / n_layers
    notes = []
    if n_layers < full.layers:
        notes.append(f"ran {n_layers} of {full.layers} layers; per-layer time, bytes and memory scaled x{scale:.3g}")
    if weight_dtype in QUANTISED_WEIGHTS:
        notes.append(f"{weight_dtype} weights: torch's tinygemm kernels, groups of {group} with a bf16 scale and zero")
    elif scenario.model.weight_dtype != dtype_name:
        notes.append(f"weights run in {dtype_name} (scenario says {scenario.model.weight_dtype}): torch has no "
                     f"{scenario.model.weight_dtype} weight-only kernel fit for timing")
    if scenario.model.kv_dtype != dtype_name:
        notes.append(f"KV runs in {dtype_name} (scenario says {scenario.model.kv_dtype})")

    model = SyntheticTransformer(shapes, rt.device, dtype, w.seed + SEED_MODEL, weight_dtype, group)
    geom = CacheGeometry(n_layers, w.batch_size, shapes.kv_heads, shapes.head_dim)
    _warm_up(rt, model, w.batch_size, dtype)
    replay = sequence_tiers(scenario, policy, lengths) if opts.scores == "simulator" else None
    split_rule = None
    if p.access == "split" and opts.host_fraction is None:
        split_rule = simulator_split_rule(build_context(scenario))
        notes.append(f"split: the host's share of each layer's host slots is the simulator's choice per step "
                     f"(decode_step_cost on the {scenario.hardware.gpu} model)")
    elif p.access == "split":
        notes.append(f"split: a fixed {opts.host_fraction:g} of each layer's host slots attended on the host")
    cache = TieredKVCache(rt, geom, policy, CacheOptions.from_policy(p, opts.attention, opts.host_fraction),
                          w.prompt_tokens, lengths, dtype, replay, split_rule)
    gen = torch.Generator(device=rt.device).manual_seed(w.seed + SEED_PROMPT)
    if opts.prefill == "model" and w.prompt_tokens:
        prompt = torch.randint(0, shapes.vocab, (w.batch_size, w.prompt_tokens), generator=gen, device=rt.device)
        tokens = model.prefill(prompt, cache).argmax(-1)
    else:
        cache.fill_prompt_random(torch.Generator(device=rt.device).manual_seed(w.seed + SEED_KV))
        tokens = torch.randint(0, shapes.vocab, (w.batch_size,), generator=gen, device=rt.device)
    raw = _decode_loop(rt, model, cache, tokens)
    return _summarise(scenario, spec, rt, model, cache, raw, scale, n_layers, dtype_name, opts, notes)


def check_access_options(p, f: float | None, attention: str) -> None:
    """--host-fraction and --attention against the scenario's policy.access (p: its PolicyCfg)."""
    if f is not None and not 0.0 <= f <= 1.0:
        raise ConfigError(f"expected 0 to 1, got {f:g}", field="--host-fraction")
    if f is not None and p.access != "split":
        raise ConfigError(f"applies to policy.access split, the scenario has {p.access!r}", field="--host-fraction")
    if p.access != "prefetch" and attention != "merged":
        raise ConfigError(f"policy.access {p.access} merges the host's partial attention by LSE: it runs with "
                          f"--attention merged", field="--attention")


@dataclass
class _Raw:
    begin: object
    marks: list  # per step: (step begin, layers end, step end)
    counters: list
    counts: list
    hbm_bytes: list
    host_bytes: list
    active: list
    hbm_peak_bytes: float
    host_s: list = field(default_factory=list)  # host time to enqueue each step (no synchronisation)


def _decode_loop(rt, model, cache, tokens) -> _Raw:
    torch = rt.torch
    weights = model.weight_bytes()
    if rt.is_cuda:
        torch.cuda.reset_peak_memory_stats(rt.device)
    rt.synchronize()
    begin = rt.mark()
    raw = _Raw(begin, [], [], [], [], [], [], 0.0)
    for s in range(cache.steps):
        h0 = time.perf_counter()
        m_step = rt.mark()
        cache.begin_step()
        x = model.embed(tokens)
        for i in range(model.shapes.layers):
            x = model.layer(i, x, cache)
        m_layers = rt.mark()
        tokens = model.head(x).argmax(dim=-1)
        counts = cache.end_step()
        raw.marks.append((m_step, m_layers, rt.mark()))
        raw.host_s.append(time.perf_counter() - h0)
        raw.counters.append(cache.take_counters())
        raw.counts.append(counts)
        raw.active.append(int(np.count_nonzero(cache.lengths > s)))
        raw.hbm_bytes.append(torch.cuda.memory_allocated(rt.device) if rt.is_cuda else weights + cache.device_kv_bytes())
        raw.host_bytes.append(cache.host_kv_bytes())
    rt.synchronize()
    cache.drain()  # an offload of the last re-tier lands in the host stores (outside the timed span)
    cache.close()
    tracked = max(raw.hbm_bytes + [weights + cache.device_kv_peak_bytes])
    raw.hbm_peak_bytes = float(torch.cuda.max_memory_allocated(rt.device) if rt.is_cuda else tracked)
    return raw


def _summarise(scenario, spec, rt, model, cache, raw: _Raw, scale: float, n_layers: int, dtype_name: str,
               opts: RunOptions, notes: list[str]) -> Measurement:
    depth = _scale_to_depth(raw, rt.elapsed_s, model.non_layer_bytes(), scale)
    host_p50 = float(np.percentile(raw.host_s, P50)) if raw.marks else None
    if rt.is_cuda and raw.marks and _launch_bound(host_p50, depth.run_step_s):
        notes.append(f"launch-bound: the host needs {host_p50 / MS:.2f} ms to enqueue a step "
                     f"(GPU step p50 {np.percentile(depth.run_step_s, P50) / MS:.2f} ms); step time is the Python loop's")
    summary = _measured_summary(scenario, spec, rt, model, cache, raw, depth, _link_busy(raw, rt.elapsed_s), scale,
                                n_layers, dtype_name, opts, notes, host_p50)
    return Measurement(summary=summary, steps=_step_table(depth, raw.active), notes=notes)


def _launch_bound(host_p50_s: float, gpu_step_s: np.ndarray) -> bool:
    """The host needs about as long to enqueue a step as the GPU takes to run it."""
    return host_p50_s >= HOST_BOUND_SHARE * float(np.percentile(gpu_step_s, P50))


@dataclass(frozen=True)
class _FullDepth:
    """Per-step figures scaled to the model's full depth: the layers, the re-tiers and their bytes
    scale with it; embedding, LM head and sampling do not."""

    run_step_s: np.ndarray  # as timed, the layers run
    step_s: np.ndarray
    stall_s: np.ndarray
    compute_s: np.ndarray
    h2d_bytes: np.ndarray
    d2h_bytes: np.ndarray
    hbm_bytes: np.ndarray
    host_bytes: np.ndarray
    counts: np.ndarray  # (steps, tiers): tokens per tier after each step, over the batch


def _scale_to_depth(raw: _Raw, el, non_layer_bytes: float, scale: float) -> _FullDepth:
    n = len(raw.marks)
    ends = [raw.begin] + [m[2] for m in raw.marks]
    step_s = np.array([el(ends[i], ends[i + 1]) for i in range(n)])
    layer_s = np.array([el(m[0], m[1]) for m in raw.marks])
    stall_s = np.array([sum(el(a, b) for a, b in c.stalls) for c in raw.counters])
    retier_s = np.array([el(*c.retier_span) if c.retier_span else 0.0 for c in raw.counters])
    per_layer_part = layer_s + retier_s
    step_scaled = step_s + (scale - 1.0) * per_layer_part
    stall_scaled = np.minimum(stall_s * scale, step_scaled)
    return _FullDepth(
        run_step_s=step_s, step_s=step_scaled, stall_s=stall_scaled, compute_s=np.maximum(step_scaled - stall_scaled, 0.0),
        h2d_bytes=np.array([c.h2d_bytes for c in raw.counters], dtype=float) * scale,
        d2h_bytes=np.array([c.d2h_bytes for c in raw.counters], dtype=float) * scale,
        hbm_bytes=non_layer_bytes + (np.array(raw.hbm_bytes, dtype=float) - non_layer_bytes) * scale,
        host_bytes=np.array(raw.host_bytes, dtype=float) * scale,
        counts=np.array(raw.counts, dtype=np.int64).reshape(n, len(TIERS)),
    )


@dataclass(frozen=True)
class _LinkBusy:
    """Time each link direction, and either, was busy during the decode span of the layers run (s)."""

    h2d_s: float
    d2h_s: float
    either_s: float


def _link_busy(raw: _Raw, el) -> _LinkBusy:
    def offsets(key):
        return [(el(raw.begin, a), el(raw.begin, b)) for c in raw.counters for a, b in getattr(c, key)]

    span = el(raw.begin, raw.marks[-1][2]) if raw.marks else 0.0
    h2d, d2h = offsets("h2d_busy"), offsets("d2h_busy")
    return _LinkBusy(busy_union_s(h2d, until=span), busy_union_s(d2h, until=span), busy_union_s(h2d, d2h, until=span))


def _step_table(depth: _FullDepth, active: list) -> pd.DataFrame:
    c = depth.counts
    return pd.DataFrame({
        "step": np.arange(len(depth.step_s)), "t_s": np.cumsum(depth.step_s), "step_s": depth.step_s,
        "compute_s": depth.compute_s, "stall_s": depth.stall_s, "h2d_bytes": depth.h2d_bytes, "d2h_bytes": depth.d2h_bytes,
        "tokens_t0": c[:, T0], "tokens_t1": c[:, T1], "tokens_t2": c[:, T2], "tokens_t3": c[:, T3],
        "hbm_bytes": depth.hbm_bytes, "host_bytes": depth.host_bytes, "batch_active": active,
    })[STEP_COLUMNS]


def _measured_summary(scenario, spec, rt, model, cache, raw: _Raw, depth: _FullDepth, busy: _LinkBusy, scale: float,
                      n_layers: int, dtype_name: str, opts: RunOptions, notes: list[str],
                      host_p50: float | None) -> MeasuredSummary:
    torch = rt.torch
    n = len(depth.step_s)
    generated = int(sum(raw.active))
    decode_s = float(depth.step_s.sum())  # as the simulator: the end of the last step, so stall share
    # and transfer share are shares of the same span the step times add up to
    timed = decode_s > 0
    tpot_p50_s, tpot_p99_s = tpot_percentiles_s(depth.step_s) if n else (None, None)
    h2d_bytes, d2h_bytes = float(depth.h2d_bytes.sum()), float(depth.d2h_bytes.sum())
    non_layer = model.non_layer_bytes()
    access = scenario.policy.access
    host_busy_s = sum(c.host_busy_s for c in raw.counters) * scale  # host wall clock, per layer: scales with depth
    return MeasuredSummary(
        scenario=scenario.name, model=spec.name, device=rt.device.type,
        device_name=torch.cuda.get_device_name(rt.device) if rt.is_cuda else platform.processor() or platform.machine(),
        measured=True, timing=rt.timing_label,
        policy=scenario.policy.kind, semantics=scenario.policy.semantics, prefetch=scenario.policy.prefetch,
        pinned=bool(scenario.policy.pinned and rt.is_cuda),
        batch_size=scenario.workload.batch_size, generated_tokens=generated, steps=n,
        decode_s=decode_s,
        throughput_tok_per_s=generated / decode_s if timed else None,
        tpot_p50_s=tpot_p50_s, tpot_p99_s=tpot_p99_s,
        hbm_peak_bytes=non_layer + (raw.hbm_peak_bytes - non_layer) * scale,
        hbm_peak_source=("torch.cuda.max_memory_allocated (excludes CUDA context and allocator reserve)"
                         if rt.is_cuda else "estimate: tracked tensor bytes of weights + T0 + staging "
                                            "+ attention workspace + offloads in flight"),
        attention_workspace_bytes=float(cache.attention_workspace_bytes()),
        offload_in_flight_peak_bytes=float(cache.lane.peak_bytes * scale),
        host_peak_bytes=float(max(raw.host_bytes, default=0)) * scale,
        h2d_bytes=h2d_bytes, d2h_bytes=d2h_bytes,
        h2d_utilization=busy.h2d_s * scale / decode_s if timed else None,
        d2h_utilization=busy.d2h_s * scale / decode_s if timed else None,
        transfer_share=min(1.0, busy.either_s * scale / decode_s) if timed else None,
        stall_share=float(depth.stall_s.sum()) / decode_s if timed else None,
        h2d_achieved_bytes_per_s=h2d_bytes / (busy.h2d_s * scale) if busy.h2d_s > 0 else None,
        access=access,
        host_attention_share=min(1.0, host_busy_s / decode_s) if timed and access != "prefetch" else None,
        d2h_achieved_bytes_per_s=d2h_bytes / (busy.d2h_s * scale) if busy.d2h_s > 0 else None,
        host_enqueue_p50_s=host_p50,
        offloaded_tokens=int(cache.offloaded_tokens), evicted_tokens=int(cache.evicted_tokens),
        final_tokens_per_tier={f"t{i}": int(depth.counts[-1, i]) for i in TIERS} if n else {},
        layers_model=int(round(n_layers * scale)), layers_run=n_layers, layer_scale=scale,
        run_dtype=dtype_name, weight_dtype_run=model.weight_dtype, attention=opts.attention, prefill=opts.prefill,
        scores=opts.scores,
        weights_bytes=float(model.non_layer_bytes() + (model.weight_bytes() - non_layer) * scale),
        rope=True, notes=notes,
        versions={"torch": torch.__version__, "cuda": torch.version.cuda or "none", "python": platform.python_version()},
        resolved_scenario=scenario.model_dump(mode="json"),
    )
