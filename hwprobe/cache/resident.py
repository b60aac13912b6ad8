"""`per_interval`: T1/T2 brought to the device once per re-tier interval and kept there.

Right after each re-tier every layer's T1 and T2 prefix is copied host -> device (per layer one T1
copy and T2 payload + scales, sim/device/physics.py's `prefetch_copies_per_layer("per_interval", ...)`)
and the next step waits for it, as the simulator's re-tier waits for its promotions. No copy runs
per step. The device then holds every layer's T1/T2 (sim/device/memory.py `staging_bytes("per_interval")`):
this is why the mode saves no HBM.
"""

from __future__ import annotations

from .runtime import COPY


class ResidentStage:
    def __init__(self, rt, layers: int, cap1: int, cap2: int, rows: int, row_elems: int, groups: int, dtype):
        torch = rt.torch
        self.rt = rt
        self.t1 = rt.device_zeros((layers, cap1, rows, row_elems), dtype)
        self.t2q = rt.device_zeros((layers, cap2, rows, row_elems), torch.int8)
        self.t2s = rt.device_zeros((layers, cap2, rows, groups), torch.float16)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.t1, self.t2q, self.t2s))

    def refresh(self, stores, t1_slots: int, t2_slots: int, counters, patch) -> None:
        """Copy every layer's prefixes (then `patch(layer, t1, t2q, t2s)` the rows still in transit);
        compute waits for all of it."""
        rt = self.rt
        with rt.exposed(counters.stalls):
            rt.copy_waits_for_compute()  # the last interval's reads of these buffers are queued before
            with rt.on_copy_stream():
                start = rt.mark(COPY)
                for layer in range(self.t1.shape[0]):
                    if t1_slots:
                        self.t1[layer, :t1_slots].copy_(stores.t1[layer, :t1_slots], non_blocking=True)
                        counters.h2d_copies += 1
                    if t2_slots:
                        self.t2q[layer, :t2_slots].copy_(stores.t2q[layer, :t2_slots], non_blocking=True)
                        self.t2s[layer, :t2_slots].copy_(stores.t2s[layer, :t2_slots], non_blocking=True)
                        counters.h2d_copies += 2
                    patch(layer, self.t1[layer], self.t2q[layer], self.t2s[layer])
                end = rt.mark(COPY)
            rt.compute_waits_for_copies()
        counters.h2d_busy.append((start, end))
        layer_bytes = stores.geom.batch * (t1_slots * stores.full_row_bytes + t2_slots * stores.t2_row_bytes)
        counters.h2d_bytes += self.t1.shape[0] * layer_bytes

    def layer(self, layer: int):
        return self.t1[layer], self.t2q[layer], self.t2s[layer]
