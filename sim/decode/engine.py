"""SimPy timing of a decode run, written as SimPy's own examples are: `DecodeSim` owns the
resources (the two link directions; with host access the host's thread pool and its DRAM) and each
behaviour is a named generator method - the step loop, one forward pass per prefetch mode or access
strategy, the re-tier's transfers.

What to schedule comes from pure functions: the tier plan (`tier_plan.plan_tiers`: which tokens sit
where at each step), a step's cost (`physics.decode_step_cost`) and a re-tier's traffic
(`physics.retier_traffic`). The processes here only schedule them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from sim.device.engine_rules import host_loop_s
from sim.device.host_dram import HostDram
from sim.device.intervals import busy_union_s
from sim.device.physics import RetierTraffic, StepCost, decode_step_cost, retier_traffic
from sim.tiering.tier_plan import ACTIVE, ATT_T0, ATT_T1, ATT_T2, MV_D2H_T1, MV_D2H_T2, MV_H2D_T1, MV_H2D_T2, TierPlan
from sim.tiering.tiers import T1, T2

from .context import RunContext

STALL_EPS_S = 1e-12  # below this a "stall" is floating-point noise of summing layer times
TIMELINE_STEPS = 4  # steps whose activity is recorded for the report's timeline


@dataclass
class StepRecord:
    step: int
    t_s: float
    step_s: float
    compute_s: float
    stall_s: float
    h2d_bytes: float
    d2h_bytes: float


@dataclass
class DecodeTiming:
    """What the engine measured: one record per step, each link direction's busy intervals, and
    the activity of a few steps for the timeline view."""

    records: list[StepRecord]
    h2d_busy: list[tuple[float, float]]
    d2h_busy: list[tuple[float, float]]
    timeline: list[dict] = field(default_factory=list)  # compute / h2d / d2h intervals in a window
    decode_s: float = 0.0
    host_busy: list[tuple[float, float]] = field(default_factory=list)  # host CPU attending T1/T2

    def step_frame(self) -> pd.DataFrame:
        return pd.DataFrame([r.__dict__ for r in self.records])

    def busy_s(self, *directions: str, until: float) -> float:
        """Seconds any of `directions` (h2d, d2h, host) was busy before `until`."""
        lists = {"h2d": self.h2d_busy, "d2h": self.d2h_busy, "host": self.host_busy}
        return busy_union_s(*(lists[d] for d in directions), until=until)


class Link:
    """One direction of the host link: a SimPy resource that records its busy intervals. With one
    copy engine both directions share the resource; otherwise a copy that starts while the other
    direction is busy gets the bidirectional share of the bandwidth. With host access a bulk copy is
    also a flow in the host DRAM (`dram`): it reads or writes host memory beside the host attention."""

    def __init__(self, env: simpy.Environment, model, resource: simpy.Resource, name: str,
                 dram: HostDram | None = None, bulk: bool = True):
        self.env, self.model, self.res, self.name = env, model, resource, name
        self.busy: list[tuple[float, float]] = []
        self.other: Link | None = None
        self.dram, self.bulk = dram, bulk  # bulk: not host attention's kilobyte queries and partials

    def other_busy(self) -> bool:
        """A bulk copy holds the other direction's engine (host attention's queries and partials,
        kilobytes, do not make a bulk copy share)."""
        o = self.other
        return o is not None and o.res is not self.res and any(getattr(r, "bulk", False) for r in o.res.users)

    def transfer(self, nbytes: float, copies: int, timeline: list | None, tag: str, host_s: float = 0.0):
        """`host_s`: host work the copies wait for inside the transfer (the prototype's packing)."""
        if nbytes <= 0 or copies <= 0:
            return
        with self.res.request() as req:
            req.bulk = self.bulk
            yield req
            start = self.env.now
            if self.dram is None:
                yield self.env.timeout(self.model.transfer_time_s(nbytes, copies, self.other_busy()) + host_s)
            else:  # host access: the copy is a DRAM flow at its link-model rate, slowed where the DRAM is short
                yield from self.dram.flow(self.model.transfer_time_s(nbytes, copies, self.other_busy()), nbytes, False)
                if host_s > 0:
                    yield self.env.timeout(host_s)
            self.busy.append((start, self.env.now))
            if timeline is not None:
                timeline.append({"kind": self.name, "start_s": start, "end_s": self.env.now, "what": tag})


def timeline_window(plan: TierPlan) -> range:
    """Steps whose activity is recorded: from just before the first re-tier that moves tokens,
    so the window shows that re-tier's offload and the prefetches that follow it."""
    m = plan.retier_moves
    moved = (m[:, MV_D2H_T1] + m[:, MV_D2H_T2] + m[:, MV_H2D_T1] + m[:, MV_H2D_T2]).nonzero()[0]
    first = max(0, int(moved[0]) - 1) if len(moved) else 0
    return range(first, first + TIMELINE_STEPS)


class DecodeSim:
    """One decode run of a batch on one GPU and its host link. `start_s`: the clock at the start (the
    fast level walks windows of steps from the middle of a run, `run_window`); `env`: a clock shared
    with other GPUs (a serving fleet's replicas)."""

    def __init__(self, ctx: RunContext, plan: TierPlan, start_s: float = 0.0, env: simpy.Environment | None = None):
        self.ctx, self.plan = ctx, plan
        pol = ctx.scenario.policy
        self.prefetch, self.buffers, self.access = pol.prefetch, pol.staging_buffers, pol.access
        self.staged = ctx.policy.tiering and pol.prefetch != "per_interval"  # T1/T2 cross the link every step
        self.blocking_offload = pol.prefetch == "sync_per_step" or not pol.pinned
        self.layer_detail = ctx.scenario.sim.detail == "layer"
        self.stride = ctx.scenario.sim.step_stride
        self.env = env or simpy.Environment(initial_time=start_s)  # a fleet's replicas share one clock
        # with host access the host DRAM is shared by the attention stream and every bulk copy
        self.dram = HostDram(self.env, ctx.hw.host_cpu.shared_bytes_per_s) if ctx.hw.host_cpu is not None else None
        h2d_res = simpy.Resource(self.env, capacity=1)
        d2h_res = h2d_res if ctx.hw.copy_engines < 2 else simpy.Resource(self.env, capacity=1)
        self.h2d = Link(self.env, ctx.hw.h2d, h2d_res, "h2d", self.dram)
        self.d2h = Link(self.env, ctx.hw.d2h, d2h_res, "d2h", self.dram)
        self.h2d.other, self.d2h.other = self.d2h, self.h2d
        # host attention's queries and partial outputs are tiny: with a third copy engine they need not
        # queue behind bulk copies; they never make a bulk copy take the bidirectional share
        small = ctx.hw.copy_engines >= 3
        q_res = simpy.Resource(self.env, capacity=1) if small else d2h_res
        p_res = simpy.Resource(self.env, capacity=1) if small else h2d_res
        self.d2h_queries = Link(self.env, ctx.hw.d2h, q_res, "d2h", bulk=False)
        self.h2d_partials = Link(self.env, ctx.hw.h2d, p_res, "h2d", bulk=False)
        self.d2h_queries.other, self.h2d_partials.other = self.h2d, self.d2h
        self.host = simpy.Resource(self.env, capacity=1)  # the host's attention thread pool: one layer at a time
        self.host_busy: list[tuple[float, float]] = []
        self.records: list[StepRecord] = []
        self.timeline: list[dict] = []

    def run(self) -> DecodeTiming:
        self.env.process(self.decode())
        self.env.run()
        return self.timing()

    def timing(self) -> DecodeTiming:
        """What this sim measured so far."""
        decode_s = self.records[-1].t_s if self.records else 0.0
        # an async offload can outlive the last step; utilisation is over the decode span
        return DecodeTiming(self.records, self.h2d.busy + self.h2d_partials.busy, self.d2h.busy + self.d2h_queries.busy,
                            self.timeline, decode_s, self.host_busy)

    def run_window(self, first: int) -> int:
        """Run `window` from step `first`; returns the step after it."""
        walk = self.env.process(self.window(first))
        self.env.run()
        return walk.value

    def link_in_flight(self) -> bool:
        """A copy holds or waits for either link direction."""
        return any(r.count or r.queue for r in (self.h2d.res, self.d2h.res))

    # ---- costs (pure functions, evaluated per step) -----------------------------------------
    def step_cost(self, s: int) -> StepCost:
        ctx, row = self.ctx, self.plan.attended[s]
        m = ctx.scenario.model
        return decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, self.prefetch,
                                int(row[ACTIVE]), int(row[ATT_T0]), int(row[ATT_T1]), int(row[ATT_T2]),
                                ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, self.staged, self.access,
                                self.buffers, fetch=ctx.sparse_fetch, chunk_tokens=self.chunk_tokens(s),
                                staged_tokens=self.staged_tokens(s))

    def chunk_tokens(self, s: int) -> int | None:
        """Step `s`'s chunked-layer reads (`RunContext.closed_chunk_tokens`); None without chunked layers."""
        out = self.ctx.closed_chunk_tokens(self.plan.attended[[s]], np.array([s]))
        return None if out is None else int(out[0])

    def staged_tokens(self, s: int) -> tuple | None:
        """Step `s`'s (T1, T2) the mean layer stages (`RunContext.closed_staged_tokens`); None without
        chunked layers."""
        out = self.ctx.closed_staged_tokens(self.plan.attended[[s]], np.array([s]))
        return None if out is None else (float(out[0][0]), float(out[1][0]))

    def retier_traffic(self, s: int) -> RetierTraffic:
        ctx, mv, after = self.ctx, self.plan.retier_moves[s], self.plan.tiers_after[s]
        return retier_traffic(self.prefetch, ctx.num_layers, ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer,
                              mv[MV_D2H_T1], mv[MV_D2H_T2], mv[MV_H2D_T1], mv[MV_H2D_T2], after[T1], after[T2],
                              float(ctx.closed_kept(s)))

    def forward_bytes(self, cost: StepCost) -> tuple[float, float]:
        """(H2D, D2H) bytes of a step's forward pass: prefetched T1/T2, host attention's partial
        outputs back and queries out, every layer."""
        h2d_bytes = self.ctx.num_layers * cost.prefetch_bytes_per_layer if self.staged else 0.0
        d2h_bytes = 0.0
        if cost.host is not None:
            h2d_bytes += self.ctx.num_layers * cost.host.partial_bytes
            d2h_bytes = self.ctx.num_layers * cost.host.query_bytes
        return h2d_bytes, d2h_bytes

    # ---- processes ---------------------------------------------------------------------------
    def decode(self):
        """The step loop: each step's forward pass, then its re-tier if one is due."""
        window = timeline_window(self.plan)
        last: StepRecord | None = None
        last_h2d_busy_s = 0.0
        for s in range(self.plan.steps):
            tl = self.timeline if s in window else None
            n_recorded = len(self.timeline)
            if last is not None and s % self.stride and not self.plan.retier_due[s] and tl is None:
                # stride: repeat the last simulated step's time (and link busy time) instead of simulating it
                start = self.env.now
                yield self.env.timeout(last.step_s)
                if last_h2d_busy_s > 0:
                    self.h2d.busy.append((start, start + last_h2d_busy_s))
                last = self.record(s, start, self.forward_bytes(self.step_cost(s)), last.compute_s)
            else:
                n_busy = len(self.h2d.busy)
                last = yield from self.step(s, tl)
                last_h2d_busy_s = sum(b - a for a, b in self.h2d.busy[n_busy:])
            for rec in self.timeline[n_recorded:]:
                rec["step"] = s

    def window(self, first: int):
        """The fast level's walk next to a re-tier (host access): from step `first`, the link idle as
        it starts, step after step at this sim's level - the re-tier, then each step that starts while
        its offload is in flight - until a step would start with the link idle; returns that step."""
        s = first
        while True:
            yield from self.step(s, None)
            s += 1
            if s >= self.plan.steps or not self.link_in_flight():
                return s

    def step(self, s: int, tl: list | None):
        """One step: its forward pass, then its re-tier if one is due, and the engine's host loop where
        that outlasts both (`engine_rules.host_loop_s`: it runs beside the GPU's work, so it hides any
        stall, and the step's busy time is the loop's); returns its record."""
        start = self.env.now
        cost = self.step_cost(s)
        yield from self.forward(cost, tl)
        traffic = None
        if self.plan.retier_due[s]:
            traffic = self.retier_traffic(s)
            yield from self.retier(traffic, tl)
        compute_s = cost.compute_s
        loop_s = host_loop_s(self.ctx.hw.launch, int(self.plan.attended[s, ACTIVE]), self.ctx.model.attention_dp)
        if loop_s > self.env.now - start:
            yield self.env.timeout(loop_s - (self.env.now - start))
            compute_s = loop_s
        return self.record(s, start, self.forward_bytes(cost), compute_s, traffic)

    def record(self, s: int, start: float, forward_bytes: tuple[float, float], compute_s: float,
               traffic: RetierTraffic | None = None) -> StepRecord:
        h2d_bytes, d2h_bytes = forward_bytes
        if traffic is not None:
            h2d_bytes += traffic.h2d_bytes
            d2h_bytes += traffic.d2h_bytes
        step_s = self.env.now - start
        stall_s = step_s - compute_s
        rec = StepRecord(s, self.env.now, step_s, compute_s, stall_s if stall_s > STALL_EPS_S else 0.0, h2d_bytes,
                         d2h_bytes)
        self.records.append(rec)
        return rec

    def forward(self, cost: StepCost, tl: list | None):
        """One step's forward pass in the policy's prefetch mode, then its tail."""
        if cost.host is not None:
            yield from (self.host_layers(cost, tl) if self.walk_host_step(cost) else self.host_closed_form(cost, tl))
        elif cost.stages and cost.on_demand:  # sparse_fetch: each layer fetches its picks after its indexer
            walk = self.layer_detail or self.link_in_flight()
            yield from (self.on_demand_layers(cost, tl) if walk else self.layerwise_closed_form(cost, tl))
        elif cost.stages and self.prefetch == "layerwise_async":
            walk = self.layer_detail or (self.dram is not None and self.link_in_flight())  # split prefetching it all
            yield from (self.layerwise_layers(cost, tl) if walk else self.layerwise_closed_form(cost, tl))
        elif cost.stages and self.prefetch == "sync_per_step":
            yield from self.sync_copies(cost, tl)
            yield from self.compute(cost.num_layers * cost.layer.total_s, tl, "forward")
        else:  # nothing staged (full_hbm, per_interval, or no host tokens yet)
            yield from self.compute(cost.num_layers * cost.layer.total_s, tl, "forward")
        yield from self.compute(cost.tail_s, tl, "lm head + sampling")

    def walk_host_step(self, cost: StepCost) -> bool:
        """Whether a host-access step runs layer by layer: always at the layer level; at the step
        level where its closed form (`host_pipeline`: the link and the host DRAM to this step alone)
        does not hold - a copy (an offload) is in flight as it starts, or one copy engine serialises
        its queries behind its prefetches. (With host access the step level also walks a step that
        prefetches all of its T1/T2 while a copy is in flight: `split` choosing no host share.)"""
        return self.layer_detail or self.link_in_flight() or (cost.stages and self.ctx.hw.copy_engines < 2)

    def layerwise_layers(self, cost: StepCost, tl: list | None):
        """Layer by layer: a copier brings each layer's T1/T2 into one of the staging buffers while
        earlier layers compute; a layer's attention waits for its copy, then frees the buffer."""
        env, L = self.env, cost.num_layers
        buffers = simpy.Container(env, capacity=self.buffers, init=self.buffers)
        staged = [env.event() for _ in range(L)]
        env.process(self.layerwise_copier(cost, buffers, staged, tl))
        pre_s, rest_s = cost.layer.pre_attention_s, cost.layer.post_attention_s
        for layer in range(L):
            start = env.now
            yield env.timeout(pre_s)
            yield staged[layer]  # attention needs this layer's staged tokens
            yield buffers.put(1)  # they move into the attention workspace: buffer free
            yield env.timeout(rest_s)
            if tl is not None:
                tl.append({"kind": "compute", "start_s": start, "end_s": env.now, "what": f"layer {layer}"})

    def on_demand_layers(self, cost: StepCost, tl: list | None):
        """sparse_fetch, layer by layer: the layer's pre-attention (its indexer picks the rows), then its
        copy of the picked host rows (waiting for the H2D direction like any copy), then the rest."""
        pre_s, rest_s = cost.layer.pre_attention_s, cost.layer.post_attention_s
        for layer in range(cost.num_layers):
            start = self.env.now
            yield self.env.timeout(pre_s)
            yield from self.h2d.transfer(cost.prefetch_bytes_per_layer, cost.prefetch_copies_per_layer, tl,
                                         f"fetch L{layer}")
            yield self.env.timeout(rest_s)
            if tl is not None:
                tl.append({"kind": "compute", "start_s": start, "end_s": self.env.now, "what": f"layer {layer}"})

    def layerwise_copier(self, cost: StepCost, buffers: simpy.Container, staged: list, tl: list | None):
        for layer in range(cost.num_layers):
            yield buffers.get(1)
            yield from self.h2d.transfer(cost.prefetch_bytes_per_layer, cost.prefetch_copies_per_layer, tl,
                                         f"prefetch L{layer}")
            staged[layer].succeed()

    def layerwise_closed_form(self, cost: StepCost, tl: list | None):
        """Step level: the same pipeline from its closed form (`physics.layerwise_pipeline`), the
        H2D direction held for the whole forward pass."""
        copy_s = cost.prefetch_copy_s(self.ctx.hw.h2d, self.h2d.other_busy())
        copies, computes = cost.layerwise_pipeline(copy_s, self.buffers)
        with self.h2d.res.request() as req:
            req.bulk = True
            yield req
            start = self.env.now
            yield self.env.timeout(computes[-1][1])
        self.h2d.busy.extend((start + a, start + b) for a, b in copies)
        if tl is not None:
            tl.extend({"kind": "h2d", "start_s": start + a, "end_s": start + b, "what": f"prefetch L{i}"}
                      for i, (a, b) in enumerate(copies))
            tl.extend({"kind": "compute", "start_s": start + a, "end_s": start + b, "what": f"layer {i}"}
                      for i, (a, b) in enumerate(computes))

    def host_layers(self, cost: StepCost, tl: list | None):
        """Layer by layer with part (or all) of T1/T2 attended on the host: once a layer's prefetched
        part is staged, its queries go to the host, which attends its tokens while the GPU attends its
        own; the layer continues when both are done."""
        env, L = self.env, cost.num_layers
        staged = None
        if cost.stages:
            buffers = simpy.Container(env, capacity=self.buffers, init=self.buffers)
            staged = [env.event() for _ in range(L)]
            env.process(self.layerwise_copier(cost, buffers, staged, tl))
        pre_s, attention_s = cost.layer.pre_attention_s, cost.layer.attention_s
        after_s = cost.layer.post_attention_s - attention_s  # output projection, MLP, launch gaps
        for layer in range(L):
            start = env.now
            yield env.timeout(pre_s)
            if staged is not None:
                yield staged[layer]
                yield buffers.put(1)
            on_host = env.process(self.host_attention(cost.host, tl, layer))
            yield env.timeout(attention_s)
            yield on_host  # merge the host's partial outputs by their log-sum-exp
            yield env.timeout(after_s)
            if tl is not None:
                tl.append({"kind": "compute", "start_s": start, "end_s": env.now, "what": f"layer {layer}"})

    def host_attention(self, path, tl: list | None, layer: int):
        """Queries device->host, attention on the host's thread pool (its dispatch, then its K/V stream
        as a flow in the shared host DRAM), partial outputs host->device."""
        yield from self.d2h_queries.transfer(path.query_bytes, 1, tl, f"queries L{layer}")
        with self.host.request() as req:
            yield req
            start = self.env.now
            yield self.env.timeout(path.dispatch_s)
            yield from self.dram.flow(path.stream_s, path.kv_bytes, True)
            self.host_busy.append((start, self.env.now))
            if tl is not None:
                tl.append({"kind": "host", "start_s": start, "end_s": self.env.now, "what": f"host attention L{layer}"})
        yield from self.h2d_partials.transfer(path.partial_bytes, 1, tl, f"partials L{layer}")

    def host_closed_form(self, cost: StepCost, tl: list | None):
        """Step level: `host_pipeline`'s closed form of the step (the link and the host DRAM to itself),
        the H2D direction held for the forward pass."""
        hw = self.ctx.hw
        times = cost.host_times(hw, cost.prefetch_copy_s(hw.h2d) if cost.stages else 0.0, self.buffers)
        with self.h2d.res.request() as req:
            req.bulk = True
            yield req
            start = self.env.now
            yield self.env.timeout(times.finish_s)
        for busy, intervals in ((self.h2d.busy, [c for c in times.copies if c is not None]),
                                (self.d2h_queries.busy, times.queries), (self.host_busy, times.host),
                                (self.h2d_partials.busy, times.partials)):
            busy.extend((start + a, start + b) for a, b in intervals)
        if tl is not None:
            tl.extend({"kind": "compute", "start_s": start + a, "end_s": start + b, "what": f"layer {i}"}
                      for i, (a, b) in enumerate(times.layers))

    def sync_copies(self, cost: StepCost, tl: list | None):
        """The prototype: every layer's T1 copied (per-layer pageable copies, packed on the host
        first) before the forward pass starts."""
        for layer in range(cost.num_layers):
            yield from self.h2d.transfer(cost.prefetch_bytes_per_layer, cost.prefetch_copies_per_layer, tl,
                                         f"sync copy L{layer}", cost.pack_s_per_layer)

    def retier(self, traffic: RetierTraffic, tl: list | None):
        """Offloads (D2H) run beside the next steps unless they block (pageable memory or the
        prototype); promotions (H2D) must land before the next step attends them."""
        offload = self.env.process(self.d2h.transfer(traffic.d2h_bytes, traffic.d2h_copies, tl, "offload"))
        if self.blocking_offload:
            yield offload
        yield self.env.process(self.h2d.transfer(traffic.h2d_bytes, traffic.h2d_copies, tl, "promote"))

    def compute(self, dur: float, tl: list | None, what: str):
        start = self.env.now
        yield self.env.timeout(dur)
        if tl is not None:
            tl.append({"kind": "compute", "start_s": start, "end_s": self.env.now, "what": what})


def run_timing(ctx: RunContext, plan: TierPlan) -> DecodeTiming:
    """Time a decode run of `plan` (the SimPy reference model)."""
    return DecodeSim(ctx, plan).run()
