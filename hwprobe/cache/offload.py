"""Device -> host offload of a re-tier's demotions (T0 -> T1/T2) on a stream of its own.

The demoted tokens of all layers are gathered on the device into one block per destination tier
(T2: quantised there) and copied as sim/device/physics.py's `retier_copies` counts (coalesced: one copy
per block; the prototype: per layer, K and V apart). Like the simulator, the offload blocks the
next step under `sync_per_step` or pageable memory and is asynchronous otherwise: it overlaps the
following steps, and until it has landed its tokens are *in transit*:

- the gather runs on the offload stream and is what reads the source T0 slots. The slot table frees
  them at once (appends and promotions take the lowest free slot right away), so the compute stream
  waits on `sources_read` before it writes any T0 slot again;
- the host store does not hold the rows yet, so every staging copy issued meanwhile is patched on
  the device from the gathered block (attention sees what it would after landing, bit for bit);
- landing is polled, never waited for: once `landed` has completed the host scatters the rows into
  the stores, and fills issued after that read them from there. A fill issued before may read those
  host rows while they are written; its patch, queued after it, overwrites exactly those rows;
- the gathered block stays referenced (never `record_stream`ed) until the copy has landed and the
  copy stream has run every patch that reads it (`readers`, recorded at landing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.tiering.tiers import T1, T2

from .quant import quantize_int8
from .runtime import OFFLOAD
from .transfer import arrange, copy_block, restore


@dataclass(frozen=True)
class Demotion:
    """One destination tier's share of a re-tier: per token its row, old T0 slot, new host slot."""

    tier: int
    rows: np.ndarray
    t0_slots: np.ndarray
    host_slots: np.ndarray


@dataclass
class _Block:
    demotion: Demotion
    index: tuple  # (host slots, rows) on the device, to patch staged copies
    device: tuple  # token-major on the device: (rows [K, L, R],) or (int8 [K, L, R], scales [K, L, G])
    sent: tuple = ()  # the arranged device blocks the copies read
    landing: tuple = ()  # the host blocks they land in

    def nbytes(self) -> int:
        """Device bytes held (a coalesced copy sends the gathered block itself: counted once)."""
        return sum({t.data_ptr(): t.numel() * t.element_size() for t in self.device + self.sent}.values())


@dataclass
class Transit:
    blocks: list
    sources_read: object  # offload-stream event: the gather has read the T0 slots
    landed: object  # offload-stream event: the device -> host copies are done
    readers: object = None  # copy-stream event recorded at landing: patches issued before it are done


class LandingPool:
    """Pinned host memory offloads land in, allocated once with the cache: the first re-tier
    demotes about half the context at once, and pinning gigabytes inside the timed loop would be
    timed as that step's (a serving engine pins its pools up front too). One flat buffer per block
    part - T1 rows; T2 payload and scales - as large as the host store it lands in, since no
    re-tier demotes more than the store holds. The previous offload has always landed before the
    next is launched, so one buffer per part suffices."""

    def __init__(self, rt, stores):
        parts = {(T1, 0): stores.t1, (T2, 0): stores.t2q, (T2, 1): stores.t2s}  # each [L, cap, B, X]
        self.parts = {key: rt.host_empty((store.numel(),), store.dtype, True) for key, store in parts.items()}

    def take(self, tier: int, index: int, like):
        """A view shaped like `like` at the start of that part's buffer."""
        return self.parts[(tier, index)][: like.numel()].view(like.shape)


