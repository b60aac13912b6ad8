"""Double-buffered per-layer prefetch of T1/T2 into device staging buffers (`layerwise_async`).

Layer l uses buffer l % n. The side stream fills a buffer only after the compute stream has
released it (an event recorded after the last read), then records `ready`; the compute stream
waits on `ready` before reading. Both waits are GPU-side, so the host never blocks and layer l+1's
copy runs while layer l computes. Releases are recorded, never `record_stream`ed (FACTS.md).
With one buffer the next copy can only start after the current layer has read it. Per layer the
copies are sim/device/physics.py's `prefetch_copies_per_layer("layerwise_async", ...)`: one T1 prefix, T2
payload and scales.
"""

from __future__ import annotations

from .runtime import COPY


class _Buffer:
    def __init__(self, rt, index: int, cap1: int, cap2: int, rows: int, row_elems: int, groups: int, dtype):
        import torch

        self.index = index
        self.t1 = rt.device_zeros((cap1, rows, row_elems), dtype)
        self.t2q = rt.device_zeros((cap2, rows, row_elems), torch.int8)
        self.t2s = rt.device_zeros((cap2, rows, groups), torch.float16)
        self.ready = rt.event()
        self.free = rt.event()
        self.key = None  # (step, layer) whose data it holds or is receiving
        self.released = True  # its last data has been read (or it never held any)
        self.ever_released = False  # a `free` event has been recorded at least once

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.t1, self.t2q, self.t2s))


class StagingRing:
    def __init__(self, rt, n_buffers: int, cap1: int, cap2: int, rows: int, row_elems: int, groups: int, dtype):
        self.rt = rt
        self.buffers = [_Buffer(rt, i, cap1, cap2, rows, row_elems, groups, dtype) for i in range(n_buffers)]

    def nbytes(self) -> int:
        return sum(b.nbytes() for b in self.buffers)

    def buffer_for(self, layer: int) -> _Buffer:
        return self.buffers[layer % len(self.buffers)]

    def can_fill(self, key, layer: int) -> bool:
        buf = self.buffer_for(layer)
        return buf.key != key and buf.released

    def holds(self, key, layer: int) -> bool:
        return self.buffer_for(layer).key == key

    def fill(self, key, layer: int, stores, t1_slots: int, t2_slots: int, counters, patch) -> None:
        """Issue the copies of layer `layer`'s T1 prefix [0, t1_slots) and T2 prefix [0, t2_slots), then
        `patch(layer, t1, t2q, t2s)` the rows an offload still has in transit."""
        rt, buf = self.rt, self.buffer_for(layer)
        if not buf.released:
            raise RuntimeError(f"staging buffer {buf.index} refilled before layer {buf.key} was read")
        # (destination, source) views made before the start mark: on a GPU the busy window opens
        # when the copy stream reaches the mark, so host work after it would count as link time
        pairs = ([(buf.t1[:t1_slots], stores.t1[layer, :t1_slots])] if t1_slots else []) + (
            [(buf.t2q[:t2_slots], stores.t2q[layer, :t2_slots]),
             (buf.t2s[:t2_slots], stores.t2s[layer, :t2_slots])] if t2_slots else [])
        with rt.on_copy_stream():
            if buf.ever_released:
                rt.copy_waits_for(buf.free)
            start = rt.mark(COPY)
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            end = rt.mark(COPY)
            patch(layer, buf.t1, buf.t2q, buf.t2s)
            rt.record_copy(buf.ready)
        counters.h2d_copies += len(pairs)
        rt.note("fill", buf.index, key)
        buf.key, buf.released = key, False
        rows = stores.geom.batch
        counters.h2d_bytes += rows * (t1_slots * stores.full_row_bytes + t2_slots * stores.t2_row_bytes)
        counters.h2d_busy.append((start, end))
        if not rt.is_cuda:  # nothing overlaps on the CPU: the copy is exposed in full
            counters.stalls.append((start, end))

    def acquire(self, key, layer: int, counters) -> _Buffer:
        """Compute stream waits until the buffer holding `key` has landed."""
        rt, buf = self.rt, self.buffer_for(layer)
        if buf.key != key or buf.released:
            raise RuntimeError(f"layer {key} read before its prefetch was issued")
        if rt.is_cuda:
            with rt.exposed(counters.stalls):
                rt.compute_waits_for(buf.ready)
        else:
            rt.compute_waits_for(buf.ready)
        rt.note("acquire", buf.index, key)
        return buf

    def release(self, buf: _Buffer) -> None:
        """Everything queued so far on the compute stream has read the buffer: it may be refilled."""
        self.rt.note("release", buf.index, buf.key)
        self.rt.record_compute(buf.free)
        buf.released = buf.ever_released = True
