"""The load AIConfigurator's power-law routing puts on the GPU its MoE tables time (sim/model/power_law.py):
the collector's draw, re-done here the slow way on the same uniforms, conservation of pairs, the bounds of
the busiest rank's load, the interpolation above the exact range, and determinism."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from sim.model import power_law as pl
from sim.model.power_law import power_law_load, routing_alpha


def _collector_draw(u: np.ndarray, tie: np.ndarray, tokens: int, experts: int, top_k: int, ep: int,
                    alpha: float) -> tuple[int, int]:
    """One draw as collector/helper.py `_generate_power_law_distribution` makes it, element by element, equal
    pairs ordered by `tie`."""
    lo, hi = (1.0, tokens * 0.8) if tokens * top_k > experts else (0.01, 2.0)
    x = [((hi ** (1 - alpha) - lo ** (1 - alpha)) * v + lo ** (1 - alpha)) ** (1 / (1 - alpha)) for v in u]
    counts = [int(np.rint(w / sum(x) * tokens * top_k)) for w in x]
    delta = tokens * top_k - sum(counts)
    order = sorted(range(experts), key=lambda i: (-counts[i], tie[i]))  # descending, ties in random order
    for i in range(delta):
        counts[order[i % experts]] += 1
    for i in range(-delta):
        j = order[-(i % experts) - 1]
        if counts[j] > 0:
            counts[j] -= 1
        else:
            counts[max(range(experts), key=lambda e: (counts[e], -e))] -= 1
    per = experts // ep
    ranks = [counts[r * per:(r + 1) * per] for r in range(ep)]
    busiest = max(range(ep), key=lambda r: (sum(ranks[r]), -r))
    return sum(1 for c in ranks[busiest] if c > 0), sum(ranks[busiest])


@pytest.mark.parametrize("tokens, experts, top_k, ep, alpha", [
    (1, 128, 4, 1, 1.2), (7, 32, 4, 1, 1.2), (33, 128, 4, 1, 1.2), (200, 256, 8, 8, 1.01), (100, 128, 1, 4, 1.01),
])
def test_the_expectation_is_the_collectors_draw_averaged_over_the_seeded_uniforms(tokens, experts, top_k, ep, alpha):
    draws = [_collector_draw(u, tie, tokens, experts, top_k, ep, alpha) for u, tie in zip(*pl._uniforms(experts))]
    touched, pairs = power_law_load(tokens, experts, top_k, ep, alpha)
    assert touched == pytest.approx(np.mean([d[0] for d in draws]), rel=1e-12)
    assert pairs == pytest.approx(np.mean([d[1] for d in draws]), rel=1e-12)


@pytest.mark.parametrize("tokens", [1, 5, 31, 32, 33, 100, 256])
def test_every_pair_lands_on_one_gpu_without_expert_parallelism(tokens):
    touched, pairs = power_law_load(tokens, 128, 4, 1, 1.2)
    assert pairs == tokens * 4
    assert 1 <= touched <= min(128, tokens * 4)


@pytest.mark.parametrize("tokens", [8, 64, 512, 3000, 20000])
def test_the_busiest_rank_holds_at_least_its_share_and_at_most_its_experts(tokens):
    touched, pairs = power_law_load(tokens, 256, 8, 8, 1.01)
    assert tokens * 8 / 8 <= pairs <= tokens * 8
    assert touched <= 32


def test_few_tokens_scatter_over_the_ranks():
    """4 tokens of Kimi-K2's shape (E 384, k 6) over EP16: the 24 pairs all round to nothing, and the remainder
    lands on 24 experts in random order - the busiest of 16 ranks gets a few of them, not all 24."""
    touched, pairs = power_law_load(4, 384, 6, 16, 1.01)
    assert touched == pairs and 2.5 < pairs < 6


def test_the_busiest_rank_carries_more_than_balanced_routing_gives_it():
    """DeepSeek-R1 (E 256, k 8) over EP8 at 1,024 tokens: the power law's busiest rank computes ~1,423 pairs
    where balanced routing gives every rank 1,024; it reads ~29.4 of its 32 experts."""
    touched, pairs = power_law_load(1024, 256, 8, 8, 1.01)
    assert pairs == pytest.approx(1423, rel=0.01)
    assert touched == pytest.approx(29.4, abs=0.1)


def test_above_the_exact_range_the_grid_matches_the_draw_at_its_points_and_moves_smoothly():
    experts, top_k, ep, alpha = 128, 4, 1, 1.2
    t = round(2 ** (150 / pl.PER_OCTAVE))  # a grid point: 2^(150/16) ~ 665 tokens
    grid = pl._grid(experts, top_k, ep, alpha, pl.EXACT_TOKENS)
    point = next(g for g in grid if g[0] == 150)
    assert point[1:] == pytest.approx((pl._exact(t, experts, top_k, ep, alpha)[0], top_k), rel=1e-12)
    loads = [power_law_load(n, experts, top_k, ep, alpha)[0] for n in range(300, 5000, 37)]
    assert all(b >= a - 0.5 for a, b in pairwise(loads))  # touched experts grow with tokens
    exact_edge = power_law_load(pl.EXACT_TOKENS, experts, top_k, ep, alpha)[0]
    assert power_law_load(pl.EXACT_TOKENS + 1, experts, top_k, ep, alpha)[0] == pytest.approx(exact_edge, rel=0.01)


def test_it_is_deterministic_and_the_routing_names_parse():
    assert power_law_load(777, 32, 4, 1, 1.2) == power_law_load(777, 32, 4, 1, 1.2)
    assert power_law_load(0, 32, 4, 1, 1.2) == (0.0, 0.0)
    assert routing_alpha("power_law_1.2") == 1.2 and routing_alpha("power_law_1.01") == 1.01
    assert routing_alpha("balanced") is None
