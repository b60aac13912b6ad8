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
- Host access (`host_attention`, `split`): sim/fast_host.py - the split's options and the closed
  form of `host_pipeline` as arrays, the steps next to re-tiers walked by the engine itself; with one
  copy engine such runs are timed at the step level.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .capacity import batch_counts
from .engine import STALL_EPS_S
from .intervals import busy_union_s
from .context import RunContext, draw_lengths
from .batch_tiers import BatchTiers
from .pressure import resolve
from .physics import (KV_SPLIT_COPIES, T2_BLOCKS, attention_flop, attention_s_array, decode_layer_cost,
                      retier_traffic, step_tail_s)
from .tier_plan import (ACTIVE, ATT_T0, ATT_T1, ATT_T2, MV_D2H_T1, MV_D2H_T2, MV_H2D_T1, MV_H2D_T2,
                        MOVE_COLUMNS, TierPlan, sequence_rngs)
from .tiers import T0, T1, T2, T3, TierPolicy



def supports(ctx: RunContext) -> bool:
    """Whether the fast level times this run itself: host access with one copy engine (queries
    queueing behind prefetches on it) is timed at the step level."""
    return ctx.scenario.policy.access == "prefetch" or not ctx.policy.tiering or ctx.hw.copy_engines >= 2


def host_access(ctx: RunContext) -> bool:
    return ctx.scenario.policy.access != "prefetch" and ctx.policy.tiering


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


# ---- step costs as arrays ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StepArrays:
    """`physics.decode_step_cost` of every step, the fields the timing reads (per layer unless named)."""

    pre_s: np.ndarray
    post_s: np.ndarray
    tail_s: np.ndarray
    compute_s: np.ndarray  # the step: L * layer + tail
    prefetch_bytes: np.ndarray
    prefetch_copies: np.ndarray
    pack_s: np.ndarray


def step_arrays(ctx: RunContext, att: np.ndarray) -> StepArrays:
    """The step cost of `physics.decode_step_cost` (prefetch access) for every row of `att` (columns
    `tier_plan.ATT_*`: T0, T1, T2 attended and sequences) at once: the batch-dependent parts (GEMMs,
    all-reduces, overheads, tail) once per distinct batch, attention as `physics.attention_s_array`.
    Same formulas, same order of operations: the same floats."""
    m, pol, hw, model = ctx.scenario.model, ctx.scenario.policy, ctx.hw, ctx.model
    batch, t0, t1, t2 = att[:, ACTIVE], att[:, ATT_T0], att[:, ATT_T1], att[:, ATT_T2]
    uniq, inv = np.unique(batch, return_inverse=True)
    per_batch = [decode_layer_cost(model, hw, m.weight_dtype, m.weight_group_size, int(b), 0,
                                   ctx.kv_bytes_per_token_layer) for b in uniq]
    gemm = np.array([c.gemm_s for c in per_batch])[inv]
    overhead = np.array([c.overhead_s for c in per_batch])[inv]
    allreduce = np.array([c.allreduce_s for c in per_batch])[inv]
    host = np.array([c.host_s for c in per_batch])[inv]
    qkv = per_batch[0].qkv_share if per_batch else 0.0
    tail = np.array([step_tail_s(model, hw, int(b)) for b in uniq])[inv]
    kvl, t2b = ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer
    attended = t0 + t1 + t2
    kv_bytes = (attended + batch) * kvl + t2 * (t2b + kvl)
    attn = attention_s_array(attention_flop(model, attended), kv_bytes, hw)
    device = gemm + attn + overhead + allreduce
    total = np.maximum(device, host)
    stretch = np.where(device > 0, total / np.where(device > 0, device, 1.0), 1.0)
    pre = gemm * qkv * stretch
    staged = ctx.policy.tiering and pol.prefetch != "per_interval"
    zeros = np.zeros(len(batch))
    if staged:
        nbytes = (t1 * kvl + t2 * t2b).astype(float)
        per_tier = KV_SPLIT_COPIES if pol.prefetch == "sync_per_step" else 1
        copies = per_tier * (t1 > 0) + T2_BLOCKS * (t2 > 0)
        pack = t1 * kvl / hw.host_pack_bytes_per_s if pol.prefetch == "sync_per_step" else zeros
    else:
        nbytes, copies, pack = zeros, np.zeros(len(batch), dtype=np.int64), zeros
    return StepArrays(pre, total - pre, tail, ctx.num_layers * total + tail, nbytes, copies, pack)


