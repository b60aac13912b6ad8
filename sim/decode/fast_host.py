"""The fast level of host access (`sim.detail: fast` with policy.access host_attention / split; the
method is sim/decode/fast.py's):

- step costs as arrays over steps x split options: `physics.decode_step_cost` for every fraction
  split tries, the same formulas in the same order (the same floats), and the first fastest option
  of each step, as `min` picks it;
- steps with the link idle as they start: `host_pipeline`'s closed form as arrays, one pass per layer
  (the host DRAM shared by the attention stream and the step's own prefetches);
- steps next to a re-tier: the re-tier step and every step that starts while its offload is in
  flight are walked by the engine itself (`engine.DecodeSim.run_window`, the step level: layer by
  layer against the offload, the link's and the DRAM's state), from the window's start time.

So every step is timed as the step level times it, and the step level follows the layer level step
for step (tests/test_fast.py). Busy time of steps away from re-tiers comes from the same closed form
(a partial-output or query copy counts only where no prefetch copy covers it, as a union would).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.device.intervals import busy_union_s
from sim.device.physics import (
    PARTIAL_BYTES_PER_ELEMENT,
    QUERY_BYTES_PER_ELEMENT,
    SPLIT_STEPS,
    T2_BLOCKS,
    attention_flop,
    decode_attention_s,
    decode_layer_cost,
    decode_step_cost,
    gpu_chunk_tokens,
    step_tail_s,
)
from sim.tiering.tier_plan import ACTIVE, ATT_T0, ATT_T1, ATT_T2, TierPlan

from .context import RunContext
from .engine import STALL_EPS_S, DecodeSim
from .fast_arrays import FastTiming, host_loop_arrays_s, pipeline_finish_s, staged_columns, step_arrays


def split_fractions(access: str) -> list[float]:
    """The shares of the host-resident tokens attended on the host that `decode_step_cost` tries, in its order."""
    return [1.0] if access == "host_attention" else [1.0 - i / SPLIT_STEPS for i in range(SPLIT_STEPS + 1)]


def transfer_times_s(link, nbytes: np.ndarray, copies: np.ndarray, both_busy: bool = False) -> np.ndarray:
    """`LinkModel.transfer_time_s` over arrays: its formula where no measured curve applies, else
    once per distinct size."""
    nbytes, copies = np.broadcast_arrays(np.asarray(nbytes, dtype=float), np.asarray(copies))
    if link.curve is not None and not both_busy:
        uniq, inv = np.unique(np.column_stack([nbytes, copies]), axis=0, return_inverse=True)
        return np.array([link.transfer_time_s(b, int(c), both_busy) for b, c in uniq])[inv.ravel()]
    bw = link.bidirectional_bytes_per_s if both_busy else link.bytes_per_s
    ok = (nbytes > 0) & (copies > 0)
    c = np.where(ok, copies, 1)
    size = nbytes / c
    t = link.per_copy_latency_s + size / bw
    if link.cap_bytes_per_s < np.inf:
        share = link.bidirectional_bytes_per_s / link.bytes_per_s if both_busy else 1.0
        t = np.maximum(t, link.per_copy_latency_s + size / (link.cap_bytes_per_s * share))
    return np.where(ok, c * t, 0.0)


def pair_speeds(stream_demand: np.ndarray, copy_demand: np.ndarray, capacity: float) -> tuple[np.ndarray, np.ndarray]:
    """`host_pipeline.dram_speeds` of (attention stream, one copy) over arrays."""
    lo, fair = np.minimum(stream_demand, copy_demand), capacity / 2
    fits = stream_demand + copy_demand <= capacity
    safe_h, safe_c = np.where(stream_demand > 0, stream_demand, 1.0), np.where(copy_demand > 0, copy_demand, 1.0)
    host_first = stream_demand <= copy_demand  # the smaller demand is served first (ties: the stream)
    s_host = np.where(fits | (host_first & (lo <= fair)), 1.0,
                      np.where(lo > fair, fair / safe_h, (capacity - copy_demand) / safe_h))
    s_copy = np.where(fits | (~host_first & (lo <= fair)), 1.0,
                      np.where(lo > fair, fair / safe_c, (capacity - stream_demand) / safe_c))
    return np.where(stream_demand > 0, s_host, 1.0), np.where(copy_demand > 0, s_copy, 1.0)


@dataclass(frozen=True)
class PipelineArrays:
    """The closed form's finish and busy seconds per step (the union of each kind of interval)."""

    finish_s: np.ndarray  # the last layer's end
    copy_busy_s: np.ndarray
    partials_busy_s: np.ndarray  # while no prefetch copy is on the link
    queries_busy_s: np.ndarray
    queries_alone_s: np.ndarray  # while no prefetch copy is on the link
    host_busy_s: np.ndarray


