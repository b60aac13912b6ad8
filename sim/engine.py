"""SimPy timing of a decode run: the GPU computes layer by layer; host->device and device->host
are separate link resources; prefetch follows the policy's mode; re-tiers move bytes.

The tier plan (which tokens are where at each step) comes from `evolution.evolve`; this module only
schedules the costs that `physics` computes for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from .context import RunContext
from .evolution import ACTIVE, ATT_T0, ATT_T1, ATT_T2, MV_D2H_T1, MV_D2H_T2, MV_H2D_T1, MV_H2D_T2, StepPlan
from .physics import (LayerCost, decode_layer_cost, host_pack_s, layerwise_pipeline, prefetch_copies_per_layer,
                      retier_copies, step_tail_s)
STALL_EPS_S = 1e-12  # below this a "stall" is floating-point noise of summing layer times


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
class Timing:
    records: list[StepRecord]
    h2d_busy: list[tuple[float, float]]
    d2h_busy: list[tuple[float, float]]
    timeline: list[dict] = field(default_factory=list)  # compute / h2d / d2h intervals in a window
    decode_s: float = 0.0


class _Link:
    """One direction of the host link as a SimPy resource that records its busy intervals."""

    def __init__(self, env: simpy.Environment, model, resource: simpy.Resource, name: str):
        self.env, self.model, self.res, self.name = env, model, resource, name
        self.busy: list[tuple[float, float]] = []
        self.other: _Link | None = None

    def transfer(self, nbytes: float, copies: int, timeline: list | None, tag: str, host_s: float = 0.0):
        """`host_s`: host work the copies wait for inside the transfer (the prototype's packing)."""
        if nbytes <= 0 or copies <= 0:
            return
        with self.res.request() as req:
            yield req
            both = self.other is not None and self.other.res.count > 0 and self.other.res is not self.res
            dur = self.model.transfer_time_s(nbytes, copies, both) + host_s
            start = self.env.now
            yield self.env.timeout(dur)
            self.busy.append((start, self.env.now))
            if timeline is not None:
                timeline.append({"kind": self.name, "start_s": start, "end_s": self.env.now, "what": tag})


def _layer_cost(ctx: RunContext, row: np.ndarray) -> LayerCost:
    m = ctx.scenario.model
    attended = int(row[ATT_T0] + row[ATT_T1] + row[ATT_T2])
    return decode_layer_cost(
        ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, int(row[ACTIVE]), attended,
        ctx.kv_bytes_per_token_layer, int(row[ATT_T2]), ctx.t2_bytes_per_token_layer,
    )


def _prefetch_layer(ctx: RunContext, row: np.ndarray) -> tuple[float, int]:
    """(bytes, copies) of one layer's T1/T2 prefetch for the batch."""
    nbytes = row[ATT_T1] * ctx.kv_bytes_per_token_layer + row[ATT_T2] * ctx.t2_bytes_per_token_layer
    copies = prefetch_copies_per_layer(ctx.scenario.policy.prefetch, row[ATT_T1] > 0, row[ATT_T2] > 0)
    return float(nbytes), copies


TIMELINE_STEPS = 4


def timeline_window(plan: StepPlan) -> range:
    """Steps whose activity is recorded: from just before the first re-tier that moves tokens,
    so the window shows that re-tier's offload and the prefetches that follow it."""
    moved = np.flatnonzero(plan.moves[:, MV_D2H_T1] + plan.moves[:, MV_D2H_T2] + plan.moves[:, MV_H2D_T1] + plan.moves[:, MV_H2D_T2])
    first = max(0, int(moved[0]) - 1) if len(moved) else 0
    return range(first, first + TIMELINE_STEPS)


def run_timing(ctx: RunContext, plan: StepPlan) -> Timing:
    sc = ctx.scenario
    pol = sc.policy
    L = ctx.num_layers
    env = simpy.Environment()
    h2d_res = simpy.Resource(env, capacity=1)
    d2h_res = h2d_res if ctx.hw.copy_engines < 2 else simpy.Resource(env, capacity=1)
    h2d = _Link(env, ctx.hw.h2d, h2d_res, "h2d")
    d2h = _Link(env, ctx.hw.d2h, d2h_res, "d2h")
    h2d.other, d2h.other = d2h, h2d
    records: list[StepRecord] = []
    timeline: list[dict] = []
    window = timeline_window(plan)
    stride = sc.sim.step_stride
    blocking_offload = pol.prefetch == "sync_per_step" or not pol.pinned
    layer_detail = sc.sim.detail == "layer"
    last: StepRecord | None = None

    def compute(dur: float, tl: list | None, what: str):
        start = env.now
        yield env.timeout(dur)
        if tl is not None:
            tl.append({"kind": "compute", "start_s": start, "end_s": env.now, "what": what})

    def step_body(s: int, row: np.ndarray, tl: list | None):
        """One decode step's forward pass; returns compute seconds (the rest is stall)."""
        cost = _layer_cost(ctx, row)
        layer_s, pre_s, rest_s = cost.total_s, cost.pre_attention_s, cost.post_attention_s
        pf_bytes, pf_copies = _prefetch_layer(ctx, row)
        tiered = ctx.policy.tiering and pf_bytes > 0
        if tiered and pol.prefetch == "layerwise_async":
            if layer_detail:
                buffers = simpy.Container(env, capacity=pol.staging_buffers, init=pol.staging_buffers)
                done = [env.event() for _ in range(L)]

                def copier():
                    for layer in range(L):
                        yield buffers.get(1)
                        yield from h2d.transfer(pf_bytes, pf_copies, tl, f"prefetch L{layer}")
                        done[layer].succeed()

                env.process(copier())
                for layer in range(L):
                    start = env.now
                    yield env.timeout(pre_s)
                    yield done[layer]  # attention needs this layer's staged tokens
                    yield buffers.put(1)  # they move into the attention workspace: buffer free
                    yield env.timeout(rest_s)
                    if tl is not None:
                        tl.append({"kind": "compute", "start_s": start, "end_s": env.now, "what": f"layer {layer}"})
            else:
                both = d2h.res.count > 0 and d2h.res is not h2d.res
                copy_s = ctx.hw.h2d.transfer_time_s(pf_bytes, pf_copies, both)
                copies, computes = layerwise_pipeline([pre_s] * L, [rest_s] * L, [copy_s] * L, pol.staging_buffers)
                with h2d.res.request() as req:
                    yield req
                    start = env.now
                    yield env.timeout(computes[-1][1])
                h2d.busy.extend((start + a, start + b) for a, b in copies)
                if tl is not None:
                    tl.extend({"kind": "h2d", "start_s": start + a, "end_s": start + b, "what": f"prefetch L{i}"}
                              for i, (a, b) in enumerate(copies))
                    tl.extend({"kind": "compute", "start_s": start + a, "end_s": start + b, "what": f"layer {i}"}
                              for i, (a, b) in enumerate(computes))
        elif tiered and pol.prefetch == "sync_per_step":
            # the prototype: every layer's T1 copied (per-layer pageable copies), then compute
            pack_s = host_pack_s(ctx.hw, row[ATT_T1] * ctx.kv_bytes_per_token_layer)
            for layer in range(L):
                yield from h2d.transfer(pf_bytes, pf_copies, tl, f"sync copy L{layer}", pack_s)
            yield from compute(L * layer_s, tl, "forward")
        else:
            yield from compute(L * layer_s, tl, "forward")
        yield from compute(step_tail_s(ctx.model, ctx.hw, int(row[ACTIVE])), tl, "lm head + sampling")
        return L * layer_s + step_tail_s(ctx.model, ctx.hw, int(row[ACTIVE]))

    def retier_traffic(s: int, tl: list | None):
        """Offloads (D2H) and promotions (H2D) of the re-tier after step s; returns H2D, D2H bytes."""
        mv = plan.moves[s]
        d2h_bytes = L * (mv[MV_D2H_T1] * ctx.kv_bytes_per_token_layer + mv[MV_D2H_T2] * ctx.t2_bytes_per_token_layer)
        h2d_bytes = L * (mv[MV_H2D_T1] * ctx.kv_bytes_per_token_layer + mv[MV_H2D_T2] * ctx.t2_bytes_per_token_layer)
        d2h_copies = retier_copies(pol.prefetch, L, mv[MV_D2H_T1] > 0, mv[MV_D2H_T2] > 0)
        h2d_copies = retier_copies(pol.prefetch, L, mv[MV_H2D_T1] > 0, mv[MV_H2D_T2] > 0)
        if pol.prefetch == "per_interval":
            # T1/T2 brought back once per interval and kept resident on the GPU
            after = plan.after[s]
            h2d_bytes += L * (after[1] * ctx.kv_bytes_per_token_layer + after[2] * ctx.t2_bytes_per_token_layer)
            h2d_copies += L * prefetch_copies_per_layer(pol.prefetch, after[1] > 0, after[2] > 0)
        offload = env.process(d2h.transfer(float(d2h_bytes), d2h_copies, tl, "offload"))
        if blocking_offload:
            yield offload
        # promoted tokens must be in HBM before the next step attends them
        yield env.process(h2d.transfer(float(h2d_bytes), h2d_copies, tl, "promote"))
        return float(h2d_bytes), float(d2h_bytes)

    def decode():
        nonlocal last
        last_h2d_busy_s = 0.0
        for s in range(plan.steps):
            row = plan.attend[s]
            tl = timeline if s in window else None
            n_recorded = len(timeline)
            start = env.now
            pf_bytes, _ = _prefetch_layer(ctx, row)
            h2d_b = L * pf_bytes if (ctx.policy.tiering and pol.prefetch != "per_interval") else 0.0
            if last is not None and s % stride and not plan.retier[s] and tl is None:
                # stride: repeat the last simulated step's time (and link busy time) instead of simulating it
                yield env.timeout(last.step_s)
                if last_h2d_busy_s > 0:
                    h2d.busy.append((start, start + last_h2d_busy_s))
                compute_s = last.compute_s
            else:
                n_busy = len(h2d.busy)
                compute_s = yield from step_body(s, row, tl)
                last_h2d_busy_s = sum(b - a for a, b in h2d.busy[n_busy:])
            d2h_b = 0.0
            if plan.retier[s]:
                extra_h2d, d2h_b = yield from retier_traffic(s, tl)
                h2d_b += extra_h2d
            step_s = env.now - start
            for rec in timeline[n_recorded:]:
                rec["step"] = s
            stall_s = step_s - compute_s
            last = StepRecord(s, env.now, step_s, compute_s, stall_s if stall_s > STALL_EPS_S else 0.0, h2d_b, d2h_b)
            records.append(last)

    env.process(decode())
    env.run()
    decode_s = records[-1].t_s if records else 0.0
    # an async offload can outlive the last step; utilisation is over the decode span
    return Timing(records=records, h2d_busy=h2d.busy, d2h_busy=d2h.busy, timeline=timeline, decode_s=decode_s)