def copy_times_s(link, nbytes: np.ndarray, copies: np.ndarray, both_busy: bool) -> np.ndarray:
    """`LinkModel.transfer_time_s` of each step's per-layer prefetch (once per distinct size)."""
    uniq, inv = np.unique(np.column_stack([nbytes, copies]), axis=0, return_inverse=True)
    return np.array([link.transfer_time_s(b, int(c), both_busy) for b, c in uniq])[inv.ravel()]


def pipeline_finish_s(pre: np.ndarray, rest: np.ndarray, copy: np.ndarray, layers: int, buffers: int) -> np.ndarray:
    """`physics.layerwise_pipeline` of `layers` identical layers per step, every step at once:
    the finish time of the last layer (steps whose copy is 0 need no buffer: plain compute)."""
    link_free = np.zeros_like(pre)
    end = np.zeros_like(pre)
    taken = np.zeros((layers, len(pre)))
    for layer in range(layers):
        start = link_free if layer < buffers else np.maximum(link_free, taken[layer - buffers])
        ready = start + copy
        link_free = ready
        taken[layer] = np.maximum(end + pre, ready)
        end = taken[layer] + rest
    return np.where(copy > 0, end, layers * (pre + rest))


def uncontended_step_s(ctx: RunContext, a: StepArrays) -> tuple[np.ndarray, np.ndarray]:
    """(step time, one layer's copy time) of every step with the link to itself: the prototype's
    copies before the forward pass, or the layerwise pipeline, or - nothing staged - the compute."""
    pol, L = ctx.scenario.policy, ctx.num_layers
    copy_s = copy_times_s(ctx.hw.h2d, a.prefetch_bytes, a.prefetch_copies, False) + a.pack_s
    if pol.prefetch == "sync_per_step":
        step_s = L * copy_s + a.compute_s
    else:
        step_s = pipeline_finish_s(a.pre_s, a.post_s, copy_s, L, pol.staging_buffers) + a.tail_s
    return np.where(a.prefetch_bytes > 0, step_s, a.compute_s), copy_s


# ---- timing ----------------------------------------------------------------------------------------
@dataclass
class FastTiming:
    """What the fast level measured: the per-step table and each direction's busy seconds."""

    frame: pd.DataFrame
    decode_s: float
    busy: dict[str, float]
    timeline: list = field(default_factory=list)  # the fast level records no timeline

    def step_frame(self) -> pd.DataFrame:
        return self.frame

    def busy_s(self, *directions: str, until: float) -> float:
        """As `DecodeTiming.busy_s`; `busy` is already clipped at the end of decode."""
        return self.busy["+".join(directions)]


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
        from .fast_host import fast_host_timing  # it builds on this module

        return fast_host_timing(ctx, plan)
    pol, L = ctx.scenario.policy, ctx.num_layers
    a = step_arrays(ctx, plan.attended)
    free_s, copy_s = uncontended_step_s(ctx, a)
    staged = a.prefetch_bytes > 0
    steps = plan.steps
    step_s = free_s.copy()
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
            step_s[s] = _walk_step(ctx, a, s, t, links)
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
            step_s[r] += end - t
            t = end
    t_s = np.cumsum(step_s)
    decode_s = float(t_s[-1]) if steps else 0.0
    stall = step_s - a.compute_s
    frame = pd.DataFrame({"step": np.arange(steps), "t_s": t_s, "step_s": step_s, "compute_s": a.compute_s,
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
                          after[T1], after[T2])


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