def host_pipeline_arrays(pre, att, after, copy_s, copy_bytes, query_s, query_shared_s, dispatch, stream,
                         stream_bytes, partials, num_layers: int, buffers: int, capacity: float,
                         partials_behind_copies: bool) -> PipelineArrays:
    """`host_pipeline.host_pipeline` of every element at once, one pass per layer: the same steps,
    the same operations in the same order (the same floats)."""
    L, b = num_layers, buffers
    staged = copy_s > 0
    zero = np.zeros(len(pre))
    d_h = np.where(stream > 0, stream_bytes / np.where(stream > 0, stream, 1.0), 0.0)
    d_c = np.where(staged, copy_bytes / np.where(staged, copy_s, 1.0), 0.0)
    s_host, s_copy = pair_speeds(d_h, d_c, capacity)
    starts, ends = {}, {}
    link_free = zero
    for k in range(min(b, L)):
        starts[k], ends[k] = np.where(staged, link_free, 0.0), np.where(staged, link_free + copy_s, 0.0)
        link_free = ends[k]
    behind = staged & partials_behind_copies
    end, copy_busy, part_busy, q_busy, q_alone, host_busy = zero, zero, zero, zero, zero, zero
    for layer in range(L):
        begin = end
        put = np.where(staged, np.maximum(begin + pre, ends[layer]), begin + pre)
        copy_busy = copy_busy + (ends[layer] - starts.pop(layer))
        in_flight = link_free > put
        if layer + b < L:
            st = np.maximum(put, link_free)
            starts[layer + b], ends[layer + b] = np.where(staged, st, 0.0), np.where(staged, st + copy_s, 0.0)
            link_free = np.where(staged, ends[layer + b], link_free)
            in_flight = in_flight | staged
        q_end = put + np.where(in_flight, query_shared_s, query_s)
        # the link is busy from put to link_free: the query counts where it is not
        q_alone = q_alone + (q_end - put) - np.maximum(np.minimum(q_end, link_free) - put, 0.0)
        hs = q_end + dispatch
        ahead = link_free - hs
        contend = (stream > 0) & (ahead > 0)
        both = np.minimum(stream / s_host, ahead / s_copy)
        he = np.where(contend, hs + both + (stream - s_host * both), hs + stream)
        last = min(layer + b, L - 1)
        for k in range(layer + 1, last + 1):
            starts[k], ends[k] = (np.where(contend & (x > hs), _moved(x, hs, both, s_copy), x)
                                  for x in (starts[k], ends[k]))
        if last > layer:
            link_free = np.where(contend, ends[last], link_free)
        del ends[layer]
        p_start = np.where(behind, np.maximum(he, link_free), he)
        p_end = p_start + partials
        part_busy = part_busy + (p_end - p_start) - np.maximum(np.minimum(p_end, link_free) - p_start, 0.0)
        link_free = np.where(behind, p_end, link_free)
        end = np.maximum(put + att, p_end) + after
        q_busy, host_busy = q_busy + (q_end - put), host_busy + (he - q_end)
    return PipelineArrays(end, copy_busy, part_busy, q_busy, q_alone, host_busy)


def _moved(e: np.ndarray, hs: np.ndarray, both: np.ndarray, s_copy: np.ndarray) -> np.ndarray:
    """`host_pipeline`'s `moved`: a moment of the copy chain after hs, from its full-speed projection."""
    a = e - hs
    return np.where(a <= s_copy * both, hs + a / s_copy, hs + both + (a - s_copy * both))


@dataclass(frozen=True)
class HostStepArrays:
    """The option `decode_step_cost` chooses for every step, as the timing reads it."""

    step_s: np.ndarray  # with the link to itself
    compute_s: np.ndarray
    h2d_bytes: np.ndarray  # the forward pass's: prefetched part and partial outputs
    d2h_bytes: np.ndarray  # queries
    h2d_busy_s: np.ndarray
    d2h_busy_s: np.ndarray
    either_busy_s: np.ndarray  # H2D or D2H
    host_busy_s: np.ndarray
    fraction: np.ndarray  # share of the host-resident tokens attended on the host (0 where none)


