"""One simulated serving run: requests -> memory budget (fits?) -> SimPy serving timing -> tables and summary."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from sim.decode.context import RunContext, build_context
from sim.decode.simulate import _versions
from sim.inputs.profile import Profile
from sim.inputs.requests import RequestSet, build_requests
from sim.inputs.scenario import Scenario
from sim.inputs.serving_config import ClosedLoopArrivals, GammaArrivals, PoissonArrivals
from sim.model.units import GB
from sim.outputs.schema import ServingSummary
from sim.tiering.tiers import T0, T1, T2

from .engine import ServingSim, ServingTrace
from .kv_memory import KvMemory, engine_scheduler, kv_memory
from .metrics import (
    request_columns,
    request_table,
    serving_figures,
    swap_figures,
    thin_timeline,
    timeline_columns,
    timeline_table,
)
from .request import RequestTable
from .row_counts import FixedRows, PressureRows
from .scheduler import Scheduler
from .tier_counts import TierCounter


@dataclass
class ServingResult:
    summary: ServingSummary
    requests: pd.DataFrame  # metrics.request_columns
    timeline: pd.DataFrame  # metrics.timeline_columns
    scenario: Scenario
    stopped: bool = False  # `stop` ended the run before every request finished: figures over the finished ones


def alone_shortfall(memory: KvMemory, counter: TierCounter, reqs: RequestSet) -> str | None:
    """Why some request could never run even alone (its largest K/V over its life exceeds the KV
    budget or host memory: vLLM refuses such a request), or None. A request of prompt P and N output
    tokens holds at most its counts during and after decode steps 0..N-2, or its prompt."""
    if memory.kv_budget_bytes <= 0:
        return (f"weights, activations and runtime reserve need {memory.fixed_bytes / GB:,.2f} GB of "
                f"{memory.hbm_capacity_bytes / GB:,.2f} GB HBM: nothing is left for KV")
    for p in np.unique(reqs.prompt_tokens):
        mine = reqs.prompt_tokens == p
        steps = np.arange(max(int(reqs.output_tokens[mine].max()) - 1, 1))
        att, aft = counter.attended(int(p), steps), counter.after(int(p), steps)
        hbm = np.maximum.accumulate(np.maximum(memory.hbm_kv_bytes(att[:, T0], att[:, T1] + att[:, T2], att.sum(axis=1)),
                                               memory.hbm_kv_bytes(aft[:, T0], 0, aft.sum(axis=1))))
        host = np.maximum.accumulate(np.maximum(memory.host_bytes(att[:, T1], att[:, T2], att.sum(axis=1), int(p)),
                                                memory.host_bytes(aft[:, T1], aft[:, T2], aft.sum(axis=1), int(p))))
        last = np.maximum(reqs.output_tokens[mine] - 2, 0)
        need_hbm = np.maximum(hbm[last], memory.hbm_kv_bytes(int(p), 0, int(p)))
        need_host = host[last]
        bad = np.flatnonzero((need_hbm > memory.kv_budget_bytes) | (need_host > memory.host_capacity_bytes))
        if len(bad):
            i = bad[0]
            rid = int(reqs.ids[mine][i])
            return (f"request {rid} ({int(p)} + {int(reqs.output_tokens[mine][i])} tokens) needs "
                    f"{need_hbm[i] / GB:,.2f} GB of KV in HBM (budget {memory.kv_budget_bytes / GB:,.2f} GB) and "
                    f"{need_host[i] / GB:,.2f} GB of host memory (has {memory.host_capacity_bytes / GB:,.2f} GB) alone")
    return None


def row_counts(ctx: RunContext, memory: KvMemory, reqs: RequestSet) -> FixedRows | PressureRows:
    """One scheduler's tier counts (a fleet's replicas each have their own: `PressureRows` is state)."""
    if ctx.policy.auto:
        return PressureRows(ctx.policy, memory, reqs.prompt_tokens)
    return FixedRows(TierCounter(ctx.policy, reqs.prompt_tokens, reqs.output_tokens), reqs.prompt_tokens)


def simulate_serving(scenario: Scenario, profile: Profile | None = None, *, profile_path: str | None = None,
                     stop=None, prefilled: bool = False) -> ServingResult:
    """The run and its tables. `stop(sim)`, called after every step, may end it early (a steady-state
    probe that has its verdict: `sim.serving.steady`); the summary's figures then cover the requests
    that finished, and `requests` still lists every one (the unfinished with empty times). `prefilled`:
    the requests arrive with their prompts' K/V (a decode instance: `sim.serving.request.RequestTable`)."""
    ctx, reqs, memory, why = prepare(scenario, profile, profile_path)
    scenario = ctx.scenario  # with the scheduler the engine runs (`engine_scheduler`)
    sched_cfg = scenario.scheduler
    counter = row_counts(ctx, memory, reqs)
    swap = sched_cfg.preemption == "swap"
    figures, stopped = {}, False
    requests, timeline = pd.DataFrame(columns=request_columns(swap)), pd.DataFrame(columns=timeline_columns(swap))
    if why is None:
        sim = ServingSim(ctx, reqs, Scheduler(sched_cfg, memory, counter, RequestTable(reqs, prefilled)), stop)
        trace = sim.run()
        stopped = sim.stopped
        requests, timeline, figures = trace_figures(trace, stopped, scenario.slo)
    summary = serving_summary(scenario, ctx, reqs, memory, why, figures, profile_path)
    timeline = thin_timeline(timeline, scenario.sim.record_every)  # the summary used every row
    return ServingResult(summary=summary, requests=requests, timeline=timeline, scenario=scenario, stopped=stopped)


