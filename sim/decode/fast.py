"""The fast level of detail (`sim.detail: fast`): the engine's timing model evaluated as numpy over
all steps, for sweeps of 10^5 points. The SimPy layer level stays the reference; a test keeps this
within 1% of it on every shipped scenario and a random sample of sweep points.

What it computes, and how it differs from the SimPy levels:
- Tier plan (`fast_plan`): tier sizes exact from the ratios (`capacity.batch_counts`, the same counts
  the token-level plan has); the churn a re-tier causes (promotions, re-demotions) from the
  token-level evolution of at most `sim.fast_rows` sequences, one per block of sequences of similar
  length, scaled by how many of its block are still decoding. With batch <= fast_rows it is the
  token-level plan exactly.
- Steps away from re-tier traffic: the step cost of `physics.decode_step_cost` and the layerwise
  pipeline of `physics.layerwise_pipeline`, as arrays over steps (one pass per layer, not per step).
- Steps next to a re-tier: walked in order, layer by layer, as the layer level does: the offload
  and the promotions share the link (bidirectional share, or one copy engine queueing), a prefetch
  copy that starts while an offload is in flight gets the bidirectional share or queues behind it,
  and a copy that starts after it lands gets the full rate.
- Host access (`host_attention`, `split`): sim/decode/fast_host.py - the split's options and the closed
  form of `host_pipeline` as arrays, the steps next to re-tiers walked by the engine itself; with one
  copy engine such runs are timed at the step level.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.device.intervals import busy_union_s
from sim.device.physics import retier_traffic
from sim.inputs.lengths import draw_lengths
from sim.tiering.batch_tiers import BatchTiers
from sim.tiering.pressure import resolve
from sim.tiering.tier_plan import MOVE_COLUMNS, MV_D2H_T1, MV_D2H_T2, MV_H2D_T1, MV_H2D_T2, TierPlan, sequence_rngs
from sim.tiering.tiers import T0, T1, T2, T3, TierPolicy

from .capacity import batch_counts
from .context import RunContext
from .engine import STALL_EPS_S
from .fast_arrays import FastTiming, StepArrays, host_loop_arrays_s, step_arrays, uncontended_step_s
from .fast_host import fast_host_timing


def supports(ctx: RunContext) -> bool:
    """Whether the fast level times this run itself: host access with one copy engine (queries
    queueing behind prefetches on it) and sparse_fetch (its on-demand copies) are timed at the step level."""
    access = ctx.scenario.policy.access
    if access == "sparse_fetch" and ctx.policy.tiering:
        return False
    return access == "prefetch" or not ctx.policy.tiering or ctx.hw.copy_engines >= 2


def host_access(ctx: RunContext) -> bool:
    return ctx.scenario.policy.host_access and ctx.policy.tiering


# ---- tier plan ------------------------------------------------------------------------------------
def fast_plan(ctx: RunContext) -> TierPlan:
    """Exact tier counts; re-tier moves from `sim.fast_rows` representative sequences (module doc)."""
    w = ctx.scenario.workload
    lengths = draw_lengths(w, w.batch_size)
    policy = resolve(ctx, lengths)  # hbm_ratio auto: the whole batch's pressure sets the shares
    c = batch_counts(ctx, w.batch_size, policy)
    steps = len(c.active)
    retier = policy.retier_mask(steps)
    attended = np.column_stack([c.attended[:, T0], c.attended[:, T1], c.attended[:, T2], c.active])
    moves = np.zeros((steps, MOVE_COLUMNS), dtype=np.int64)
    if retier.any():
        moves = _sampled_moves(ctx, policy, lengths, retier)
    return TierPlan(lengths=lengths, attended=attended, tiers_after=c.tiers_after, retier_moves=moves,
                    retier_due=retier, policy=policy)


def _sampled_moves(ctx: RunContext, policy: TierPolicy, lengths: np.ndarray, retier: np.ndarray) -> np.ndarray:
    """Re-tier moves summed over the batch, from one representative per block of sequences in
    length order (the longest of its block, so it decodes while any of its block does)."""
    sc, w = ctx.scenario, ctx.scenario.workload
    order = np.argsort(-lengths, kind="stable")
    blocks = np.array_split(order, min(sc.sim.fast_rows, len(lengths)))
    reps = np.array([b[0] for b in blocks])
    tiers = BatchTiers(w.prompt_tokens, lengths[reps], policy, sc.policy.importance,
                       sequence_rngs(w, len(lengths), reps), sc.policy.scoring)
    block_lengths = [np.sort(lengths[b]) for b in blocks]
    moves = np.zeros((len(retier), MOVE_COLUMNS), dtype=np.int64)
    for step in np.flatnonzero(retier):
        trans = tiers.retier(int(step) + 1)  # (unfinished representatives, old, new), longest first
        weight = np.array([len(bl) - np.searchsorted(bl, step, side="right") for bl in block_lengths[: len(trans)]])
        total = np.einsum("r,rij->ij", weight, trans)
        moves[step] = (total[T0, T1], total[T0, T2], total[T1, T0], total[T2, T0], total[:T3, T3].sum())
    return moves


# ---- timing ----------------------------------------------------------------------------------------
class _Links:
    """The two link directions around re-tiers: when each is free, and the busy intervals near
    re-tiers (the only places the directions overlap)."""

    def __init__(self, ctx: RunContext):
        self.hw, self.one_engine = ctx.hw, ctx.hw.copy_engines < 2
        self.h2d_free = self.d2h_free = 0.0
        self.h2d: list[tuple[float, float]] = []
        self.d2h: list[tuple[float, float]] = []

    def offload_in_flight(self, t: float) -> bool:
        return bool(self.d2h) and self.d2h[-1][0] <= t < self.d2h[-1][1]

    def copy(self, t: float, nbytes: float, copies: int, extra_s: float = 0.0) -> tuple[float, float]:
        """One H2D copy requested at t: it waits for the direction (and, with one copy engine, for an
        offload holding the engine); the bidirectional share while an offload is in flight."""
        start = max(t, self.h2d_free, self.d2h_free if self.one_engine else 0.0)
        both = not self.one_engine and self.offload_in_flight(start)
        end = start + self.hw.h2d.transfer_time_s(nbytes, copies, both) + extra_s
        self.h2d.append((start, end))
        self.h2d_free = end
        return start, end


def fast_timing(ctx: RunContext, plan: TierPlan) -> FastTiming:
    """Time `plan` at the fast level (module doc)."""
    if host_access(ctx):
        return fast_host_timing(ctx, plan)
    pol, L = ctx.scenario.policy, ctx.num_layers
    a = step_arrays(ctx, plan.attended)
    free_s, copy_s = uncontended_step_s(ctx, a)
    staged = a.prefetch_bytes > 0
    steps = plan.steps
    loop_s = host_loop_arrays_s(ctx, plan)
    retier_due = plan.retier_due
    gpu_s = free_s.copy()  # each step's own work: its forward (and re-tier), as the walk and the re-tiers set it
    step_s = np.where(retier_due, free_s, np.maximum(free_s, loop_s))  # a re-tier step waits for its loop after it
    h2d_bytes = np.where(staged, L * a.prefetch_bytes, 0.0)
    d2h_bytes = np.zeros(steps)
    links = _Links(ctx)
    blocking = pol.prefetch == "sync_per_step" or not pol.pinned
    t, s = 0.0, 0
    walked = np.zeros(steps, dtype=bool)
    for r in [*np.flatnonzero(plan.retier_due).tolist(), steps]:
        last = min(r, steps - 1)  # steps s..last, then the re-tier after r
        # steps that start while the last re-tier's offload is in flight: walked layer by layer
        while s <= last and staged[s] and t < links.d2h_free:
            gpu_s[s] = _walk_step(ctx, a, s, t, links)
            step_s[s] = gpu_s[s] if retier_due[s] else max(gpu_s[s], loop_s[s])
            walked[s] = True
            t += float(step_s[s])
            s += 1
        t += float(np.sum(step_s[s : last + 1]))  # the rest: no contention
        s = last + 1
        if r < steps:
            traffic = _traffic(ctx, plan, r)
            end = _retier(traffic, t, links, blocking)
            h2d_bytes[r] += traffic.h2d_bytes
            d2h_bytes[r] = traffic.d2h_bytes
            gpu_s[r] = step_s[r] + end - t
            step_s[r] = max(gpu_s[r], loop_s[r])
            t = end + step_s[r] - gpu_s[r]
    t_s = np.cumsum(step_s)
    decode_s = float(t_s[-1]) if steps else 0.0
    compute_s = np.where(loop_s > gpu_s, loop_s, a.compute_s)  # the loop hides any stall (`engine.DecodeSim.step`)
    stall = step_s - compute_s
    frame = pd.DataFrame({"step": np.arange(steps), "t_s": t_s, "step_s": step_s, "compute_s": compute_s,
                          "stall_s": np.where(stall > STALL_EPS_S, stall, 0.0), "h2d_bytes": h2d_bytes,
                          "d2h_bytes": d2h_bytes})
    busy = _busy(links, float(np.sum(np.where(staged & ~walked, L * copy_s, 0.0))), decode_s)
    return FastTiming(frame=frame, decode_s=decode_s, busy=busy)


def _walk_step(ctx: RunContext, a: StepArrays, s: int, t: float, links: _Links) -> float:
    """One step, layer by layer, against the link's state (`_Links.copy`): the layerwise pipeline of
    `physics.layerwise_pipeline` or the prototype's copies before the forward pass."""
    pol, L = ctx.scenario.policy, ctx.num_layers
    nbytes, copies, pack = float(a.prefetch_bytes[s]), int(a.prefetch_copies[s]), float(a.pack_s[s])
    if pol.prefetch == "sync_per_step":
        end = t
        for _ in range(L):
            _, end = links.copy(end, nbytes, copies, pack)
        return end - t + float(a.compute_s[s])
    pre, rest, buffers = float(a.pre_s[s]), float(a.post_s[s]), pol.staging_buffers
    taken = [0.0] * L
    end = t
    for layer in range(L):
        request = t if layer < buffers else taken[layer - buffers]
        _, ready = links.copy(request, nbytes, copies)
        taken[layer] = max(end + pre, ready)
        end = taken[layer] + rest
    return end - t + float(a.tail_s[s])


