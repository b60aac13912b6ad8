"""One simulated run: tier plan -> memory (fits?) -> SimPy timing -> summary and per-step table."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim import __version__
from sim.device.physics import prefill_s
from sim.inputs.errors import ConfigError
from sim.inputs.profile import Profile
from sim.inputs.scenario import Scenario
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION, STEP_COLUMNS, SimRunSummary, tpot_percentiles_s
from sim.tiering.memory_trace import memory_trace
from sim.tiering.tier_plan import ACTIVE, ATT_T0, ATT_T1, ATT_T2, MV_D2H_T1, MV_D2H_T2, MV_EVICTED, plan_tiers
from sim.tiering.tiers import T0, T1, T2, T3, TIERS

from .capacity import baseline_max_batches, fits, full_hbm_peak_bytes, max_batch
from .context import RunContext, build_context
from .engine import run_timing
from .fast import fast_plan, fast_timing, supports


@dataclass
class SimResult:
    summary: SimRunSummary
    steps: pd.DataFrame
    timeline: pd.DataFrame
    scenario: Scenario


def _versions() -> dict[str, str]:
    import pydantic
    import simpy

    return {"kvtier": __version__, "python": platform.python_version(), "simpy": simpy.__version__,
            "numpy": np.__version__, "pandas": pd.__version__, "pydantic": pydantic.__version__}


def simulate(scenario: Scenario, profile: Profile | None = None, *, profile_path: str | None = None,
             with_max_batch: bool = True) -> SimResult:
    if scenario.workload.arrivals is not None:  # not a closed batch: sim.serving.run.simulate_serving runs it
        raise ConfigError("a serving scenario (requests arriving): `kvsim run` simulates it; this command takes a "
                          "closed batch", field="workload.arrivals")
    ctx = build_context(scenario, profile, profile_path)
    fast = scenario.sim.detail == "fast"
    plan = fast_plan(ctx) if fast else plan_tiers(ctx)
    att = plan.attended
    mem = memory_trace(ctx, att[:, ATT_T0], att[:, ATT_T1], att[:, ATT_T2], att[:, ACTIVE], plan.tiers_after,
                       plan.retier_moves[:, [MV_D2H_T1, MV_D2H_T2]], ctx.closed_kept(np.arange(plan.steps)))
    ok, hbm_short, host_short = fits(mem, ctx)
    timing = None
    if ok:
        timing = fast_timing(ctx, plan) if fast and supports(ctx) else run_timing(ctx, plan)

    steps = pd.DataFrame({
        "step": np.arange(plan.steps),
        "tokens_t0": plan.tiers_after[:, T0], "tokens_t1": plan.tiers_after[:, T1],
        "tokens_t2": plan.tiers_after[:, T2], "tokens_t3": plan.tiers_after[:, T3],
        "hbm_bytes": mem.hbm_bytes, "host_bytes": mem.host_bytes, "batch_active": att[:, ACTIVE],
    })
    if timing is not None:
        steps = timing.step_frame().merge(steps, on="step")
    else:
        for col in ("t_s", "step_s", "compute_s", "stall_s", "h2d_bytes", "d2h_bytes"):
            steps[col] = np.nan
    steps = steps[STEP_COLUMNS]

    summary = _run_summary(scenario, ctx, plan, mem, (ok, hbm_short, host_short), timing, steps, profile_path,
                           with_max_batch)
    every = scenario.sim.record_every
    if every > 1:  # the CSV keeps every n-th step and the last; the summary used them all
        keep = (steps["step"] % every == 0) | (steps["step"] == plan.steps - 1)
        steps = steps[keep].reset_index(drop=True)
    return SimResult(summary=summary, steps=steps, timeline=pd.DataFrame(timing.timeline if timing else []), scenario=scenario)


def _run_summary(scenario: Scenario, ctx: RunContext, plan, mem, fit: tuple, timing, steps: pd.DataFrame,
                 profile_path: str | None, with_max_batch: bool) -> SimRunSummary:
    """The summary of a run from its tier plan, memory trace, fit (ok, HBM and host shortfall) and
    timing (None when it does not fit); `steps` is the full per-step table."""
    ok, hbm_short, host_short = fit
    generated = int(plan.lengths.sum())
    moves = plan.retier_moves
    return SimRunSummary(
        scenario=scenario.name, model=ctx.model.name, gpu=ctx.hw.gpu.name,
        policy=scenario.policy.kind, semantics=scenario.policy.semantics, prefetch=scenario.policy.prefetch,
        access=scenario.policy.access,
        batch_size=scenario.workload.batch_size, generated_tokens=generated, steps=plan.steps,
        fits=ok, hbm_shortfall_bytes=hbm_short, host_shortfall_bytes=host_short,
        hbm_capacity_bytes=ctx.hw.memory_bytes, host_capacity_bytes=ctx.hw.host_memory_bytes,
        hbm_peak_bytes=mem.hbm_peak_bytes, hbm_saved_bytes=full_hbm_peak_bytes(ctx) - mem.hbm_peak_bytes,
        host_peak_bytes=mem.host_peak_bytes,
        offload_in_flight_peak_bytes=float(mem.transit_bytes.max()) if plan.steps else 0.0,
        runtime_reserve_bytes=ctx.hw.runtime_reserve_bytes, weights_bytes=ctx.weights_bytes,
        kv_bytes_per_token=ctx.kv_bytes_per_token,
        offloaded_tokens=int(moves[:, MV_D2H_T1].sum() + moves[:, MV_D2H_T2].sum()),
        evicted_tokens=int(moves[:, MV_EVICTED].sum()),
        final_tokens_per_tier={f"t{i}": int(plan.tiers_after[-1, i]) for i in TIERS} if plan.steps else {},
        **_auto_shares(ctx, plan),
        **(_decode_figures(scenario, ctx, timing, steps, generated) if timing is not None else {}),
        max_batch=max_batch(ctx) if with_max_batch else None,
        max_batch_by_policy=baseline_max_batches(ctx) if with_max_batch else None,
        sources=dict(ctx.hw.sources), profile=profile_path,
        versions=_versions(), resolved_scenario=scenario.model_dump(mode="json"),
    )


def _auto_shares(ctx: RunContext, plan) -> dict:
    """hbm_ratio auto: the lowest T0 share pressure set and the first step that tiered (else nothing)."""
    if not ctx.policy.auto:
        return {}
    shares = plan.policy.hbm_schedule
    out = plan.retier_moves[:, MV_D2H_T1] + plan.retier_moves[:, MV_D2H_T2] + plan.retier_moves[:, MV_EVICTED]
    first = np.flatnonzero(out)
    return {"hbm_share_min": min(shares, default=1.0), "tiering_from_step": int(first[0]) if len(first) else None}


def _decode_figures(scenario: Scenario, ctx: RunContext, timing, steps: pd.DataFrame, generated: int) -> dict:
    """The timing figures of a run that fits, as SimRunSummary fields (they stay None otherwise)."""
    decode_s = timing.decode_s
    h2d_utilization = timing.busy_s("h2d", until=decode_s) / decode_s
    d2h_utilization = timing.busy_s("d2h", until=decode_s) / decode_s
    tpot_p50_s, tpot_p99_s = tpot_percentiles_s(steps["step_s"].to_numpy())
    return dict(
        decode_s=decode_s,
        prefill_s=prefill_s(ctx.model, ctx.hw, scenario.model.weight_dtype, scenario.model.weight_group_size,
                            scenario.workload.batch_size, scenario.workload.prompt_tokens, ctx.kv_bytes_per_token_layer),
        throughput_tok_per_s=generated / decode_s if decode_s > 0 else None,
        tpot_p50_s=tpot_p50_s, tpot_p99_s=tpot_p99_s,
        h2d_bytes=float(steps["h2d_bytes"].sum()), d2h_bytes=float(steps["d2h_bytes"].sum()),
        h2d_utilization=h2d_utilization, d2h_utilization=d2h_utilization,
        transfer_share=timing.busy_s("h2d", "d2h", until=decode_s) / decode_s,
        stall_share=float(steps["stall_s"].sum()) / decode_s,
        link_bottleneck=max(h2d_utilization, d2h_utilization) >= LINK_BOTTLENECK_UTILIZATION,
        host_attention_share=(timing.busy_s("host", until=decode_s) / decode_s
                              if scenario.policy.host_access else None),
    )
