"""Swap preemption (`scheduler.preemption: swap`, vLLM's preemption_mode="swap"): a preempted
request's K/V is copied to host memory and back instead of being dropped and prefilled again.

What crosses the link is what sits in HBM: the T0 tokens of the request's cache (a decoding
request holds prompt + generated - 1 tokens, split by `TierCounter.held`; one mid-prefill holds the
tokens computed so far, all in HBM). Its T1/T2 are already on the host and stay there. While
swapped, a request holds host memory: its T0 copy plus its T1/T2. `SwapSpace` keeps that ledger
and says whether one more fits - in host memory beside the running requests' T1/T2 and, where
`scheduler.swap_space_bytes` is given (vLLM's --swap-space), with the T0 copies under that limit.
A victim that does not fit is recomputed instead (counted as a fallback).

Costs: one D2H (out) or H2D (in) transfer per step on the GPU's host link (`hardware.LinkModel`),
as the step starts - vLLM issues its swaps ahead of the forward pass, which waits for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def swap_bytes(t0_tokens: int, t1_tokens: int, t2_tokens: int, kv_bytes_per_token: float,
               t2_bytes_per_token: float) -> tuple[float, float]:
    """(bytes crossing the link, host bytes held while swapped) of one request:
    link = T0 x KV bytes per token; host = link + T1 x KV bytes + T2 x compressed bytes."""
    link_bytes = t0_tokens * kv_bytes_per_token
    return link_bytes, link_bytes + t1_tokens * kv_bytes_per_token + t2_tokens * t2_bytes_per_token


def swap_copies(num_layers: int, requests: int) -> int:
    """One coalesced copy of a request's T0 K/V per layer, as a re-tier's offload is copied
    (vLLM copies block by block: more per-copy latency, the same bytes)."""
    return num_layers * requests


@dataclass
class SwapSpace:
    """Requests whose K/V waits on the host, by request: the bytes that come back over the link
    (`link_bytes`) and the host bytes each holds (`host_bytes`). `limit_bytes`: the swap space for
    the T0 copies (inf: host memory alone bounds them)."""

    limit_bytes: float = math.inf
    link_bytes: dict[int, float] = field(default_factory=dict)
    host_bytes: dict[int, float] = field(default_factory=dict)

    def __contains__(self, i: int) -> bool:
        return i in self.link_bytes

    def __len__(self) -> int:
        return len(self.link_bytes)

    @property
    def held_bytes(self) -> float:
        """Host bytes all swapped requests hold (0.0 when none)."""
        return float(sum(self.host_bytes.values()))

    def fits(self, link_bytes: float, host_bytes: float, host_free_bytes: float) -> bool:
        """One more: held + its host bytes <= the host memory the running requests leave, and the
        T0 copies within the swap space."""
        return (self.held_bytes + host_bytes <= host_free_bytes
                and sum(self.link_bytes.values()) + link_bytes <= self.limit_bytes)

    def put(self, i: int, link_bytes: float, host_bytes: float) -> None:
        self.link_bytes[i], self.host_bytes[i] = link_bytes, host_bytes

    def take(self, i: int) -> float:
        """Remove request i (swapped in, or dropped); its bytes that come back over the link."""
        del self.host_bytes[i]
        return self.link_bytes.pop(i)
