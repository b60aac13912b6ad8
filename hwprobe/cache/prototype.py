"""`sync_per_step`: the paper's prototype prefetch (FACTS.md, "What the authors' code actually does").

Before each step's forward pass the host synchronises, copies every layer's T1 tokens to the device
with K and V as two separate copies (the prototype keeps them as separate tensors) and the T2 tokens
as payload and scales (two copies), from pageable memory unless pinned, and synchronises again: no
copy overlaps compute. The copies are dropped after the step. Per layer that is
sim/device/physics.py's `prefetch_copies_per_layer("sync_per_step", ...)`.
"""

from __future__ import annotations

from sim.model.units import KV_TENSORS


class PrototypeCopies:
    def __init__(self, rt, layers: int):
        self.rt, self.layers = rt, layers
        self.staged: list | None = None  # per layer: ((K, V) or None, T2 payload or None, T2 scales or None)

    def copy_all(self, stores, t1_slots: int, t2_slots: int, counters) -> None:
        rt = self.rt
        with rt.exposed(counters.stalls):
            rt.synchronize()
            start = rt.mark()
            self.staged = [self._copy_layer(stores, layer, t1_slots, t2_slots, counters)
                           for layer in range(self.layers)]
            rt.synchronize()
            end = rt.mark()
        counters.h2d_busy.append((start, end))
        layer_bytes = stores.geom.batch * (t1_slots * stores.full_row_bytes + t2_slots * stores.t2_row_bytes)
        counters.h2d_bytes += self.layers * layer_bytes

    def _copy_layer(self, stores, layer: int, t1_slots: int, t2_slots: int, counters):
        t1 = stores.t1[layer, :t1_slots]
        half = t1.shape[-1] // KV_TENSORS
        kv = (self._copy(t1[..., :half], counters), self._copy(t1[..., half:], counters)) if t1_slots else None
        if not t2_slots:
            return kv, None, None
        t2q, t2s = stores.t2q[layer, :t2_slots], stores.t2s[layer, :t2_slots]
        return kv, self._copy(t2q, counters), self._copy(t2s, counters)

    def _copy(self, x, counters):
        """One synchronous host -> device copy (a strided host view is packed on the host first,
        as the prototype concatenates before it copies)."""
        out = self.rt.device_empty(tuple(x.shape), x.dtype)
        out.copy_(x)
        counters.h2d_copies += 1
        return out

    def layer(self, layer: int):
        return self.staged[layer]

    def discard(self) -> None:
        self.staged = None

    def nbytes(self) -> int:
        """Device bytes of the copies held now (all layers, between copy_all and discard)."""
        if self.staged is None:
            return 0
        return sum(t.numel() * t.element_size() for kv, q, s in self.staged
                   for t in (*(kv or ()), q, s) if t is not None)
