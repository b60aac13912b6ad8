"""Fast projection: the simulator's physics evaluated without token identities or SimPy events.

For sweeps of thousands of configurations (reports). Tier sizes come from the ratios
(`counts`), step time from the engine's own step cost (`physics.decode_step_cost`) with the
layerwise pipeline in closed form, at `samples` evenly spaced steps, integrated over the run. What it
leaves out, compared with `sim.decode.simulate.simulate`: re-tier churn (promotions and demotions caused by changing scores; only the
net flow into the host is moved) and link contention between re-tier traffic and prefetch.
A test keeps it within a few percent of the full simulation on the shipped scenarios.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.device.physics import decode_step_cost, retier_copies
from sim.inputs.profile import Profile
from sim.inputs.scenario import Scenario
from sim.outputs.schema import ProjectionSummary
from sim.tiering.tiers import T0, T1, T2

from .capacity import batch_counts, fits, full_hbm_peak_bytes, max_batch
from .context import RunContext, build_context
from .fast_arrays import staged_columns, step_arrays, uncontended_step_s

DEFAULT_SAMPLES = 48


@dataclass(frozen=True)
class StepTime:
    step_s: float
    compute_s: float
    h2d_busy_s: float
    h2d_bytes: float = 0.0  # set where part of T1/T2 is attended on the host (prefetched part + partial outputs)


def step_time(ctx: RunContext, batch: int, t0: int, t1: int, t2: int, staged_tokens: tuple | None = None,
              chunk_tokens: int | None = None) -> StepTime:
    """One decode step for tier counts summed over the batch: the engine's step cost
    (`physics.decode_step_cost`; `staged_tokens` and `chunk_tokens` as there), its prefetch and host path in
    closed form with no link contention."""
    m, pol = ctx.scenario.model, ctx.scenario.policy
    staged = ctx.policy.tiering and pol.prefetch != "per_interval"  # per_interval keeps T1/T2 resident
    cost = decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, pol.prefetch, batch, t0, t1, t2,
                            ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, staged, pol.access,
                            pol.staging_buffers, fetch=ctx.sparse_fetch, chunk_tokens=chunk_tokens,
                            staged_tokens=staged_tokens)
    L = cost.num_layers
    if cost.host is not None:
        copy_s = cost.prefetch_copy_s(ctx.hw.h2d) if cost.stages else 0.0
        partials_s = ctx.hw.h2d.transfer_time_s(cost.host.partial_bytes, 1)
        return StepTime(cost.closed_form_s(ctx.hw, copy_s, pol.staging_buffers), cost.compute_s, L * (copy_s + partials_s),
                        L * (cost.prefetch_bytes_per_layer + cost.host.partial_bytes))
    if not cost.stages:
        return StepTime(cost.compute_s, cost.compute_s, 0.0)
    copy_s = cost.prefetch_copy_s(ctx.hw.h2d)
    if pol.prefetch == "sync_per_step":
        return StepTime(L * copy_s + cost.compute_s, cost.compute_s, L * copy_s)
    _, layers = cost.layerwise_pipeline(copy_s, pol.staging_buffers)
    return StepTime(layers[-1][1] + cost.tail_s, cost.compute_s, L * copy_s, L * cost.prefetch_bytes_per_layer)


@dataclass(frozen=True)
class SampledSteps:
    """`step_time` of the sampled steps, as arrays over them."""

    step_s: np.ndarray
    compute_s: np.ndarray
    h2d_busy_s: np.ndarray
    h2d_bytes: np.ndarray  # each step's over the link: the staged T1/T2, or with host access `StepTime.h2d_bytes`


def _step_times(ctx: RunContext, c, idx: np.ndarray) -> SampledSteps:
    """`step_time` of the sampled steps; with prefetch access all at once (`fast_arrays.step_arrays`, the
    same floats as the scalar physics), host access one step at a time."""
    att = np.column_stack([c.attended[idx, T0], c.attended[idx, T1], c.attended[idx, T2], c.active[idx]])
    if ctx.scenario.policy.access != "prefetch" and ctx.policy.tiering:
        staged, chunks = ctx.closed_staged_tokens(att, idx), ctx.closed_chunk_tokens(att, idx)
        times = [step_time(ctx, int(c.active[i]), *(int(x) for x in c.attended[i, [T0, T1, T2]]),
                           None if staged is None else (float(staged[0][j]), float(staged[1][j])),
                           None if chunks is None else int(chunks[j]))
                 for j, i in enumerate(idx)]
        return SampledSteps(*(np.array([getattr(t, f) for t in times])
                              for f in ("step_s", "compute_s", "h2d_busy_s", "h2d_bytes")))
    a = step_arrays(ctx, att, idx)
    step_s, copy_s = uncontended_step_s(ctx, a)
    h2d_s = np.where(a.prefetch_bytes > 0, ctx.num_layers * copy_s, 0.0)
    s1, s2 = staged_columns(ctx, att, idx)  # every staged T1/T2 token, all layers
    return SampledSteps(step_s, a.compute_s, h2d_s, s1 * ctx.kv_bytes_per_token + s2 * ctx.t2_bytes_per_token)


def project(scenario: Scenario, profile: Profile | None = None, *, samples: int = DEFAULT_SAMPLES,
            with_max_batch: bool = True) -> ProjectionSummary:
    """Summary metrics of one scenario (the keys `kvsim run` reports, where defined here)."""
    ctx = build_context(scenario, profile)
    batch = scenario.workload.batch_size
    c = batch_counts(ctx, batch)
    mem = c.trace(ctx)
    ok, hbm_short, host_short = fits(mem, ctx)
    steps = len(c.active)
    idx = np.unique(np.linspace(0, steps - 1, min(samples, steps)).round().astype(int))
    weights = np.diff(np.concatenate([[0], (idx[1:] + idx[:-1]) // 2 + 1, [steps]]))  # steps each sample stands for
    times = _step_times(ctx, c, idx)
    step_s, compute_s, h2d_s = times.step_s, times.compute_s, times.h2d_busy_s
    # net flow into the host at re-tiers (D2H), asynchronous unless the offload blocks
    d2h_tokens = np.clip(np.diff(np.concatenate([[0], c.tiers_after[:, T1] + c.tiers_after[:, T2]])), 0, None)
    d2h_bytes = float(np.sum(d2h_tokens * ctx.closed_kept(np.arange(steps))) * ctx.kv_bytes_per_token)
    per_retier = retier_copies(scenario.policy.prefetch, ctx.num_layers, True, scenario.policy.compressed_ratio > 0)
    d2h_s = ctx.hw.d2h.transfer_time_s(d2h_bytes, int(np.count_nonzero(d2h_tokens)) * per_retier)
    blocking = scenario.policy.prefetch == "sync_per_step" or not scenario.policy.pinned
    decode_s = float(np.sum(step_s * weights)) + (d2h_s if blocking else 0.0)
    h2d_total = float(np.sum(h2d_s * weights))
    generated = int(c.active.sum())
    return ProjectionSummary(
        fits=ok, hbm_peak_bytes=mem.hbm_peak_bytes, host_peak_bytes=mem.host_peak_bytes,
        hbm_shortfall_bytes=hbm_short, hbm_capacity_bytes=ctx.hw.memory_bytes,
        hbm_saved_bytes=full_hbm_peak_bytes(ctx) - mem.hbm_peak_bytes,
        max_batch=max_batch(ctx) if with_max_batch else None,
        decode_s=decode_s,
        throughput_tok_per_s=generated / decode_s,
        tpot_p50_s=float(np.median(np.repeat(step_s, weights))),
        h2d_utilization=min(1.0, h2d_total / decode_s),
        d2h_utilization=min(1.0, d2h_s / decode_s),
        stall_share=float(np.sum((step_s - compute_s) * weights)) / decode_s,
        transfer_share=min(1.0, (h2d_total + (d2h_s if blocking else 0.0)) / decode_s),
        # over the run: every staged T1/T2 token, or with host access the prefetched part + the partial outputs
        h2d_bytes=float(np.sum(weights * times.h2d_bytes)) if ctx.policy.tiering else 0.0,
        d2h_bytes=d2h_bytes,
    )
