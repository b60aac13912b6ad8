"""Tier policy: protected sets, ratios, conservation, both semantics, count-only mirror."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.inputs.scenario import ImportanceCfg
from sim.tiering.counts import count_trajectory, protected_count
from sim.tiering.sequence import SequenceTiers, draw_importance
from sim.tiering.tiers import T0, T1, T2, T3, TierPolicy, assign_tiers, protected_mask, tier_counts


def test_protected_mask_prompt_sinks_recent():
    p = TierPolicy(sink_tokens=4, recent_window=3)
    mask = protected_mask(20, 5, p)
    assert mask.tolist() == [True] * 9 + [False] * 8 + [True] * 3
    mask = protected_mask(20, 5, TierPolicy(sink_tokens=4, recent_window=3, protect_prompt=False))
    assert mask[:5].sum() == 0 and mask[5:9].all()


@given(st.integers(0, 400), st.integers(0, 100), st.integers(0, 10), st.integers(0, 200), st.booleans())
def test_protected_count_matches_mask(n, prompt, sinks, recent, protect):
    p = TierPolicy(sink_tokens=sinks, recent_window=recent, protect_prompt=protect)
    assert protected_count(n, prompt, p) == protected_mask(n, prompt, p).sum()


def test_global_split_follows_ratios():
    n = 1000
    p = TierPolicy(hbm_ratio=0.5, evict_ratio=0.1, compressed_ratio=0.2, sink_tokens=0, recent_window=0, protect_prompt=False)
    score = np.arange(n, dtype=float)  # token i has score i
    new = assign_tiers(np.zeros(n, dtype=np.int8), score, np.zeros(n, dtype=bool), p)
    assert tier_counts(new) == (500, 200, 200, 100)
    assert (new[:100] == T3).all() and (new[100:300] == T2).all() and (new[300:500] == T1).all() and (new[500:] == T0).all()


def test_global_eviction_does_not_compound_paper_does():
    p_global = TierPolicy(hbm_ratio=0.5, evict_ratio=0.1, sink_tokens=0, recent_window=0, protect_prompt=False)
    p_paper = TierPolicy(semantics="paper_prototype", hbm_ratio=0.5, evict_ratio=0.1, sink_tokens=0,
                         recent_window=0, protect_prompt=False)
    rng = np.random.default_rng(0)
    n = 1000
    tg = np.zeros(n, dtype=np.int8)
    tp = np.zeros(n, dtype=np.int8)
    for _ in range(5):
        score = rng.random(n)
        tg = assign_tiers(tg, score, np.zeros(n, dtype=bool), p_global)
        tp = assign_tiers(tp, score, np.zeros(n, dtype=bool), p_paper)
    assert tier_counts(tg)[3] == 100  # a target for the whole sequence
    # paper: 100 of 1000, then 10% of the 500 left on GPU, ... -> 100 + 50 + 25 + 12 + 6
    assert tier_counts(tp)[3] == 193
    # paper: host tokens never return
    assert tier_counts(tp)[0] == 31 and tier_counts(tp)[1] == 1000 - 31 - 193


def test_paper_prototype_never_promotes():
    p = TierPolicy(semantics="paper_prototype", hbm_ratio=0.5, evict_ratio=0.0, sink_tokens=0, recent_window=0, protect_prompt=False)
    n = 100
    t = assign_tiers(np.zeros(n, dtype=np.int8), np.arange(n, dtype=float), np.zeros(n, dtype=bool), p)
    t2 = assign_tiers(t, -np.arange(n, dtype=float), np.zeros(n, dtype=bool), p)  # scores reversed
    assert (t2[t == T1] == T1).all()


def test_global_promotes_when_scores_change():
    p = TierPolicy(hbm_ratio=0.5, evict_ratio=0.0, sink_tokens=0, recent_window=0, protect_prompt=False)
    n = 100
    t = assign_tiers(np.zeros(n, dtype=np.int8), np.arange(n, dtype=float), np.zeros(n, dtype=bool), p)
    t2 = assign_tiers(t, -np.arange(n, dtype=float), np.zeros(n, dtype=bool), p)
    assert (t2[:50] == T0).all() and (t2[50:] == T1).all()


def test_protected_tokens_stay_in_t0():
    p = TierPolicy(hbm_ratio=0.0, evict_ratio=0.5, sink_tokens=4, recent_window=10)
    n, prompt = 200, 20
    mask = protected_mask(n, prompt, p)
    new = assign_tiers(np.zeros(n, dtype=np.int8), np.zeros(n), mask, p)
    assert (new[mask] == T0).all() and (new[~mask] != T0).all()


def test_importance_default_matches_paper_shape():
    cfg = ImportanceCfg()
    x = np.sort(draw_importance(np.random.default_rng(7), 200_000, cfg.gamma_shape, cfg.gamma_power))[::-1]
    top20 = x[: len(x) // 5].sum() / x.sum()
    bottom50 = x[len(x) // 2:].sum() / x.sum()
    assert abs(top20 - 0.565) < 0.02
    assert bottom50 < 0.10


policies = st.builds(
    TierPolicy,
    kind=st.sampled_from(["tiered", "evict_only"]),
    semantics=st.sampled_from(["global", "paper_prototype"]),
    hbm_ratio=st.sampled_from([0.0, 0.25, 0.5, 0.7]),
    evict_ratio=st.sampled_from([0.0, 0.05, 0.1, 0.3]),
    compressed_ratio=st.sampled_from([0.0, 0.1, 0.2]),
    retier_interval=st.integers(1, 40),
    sink_tokens=st.integers(0, 8),
    recent_window=st.integers(0, 50),
    protect_prompt=st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(policies, st.integers(0, 60), st.integers(1, 200), st.integers(0, 2**31))
def test_token_level_state_conserves_and_matches_count_model(policy, prompt, length, seed):
    seq = SequenceTiers(prompt, prompt + length, policy, ImportanceCfg(drift=0.3), np.random.default_rng(seed))
    expected = count_trajectory(prompt, length, policy)
    for step in range(length):
        seq.append_token()
        if policy.retier_due(step):
            seq.retier()
        counts = seq.counts()
        assert sum(counts) == prompt + step + 1  # conservation
        assert counts == tuple(expected[step])  # the count-only mirror agrees
        assert (seq.tier[: seq.n][protected_mask(seq.n, prompt, policy)] == T0).all()