class OffloadLane:
    def __init__(self, rt, stores, *, asynchronous: bool, prototype: bool, pinned: bool):
        self.rt, self.stores = rt, stores
        self.asynchronous, self.prototype, self.pinned = asynchronous, prototype, pinned
        self.pool = LandingPool(rt, stores) if pinned and rt.is_cuda else None  # pageable: allocated per offload
        self.pending: Transit | None = None  # in transit: patch staged copies from it
        self.retiring: Transit | None = None  # landed: its blocks wait for their last readers
        self.peak_bytes = 0  # most device memory offload blocks held at once

    # ---- issue -----------------------------------------------------------------------------
    def launch(self, demotions: list[Demotion], counters) -> None:
        """Gather, (quantise) and copy every demotion; blocks unless the lane is asynchronous."""
        rt, st, torch = self.rt, self.stores, self.rt.torch
        if self.pending is not None or self.retiring is not None:
            raise RuntimeError("a re-tier offload was launched while the previous one is in flight")
        transit = Transit([], rt.event(), rt.event())
        rt.offload_waits_for_compute()  # the gather sees every T0 write queued so far
        with rt.on_offload_stream():  # device tensors made here belong to the offload stream's pool
            for d in demotions:
                rows = torch.as_tensor(d.rows, device=rt.device)
                data = st.t0_gather(rows, torch.as_tensor(d.t0_slots, device=rt.device))
                device = (data,) if d.tier == T1 else quantize_int8(data, st.group)
                transit.blocks.append(_Block(d, (torch.as_tensor(d.host_slots, device=rt.device), rows), device))
            rt.record_offload(transit.sources_read)
            for b in transit.blocks:  # arranged and landing blocks first: allocating (pinning) host
                # memory is host time, not link time, so it stays out of the busy window below
                b.sent = tuple(arrange(t, self.prototype, self._kv_split(b, i)) for i, t in enumerate(b.device))
                b.landing = tuple(self.pool.take(b.demotion.tier, i, t) if self.pool is not None
                                  else rt.host_empty(tuple(t.shape), t.dtype, self.pinned) for i, t in enumerate(b.sent))
            start = rt.mark(OFFLOAD)
            for b in transit.blocks:
                for i, (dst, src) in enumerate(zip(b.landing, b.sent)):
                    counters.d2h_copies += copy_block(dst, src, self.prototype, self._kv_split(b, i), rt.is_cuda)
                row_bytes = st.full_row_bytes if b.demotion.tier == T1 else st.t2_row_bytes
                counters.d2h_bytes += len(b.demotion.rows) * st.geom.layers * row_bytes
            end = rt.mark(OFFLOAD)
            rt.record_offload(transit.landed)
        counters.d2h_busy.append((start, end))
        if self.asynchronous and not rt.is_cuda:  # nothing overlaps on the CPU: the copy is exposed
            counters.stalls.append((start, end))
        if rt.trace is not None:
            rt.note("offload", id(transit.sources_read),
                    [(int(r), int(s)) for d in demotions for r, s in zip(d.rows, d.t0_slots)])
        self._guard_sources(transit.sources_read)
        self.pending = transit
        self.peak_bytes = max(self.peak_bytes, self.device_bytes())
        if not self.asynchronous:  # blocking: the host waits for the link here (the caller times it
            rt.wait_host(transit.landed)  # as stall), then lands it with finish() outside that window

    def _guard_sources(self, sources_read) -> None:
        """Compute writes no T0 slot (a freed source among them) before the gather has read it."""
        self.rt.compute_waits_for(sources_read)

    def _kv_split(self, block: _Block, index: int) -> bool:
        """Full-precision rows travel K and V apart in the prototype; int8 payload and scales do not."""
        return block.demotion.tier == T1 and index == 0

    # ---- while in transit ------------------------------------------------------------------
    def patch(self, layer: int, t1, t2q, t2s) -> None:
        """On the copy stream, right after a staging copy of `layer`: write the in-transit rows
        from the device blocks into the staged copy (t1 [cap1, B, R], t2q/t2s [cap2, B, X])."""
        transit = self.pending
        if transit is None:
            return
        self.rt.copy_waits_for(transit.sources_read)  # the device blocks are written on the offload stream
        for b in transit.blocks:
            slots, rows = b.index
            targets = (t1,) if b.demotion.tier == T1 else (t2q, t2s)
            for dst, src in zip(targets, b.device):
                dst[slots, rows] = src[:, layer]

    def device_bytes(self) -> int:
        """Device memory held by offloads not yet retired (the simulator does not count it)."""
        return sum(b.nbytes() for t in (self.pending, self.retiring) if t is not None for b in t.blocks)

    # ---- landing ---------------------------------------------------------------------------
    def poll(self) -> None:
        """Land a completed offload and retire a landed one whose readers are done; never blocks."""
        rt = self.rt
        if self.pending is not None and rt.event_done(self.pending.landed):
            self._land()
        if self.retiring is not None and rt.event_done(self.retiring.readers):
            self.retiring = None

    def finish(self) -> None:
        """Wait for the offload in flight, land it and retire it (host-blocking)."""
        rt = self.rt
        if self.pending is not None:
            rt.wait_host(self.pending.landed)
            self._land()
        if self.retiring is not None:
            rt.wait_host(self.retiring.readers)
            self.retiring = None

    def _land(self) -> None:
        """The copies have completed: scatter the rows into the host stores, stop patching."""
        rt, st, torch = self.rt, self.stores, self.rt.torch
        transit, self.pending = self.pending, None
        for b in transit.blocks:
            d = b.demotion
            rows = [restore(t, self.prototype, self._kv_split(b, i)) for i, t in enumerate(b.landing)]
            rows_idx, slots_idx = torch.as_tensor(d.rows), torch.as_tensor(d.host_slots)
            if d.tier == T1:
                st.t1_scatter(rows_idx, slots_idx, rows[0])
            else:
                st.t2_scatter(rows_idx, slots_idx, *rows)
        transit.readers = rt.event()
        rt.record_copy(transit.readers)
        rt.note("landed", id(transit.sources_read))
        self.retiring = transit
