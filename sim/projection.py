"""Fast projection: the simulator's physics evaluated without token identities or SimPy events.

For sweeps of thousands of configurations (reports). Tier sizes come from the ratios
(`counts`), step time from the closed-form layerwise pipeline (`physics.layerwise_pipeline_s`) at
`samples` evenly spaced steps, integrated over the run. What it leaves out, compared with
`sim.engine.simulate`: re-tier churn (promotions and demotions caused by changing scores; only the
net flow into the host is moved) and link contention between re-tier traffic and prefetch.
A test keeps it within a few percent of the full simulation on the shipped scenarios.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .capacity import batch_counts, fits, full_hbm_peak_bytes, max_batch, memory_trace
from .context import RunContext, build_context
from .physics import (decode_layer_cost, host_pack_s, layerwise_pipeline_s, prefetch_copies_per_layer, retier_copies,
                      step_tail_s)
from .profile import Profile

from .scenario import Scenario

DEFAULT_SAMPLES = 48


@dataclass(frozen=True)
class StepTime:
    step_s: float
    compute_s: float
    h2d_busy_s: float


def step_time(ctx: RunContext, batch: int, t0: int, t1: int, t2: int) -> StepTime:
    """One decode step for tier counts summed over the batch (same formulas as the engine)."""
    m, pol = ctx.scenario.model, ctx.scenario.policy
    L = ctx.num_layers
    cost = decode_layer_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, batch, t0 + t1 + t2,
                             ctx.kv_bytes_per_token_layer, t2, ctx.t2_bytes_per_token_layer)
    layer_s = cost.total_s
    tail_s = step_tail_s(ctx.model, ctx.hw, batch)
    compute_s = L * layer_s + tail_s
    pf_bytes = t1 * ctx.kv_bytes_per_token_layer + t2 * ctx.t2_bytes_per_token_layer
    if not ctx.policy.tiering or pf_bytes <= 0 or pol.prefetch == "per_interval":
        return StepTime(compute_s, compute_s, 0.0)
    copy_s = ctx.hw.h2d.transfer_time_s(pf_bytes, prefetch_copies_per_layer(pol.prefetch, t1 > 0, t2 > 0))
    if pol.prefetch == "sync_per_step":
        copy_s += host_pack_s(ctx.hw, t1 * ctx.kv_bytes_per_token_layer)
        return StepTime(L * copy_s + compute_s, compute_s, L * copy_s)
    finish, _ = layerwise_pipeline_s([cost.pre_attention_s] * L, [cost.post_attention_s] * L, [copy_s] * L, pol.staging_buffers)
    return StepTime(finish + tail_s, compute_s, L * copy_s)


def project(scenario: Scenario, profile: Profile | None = None, *, samples: int = DEFAULT_SAMPLES,
            with_max_batch: bool = True) -> dict:
    """Summary metrics of one scenario (the keys `kvsim run` reports, where defined here)."""
    ctx = build_context(scenario, profile)
    batch = scenario.workload.batch_size
    c = batch_counts(ctx, batch)
    mem = memory_trace(ctx, c.attend[:, 0], c.attend[:, 1], c.attend[:, 2], c.active, c.after, c.net_demoted)
    ok, hbm_short, host_short = fits(mem, ctx)
    out = {
        "fits": ok, "hbm_peak_bytes": mem.hbm_peak_bytes, "host_peak_bytes": mem.host_peak_bytes,
        "hbm_shortfall_bytes": hbm_short, "hbm_capacity_bytes": ctx.hw.memory_bytes,
        "hbm_saved_bytes": full_hbm_peak_bytes(ctx) - mem.hbm_peak_bytes,
        "max_batch": max_batch(ctx) if with_max_batch else None,
    }
    steps = len(c.active)
    idx = np.unique(np.linspace(0, steps - 1, min(samples, steps)).round().astype(int))
    weights = np.diff(np.concatenate([[0], (idx[1:] + idx[:-1]) // 2 + 1, [steps]]))  # steps each sample stands for
    times = [step_time(ctx, int(c.active[i]), *(int(x) for x in c.attend[i, :3])) for i in idx]
    step_s = np.array([t.step_s for t in times])
    compute_s = np.array([t.compute_s for t in times])
    h2d_s = np.array([t.h2d_busy_s for t in times])
    # net flow into the host at re-tiers (D2H), asynchronous unless the offload blocks
    d2h_tokens = np.clip(np.diff(np.concatenate([[0], c.after[:, 1] + c.after[:, 2]])), 0, None)
    d2h_bytes = float(np.sum(d2h_tokens) * ctx.kv_bytes_per_token)
    per_retier = retier_copies(scenario.policy.prefetch, ctx.num_layers, True, scenario.policy.compressed_ratio > 0)
    d2h_s = ctx.hw.d2h.transfer_time_s(d2h_bytes, int(np.count_nonzero(d2h_tokens)) * per_retier)
    blocking = scenario.policy.prefetch == "sync_per_step" or not scenario.policy.pinned
    decode_s = float(np.sum(step_s * weights)) + (d2h_s if blocking else 0.0)
    h2d_total = float(np.sum(h2d_s * weights))
    generated = int(c.active.sum())
    out.update({
        "decode_s": decode_s,
        "throughput_tok_per_s": generated / decode_s,
        "tpot_p50_s": float(np.median(np.repeat(step_s, weights))),
        "h2d_utilization": min(1.0, h2d_total / decode_s),
        "d2h_utilization": min(1.0, d2h_s / decode_s),
        "stall_share": float(np.sum((step_s - compute_s) * weights)) / decode_s,
        "transfer_share": min(1.0, (h2d_total + (d2h_s if blocking else 0.0)) / decode_s),
        "h2d_bytes": float(np.sum(weights * (c.attend[idx, 1] * ctx.kv_bytes_per_token + c.attend[idx, 2] * ctx.t2_bytes_per_token))) if ctx.policy.tiering else 0.0,
        "d2h_bytes": d2h_bytes,
    })
    return out
