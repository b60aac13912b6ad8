"""Re-tier: fold the accumulated attention into per-token scores, let sim/tiering/tiers.py decide every
token's new tier (the simulator's rule), then move the bytes. With `replay` (scores: simulator) the
decisions are the simulator's own seeded ones instead, so both move exactly the same tokens.

Moves, batched over rows and all layers at once (copy counts as sim/device/physics.py's `retier_copies`):
- T0 -> T1 / T2 (demotion): offload.py - gathered on the device (T2: quantised there), device -> host
  on the offload stream; asynchronous unless the policy blocks (sync_per_step, pageable memory).
- T1 / T2 -> T0 (promotion): gathered on the host, host -> device on the copy stream (T2: dequantised
  there); the next step always waits for it, as the simulator's does.
- T1 <-> T2: re-encoded on the host, no link traffic. -> T3: the slot is freed, nothing moves.
Host reads happen before any slot is reused. Stall is only the wait for link transfers (blocking
offloads, promotions); scoring and bookkeeping on the host are step time the simulator leaves out.
"""

from __future__ import annotations

import numpy as np

from sim.tiering.tiers import T0, T1, T2, assign_tiers, diff_moves, protected_mask

from .offload import Demotion
from .quant import dequantize_int8, quantize_int8
from .runtime import COPY
from .slots import FREE
from .transfer import arrange, copy_block, restore


def fold_scores(cache) -> None:
    """Per-slot attention accumulated on the device since the last re-tier -> per-position scores.
    Staged columns are T1 slots [0, t1_high_water) then T2 slots [0, t2_high_water), as attention
    saw them."""
    acc0 = cache.acc0.cpu().numpy()
    acc_s = cache.acc_s.cpu().numpy()
    if cache.host is not None and cache.host.scoring:  # host-attended slots, same columns (host_attention.py)
        acc_s = acc_s + cache.host.take_scores()
    spans = [(cache.tables[T0], acc0, 0, cache.tables[T0].high_water()),
             (cache.tables[T1], acc_s, 0, cache.t1_high_water),
             (cache.tables[T2], acc_s, cache.t1_high_water, cache.t2_high_water)]
    for table, acc, offset, width in spans:
        if width == 0:
            continue
        pos = table.pos[:, :width]
        rows, cols = np.nonzero(pos != FREE)
        cache.score[rows, pos[rows, cols]] += acc[rows, offset + cols]
    cache.acc0.zero_()
    cache.acc_s.zero_()


def _replayed(cache, b: int, old: np.ndarray) -> np.ndarray:
    """Row b's new tiers from the simulator's seeded state for the same sequence (sim/tiering/tier_plan.py),
    which must have reached the same tiers: both start from the same prompt and take the same steps."""
    seq = cache.replay[b]
    seq.advance(cache.step + 1 - seq.steps_done)
    if seq.n != len(old) or not np.array_equal(seq.tier[: seq.n], old):
        raise RuntimeError(f"row {b}: the real cache's tiers left the simulator's plan at step {cache.step}")
    seq.retier()
    return seq.tier[: seq.n].copy()


def _decide(cache, rows):
    """New tiers for the given rows; returns (row, position, old tier, new tier) of every change."""
    pol = cache.policy
    parts = []
    for b in rows:
        n = int(cache.n[b])
        old = cache.tier[b, :n].copy()
        if cache.replay is not None:
            new = _replayed(cache, b, old)
        else:
            rule = pol.at_retier(n - cache.prompt)  # auto: this re-tier's share of T0
            new = assign_tiers(old, cache.score[b, :n], protected_mask(n, cache.prompt, rule), rule)
        mv = diff_moves(old, new)
        cache.offloaded_tokens += mv.offloaded
        cache.evicted_tokens += mv.evicted
        cache.counters.offloaded_tokens += mv.offloaded
        cache.counters.evicted_tokens += mv.evicted
        changed = np.flatnonzero(old != new)
        parts.append((np.full(len(changed), b, dtype=np.int64), changed, old[changed], new[changed]))
        cache.tier[b, :n] = new
        if cache.options.scoring == "recent":
            cache.score[b, :n] = 0.0
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    return tuple(np.concatenate(x) for x in zip(*parts))


def _reassign_slots(cache, b, p, src, dst):
    """Free every leaving slot, then give every arriving token a slot; returns the new slots."""
    for tier in (T0, T1, T2):
        sel = src == tier
        for row in np.unique(b[sel]):
            cache.tables[tier].release(row, cache.slot[row, p[sel & (b == row)]])
    new_slot = np.full(len(b), FREE, dtype=np.int64)
    for tier in (T0, T1, T2):
        sel = np.flatnonzero(dst == tier)
        for row in np.unique(b[sel]):
            idx = sel[b[sel] == row]
            new_slot[idx] = cache.tables[tier].alloc(row, p[idx])
    cache.slot[b, p] = new_slot
    return new_slot


def _sources(cache, blocks, tier):
    """Host blocks [K, L, X] of one tier as they travel (coalesced, or the prototype's per-layer
    K/V pieces), pinned where the policy pins: host work, done before the copies are timed."""
    rt, opts = cache.rt, cache.options
    out = []
    for i, block in enumerate(blocks):
        src = arrange(block, opts.prefetch == "sync_per_step", _kv_split(i, tier))
        if opts.pinned and rt.is_cuda:
            src = src.pin_memory()
        cache.promotion_sources.append(src)  # a pinned source must outlive its async copy
        out.append(src)
    return out