def host_step_arrays(ctx: RunContext, att: np.ndarray, steps: np.ndarray) -> HostStepArrays:
    """`decode_step_cost` (host access) and its closed form for every row of `att` (columns
    `tier_plan.ATT_*`; the rows of decode `steps`) at once."""
    m, pol, hw, model, L = ctx.scenario.model, ctx.scenario.policy, ctx.hw, ctx.model, ctx.num_layers
    n, fr = len(att), np.array(split_fractions(pol.access))
    k = len(fr)
    batch, t0, t1, t2 = (np.tile(att[:, c], k) for c in (ACTIVE, ATT_T0, ATT_T1, ATT_T2))
    s1, s2 = (np.tile(x, k) for x in staged_columns(ctx, att, steps))
    f = np.repeat(fr, n)
    kvl, t2b = ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer
    uniq, inv = np.unique(batch, return_inverse=True)
    per_batch = [decode_layer_cost(model, hw, m.weight_dtype, m.weight_group_size, int(x), 0, kvl) for x in uniq]
    gemm, overhead, allreduce = (np.array([getattr(c, a) for c in per_batch])[inv]
                                 for a in ("gemm_s", "overhead_s", "allreduce_s"))
    tail = np.array([step_tail_s(model, hw, int(x)) for x in uniq])[inv]
    qkv = per_batch[0].qkv_share if per_batch else 0.0
    # `_host_split_cost`: the GPU attends T0 + the prefetched part, the host the rest
    g1, g2 = (1.0 - f) * t1, (1.0 - f) * t2
    p1, p2 = (1.0 - f) * s1, (1.0 - f) * s2  # the prefetched part as the link sees it (`staged_tokens`)
    attended = t0 + g1 + g2
    chunks = ctx.closed_chunk_tokens(att, steps)
    chunk = None if chunks is None else gpu_chunk_tokens(model, np.tile(chunks, k), t1 + t2, s1 + s2, f)
    attn = decode_attention_s(model, hw, batch, attended, (attended + batch) * kvl + p2 * (t2b + kvl), kvl, chunk)
    device = gemm + attn + overhead + allreduce
    total = np.maximum(device, np.array([c.host_s for c in per_batch])[inv])
    pre = gemm * qkv * np.where(device > 0, total / np.where(device > 0, device, 1.0), 1.0)
    post, compute = total - pre, L * total + tail
    h1, h2 = s1 - p1, s2 - p2
    kv = h1 * kvl + h2 * t2b
    cpu = hw.host_cpu
    flop = attention_flop(model, h1 + h2)
    stream = np.where(kv > 0, np.maximum(kv / cpu.dram_bytes_per_s, flop / cpu.flop_per_s), 0.0)
    has_host = h1 + h2 > 0
    q_bytes = batch * model.num_heads * model.head_dim * QUERY_BYTES_PER_ELEMENT
    p_bytes = batch * model.num_heads * (model.head_dim + 1) * PARTIAL_BYTES_PER_ELEMENT
    nbytes = p1 * kvl + p2 * t2b
    copy_s = transfer_times_s(hw.h2d, nbytes, (p1 > 0).astype(int) + T2_BLOCKS * (p2 > 0))
    query_s = transfer_times_s(hw.d2h, q_bytes, 1)
    query_shared_s = transfer_times_s(hw.d2h, q_bytes, 1, True) if hw.copy_engines >= 2 else query_s
    partials_s = transfer_times_s(hw.h2d, p_bytes, 1)
    pipe = host_pipeline_arrays(pre, attn, post - attn, copy_s, nbytes, query_s, query_shared_s,
                                np.where(kv > 0, cpu.dispatch_s, 0.0), stream, kv, partials_s, L, pol.staging_buffers,
                                cpu.shared_bytes_per_s, hw.copy_engines < 3)
    # no host share (split prefetching it all): the layerwise pipeline, or plain compute
    prefetch_only = np.where(copy_s > 0, pipeline_finish_s(pre, post, copy_s, L, pol.staging_buffers) + tail, compute)
    step = np.where(has_host, pipe.finish_s + tail, prefetch_only).reshape(k, n)
    pick = np.argmin(step, axis=0)
    rows = pick * n + np.arange(n)

    def chosen(x):
        return np.broadcast_to(x, (k * n,))[rows]

    host_h2d = np.where(has_host, L * p_bytes, 0.0)
    h2d_busy = np.where(has_host, pipe.copy_busy_s + pipe.partials_busy_s, np.where(copy_s > 0, L * copy_s, 0.0))
    return HostStepArrays(
        step_s=step[pick, np.arange(n)], compute_s=chosen(compute),
        h2d_bytes=chosen(L * nbytes + host_h2d), d2h_bytes=chosen(np.where(has_host, L * q_bytes, 0.0)),
        h2d_busy_s=chosen(h2d_busy), d2h_busy_s=chosen(np.where(has_host, pipe.queries_busy_s, 0.0)),
        either_busy_s=chosen(h2d_busy + np.where(has_host, pipe.queries_alone_s, 0.0)),
        host_busy_s=chosen(np.where(has_host, pipe.host_busy_s, 0.0)), fraction=chosen(np.where(has_host, f, 0.0)))


