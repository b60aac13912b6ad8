"""The load AIConfigurator's power-law routing puts on the GPU its MoE tables time, as the datasheet
model's inputs: the distinct experts that GPU reads and the token-expert pairs it computes.

The collector (collector/helper.py `_generate_power_law_distribution`, which `power_law_logits_v3` calls)
draws each of the E experts a weight from a power law x^-alpha on [1, 0.8 T] (on [0.01, 2] when T k <= E),
scales the weights to T k pairs, rounds them (half to even), moves the rounding's remainder onto the
largest experts (or off the smallest, the largest where those hold none), and times the expert-parallel
rank whose E / ep experts hold the most pairs. Experts of equal pairs are ordered at random here: torch's
CPU argsort leaves ties in no useful order, and when T k is far below E every expert rounds to none, so
the remainder is all the pairs and the tie order alone places them (a fixed order would put them all on
rank 0, which the tables' timings rule out). One draw per measured row; here the expectation over `DRAWS`
seeded draws. The same uniforms serve every token count of a shape (common random numbers), so
the figures change smoothly with T. Exact at T <= `EXACT_TOKENS` (or just past the T k = E switch, where
that is higher); above, on a grid of `PER_OCTAVE` points an octave, linear in log T between them.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, log2

import numpy as np

DRAWS = 64
SEED = 0
EXACT_TOKENS = 256
PER_OCTAVE = 16
POWER_LAW_PREFIX = "power_law_"


def routing_alpha(routing: str) -> float | None:
    """The power-law exponent of a table routing ('power_law_1.2' -> 1.2); None for 'balanced'."""
    return float(routing[len(POWER_LAW_PREFIX):]) if routing.startswith(POWER_LAW_PREFIX) else None


def power_law_load(tokens: float, experts: int, top_k: int, ep: int, alpha: float) -> tuple[float, float]:
    """(distinct experts, token-expert pairs) the power-law routing puts on the busiest of `ep` ranks for
    `tokens` tokens, in expectation. Example: 1,024 tokens of DeepSeek-R1 (E 256, k 8) over EP8 at alpha
    1.01: the busiest rank reads ~29.4 of its 32 experts over ~1,423 pairs (balanced routing: 1,024)."""
    if tokens <= 0:
        return 0.0, 0.0
    exact = max(EXACT_TOKENS, ceil(experts / top_k) + 1)
    if tokens <= exact:
        return _exact(max(1, round(tokens)), experts, top_k, ep, alpha)
    grid = _grid(experts, top_k, ep, alpha, exact)
    x = log2(tokens) * PER_OCTAVE
    i = min(int(x) - int(log2(exact) * PER_OCTAVE), len(grid) - 2)
    (x0, t0, p0), (x1, t1, p1) = grid[i], grid[i + 1]
    w = (x - x0) / (x1 - x0)
    return t0 + w * (t1 - t0), tokens * (p0 + w * (p1 - p0))  # pairs as a multiple of tokens


@lru_cache(maxsize=64)
def _grid(experts: int, top_k: int, ep: int, alpha: float, exact: int) -> tuple[tuple[float, float, float], ...]:
    """(log2 T x PER_OCTAVE, touched, pairs / T) at T = 2^(i / PER_OCTAVE) from `exact` to 2^24 tokens."""
    first = int(log2(exact) * PER_OCTAVE)
    out = []
    for i in range(first, 24 * PER_OCTAVE + 2):
        t = 2 ** (i / PER_OCTAVE)
        touched, pairs = _exact(round(t), experts, top_k, ep, alpha)
        out.append((float(i), touched, pairs / round(t)))
    return tuple(out)


@lru_cache(maxsize=65536)
def _exact(tokens: int, experts: int, top_k: int, ep: int, alpha: float) -> tuple[float, float]:
    counts = _counts(tokens, experts, top_k, alpha)
    per_rank = counts.reshape(DRAWS, ep, experts // ep)
    busiest = per_rank[np.arange(DRAWS), per_rank.sum(axis=2).argmax(axis=1)]
    return float((busiest > 0).sum(axis=1).mean()), float(busiest.sum(axis=1).mean())


def _counts(tokens: int, experts: int, top_k: int, alpha: float) -> np.ndarray:
    """Pairs per expert, one row per draw, as the collector rounds them to T k in all."""
    lo, hi = (1.0, 0.8 * tokens) if tokens * top_k > experts else (0.01, 2.0)
    a = 1.0 - alpha
    draw, ties = _uniforms(experts)
    weights = ((hi**a - lo**a) * draw + lo**a) ** (1.0 / a)
    counts = np.rint(weights / weights.sum(axis=1, keepdims=True) * (tokens * top_k)).astype(np.int64)
    for row, tie, delta in zip(counts, ties, tokens * top_k - counts.sum(axis=1)):
        _settle(row, tie, int(delta))
    return counts


def _settle(row: np.ndarray, tie: np.ndarray, delta: int) -> None:
    """The collector's remainder: +1 to the experts in descending order of pairs (ties in `tie`'s random
    order), cycling; or -1 from the smallest upward, where one holds none -1 from the current largest."""
    order = np.lexsort((tie, -row))
    n = len(row)
    if delta > 0:
        row[order] += delta // n + (np.arange(n) < delta % n)
    for i in range(-delta):
        j = order[-(i % n) - 1]
        row[j if row[j] > 0 else int(np.argmax(row))] -= 1


@lru_cache(maxsize=16)
def _uniforms(experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(the power law's uniforms, the tie order's), one row per draw."""
    u = np.random.default_rng(SEED).random((2, DRAWS, experts))
    return u[0], u[1]