def _traffic(ctx: RunContext, plan: TierPlan, r: int):
    mv, after = plan.retier_moves[r], plan.tiers_after[r]
    return retier_traffic(ctx.scenario.policy.prefetch, ctx.num_layers, ctx.kv_bytes_per_token_layer,
                          ctx.t2_bytes_per_token_layer, mv[MV_D2H_T1], mv[MV_D2H_T2], mv[MV_H2D_T1], mv[MV_H2D_T2],
                          after[T1], after[T2], float(ctx.closed_kept(r)))


def _retier(tr, t: float, links: _Links, blocking: bool) -> float:
    """The re-tier after step r, its forward done at t: the offload (D2H) starts, the promotions
    (H2D) follow - after the offload when it blocks or shares the one copy engine - and the step
    ends when the promotions land (and the offload, when it blocks). As `engine.DecodeSim.retier`."""
    hw = links.hw
    promote = tr.h2d_bytes > 0 and tr.h2d_copies > 0
    off_end = t
    if tr.d2h_bytes > 0 and tr.d2h_copies > 0:
        start = max(t, links.d2h_free, links.h2d_free if links.one_engine else 0.0)
        both = not links.one_engine and promote and not blocking and links.h2d_free <= start
        off_end = start + hw.d2h.transfer_time_s(tr.d2h_bytes, tr.d2h_copies, both)
        links.d2h.append((start, off_end))
        links.d2h_free = off_end
    end = off_end if blocking else t
    if promote:
        _, end = links.copy(off_end if blocking else t, tr.h2d_bytes, tr.h2d_copies)
    return end


def _busy(links: _Links, free_h2d_s: float, decode_s: float) -> dict[str, float]:
    """Busy seconds per direction and of either, clipped at the end of decode. Copies of steps
    away from re-tiers cannot overlap an offload (those steps start after it lands), so they add."""
    h2d = free_h2d_s + busy_union_s(links.h2d, until=decode_s)
    either = free_h2d_s + busy_union_s(links.h2d, links.d2h, until=decode_s)
    return {"h2d": min(h2d, decode_s), "d2h": busy_union_s(links.d2h, until=decode_s), "h2d+d2h": min(decode_s, either),
            "host": 0.0}
