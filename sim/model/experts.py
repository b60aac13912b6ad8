"""Routing arithmetic of a mixture-of-experts layer: how many experts a step touches and how many
GPUs a token's hidden state must reach under expert parallelism.

Each token picks `top_k` distinct experts of `experts`; tokens route independently and, unless a
skew is given, uniformly (every expert equally likely). These are the exact expectations of that
balls-in-bins model, checked against brute-force sampling in tests/test_experts.py.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb, erf, pi, sqrt

import numpy as np


def expected_experts_touched(experts: int, top_k: int, tokens: float, held: int | None = None) -> float:
    """Distinct experts, of the `held` ones a GPU holds (all `experts` by default), that at least one
    of `tokens` tokens routes to: held x (1 - (1 - k/E)^tokens), since one token misses a given
    expert with probability 1 - k/E exactly (it picks k of E distinct)."""
    held = experts if held is None else held
    return held * (1.0 - (1.0 - top_k / experts) ** tokens)


def expected_ranks_hit(experts: int, top_k: int, ranks: int) -> float:
    """Distinct expert-parallel ranks one token's top-k experts sit on, the experts split evenly over
    `ranks` GPUs (E / ranks each, contiguous as vLLM and SGLang place them):
    ranks x (1 - C(E - E/ranks, k) / C(E, k)) - a rank is missed when all k picks fall elsewhere.
    A dispatch sends the token once to each rank it hits (DeepEP, vLLM's all2all backends)."""
    if ranks <= 1:
        return 1.0
    per_rank = experts // ranks
    miss = comb(experts - per_rank, top_k) / comb(experts, top_k)
    return ranks * (1.0 - miss)


def expected_remote_ranks(experts: int, top_k: int, ranks: int) -> float:
    """Ranks other than the token's own that its dispatch reaches: `expected_ranks_hit` x (ranks - 1)
    / ranks (by symmetry, the token's own rank is hit as often as any other)."""
    if ranks <= 1:
        return 0.0
    return expected_ranks_hit(experts, top_k, ranks) * (ranks - 1) / ranks


def expected_max_standard_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1; 0.5642 for 2, 1.4236 for 8), by
    quadrature of n x phi(x) Phi(x)^(n-1) x over [-10, 10]."""
    if n <= 1:
        return 0.0
    return _expected_max_normal(n)


@lru_cache(maxsize=128)
def _expected_max_normal(n: int) -> float:
    x = np.linspace(-10.0, 10.0, 20001)
    phi = np.exp(-x * x / 2) / sqrt(2 * pi)
    cdf = 0.5 * (1.0 + np.vectorize(erf)(x / sqrt(2)))
    return float(np.trapezoid(x * n * phi * cdf ** (n - 1), x))


def busiest_rank_experts_touched(experts: int, top_k: int, tokens: float, ranks: int) -> float:
    """Distinct experts touched on the busiest of `ranks` expert-parallel GPUs (E / ranks each): the
    step waits for it. Per rank the count has mean m = E_r q, q = 1 - (1 - k/E)^tokens, and, the
    experts taken as independent, variance E_r q (1 - q); the busiest of the ranks is taken as
    m + sd x E[max of `ranks` standard normals], at most E_r. (The independence and normal
    approximations are checked against sampling in tests/test_experts.py.)"""
    held = experts // ranks
    q = 1.0 - (1.0 - top_k / experts) ** tokens
    mean = held * q
    if ranks <= 1:
        return mean
    return min(float(held), mean + sqrt(held * q * (1.0 - q)) * expected_max_standard_normal(ranks))


# ---- skewed routing --------------------------------------------------------------------------------
# Expert popularity follows a Zipf law of exponent `skew` over a fixed shuffle of the experts (which
# experts are popular is unrelated to their index, hence to the GPU that holds them): a token routes
# to expert i with probability pi_i proportional to its popularity, capped at 1, the pi summing to k.
# Expected distinct experts need only these marginals: sum_i 1 - (1 - pi_i)^tokens, exact whatever
# the dependence between one token's k picks. skew 0 is uniform routing (pi_i = k / E).
PLACEMENT_SEED = 0  # the fixed shuffle of popularity over expert indices


@lru_cache(maxsize=64)
def routing_probabilities(experts: int, top_k: int, skew: float) -> tuple[float, ...]:
    """pi_i, in expert-index order: Zipf(skew) popularity over a seeded shuffle of the experts,
    scaled so that sum pi = k with no pi above 1 (water-filling: capped experts fixed at 1, the rest
    rescaled)."""
    weights = (np.arange(1, experts + 1, dtype=float) ** -skew)[np.random.default_rng(PLACEMENT_SEED).permutation(experts)]
    pi = np.zeros(experts)
    free = np.ones(experts, dtype=bool)
    left = float(top_k)
    while True:
        pi[free] = weights[free] * left / weights[free].sum()
        over = free & (pi > 1.0)
        if not over.any():
            return tuple(float(p) for p in pi)
        pi[over], free[over] = 1.0, False
        left = top_k - float((~free).sum())


def touched_per_rank(experts: int, top_k: int, tokens: float, ranks: int, skew: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of the distinct experts touched on each of `ranks` GPUs holding E / ranks
    contiguous experts each: q_i = 1 - (1 - pi_i)^tokens summed, and q_i (1 - q_i) summed (experts
    taken as independent)."""
    pi = np.asarray(routing_probabilities(experts, top_k, skew))
    q = (1.0 - (1.0 - pi) ** tokens).reshape(ranks, -1)
    return q.sum(axis=1), (q * (1.0 - q)).sum(axis=1)


def skewed_experts_touched(experts: int, top_k: int, tokens: float, skew: float) -> float:
    """Distinct experts all the GPUs together read for `tokens` tokens under skewed routing."""
    return float(touched_per_rank(experts, top_k, tokens, 1, skew)[0][0])


def skewed_busiest_rank(experts: int, top_k: int, tokens: float, ranks: int, skew: float) -> float:
    """The busiest expert-parallel GPU's expected distinct experts under skewed routing: the largest
    of each rank's mean + sd x E[max of `ranks` standard normals], at most E / ranks (with skew 0 this
    is `busiest_rank_experts_touched`; with skew it leans upward where one rank dominates)."""
    mean, var = touched_per_rank(experts, top_k, tokens, ranks, skew)
    return min(float(experts // ranks), float(np.max(mean + np.sqrt(var) * expected_max_standard_normal(ranks))))


def busiest_routing_share(experts: int, top_k: int, ranks: int, skew: float) -> float:
    """The busiest rank's share of a token's k routings over 1 / ranks (1: balanced): it computes
    that much more than the mean rank's expert FLOP."""
    pi = np.asarray(routing_probabilities(experts, top_k, skew)).reshape(ranks, -1)
    return float(pi.sum(axis=1).max() / top_k * ranks)
