"""A fleet: k replicas of one configuration (each a GPU or tensor-parallel group with its own
scheduler and KV cache) behind a load balancer, simulated together on one clock.

- round-robin: arrival i goes to replica i mod k. Each replica then sees every k-th arrival whatever
  the others do, so the planner simulates one replica on that stream alone
  (`sim.plan.candidates.replica_arrivals`); a fleet reproduces it exactly (tests/test_fleet.py).
  SGLang's data-parallel controller does this by default (`--load-balance-method round_robin`).
- least-outstanding: each arrival goes to the replica with the fewest requests in it (arrived, not
  finished; the lowest index among equals), as NGINX's `least_conn` and AWS ALB's
  `least_outstanding_requests` route. It needs the fleet: where a request goes depends on how far
  every replica has got.
- vllm: vLLM's own data-parallel balancer (`--data-parallel-size`, internal load balancing): the
  replica with the lowest 4 x waiting + running (vllm/v1/engine/core_client.py,
  `DPLBAsyncMPClient.get_core_engine_for_request`; the lowest index among equals), on the counts
  its coordinator last published - every 100 ms (vllm/v1/engine/coordinator.py
  min_stats_update_interval_ms) - each raised by one waiting request for every arrival sent since, as
  the client does between updates (`VllmBalancer`).

The replicas share the request table (each request is one replica's) and the finished count
(`engine.Tally`), so every step loop runs until the fleet's last request has finished, and a
steady-state `stop` sees the fleet (`FleetView`): its verdict is over every request. Figures are the
fleet's (throughputs, latency percentiles, concurrency), memory and batch figures the busiest GPU's
(HBM and host peak, max running), mean running and link utilisation a replica's mean.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import simpy

from sim.inputs.errors import ConfigError
from sim.inputs.scenario import Scenario

from .engine import ServingSim, ServingTrace, Tally
from .metrics import thin_timeline, time_average
from .request import RequestTable
from .run import ServingResult, prepare, row_counts, serving_summary, trace_figures
from .scheduler import Scheduler

ROUND_ROBIN, LEAST_OUTSTANDING, VLLM = "round-robin", "least-outstanding", "vllm"
BALANCERS = (ROUND_ROBIN, LEAST_OUTSTANDING, VLLM)
VLLM_WAITING_WEIGHT = 4  # vLLM's score: 4 x waiting + running
VLLM_STATS_INTERVAL_S = 0.1  # the coordinator publishes the engines' counts every 100 ms


def pick_replica(balancer: str, i: int, sims: list) -> int:
    """The replica arrival i goes to (module docstring), given the replicas (`ServingSim`s: requests
    in system, the scheduler's waiting and running) as they are now (vllm: `VllmBalancer` reads them
    as vLLM's coordinator publishes them)."""
    if balancer == ROUND_ROBIN:
        return i % len(sims)
    load = [s.in_system for s in sims] if balancer == LEAST_OUTSTANDING else vllm_scores(vllm_counts(sims))
    return int(np.argmin(load))  # the first of the least loaded


def vllm_counts(sims: list) -> list[list[int]]:
    """[waiting, running] of each replica, as vLLM's engines report them."""
    return [[len(s.scheduler.waiting), len(s.scheduler.running)] for s in sims]


def vllm_scores(counts: list[list[int]]) -> list[int]:
    return [VLLM_WAITING_WEIGHT * w + r for w, r in counts]


class VllmBalancer:
    """vLLM's data-parallel balancer over `sims` (module docstring): counts published every
    VLLM_STATS_INTERVAL_S by a process on the fleet's clock, the chosen replica's waiting raised by
    one per request sent until the next publication."""

    def __init__(self, sims: list, env: simpy.Environment):
        self.sims = sims
        self.counts = vllm_counts(sims)
        env.process(self._publish(env))

    def _publish(self, env: simpy.Environment):
        while True:
            yield env.timeout(VLLM_STATS_INTERVAL_S)
            self.counts = vllm_counts(self.sims)

    def pick(self, i: int) -> int:
        j = int(np.argmin(vllm_scores(self.counts)))
        self.counts[j][0] += 1  # core_client.py: current_counts[eng_index][0] += client_count (one client)
        return j


def check_balancer(balancer: str, field: str = "--balancer") -> str:
    if balancer not in BALANCERS:
        raise ConfigError(f"unknown load balancer {balancer!r}; expected one of {', '.join(BALANCERS)}", field=field)
    return balancer


class FleetView:
    """What a fleet's `stop` looks at, in the shape of one `ServingSim`: the shared clock and
    request table, every replica's steps, their preemptions summed."""

    def __init__(self, sims: list[ServingSim]):
        self.sims, self.env, self.table = sims, sims[0].env, sims[0].table

    @property
    def trace(self) -> ServingTrace:
        return merged_trace([s.trace for s in self.sims], self.env.now)

    @property
    def scheduler(self) -> SimpleNamespace:
        return SimpleNamespace(preemptions=sum(s.scheduler.preemptions for s in self.sims),
                               memory=self.sims[0].scheduler.memory, cfg=self.sims[0].scheduler.cfg)


def merged_trace(traces: list[ServingTrace], end_s: float) -> ServingTrace:
    """One trace of the fleet (module docstring): steps of every replica in time order, counts summed,
    link busy time a replica's mean."""
    k = len(traces)
    steps = sorted((row for t in traces for row in t.steps), key=lambda r: r.t_s)
    cat = lambda f: [x for t in traces for x in getattr(t, f)]  # noqa: E731
    total = lambda f: sum(getattr(t, f) for t in traces)  # noqa: E731
    return ServingTrace(traces[0].table, steps, cat("itl_step_s"), cat("itl_step_tokens"), cat("itl_other_s"),
                        in_system_area_s=total("in_system_area_s"), end_s=end_s, preemptions=total("preemptions"),
                        swap_mode=traces[0].swap_mode, swaps=total("swaps"), swap_ins=total("swap_ins"),
                        swap_fallbacks=total("swap_fallbacks"), swap_out_bytes=total("swap_out_bytes"),
                        swap_in_bytes=total("swap_in_bytes"), h2d_busy_s=total("h2d_busy_s") / k,
                        d2h_busy_s=total("d2h_busy_s") / k)


def simulate_fleet(scenario: Scenario, replicas: int, balancer: str = LEAST_OUTSTANDING, stop=None) -> ServingResult:
    """`replicas` copies of the scenario's configuration behind `balancer`, serving its open-loop
    arrivals (the fleet's rate) together; `stop` as `simulate_serving`'s, over the fleet. The
    requests table says which replica served each request (`replica`)."""
    check_balancer(balancer)
    if replicas < 1:
        raise ConfigError(f"a fleet needs at least 1 replica, not {replicas}", field="replicas")
    if scenario.workload.arrivals is None or getattr(scenario.workload.arrivals, "concurrency", None) is not None:
        raise ConfigError("a fleet serves open-loop arrivals (poisson or gamma), not a closed batch or closed-loop "
                          "clients", field="workload.arrivals")
    ctx, reqs, memory, why = prepare(scenario)
    scenario = ctx.scenario  # with the scheduler the engine runs
    if why is not None:
        return ServingResult(serving_summary(scenario, ctx, reqs, memory, why, {}, None), pd.DataFrame(),
                             pd.DataFrame(), scenario)
    env, tally, table = simpy.Environment(), Tally(), RequestTable(reqs)
    sims = [ServingSim(ctx, reqs, Scheduler(scenario.scheduler, memory, row_counts(ctx, memory, reqs), table), stop,
                       env, tally) for _ in range(replicas)]
    view = FleetView(sims)
    for s in sims:
        s.view = view
    replica_of = np.full(len(reqs), -1, dtype=np.int64)
    pick = VllmBalancer(sims, env).pick if balancer == VLLM else (lambda i: pick_replica(balancer, i, sims))

    def arrivals():
        for i, t in enumerate(reqs.arrival_s):
            yield env.timeout(max(0.0, float(t) - env.now))
            replica_of[i] = pick(i)
            sims[replica_of[i]].arrive(i)

    env.process(arrivals())
    env.run(until=env.any_of([env.process(s.step_loop()) for s in sims]))  # the last request done, or stopped
    return _result(scenario, ctx, reqs, memory, sims, replica_of)


def _result(scenario: Scenario, ctx, reqs, memory, sims: list[ServingSim], replica_of: np.ndarray) -> ServingResult:
    traces = [s.close() for s in sims]
    trace = merged_trace(traces, sims[0].env.now)
    stopped = any(s.stopped for s in sims)
    requests, timeline, figures = trace_figures(trace, stopped, scenario.slo)
    requests["replica"] = replica_of[requests["id"].to_numpy()]
    if trace.end_s > 0:  # a replica's mean, not a time average over the replicas' interleaved rows
        figures["mean_running"] = float(np.mean([time_average(
            np.array([r.t_s for r in t.steps]), np.array([r.running for r in t.steps]), trace.end_s)
            for t in traces if t.steps]))
    summary = serving_summary(scenario, ctx, reqs, memory, None, figures, None)
    return ServingResult(summary=summary, requests=requests, timeline=thin_timeline(timeline, scenario.sim.record_every),
                         scenario=scenario, stopped=stopped)