def trace_figures(trace: ServingTrace, stopped: bool, slo) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(requests, timeline, the summary's timing figures) of a finished trace; a `stopped` run's
    figures cover the requests that finished."""
    requests, timeline = request_table(trace), timeline_table(trace)
    done = requests[requests["finish_s"].notna()] if stopped else requests
    figures = serving_figures(trace, done, timeline, slo) | swap_figures(trace)
    if trace.end_s > 0:
        figures.update(h2d_utilization=trace.h2d_busy_s / trace.end_s, d2h_utilization=trace.d2h_busy_s / trace.end_s)
    return requests, timeline, figures


def prepare(scenario: Scenario, profile: Profile | None = None,
            profile_path: str | None = None) -> tuple[RunContext, RequestSet, KvMemory, str | None]:
    """(context, requests, memory, why it cannot run or None) of a serving run; the context's scenario
    carries the scheduler the engine runs once its KV pool is known (`engine_scheduler`)."""
    ctx = build_context(scenario, profile, profile_path)
    reqs = build_requests(scenario.workload)
    memory = kv_memory(ctx, scenario.scheduler.max_num_batched_tokens, scenario.scheduler.max_num_seqs)
    sched = engine_scheduler(ctx, memory)
    if sched is not scenario.scheduler:
        ctx = replace(ctx, scenario=scenario.model_copy(update={"scheduler": sched}))
    # a request that could not run alone: under hbm_ratio auto, even at the least T0 pressure can leave
    least = ctx.policy.at_fraction(0.0) if ctx.policy.auto else ctx.policy
    return ctx, reqs, memory, alone_shortfall(memory, TierCounter(least, reqs.prompt_tokens, reqs.output_tokens), reqs)


def serving_summary(scenario: Scenario, ctx: RunContext, reqs: RequestSet, memory: KvMemory, why: str | None, figures: dict,
             profile_path: str | None) -> ServingSummary:
    a, sc = scenario.workload.arrivals, scenario.scheduler
    return ServingSummary(
        scenario=scenario.name, model=ctx.model.name, gpu=ctx.hw.gpu.name, tp=scenario.parallel.tp,
        policy=scenario.policy.kind, arrivals=a.kind,
        offered_rate_per_s=a.rate_per_s if isinstance(a, (PoissonArrivals, GammaArrivals)) else None,
        clients=a.concurrency if isinstance(a, ClosedLoopArrivals) else None,
        max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens,
        chunked_prefill=sc.chunked_prefill,
        preemption=sc.preemption, swap_space_bytes=sc.swap_space_bytes,
        fits=why is None, does_not_fit=why,
        hbm_capacity_bytes=memory.hbm_capacity_bytes, host_capacity_bytes=memory.host_capacity_bytes,
        weights_bytes=memory.weights_bytes, activation_bytes=memory.activation_bytes,
        runtime_reserve_bytes=memory.runtime_reserve_bytes, kv_budget_bytes=memory.kv_budget_bytes,
        kv_bytes_per_token=memory.kv_bytes_per_token,
        requests=len(reqs), total_input_tokens=int(reqs.prompt_tokens.sum()),
        total_output_tokens=int(reqs.output_tokens.sum()),
        **figures,
        sources=dict(ctx.hw.sources), profile=profile_path,
        versions=_versions(), resolved_scenario=scenario.model_dump(mode="json"),
    )
