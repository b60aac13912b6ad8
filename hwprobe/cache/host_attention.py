"""Exact attention over host-resident T1/T2 where they live (policy.access host_attention / split).

DESIGN.md "Access strategies for host tiers". Per layer with host-attended tokens:

1. `launch`: the layer's queries q [B, Hkv, G, d] go device->host (non_blocking, into a pinned
   buffer) on the host-path stream once the compute stream has produced them; an event follows;
2. a worker thread waits for that event, attends the layer's host spans - T1 slots at full
   precision, T2 slots int8 dequantised on the fly - with an exact softmax in float32, and writes
   the partial output and its log-sum-exp per (row, head) into a pinned buffer [B, Hkv, G, d + 1];
3. meanwhile the compute stream attends T0 (+ the staged part under `split`); `collect` then waits
   for the worker (stall, as the simulator counts the wait for the host path), copies the partials
   host->device, and the cache merges both by LSE (attention.merge_partials).

The GIL: the worker runs torch CPU ops only (matmul, exp, sum: they release the GIL) and waits on
the CUDA event with Event.synchronize (which releases it too), so the main thread keeps enqueuing
the device's T0 attention meanwhile. One worker: layers are attended in order, one at a time, as
the simulator's host resource serves them. On the CPU "device" the copies are memcpys and the two
threads share the CPU, through the same code.

Buffer reuse without `record_stream`: `collect` returns only after the worker has seen the query
copy land, so the device query outlives its copy; the worker of layer l+1 writes the partials
buffer only after layer l+1's queries have landed, and those were copied after the compute stream
had queued layer l's partials copy (the host-path stream waits for the compute stream first), so
one partials buffer serves every layer.

Scores (re-tier on attention): the worker keeps the layer's host probabilities [B, Hkv, G, n] until
the device's T0 log-sum-exp arrives (`send_lse`: [B, Hkv, G] float32 device->host after the T0
attention), then adds their share of the merged softmax, averaged over heads and layers, to host
score columns laid out like the cache's staged accumulator (`take_scores` at a re-tier). Replaying
the simulator's decisions needs no scores: that copy is then skipped, and the link traffic is the
simulator's: B x H x d x itemsize (2 B in bf16) queries device->host and B x H x (d + 1) x 4 B
partials host->device per layer.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from sim.model.units import KV_TENSORS
from sim.tiering.tiers import T1

from .attention import merge_shares, partial_softmax_attention
from .quant import dequantize_int8
from .runtime import HOST_PATH


@dataclass(frozen=True)
class HostSpan:
    """Slots [start, end) of one host tier attended on the host. The scores of slot j go to
    column `column + j` of the staged score layout (T1 slots first, then T2)."""

    tier: int
    start: int
    end: int
    column: int


@dataclass
class _Job:
    layer: int
    spans: tuple
    attended: Future = field(default=None)  # -> (host probabilities or None, host lse, busy seconds)


class HostAttention:
    def __init__(self, rt, stores, dtype, scale: float, layers: int, scoring: bool, score_columns: int):
        import torch

        self.torch, self.rt, self.stores, self.dtype, self.scale = torch, rt, stores, dtype, scale
        self.layers, self.scoring = layers, scoring
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="host-attention")
        self.pool.submit(int).result()  # start the worker now, not inside the first timed step
        self.scores = torch.zeros((stores.geom.batch, score_columns), dtype=torch.float32) if scoring else None
        self.q_host = None  # pinned buffers, allocated at the first layer (the query shape is known then)
        self._folds: list[Future] = []

    def _allocate(self, q) -> None:
        torch, rt = self.torch, self.rt
        b, hkv, g, d = q.shape
        self.q_host = rt.host_empty((b, hkv, g, d), q.dtype, True)
        self.partials_host = rt.host_empty((b, hkv, g, d + 1), torch.float32, True)  # output | lse
        self.partials_dev = rt.device_empty((b, hkv, g, d + 1), torch.float32)
        self.q_ready = rt.event()
        if self.scoring:  # one per layer: a fold may still read layer l's while layer l+1's lands
            self.lse_host = rt.host_empty((self.layers, b, hkv, g), torch.float32, True)
            self.lse_ready = [rt.event() for _ in range(self.layers)]

    # ---- the layer's side (main thread) ------------------------------------------------------
    def launch(self, layer: int, q, spans: tuple, bias, counters) -> _Job:
        """Queries device->host, then the worker attends `spans` of `layer` (bias [B, sum n]: 0 or
        -inf per host slot, over the spans in order)."""
        rt = self.rt
        if self.q_host is None:
            self._allocate(q)
        with rt.on_host_path_stream():
            rt.host_path_waits_for_compute()
            start = rt.mark(HOST_PATH)
            self.q_host.copy_(q, non_blocking=True)
            end = rt.mark(HOST_PATH)
            rt.record_host_path(self.q_ready)
        self._count(counters, "d2h", self.q_host, start, end)
        job = _Job(layer, spans)
        job.attended = self.pool.submit(self._attend, layer, spans, bias)
        return job

    def send_lse(self, job: _Job, lse_dev, counters) -> None:
        """(Scoring only.) The device's T0 log-sum-exp [B, Hkv, G] to the host, on the compute
        stream right after the T0 attention; the worker folds the layer's host scores once it lands."""
        rt, dst = self.rt, self.lse_host[job.layer]
        start = rt.mark()
        dst.copy_(lse_dev, non_blocking=True)
        end = rt.mark()
        rt.record_compute(self.lse_ready[job.layer])
        self._count(counters, "d2h", dst, start, end)
        self._folds.append(self.pool.submit(self._fold, job))

    def collect(self, job: _Job, counters):
        """The layer waits for the host's partials and copies them to the device: (out [B, Hkv, G, d]
        float32, lse [B, Hkv, G]) on the device."""
        rt = self.rt
        with rt.exposed(counters.stalls):  # the wait for the host path, then the partials' copy
            _, _, busy_s = job.attended.result()
            start = rt.mark()
            self.partials_dev.copy_(self.partials_host, non_blocking=True)
            end = rt.mark()
        self._count(counters, "h2d", self.partials_host, start, end, exposed=False)
        counters.host_busy_s += busy_s
        d = self.partials_dev.shape[-1] - 1
        return self.partials_dev[..., :d], self.partials_dev[..., d]

    def drain(self) -> None:
        """Wait for every score fold queued (before a re-tier reads the scores, or the step's end)."""
        folds, self._folds = self._folds, []
        for f in folds:
            f.result()

    def take_scores(self):
        """[B, score columns] host-attended probability accumulated since the last call (numpy)."""
        self.drain()
        out = self.scores.numpy().copy()
        self.scores.zero_()
        return out

    def close(self) -> None:
        self.drain()
        self.pool.shutdown(wait=True)

    def _count(self, counters, direction: str, tensor, start, end, exposed: bool = True) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        setattr(counters, f"{direction}_bytes", getattr(counters, f"{direction}_bytes") + nbytes)
        setattr(counters, f"{direction}_copies", getattr(counters, f"{direction}_copies") + 1)
        getattr(counters, f"{direction}_busy").append((start, end))
        if exposed and not self.rt.is_cuda:  # nothing overlaps a memcpy on the CPU
            counters.stalls.append((start, end))

    # ---- the worker thread ------------------------------------------------------------------
    def _attend(self, layer: int, spans: tuple, bias):
        """Exact softmax over the host spans (torch CPU ops: the GIL is released inside each)."""
        self.rt.wait_host(self.q_ready)  # on CUDA: cudaEventSynchronize, GIL released
        start = time.perf_counter()
        q = self.q_host.float()  # [B, Hkv, G, d]
        parts = [self._kv(layer, span) for span in spans]
        out, lse, probs = partial_softmax_attention(q, parts, bias, self.scale)
        d = out.shape[-1]
        self.partials_host[..., :d] = out
        self.partials_host[..., d] = lse
        return (probs if self.scoring else None), lse, time.perf_counter() - start

    def _kv(self, layer: int, span: HostSpan):
        """K, V [B, Hkv, n, d] float32 of one span, read where it lives (T2 dequantised)."""
        torch, st, g = self.torch, self.stores, self.stores.geom
        a, b = span.start, span.end
        if span.tier == T1:
            rows = st.t1[layer, a:b].float()  # [n, B, R]
        else:
            rows = dequantize_int8(st.t2q[layer, a:b], st.t2s[layer, a:b], torch.float32)
        kv = rows.view(b - a, g.batch, KV_TENSORS, g.kv_heads, g.head_dim)
        return kv[:, :, 0].permute(1, 2, 0, 3), kv[:, :, 1].permute(1, 2, 0, 3)

    def _fold(self, job: _Job) -> None:
        """Add the layer's host probabilities, scaled by the host's share of the merged softmax,
        averaged over query heads and layers, to the score columns of their slots."""
        self.rt.wait_host(self.lse_ready[job.layer])
        probs, lse_host, _ = job.attended.result()
        _, share = merge_shares(self.lse_host[job.layer], lse_host)
        weight = (probs * share[..., None]).mean(dim=(1, 2)) / self.layers  # [B, n]
        col = 0
        for span in job.spans:
            n = span.end - span.start
            self.scores[:, span.column + span.start : span.column + span.end] += weight[:, col : col + n]
            col += n


def simulator_split_rule(ctx):
    """`split`'s fraction as the simulator chooses it (sim/device/physics.py `decode_step_cost`, access
    split): the share of host-resident tokens attended on the host that makes the step fastest on
    the scenario's hardware model, for the step's tier counts. Returns
    rule(active rows, t0, t1, t2 tokens over the batch) -> fraction."""
    from sim.device.physics import decode_step_cost

    m, p = ctx.scenario.model, ctx.scenario.policy

    def rule(active: int, t0: int, t1: int, t2: int) -> float:
        if t1 + t2 == 0:
            return 0.0
        return decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, p.prefetch, active, t0, t1,
                                t2, ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, True, "split",
                                p.staging_buffers).host_fraction

    return rule
