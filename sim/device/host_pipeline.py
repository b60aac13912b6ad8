"""Host attention against the host DRAM it shares with the link's DMA, and the closed form of one
host-access step (policy.access host_attention / split) with the link to itself.

The host DRAM is one resource. The host attention stream reads the host-resident K/V from it; the
link's DMA reads it (prefetches, promotions, swap-ins: host->device copies) and writes it (offloads,
swap-outs: device->host copies). The model is a fluid one, max-min fair:

- every flow has a demand: the attention stream its rate with the DRAM to itself (K/V bytes /
  `HostCpu.stream_s`), a DMA copy its link-model rate (bytes / copy time, its per-copy latency
  spread over the copy);
- while an attention stream runs, the socket's DRAM bandwidth B (`HostCpu.shared_bytes_per_s`) is
  shared max-min fairly: each flow gets min(demand, level), the level set so the shares add up to B
  (every flow its demand where the demands fit). A 55 GB/s copy beside a 369 GB/s socket keeps its
  rate and the stream gets B - 55 GB/s; a copy faster than the level (Grace's C2C, PCIe Gen5 beside
  two DDR5 channels) is slowed to it as well;
- with no attention stream in flight, copies run at their link-model rates: DMA against DMA is the
  link model's business (its bidirectional figure);
- a flow's progress is counted in its own seconds alone: at a share r of its demand d it advances
  r / d of them per second, so a flow nothing contends with takes exactly its time alone.

The queries and partial outputs (kilobytes per layer) are not DRAM flows. `host_dram.HostDram` runs
this model in SimPy (the layer level); `host_pipeline` is its closed form for one step whose only
DMA is its own prefetch (the step level, the projection, split's choice).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


def dram_shares_bytes_per_s(demands_bytes_per_s: Sequence[float], capacity_bytes_per_s: float) -> list[float]:
    """Max-min fair shares of `capacity` among flows demanding `demands` (water-filling): every
    demand in full where they add up to no more than the capacity; else, smallest first, a flow
    whose demand is below an equal split of what is left gets it, and the rest split what is left
    equally. E.g. demands (55, 369) of 369 GB/s -> (55, 314); (340, 410) of 410 -> (205, 205)."""
    if sum(demands_bytes_per_s) <= capacity_bytes_per_s:
        return list(demands_bytes_per_s)
    n = len(demands_bytes_per_s)
    order = sorted(range(n), key=lambda i: demands_bytes_per_s[i])
    shares = [0.0] * n
    left = capacity_bytes_per_s
    for k, i in enumerate(order):
        fair = left / (n - k)
        if demands_bytes_per_s[i] > fair:
            for j in order[k:]:
                shares[j] = fair
            break
        shares[i] = demands_bytes_per_s[i]
        left -= demands_bytes_per_s[i]
    return shares


def dram_speeds(demands_bytes_per_s: Sequence[float], streams: Sequence[bool],
                capacity_bytes_per_s: float) -> list[float]:
    """Each flow's speed, its alone-seconds per second (share / demand): 1 for every flow while no
    attention stream (`streams`) is among them, or for a flow alone; else from `dram_shares_bytes_per_s`."""
    if not any(streams) or len(demands_bytes_per_s) == 1:
        return [1.0] * len(demands_bytes_per_s)
    shares = dram_shares_bytes_per_s(demands_bytes_per_s, capacity_bytes_per_s)
    return [s / d if d > 0 else 1.0 for s, d in zip(shares, demands_bytes_per_s)]


@dataclass(frozen=True)
class HostLayer:
    """One layer of a host-access step as the closed form needs it (seconds and bytes)."""

    pre_s: float  # norm + QKV projection, before attention
    attention_s: float  # the GPU's own attention (T0 and the prefetched part)
    after_s: float  # output projection, MLP, launch gaps: after both attentions merged
    copy_s: float  # the layer's prefetch copy with the link to itself (0: nothing prefetched)
    copy_bytes: float
    query_s: float  # queries device->host with no prefetch copy in flight
    query_shared_s: float  # the same while a prefetch copy is in flight (bidirectional share)
    dispatch_s: float  # the host's thread pool wakes (no DRAM traffic)
    stream_s: float  # the host attention stream with the DRAM to itself
    stream_bytes: float  # K/V bytes it reads
    partials_s: float  # partial outputs + LSE host->device


@dataclass
class HostStepTimes:
    """When each part of one host-access step ran, from the step's start (one entry per layer)."""

    layers: list = field(default_factory=list)  # (begin, end)
    copies: list = field(default_factory=list)  # (start, end) of layer l's prefetch copy, or None
    queries: list = field(default_factory=list)
    host: list = field(default_factory=list)  # the host busy: dispatch, then the stream
    partials: list = field(default_factory=list)

    @property
    def finish_s(self) -> float:
        return self.layers[-1][1] if self.layers else 0.0