def _kv_split(index: int, tier: int) -> bool:
    """Full-precision rows travel K and V apart in the prototype; int8 payload and scales do not."""
    return tier == T1 and index == 0


def _promote(cache, sources, tier, counters):
    """Arranged host blocks of one tier -> the device on the copy stream. Returns the device blocks
    as they travelled; the caller makes compute wait for the copy stream before it reads
    (`restore`s) them."""
    rt, proto = cache.rt, cache.options.prefetch == "sync_per_step"
    out = []
    for i, src in enumerate(sources):
        dst = rt.device_empty(tuple(src.shape), src.dtype)  # compute's pool: it is read and freed there
        with rt.on_copy_stream():
            counters.h2d_copies += copy_block(dst, src, proto, _kv_split(i, tier), rt.is_cuda)
        out.append(dst)
    return out


def _arrived(cache, tier, blocks):
    """Device blocks of one promoted tier, token-major and dequantised: rows for T0."""
    proto = cache.options.prefetch == "sync_per_step"
    rows = [restore(d, proto, _kv_split(i, tier)) for i, d in enumerate(blocks)]
    return rows[0] if tier == T1 else dequantize_int8(*rows, cache.dtype)


def _write_t0(cache, b, new_slot, sel, rows) -> None:
    """Promoted rows into their new T0 slots (compute stream)."""
    torch, dev = cache.torch, cache.rt.device
    if cache.rt.trace is not None:
        cache.rt.note("t0_write", list(zip(b[sel].tolist(), new_slot[sel].tolist())))
    cache.stores.t0_scatter(torch.as_tensor(b[sel], device=dev), torch.as_tensor(new_slot[sel], device=dev), rows)


def retier(cache, rows) -> None:
    rt, torch, stores, c = cache.rt, cache.torch, cache.stores, cache.counters
    cache.lane.finish()  # the last offload has landed: the host stores are read below
    rt.synchronize()  # scores are read on the host; no prefetch may still read the host stores
    cache.promotion_sources.clear()
    start = rt.mark()
    fold_scores(cache)
    b, p, src, dst = _decide(cache, rows)
    old_slot = cache.slot[b, p].copy()

    def pick(s, d):
        return np.flatnonzero((src == s) & (dst == d))

    def host_idx(a):
        return torch.as_tensor(a, dtype=torch.long)

    dem1, dem2, pro1, pro2, x12, x21 = (pick(T0, T1), pick(T0, T2), pick(T1, T0), pick(T2, T0),
                                        pick(T1, T2), pick(T2, T1))
    # host reads first: slots freed by these tokens are reused below
    rows_pro1 = stores.t1_gather(host_idx(b[pro1]), host_idx(old_slot[pro1])) if len(pro1) else None
    q_pro2 = stores.t2_gather(host_idx(b[pro2]), host_idx(old_slot[pro2])) if len(pro2) else None
    q_x12 = quantize_int8(stores.t1_gather(host_idx(b[x12]), host_idx(old_slot[x12])), stores.group) if len(x12) else None
    rows_x21 = (dequantize_int8(*stores.t2_gather(host_idx(b[x21]), host_idx(old_slot[x21])), cache.dtype)
                if len(x21) else None)
    new_slot = _reassign_slots(cache, b, p, src, dst)

    # demotions leave first: the compute stream waits until their T0 slots have been read
    demotions = [Demotion(tier, b[sel], old_slot[sel], new_slot[sel])
                 for sel, tier in ((dem1, T1), (dem2, T2)) if len(sel)]
    if demotions and cache.lane.asynchronous:
        cache.lane.launch(demotions, c)
    elif demotions:
        with rt.exposed(c.stalls):  # the blocking offload: the link time is stall...
            cache.lane.launch(demotions, c)
        cache.lane.finish()  # ...landing it in the host stores is host work, as the simulator leaves out
    promotions = [(sel, tier, blocks)
                  for sel, tier, blocks in ((pro1, T1, (rows_pro1,)), (pro2, T2, q_pro2)) if len(sel)]
    arrived = []
    if promotions:
        sources = [(sel, tier, _sources(cache, blocks, tier)) for sel, tier, blocks in promotions]
        with rt.exposed(c.stalls):
            rt.copy_waits_for_compute()  # device blocks may reuse memory queued kernels still read
            h2d_start = rt.mark(COPY)
            arrived = [(sel, tier, _promote(cache, srcs, tier, c)) for sel, tier, srcs in sources]
            c.h2d_busy.append((h2d_start, rt.mark(COPY)))
            rt.compute_waits_for_copies()
        c.h2d_bytes += cache.geom.layers * (len(pro1) * stores.full_row_bytes + len(pro2) * stores.t2_row_bytes)

    # host writes
    if len(x21):
        stores.t1_scatter(host_idx(b[x21]), host_idx(new_slot[x21]), rows_x21)
    if len(x12):
        stores.t2_scatter(host_idx(b[x12]), host_idx(new_slot[x12]), *q_x12)
    for sel, tier, blocks in arrived:
        _write_t0(cache, b, new_slot, sel, _arrived(cache, tier, blocks))
    cache.after_retier()
    c.retier_span = (start, rt.mark())
