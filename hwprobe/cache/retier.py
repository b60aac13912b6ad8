"""Re-tier: fold the accumulated attention into per-token scores, let sim/tiers.py decide every
token's new tier (so the real cache and the simulator agree token for token), then move the bytes.

Moves, batched over rows and all layers at once:
- T0 -> T1 / T2 (demotion): gathered on the device (T2: quantised there), device -> host.
- T1 / T2 -> T0 (promotion): gathered on the host, host -> device (T2: dequantised there).
- T1 <-> T2: re-encoded on the host, no link traffic. -> T3: the slot is freed, nothing moves.
Reads happen before any slot is reused; the whole re-tier is exposed (it blocks the next step) and
is counted as stall.
"""

from __future__ import annotations

import numpy as np

from sim.tiers import T0, T1, T2, T3, assign_tiers, diff_moves, protected_mask

from .quant import dequantize_int8, quantize_int8
from .slots import FREE


def fold_scores(cache) -> None:
    """Per-slot attention accumulated on the device since the last re-tier -> per-position scores.
    Staged columns are T1 slots [0, hw1) then T2 slots [0, hw2), as attention saw them."""
    acc0 = cache.acc0.cpu().numpy()
    acc_s = cache.acc_s.cpu().numpy()
    spans = [(cache.tables[T0], acc0, 0, cache.tables[T0].high_water()),
             (cache.tables[T1], acc_s, 0, cache.hw1),
             (cache.tables[T2], acc_s, cache.hw1, cache.hw2)]
    for table, acc, offset, width in spans:
        if width == 0:
            continue
        pos = table.pos[:, :width]
        rows, cols = np.nonzero(pos != FREE)
        cache.score[rows, pos[rows, cols]] += acc[rows, offset + cols]
    cache.acc0.zero_()
    cache.acc_s.zero_()


def _decide(cache, rows):
    """New tiers for the given rows; returns (row, position, old tier, new tier) of every change."""
    pol = cache.policy
    parts = []
    for b in rows:
        n = int(cache.n[b])
        old = cache.tier[b, :n].copy()
        new = assign_tiers(old, cache.score[b, :n], protected_mask(n, cache.prompt, pol), pol)
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


def uniform_block(rows, slots, batch: int):
    """(a, k) when every batch row moves exactly k tokens into slots [a, a + k): then each layer's
    [a, a + k) block of a host store is one contiguous region, written by one direct copy."""
    if len(rows) == 0 or len(rows) % batch:
        return None
    k = len(rows) // batch
    if not (np.bincount(rows, minlength=batch) == k).all():
        return None
    a = int(slots.min())
    per_row = slots[np.lexsort((slots, rows))].reshape(batch, k)
    return (a, k) if (per_row == a + np.arange(k)).all() else None


def _demote(cache, rows, old_slots, new_slots, tier):
    """T0 -> T1/T2 for the given (row, slot) pairs: gather (and quantise) on the device, then copy
    to the host. Returns (bytes, write): `write()` finishes on the host after synchronising (None
    when the copy went straight into the store), and keeps the device blocks alive until then."""
    rt, st, torch = cache.rt, cache.stores, cache.torch
    B, L = cache.geom.batch, cache.geom.layers
    block = uniform_block(rows, new_slots, B)
    order = np.lexsort((rows, new_slots)) if block else np.arange(len(rows))  # (slot, row) order
    data = st.t0_gather(torch.as_tensor(rows[order], device=rt.device),
                        torch.as_tensor(old_slots[order], device=rt.device))  # [K, L, R]
    tensors = (data,) if tier == T1 else quantize_int8(data, st.group)
    stores = (st.t1,) if tier == T1 else (st.t2q, st.t2s)
    nbytes = len(rows) * L * (st.full_row_bytes if tier == T1 else st.t2_row_bytes)
    if block:
        a, k = block
        blocks = [t.view(k, B, L, -1).permute(2, 0, 1, 3).contiguous() for t in tensors]  # [L, k, B, X]
        for blk, store in zip(blocks, stores):
            for layer in range(L):
                rt.copy_to_host(store[layer, a : a + k], blk[layer])
        return nbytes, lambda keep=blocks: None
    lands = [rt.to_host(t) for t in tensors]
    b_idx, s_idx = torch.as_tensor(rows), torch.as_tensor(new_slots)
    if tier == T1:
        return nbytes, lambda: st.t1_scatter(b_idx, s_idx, lands[0])
    return nbytes, lambda: st.t2_scatter(b_idx, s_idx, *lands)


def retier(cache, rows) -> None:
    rt, torch, stores, c = cache.rt, cache.torch, cache.stores, cache.counters
    rt.synchronize()  # scores are read on the host; no prefetch may still read the host stores
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
    # host reads first: a direct device->host copy below may land in a slot freed by these tokens
    rows_pro1 = stores.t1_gather(host_idx(b[pro1]), host_idx(old_slot[pro1])) if len(pro1) else None
    q_pro2 = stores.t2_gather(host_idx(b[pro2]), host_idx(old_slot[pro2])) if len(pro2) else None
    q_x12 = quantize_int8(stores.t1_gather(host_idx(b[x12]), host_idx(old_slot[x12])), stores.group) if len(x12) else None
    rows_x21 = (dequantize_int8(*stores.t2_gather(host_idx(b[x21]), host_idx(old_slot[x21])), cache.dtype)
                if len(x21) else None)
    new_slot = _reassign_slots(cache, b, p, src, dst)

    # link traffic on the side stream; device gathers are queued before any T0 slot is rewritten
    finish = []
    if len(dem1) or len(dem2):
        rt.copy_waits_for_compute()
        d2h_start = rt.mark(on_copy=True)
        for sel, tier in ((dem1, T1), (dem2, T2)):
            if len(sel):
                nbytes, write = _demote(cache, b[sel], old_slot[sel], new_slot[sel], tier)
                c.d2h_bytes += nbytes
                finish.append(write)
        c.d2h_busy.append((d2h_start, rt.mark(on_copy=True)))
    dev_pro1 = dev_pro2 = None
    if len(pro1) or len(pro2):
        h2d_start = rt.mark(on_copy=True)
        dev_pro1 = rt.to_device(rows_pro1) if rows_pro1 is not None else None
        dev_pro2 = tuple(rt.to_device(t) for t in q_pro2) if q_pro2 is not None else None
        c.h2d_busy.append((h2d_start, rt.mark(on_copy=True)))
        c.h2d_bytes += cache.geom.layers * (len(pro1) * stores.full_row_bytes + len(pro2) * stores.t2_row_bytes)
    rt.synchronize()

    # writes
    for write in finish:
        write()
    if len(x21):
        stores.t1_scatter(host_idx(b[x21]), host_idx(new_slot[x21]), rows_x21)
    if len(x12):
        stores.t2_scatter(host_idx(b[x12]), host_idx(new_slot[x12]), *q_x12)
    dev = rt.device
    if len(pro1):
        stores.t0_scatter(torch.as_tensor(b[pro1], device=dev), torch.as_tensor(new_slot[pro1], device=dev), dev_pro1)
    if len(pro2):
        stores.t0_scatter(torch.as_tensor(b[pro2], device=dev), torch.as_tensor(new_slot[pro2], device=dev),
                          dequantize_int8(*dev_pro2, cache.dtype))
    cache.after_retier()
    c.retier_span = (start, rt.mark())
    c.stalls.append(c.retier_span)
