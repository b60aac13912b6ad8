"""SimPy timing of a serving run, in the shape of `sim.decode.engine.DecodeSim`: `ServingSim` owns the
queue and the scheduler; its processes are the arrivals (open loop), the clients (closed loop) and
the step loop. The GPU and its host link are a `DecodeSim` (its forward pass per prefetch mode and
its re-tier transfers, over the same SimPy environment), so a serving step is timed exactly as a
decode step of the same cost is.

What to schedule comes from pure functions: the step plan (`scheduler.Scheduler.schedule`), its cost
(`physics.mixed_step_cost`), its re-tier traffic (`physics.retier_traffic`) and its swaps
(`swap.swap_copies`; the bytes come with the plan). Swaps use the same link directions as the tier
traffic, so they queue behind (and contend with) re-tier offloads and prefetches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.decode.context import RunContext
from sim.decode.engine import DecodeSim
from sim.device.engine_rules import host_loop_s
from sim.device.intervals import busy_union_s
from sim.device.physics import (
    RetierTraffic,
    StepCost,
    decode_layer_attention_s,
    mixed_step_cost,
    retier_traffic,
    with_decode_attention,
    with_prefill,
)
from sim.inputs.requests import RequestSet
from sim.model.layers import chunk_attended
from sim.tiering.tiers import T1, T2

from .request import RequestTable
from .scheduler import Scheduler, StepPlan
from .swap import swap_copies


@dataclass
class StepRow:
    """One step (or the start of an idle spell: step_s 0, nothing running) for the timeline."""

    t_s: float
    step_s: float
    running: int
    waiting: int
    decodes: int
    prefill_tokens: int
    hbm_bytes: float
    host_bytes: float
    swapped: int = 0  # swap preemption: requests whose K/V waits on the host during the step
    swap_out_bytes: float = 0.0  # K/V swaps moved since the previous row (a pass that preempts every running
    swap_in_bytes: float = 0.0  # request writes no row: its swap-outs land in the next one)


@dataclass
class Tally:
    """Requests finished so far: one replica's, or shared by a fleet's replicas (`sim.serving.fleet`),
    whose step loops run until the fleet's last request has finished."""

    finished: int = 0


@dataclass
class ServingTrace:
    """What the engine measured: every request's times (the table), one row per step, the
    inter-token gaps (each step's duration weighted by the tokens that came one step after their
    previous one, plus every other gap), and the area under requests-in-system over time."""

    table: RequestTable
    steps: list[StepRow]
    itl_step_s: list[float] = field(default_factory=list)
    itl_step_tokens: list[int] = field(default_factory=list)
    itl_other_s: list[np.ndarray] = field(default_factory=list)
    in_system_area_s: float = 0.0  # integral of (arrived, not finished) requests over time
    end_s: float = 0.0
    preemptions: int = 0
    swap_mode: bool = False  # scheduler.preemption: swap
    swaps: int = 0  # swap preemption: preemptions that copied K/V to the host
    swap_ins: int = 0  # ... readmissions that copied it back
    swap_fallbacks: int = 0  # ... that found no room there and recomputed instead
    swap_out_bytes: float = 0.0  # K/V copied device->host by swaps, and back host->device
    swap_in_bytes: float = 0.0
    h2d_busy_s: float = 0.0  # union of the host link's busy intervals per direction
    d2h_busy_s: float = 0.0


