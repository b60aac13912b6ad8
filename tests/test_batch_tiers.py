"""The batched tier evolution (`sim.tiering.batch_tiers`, used by `plan_tiers`) against the per-sequence one
(`sim.tiering.sequence.SequenceTiers`, which hwprobe replays): the same tiers, token for token, for both
semantics, both scorings, drift, unequal lengths, and ties at the cuts."""

from __future__ import annotations

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.inputs.scenario import load_scenario
from sim.tiering.batch_tiers import BatchTiers, bottom_k_masks, rank_buckets
from sim.tiering.pressure import resolve
from sim.tiering.tier_plan import ACTIVE, ATT_T0, ATT_T1, ATT_T2, plan_tiers, sequence_tiers
from sim.tiering.tiers import T0, T1, T2, T3, TierPolicy

from .conftest import SCENARIOS


def reference_plan(ctx):
    """The plan built one sequence at a time with SequenceTiers (the pre-batching algorithm)."""
    from sim.inputs.lengths import draw_lengths

    w = ctx.scenario.workload
    lengths = draw_lengths(w, w.batch_size)
    seqs = sequence_tiers(ctx.scenario, resolve(ctx, lengths), lengths)  # hbm_ratio auto: this batch's shares
    steps = int(lengths.max())
    attend, after, moves = np.zeros((steps, 4), np.int64), np.zeros((steps, 4), np.int64), np.zeros((steps, 5), np.int64)
    counts = np.zeros((len(lengths), 4), np.int64)
    counts[:, T0] = w.prompt_tokens
    for step in range(steps):
        active = np.flatnonzero(lengths > step)
        counts[active, T0] += 1
        a = counts[active]
        attend[step] = (a[:, T0].sum(), a[:, T1].sum(), a[:, T2].sum(), len(active))
        if ctx.policy.retier_due(step):
            for i in active:
                seqs[i].advance(step + 1 - seqs[i].steps_done)
                mv = seqs[i].retier()
                counts[i] = seqs[i].counts()
                moves[step] += (mv.to_t1_from_t0, mv.to_t2_from_t0, mv.to_t0_from_t1, mv.to_t0_from_t2, mv.evicted)
        after[step] = counts[active].sum(axis=0)
    return attend, after, moves


CASES = [
    ("h200-70b-int4.yaml", ["workload.batch_size=6", "workload.reasoning_tokens=600"]),
    ("h200-70b-int4.yaml", ["workload.batch_size=6", "workload.reasoning_tokens=600", "policy.semantics=paper_prototype"]),
    ("h200-70b-int4.yaml", ["workload.batch_size=5", "workload.reasoning_tokens=500", "policy.importance.drift=0.3",
                            "policy.scoring=recent"]),
    ("h200-70b-int4.yaml", ["workload.batch_size=7", "workload.reasoning_tokens={dist: uniform, min: 10, max: 700}",
                            "policy.retier_interval=7", "policy.recent_window=0", "policy.sink_tokens=0",
                            "policy.protect_prompt=false", "policy.importance.drift=0.1"]),
    ("h200-70b-int4.yaml", ["workload.batch_size=5", "workload.reasoning_tokens={dist: lognormal, mean: 300, std: 200}",
                            "policy.semantics=paper_prototype", "policy.retier_interval=3", "policy.evict_ratio=0.6",
                            "policy.hbm_ratio=0.4", "policy.compressed_ratio=0.0"]),
    ("paper-rtx5080-7b.yaml", ["workload.reasoning_tokens=400"]),
    ("h200-7b-batch.yaml", ["workload.batch_size=4", "workload.reasoning_tokens=500", "policy.kind=evict_only"]),
    ("cpu-tiny.yaml", []),
]


@pytest.mark.parametrize("name,overrides", CASES)
def test_batched_plan_equals_per_sequence_plan(name, overrides):
    ctx = build_context(load_scenario(SCENARIOS / name, overrides))
    plan = plan_tiers(ctx)
    attend, after, moves = reference_plan(ctx)
    assert np.array_equal(plan.attended, attend)
    assert np.array_equal(plan.tiers_after, after)
    assert np.array_equal(plan.retier_moves, moves)
    assert plan.retier_moves.any() or ctx.policy.kind == "full_hbm"  # the cases do move tokens


def test_tokens_are_conserved_across_tiers():
    ctx = build_context(load_scenario(SCENARIOS / "h200-70b-int4.yaml", ["workload.batch_size=4", "workload.reasoning_tokens=300"]))
    plan = plan_tiers(ctx)
    w = ctx.scenario.workload
    steps = np.arange(plan.steps)
    assert np.array_equal(plan.tiers_after.sum(axis=1), plan.attended[:, ACTIVE] * (w.prompt_tokens + steps + 1))
    evicted_before = np.r_[0, plan.tiers_after[:-1, T3]]  # equal lengths: every sequence runs every step
    assert np.array_equal(plan.attended[:, [ATT_T0, ATT_T1, ATT_T2]].sum(axis=1) + evicted_before,
                          plan.tiers_after.sum(axis=1))
    assert plan.tiers_after[-1, T3] > 0 and plan.tiers_after[-1, T1] > 0


def test_ties_at_a_cut_go_to_the_lower_position():
    key = np.array([[3.0, 1.0, 2.0, 1.0, 1.0, np.inf]])
    masks = bottom_k_masks(key, [np.array([2]), np.array([4])])
    assert masks[0].tolist() == [[False, True, False, True, False, False]]  # the first two of the three 1.0s
    assert masks[1].tolist() == [[False, True, True, True, True, False]]
    assert rank_buckets(key, [np.array([2]), np.array([4])]).tolist() == [[0, 2, 1, 2, 1, 0]]


def test_rank_buckets_match_a_stable_sort():
    rng = np.random.default_rng(3)
    key = rng.integers(0, 6, size=(5, 40)).astype(float)  # many ties
    ks = [np.array([3, 0, 5, 7, 1]), np.array([9, 4, 5, 20, 1]), np.array([30, 40, 25, 20, 2])]
    order = np.argsort(key, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(40)[None, :].repeat(5, 0), axis=1)
    expected = sum((rank < k[:, None]).astype(int) for k in ks)
    assert np.array_equal(rank_buckets(key, ks), expected)


def test_rows_are_kept_longest_first_and_finish_as_a_prefix():
    policy = TierPolicy(kind="tiered", hbm_ratio=0.5, evict_ratio=0.1, retier_interval=4)
    rngs = [np.random.default_rng(i) for i in range(3)]
    from sim.inputs.scenario import ImportanceCfg

    b = BatchTiers(8, np.array([5, 12, 9]), policy, ImportanceCfg(), rngs)
    assert b.lengths.tolist() == [12, 9, 5] and b.unfinished(6) == 2 and b.unfinished(10) == 1
    trans = b.retier(8)
    assert trans.shape == (2, 4, 4) and trans.sum() == 2 * (8 + 8)
