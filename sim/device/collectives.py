"""Collective costs as fitted on measured tables: per group size, the faster of two protocols.

An all-reduce implementation switches algorithm with the message size: NCCL between its low-latency
(LL) and bandwidth (Simple) protocols, an engine's custom kernel between one-shot (every GPU reads
every peer's whole buffer) and two-shot (reduce-scatter + all-gather). Each behaves as a floor plus
the ring bytes 2 (N - 1) / N x S over a bus bandwidth, so the call costs the smaller of the two lines
(fitted per GPU, implementation and group size by scripts/fit_datasheet.py). The group sizes differ
in kind, not just in hops (NVLink switches vs PCIe switches, NVLS from 4 GPUs), so a size the tables
did not measure takes the nearest measured one's protocols. An all-gather or a reduce-scatter of a
buffer of S bytes (the whole gathered buffer; what nccl-tests and the tables call its size) is half a
ring all-reduce: each GPU moves (N - 1) / N x S (`gather_bytes`), fitted the same way on NCCL's tables.
"""

from __future__ import annotations

import math

# (gpus, latency floor s, latency busbw B/s, bandwidth floor s, bandwidth busbw B/s)
Protocols = tuple[int, float, float, float, float]


def ring_bytes(nbytes: float, gpus: int) -> float:
    """Bytes each GPU sends in a ring all-reduce of `nbytes`: 2 (N - 1) / N x S."""
    return 2 * (gpus - 1) / gpus * nbytes


def gather_bytes(nbytes: float, gpus: int) -> float:
    """Bytes each GPU moves in an all-gather (or reduce-scatter) of a whole buffer of `nbytes`: (N - 1) / N x S."""
    return (gpus - 1) / gpus * nbytes


def two_protocol_s(moved_bytes: float, latency_floor_s: float, latency_bus_bytes_per_s: float,
                   bandwidth_floor_s: float, bandwidth_bus_bytes_per_s: float) -> float:
    """min over the two protocols of floor + the bytes each GPU moves / busbw."""
    return min(latency_floor_s + moved_bytes / latency_bus_bytes_per_s,
               bandwidth_floor_s + moved_bytes / bandwidth_bus_bytes_per_s)


def two_protocol_allreduce_s(nbytes: float, gpus: int, latency_floor_s: float, latency_bus_bytes_per_s: float,
                             bandwidth_floor_s: float, bandwidth_bus_bytes_per_s: float) -> float:
    """One all-reduce of `nbytes` per GPU over `gpus`: min over the two protocols of floor + ring bytes /
    busbw. Example: 1 MB over 4 GPUs with (5 us, 100 GB/s) and (20 us, 400 GB/s): 1.5 MB -> min(20, 23.75)
    = 20 us."""
    return two_protocol_s(ring_bytes(nbytes, gpus), latency_floor_s, latency_bus_bytes_per_s, bandwidth_floor_s,
                          bandwidth_bus_bytes_per_s)


def nearest_protocols(by_gpus: tuple[Protocols, ...], gpus: int) -> Protocols:
    """The measured group size nearest `gpus` in log2 (a tie: the larger, whose floors are higher)."""
    return min(by_gpus, key=lambda p: (abs(math.log2(p[0]) - math.log2(gpus)), -p[0]))