class ServingSim:
    """Requests arriving at one GPU (one tensor-parallel group) and its host link."""

    row_type = StepRow  # what `sim.serving.pipeline` records its steps as

    def __init__(self, ctx: RunContext, requests: RequestSet, scheduler: Scheduler, stop=None, env=None,
                 tally: Tally | None = None):
        """`env` and `tally`: a fleet's shared clock and finished count (`sim.serving.fleet`)."""
        self.ctx, self.specs, self.scheduler = ctx, requests, scheduler
        self.stop = stop  # called after each step with `view`; True ends the run there (a steady-state probe)
        self.view = self  # what `stop` looks at: this sim, or its fleet
        self.stopped = False
        self.table = scheduler.table
        self.device = DecodeSim(ctx, plan=None, env=env)  # forward passes and re-tier transfers on the GPU's link
        self.env = self.device.env
        self.done: dict[int, object] = {}  # closed loop: the event each client waits on, by request
        self.sent = 0  # requests sent so far (closed loop: the next one to send)
        self.tally = tally or Tally()
        self.wake = None  # event the idle step loop waits on
        self.in_system = 0
        self.area_s = 0.0
        self.t_changed = 0.0
        self.trace = ServingTrace(self.table, [])
        self.unrecorded = [0.0, 0.0]  # swap bytes out, in not yet in a timeline row
        self.decode_costs: dict[int, StepCost] = {}  # decode-only steps' costs by batch (`decode_cost`)
        self.pipeline = None
        if ctx.scenario.parallel.pp > 1:  # batches in flight through the stages (`sim.serving.pipeline`)
            from .pipeline import Pipeline

            self.pipeline = Pipeline(self, ctx.scenario.parallel.pp)
            scheduler.pipelined()

    def run(self) -> ServingTrace:
        if self.specs.concurrency is not None:
            for _ in range(min(self.specs.concurrency, len(self.specs))):
                self.env.process(self.client())
        else:
            self.env.process(self.arrivals())
        loop = self.env.process(self.step_loop())
        self.env.run(until=loop if self.stop is not None else None)  # stopped: the arrivals still due are dropped
        return self.close()

    def close(self) -> ServingTrace:
        """The trace, with what the scheduler and the links counted, as the run ends."""
        self.trace.in_system_area_s, self.trace.end_s = self.area_s, self.env.now
        self.trace.preemptions = self.scheduler.preemptions
        self.trace.swap_mode = self.scheduler.swap is not None
        self.trace.swaps, self.trace.swap_fallbacks = self.scheduler.swaps, self.scheduler.swap_fallbacks
        d = self.device
        self.trace.h2d_busy_s = busy_union_s(d.h2d.busy, d.h2d_partials.busy, until=self.env.now)
        self.trace.d2h_busy_s = busy_union_s(d.d2h.busy, d.d2h_queries.busy, until=self.env.now)
        if self.pipeline is not None:  # batches in flight overlap: rows are recorded as each comes back
            self.trace.steps.sort(key=lambda r: r.t_s)
        return self.trace

    # ---- requests ------------------------------------------------------------------------------
    def _count(self, delta: int) -> None:
        now = self.env.now
        self.area_s += self.in_system * (now - self.t_changed)
        self.in_system += delta
        self.t_changed = now

    def arrive(self, i: int) -> None:
        t = self.table
        t.arrival_s[i] = self.env.now
        self.sent += 1
        if t.prefilled:  # its first token came with it; a one-token request is already done
            t.first_token_s[i] = t.last_token_s[i] = self.env.now
            if t.output[i] <= 1:
                t.finish_s[i] = self.env.now
                self.tally.finished += 1
                return
        self._count(+1)
        self.scheduler.arrive(i)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def arrivals(self):
        """Open loop: each request at its arrival time, whatever the server is doing."""
        for i, t in enumerate(self.specs.arrival_s):
            yield self.env.timeout(max(0.0, float(t) - self.env.now))
            self.arrive(i)

    def client(self):
        """Closed loop: send a request, wait for its last token, send the next (no think time)."""
        while self.sent < len(self.specs):
            i = self.sent
            self.done[i] = self.env.event()
            self.arrive(i)
            yield self.done[i]

    # ---- the step loop -------------------------------------------------------------------------
    def step_cost(self, plan: StepPlan) -> StepCost:
        ctx, m, pol = self.ctx, self.ctx.scenario.model, self.ctx.scenario.policy
        a = plan.attended
        n = len(plan.decodes)
        chunk = self.chunk_tokens(plan.decodes)
        if n and not a[1] and not a[2] and ctx.sparse_fetch is None:  # the decodes attend T0 alone
            base = self.decode_cost(n, int(a[0]), chunk)
            if not len(plan.chunks):
                return base
            return with_prefill(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, base, n,
                                ctx.kv_bytes_per_token_layer, plan.prefill_tokens, plan.prefill_position_sum(),
                                plan.prefill_kv_tokens(), len(plan.chunks))
        return mixed_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, pol.prefetch,
                               len(plan.decodes), int(a[0]), int(a[1]), int(a[2]), ctx.kv_bytes_per_token_layer,
                               ctx.t2_bytes_per_token_layer, plan.prefill_tokens, plan.prefill_position_sum(),
                               plan.prefill_kv_tokens(), len(plan.chunks), self.device.staged, pol.access,
                               pol.staging_buffers, fetch=ctx.sparse_fetch, chunk_tokens=chunk,
                               staged_tokens=self.staged_tokens(plan))

    def staged_tokens(self, plan: StepPlan) -> tuple[float, float] | None:
        """The decodes' (T1, T2) the mean layer stages, each sequence at its own length
        (`RunContext.staged_tokens`); None without chunked layers (t1, t2 themselves)."""
        counts = plan.decode_counts
        if not self.ctx.model.chunked_tier_share or counts is None:
            return None
        prompt = self.table.prompt[plan.decodes]
        tokens = prompt + self.table.generated[plan.decodes]
        s1, s2 = self.ctx.staged_tokens(counts[:, T1], counts[:, T2], tokens, prompt)
        return float(np.sum(s1)), float(np.sum(s2))

    def chunk_tokens(self, decodes: np.ndarray) -> int | None:
        """Tokens the decodes attend in a chunked layer, each its own chunk's (`layers.chunk_attended` of its
        prompt + generated tokens); None for a model without chunked layers."""
        chunk = self.ctx.model.attention_chunk
        if not chunk or not len(decodes):
            return None
        return int(chunk_attended(self.table.prompt[decodes] + self.table.generated[decodes], chunk).sum())

    def decode_cost(self, n: int, t0: int, chunk_tokens: int | None = None) -> StepCost:
        """The decodes' step where they attend T0 alone (most steps; a mixed step adds its chunks to it,
        `physics.with_prefill`): the parts that depend on the batch alone computed once per batch
        size, the attention per step (`physics.with_decode_attention`)."""
        ctx = self.ctx
        base = self.decode_costs.get(n)
        if base is None:
            m, pol = ctx.scenario.model, ctx.scenario.policy
            base = self.decode_costs[n] = mixed_step_cost(
                ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, pol.prefetch, n, t0, 0, 0,
                ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, staged=self.device.staged,
                access=pol.access, buffers=pol.staging_buffers)
        attention_s = decode_layer_attention_s(ctx.model, ctx.hw, n, t0, ctx.kv_bytes_per_token_layer,
                                               chunk_tokens=chunk_tokens)
        return with_decode_attention(base, attention_s)

    def host_loop_s(self, plan: StepPlan) -> float:
        """The engine's host loop over the step's requests (`engine_rules.host_loop_s`), 0 without an engine."""
        return host_loop_s(self.ctx.hw.launch, len(plan.decodes) + len(plan.chunks), self.ctx.model.attention_dp)

    def retier_traffic(self, plan: StepPlan) -> RetierTraffic:
        ctx = self.ctx
        return retier_traffic(self.device.prefetch, ctx.num_layers, ctx.kv_bytes_per_token_layer,
                              ctx.t2_bytes_per_token_layer, plan.demoted[0], plan.demoted[1], plan.promoted[0], plan.promoted[1],
                              plan.resident[0], plan.resident[1])

    def swap(self, plan: StepPlan):
        """The step's swaps, before its forward pass: preempted K/V out (D2H) before its HBM is
        reused, readmitted K/V in (H2D) before attention reads it."""
        L, tr = self.ctx.num_layers, self.trace
        tr.swap_out_bytes += plan.swap_out_bytes
        tr.swap_in_bytes += plan.swap_in_bytes
        tr.swap_ins += plan.swap_in_requests
        self.unrecorded[0] += plan.swap_out_bytes
        self.unrecorded[1] += plan.swap_in_bytes
        yield from self.device.d2h.transfer(plan.swap_out_bytes, swap_copies(L, plan.swap_out_requests), None, "swap out")
        yield from self.device.h2d.transfer(plan.swap_in_bytes, swap_copies(L, plan.swap_in_requests), None, "swap in")

    def record(self, row: StepRow) -> None:
        """Append a timeline row, with the swaps since the previous one."""
        if self.scheduler.swap is not None:
            row.swapped = len(self.scheduler.swap)
            (row.swap_out_bytes, row.swap_in_bytes), self.unrecorded = self.unrecorded, [0.0, 0.0]
        self.trace.steps.append(row)

    def finish(self, finished) -> None:
        """Requests that got their last token leave the system; a closed-loop client sends its next."""
        if len(finished):
            self.tally.finished += len(finished)
            self._count(-len(finished))
            for i in finished:
                if int(i) in self.done:
                    self.done.pop(int(i)).succeed()

    def step_loop(self):
        """Form a step, run its forward pass (and its decodes' re-tiers), hand out its tokens."""
        if self.pipeline is not None:
            yield from self.pipeline.run()
            return
        sched, env, fixed_bytes = self.scheduler, self.env, self.scheduler.memory.fixed_bytes
        step = 0
        while self.tally.finished < len(self.specs):
            plan = sched.schedule(env.now)
            start = env.now
            yield from self.swap(plan)
            if plan.empty:
                if plan.preempted:  # all preempted: admission resumes on the next pass
                    continue
                self.record(StepRow(env.now, 0.0, 0, len(sched.waiting), 0, 0, fixed_bytes, plan.host_bytes))
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            row = StepRow(start, 0.0, len(sched.running), len(sched.waiting), len(plan.decodes), plan.prefill_tokens,
                          fixed_bytes + plan.hbm_kv_bytes, plan.host_bytes)
            yield from self.device.forward(self.step_cost(plan), None)
            if plan.retiers:
                yield from self.device.retier(self.retier_traffic(plan), None)
            host_s = self.host_loop_s(plan)
            if host_s > env.now - start:  # the engine's host loop outlasts the GPU's work: the step waits for it
                yield env.timeout(host_s - (env.now - start))
            row.step_s = env.now - start
            self.record(row)
            out = sched.complete(plan, env.now, step)
            if out.regular:
                self.trace.itl_step_s.append(row.step_s)
                self.trace.itl_step_tokens.append(out.regular)
            if len(out.gaps):
                self.trace.itl_other_s.append(out.gaps)
            step += 1
            self.finish(out.finished)
            if self.stop is not None and self.stop(self.view):
                self.stopped = True
                return
            if len(out.finished) and self.specs.concurrency is not None:
                yield env.timeout(0)  # let the clients whose request finished send their next one