def fast_host_timing(ctx: RunContext, plan: TierPlan):
    """Time `plan` at the fast level with host access (module doc)."""
    steps = plan.steps
    att = plan.attended
    host_rows = np.flatnonzero(att[:, ATT_T1] + att[:, ATT_T2] > 0)  # the others stage nothing: plain compute
    plain = _plain_compute_s(ctx, att)
    step_s, compute_s = plain.copy(), plain.copy()
    h2d_bytes, d2h_bytes = np.zeros(steps), np.zeros(steps)
    busy = {d: np.zeros(steps) for d in ("h2d", "d2h", "h2d+d2h", "host")}
    if len(host_rows):
        a = host_step_arrays(ctx, att[host_rows], host_rows)
        step_s[host_rows], compute_s[host_rows] = a.step_s, a.compute_s
        h2d_bytes[host_rows], d2h_bytes[host_rows] = a.h2d_bytes, a.d2h_bytes
        busy["h2d"][host_rows], busy["d2h"][host_rows] = a.h2d_busy_s, a.d2h_busy_s
        busy["h2d+d2h"][host_rows], busy["host"][host_rows] = a.either_busy_s, a.host_busy_s
    loop_s = host_loop_arrays_s(ctx, plan)
    waited = loop_s > step_s  # the engine's host loop outlasts the step (`engine.DecodeSim.step`): it hides any stall
    step_s[waited], compute_s[waited] = loop_s[waited], loop_s[waited]
    fraction = np.full(steps, np.nan)  # split's choice, where a step has a host share to choose
    if len(host_rows):
        fraction[host_rows] = a.fraction
    walked = np.zeros(steps, dtype=bool)
    intervals: dict[str, list] = {"h2d": [], "d2h": [], "host": []}
    t, s = 0.0, 0
    for r in np.flatnonzero(plan.retier_due).tolist():
        if r < s:
            continue  # inside the last window
        t += float(np.sum(step_s[s:r]))
        sim = _WindowSim(ctx, plan, fraction, start_s=t)
        s = sim.run_window(r)
        for rec in sim.records:
            step_s[rec.step], h2d_bytes[rec.step], d2h_bytes[rec.step] = rec.step_s, rec.h2d_bytes, rec.d2h_bytes
            if loop_s[rec.step] > 0:  # the walk's own: the loop's where it waited for it
                compute_s[rec.step] = rec.compute_s
            walked[rec.step] = True
        t = sim.records[-1].t_s
        timing = sim.timing()
        intervals["h2d"] += timing.h2d_busy
        intervals["d2h"] += timing.d2h_busy
        intervals["host"] += timing.host_busy
    t_s = np.cumsum(step_s)
    decode_s = float(t_s[-1]) if steps else 0.0
    stall = step_s - compute_s
    frame = pd.DataFrame({"step": np.arange(steps), "t_s": t_s, "step_s": step_s, "compute_s": compute_s,
                          "stall_s": np.where(stall > STALL_EPS_S, stall, 0.0), "h2d_bytes": h2d_bytes,
                          "d2h_bytes": d2h_bytes})
    # steps away from re-tiers hold no copy past their end: their busy time adds to the windows'
    free = {d: float(np.sum(np.where(walked, 0.0, v))) for d, v in busy.items()}
    lists = {"h2d": [intervals["h2d"]], "d2h": [intervals["d2h"]], "h2d+d2h": [intervals["h2d"], intervals["d2h"]],
             "host": [intervals["host"]]}
    return FastTiming(frame=frame, decode_s=decode_s,
                      busy={d: min(decode_s, free[d] + busy_union_s(*lists[d], until=decode_s)) for d in busy})


class _WindowSim(DecodeSim):
    """The engine for a window, with the split's fraction the arrays chose for each step (the choice
    `decode_step_cost` makes, without searching it again)."""

    def __init__(self, ctx: RunContext, plan: TierPlan, fraction: np.ndarray, start_s: float):
        super().__init__(ctx, plan, start_s)
        self.fraction = fraction

    def step_cost(self, s: int):
        ctx, row, m = self.ctx, self.plan.attended[s], self.ctx.scenario.model
        f = None if np.isnan(self.fraction[s]) else float(self.fraction[s])
        return decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, self.prefetch,
                                int(row[ACTIVE]), int(row[ATT_T0]), int(row[ATT_T1]), int(row[ATT_T2]),
                                ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, self.staged, self.access,
                                self.buffers, host_fraction=f, chunk_tokens=self.chunk_tokens(s),
                                staged_tokens=self.staged_tokens(s))


def _plain_compute_s(ctx: RunContext, att: np.ndarray) -> np.ndarray:
    """Steps with nothing host-resident yet: the layers and the tail, nothing staged."""
    return step_arrays(ctx, att).compute_s