def host_pipeline(x: HostLayer, num_layers: int, buffers: int, capacity_bytes_per_s: float,
                  partials_behind_copies: bool) -> HostStepTimes:
    """Closed form of one host-access step of `num_layers` identical layers, nothing else on the
    link (the layer level's `engine.DecodeSim.host_layers` when no other DMA is in flight):

    - copies: the first `buffers` layers' prefetches are issued at t = 0, back to back; layer l's
      attention takes its staged tokens (freeing the buffer) at put_l = max(begin_l + pre, copy l
      end), which issues copy l + buffers, started when the link is free;
    - queries leave at put_l (the bidirectional share while a copy is in flight), the host
      dispatches, then streams from hs_l = put_l + query + dispatch;
    - from hs_l the DMA in flight is one gapless chain of copies (the one on the link, then the one
      just issued) at one demand: the stream and the chain share the DRAM (`dram_speeds`) until the
      first of them is done, the other then runs alone;
    - partial outputs go back when the stream ends (behind the copies already issued where they
      share the H2D copy engine, `partials_behind_copies`), and the layer ends at
      max(put_l + GPU attention, partials end) + after.
    """
    L, b, c = num_layers, buffers, x.copy_s
    staged = c > 0
    stream_demand = x.stream_bytes / x.stream_s if x.stream_s > 0 else 0.0
    copy_demand = x.copy_bytes / c if staged else 0.0
    s_host, s_copy = dram_speeds([stream_demand, copy_demand], [True, False], capacity_bytes_per_s)
    t = HostStepTimes(copies=[None] * L)
    starts, ends = [0.0] * L, [0.0] * L
    link_free, issued = 0.0, 0
    if staged:
        for k in range(min(b, L)):
            starts[k], ends[k] = link_free, link_free + c
            link_free, issued = ends[k], k + 1
    end = 0.0
    for layer in range(L):
        begin = end
        put = max(begin + x.pre_s, ends[layer]) if staged else begin + x.pre_s
        copy_in_flight = link_free > put
        if staged and layer + b < L:
            k = layer + b
            starts[k] = max(put, link_free)
            ends[k] = starts[k] + c
            link_free, issued, copy_in_flight = ends[k], k + 1, True
        q_end = put + (x.query_shared_s if copy_in_flight else x.query_s)
        hs = q_end + x.dispatch_s
        ahead = link_free - hs  # the chain's alone-seconds left when the stream starts
        if x.stream_s > 0 and ahead > 0:
            he = _share_dram(hs, ahead, x.stream_s, s_host, s_copy, starts, ends, range(layer + 1, issued))
            link_free = ends[issued - 1]
        else:
            he = hs + x.stream_s
        p_start = max(he, link_free) if staged and partials_behind_copies else he
        p_end = p_start + x.partials_s
        if staged and partials_behind_copies:
            link_free = p_end
        end = max(put + x.attention_s, p_end) + x.after_s
        t.layers.append((begin, end))
        t.queries.append((put, q_end))
        t.host.append((q_end, he))
        t.partials.append((p_start, p_end))
    if staged:
        t.copies = [(starts[k], ends[k]) for k in range(L)]
    return t


def _share_dram(hs: float, ahead: float, stream_s: float, s_host: float, s_copy: float, starts: list, ends: list,
                chain: range) -> float:
    """The host stream starting at `hs` beside a chain of copies with `ahead` alone-seconds left: both
    run at their shared speeds until the first is done. Moves the chain's copies (`chain`, indices
    into `starts`/`ends`) that start or end after hs in place; returns when the stream ends."""
    both = min(stream_s / s_host, ahead / s_copy)  # seconds both flows run

    def moved(e: float) -> float:  # a moment of the chain after hs, from its full-speed projection
        a = e - hs
        return hs + a / s_copy if a <= s_copy * both else hs + both + (a - s_copy * both)

    for k in chain:
        if starts[k] > hs:
            starts[k] = moved(starts[k])
        if ends[k] > hs:
            ends[k] = moved(ends[k])
    return hs + both + (stream_s - s_host * both)
