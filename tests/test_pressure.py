"""`policy.hbm_ratio: auto` (sim/tiering/pressure.py): tiering only under memory pressure."""

from __future__ import annotations

import numpy as np
import pytest

from sim.decode import capacity
from sim.decode.context import build_context
from sim.decode.simulate import simulate
from sim.inputs.lengths import draw_lengths
from sim.inputs.scenario import load_scenario
from sim.tiering.counts import protected_count
from sim.tiering.memory_trace import memory_trace
from sim.tiering.pressure import TRANSIT_INTERVALS, _largest_keep, resolve, share_keeping
from sim.tiering.tier_plan import MV_D2H_T1, MV_D2H_T2, MV_H2D_T1, MV_H2D_T2, plan_tiers
from sim.tiering.tiers import T0, T1, T2, T3, TierPolicy

from .conftest import SCENARIOS, run_cli
from .promise import assert_refused

H200_70B = SCENARIOS / "h200-70b-int4.yaml"
SHORT = ["workload.reasoning_tokens=1024", "sim.detail=fast"]


def scenario(*overrides: str, path=H200_70B):
    return load_scenario(path, ["policy.hbm_ratio=auto", *overrides])


def reserve_for_kv(path, overrides: list[str], kv_share: float) -> str:
    """A runtime-reserve override that leaves HBM for `kv_share` of the batch's full-HBM KV peak, so
    small batches feel pressure."""
    ctx = build_context(scenario(*overrides, path=path))
    full = capacity.batch_memory_trace(ctx, ctx.scenario.workload.batch_size, TierPolicy(kind="full_hbm"))
    kv_peak = float(full.kv_t0_bytes.max())
    reserve = ctx.hw.memory_bytes - (full.hbm_peak_bytes - kv_peak) + ctx.hw.runtime_reserve_bytes - kv_share * kv_peak
    return f"hardware.efficiency.runtime_reserve_bytes={reserve:.0f}"


def test_share_gives_exactly_the_kept_count():
    for n in (1, 3, 49, 1000, 12345):
        for k in range(0, n + 1, max(1, n // 97)):
            assert int(n * share_keeping(k, n)) == k
    assert int(49 * (1 / 49)) == 0  # why the middle of the interval: k / n can land under k


def test_largest_keep_is_the_edge_of_a_monotone_peak():
    peak = lambda keep: 100.0 + 3.0 * keep  # noqa: E731
    assert _largest_keep(peak, 50, 250.0) == 50  # everything fits
    assert _largest_keep(peak, 50, 160.0) == 20  # 100 + 3 * 20 = 160 <= 160 < 163
    assert _largest_keep(peak, 50, 99.0) == 0  # nothing fits


def test_no_pressure_means_no_tiering():
    """A batch that fits in HBM: the schedule keeps every token in T0, nothing crosses the link, and
    memory and throughput equal full_hbm's."""
    auto = simulate(scenario("workload.batch_size=8", *SHORT), with_max_batch=False)
    full = simulate(load_scenario(H200_70B, ["policy.kind=full_hbm", "workload.batch_size=8", *SHORT]),
                    with_max_batch=False)
    s, f = auto.summary, full.summary
    assert s.offloaded_tokens == 0 and s.evicted_tokens == 0 and s.host_peak_bytes == 0
    assert s.hbm_peak_bytes == f.hbm_peak_bytes
    assert s.throughput_tok_per_s == pytest.approx(f.throughput_tok_per_s, rel=1e-9)


def test_pressure_fills_hbm_and_never_more():
    """Under pressure the T0 share falls as the sequences grow; the count-level trace stays within HBM,
    and at each re-tier that moved tokens, one more T0 token per sequence would not have fitted."""
    sc = scenario("workload.batch_size=96", "workload.reasoning_tokens=4096")
    ctx = build_context(sc)
    lengths = draw_lengths(sc.workload, 96)
    pol = resolve(ctx, lengths)
    sched = np.array(pol.hbm_schedule)
    assert len(sched) == 4096 // sc.policy.retier_interval
    assert sched[0] == 1.0 and sched[-1] < 0.9  # tiering starts only once HBM runs short
    assert np.all(np.diff(sched) <= 1e-12)  # equal lengths: pressure only grows
    trace = capacity.batch_memory_trace(ctx, 96)
    assert capacity.fits(trace, ctx)[0]
    assert trace.hbm_peak_bytes > 0.98 * ctx.hw.memory_bytes  # it uses the HBM it has
    # one more token per sequence at the first pressured re-tier breaks the window's budget
    first = int(np.flatnonzero(sched < 1.0)[0])
    s = (first + 1) * sc.policy.retier_interval - 1
    n = sc.workload.prompt_tokens + s + 1
    unprot = n - protected_count(n, sc.workload.prompt_tokens, pol)
    keep = int(unprot * sched[first])
    raised = list(sched)
    raised[first] = share_keeping(keep + 1, unprot)
    bumped = memory_trace  # the same HBM sum, over the raised schedule's counts
    from dataclasses import replace

    c = capacity.batch_counts(ctx, 96, replace(pol, hbm_schedule=tuple(raised)))
    window = slice(s + 1, s + sc.policy.retier_interval + 1)
    t = bumped(ctx, c.attended[window, T0], c.attended[window, T1], c.attended[window, T2], c.active[window])
    room = 96 * TRANSIT_INTERVALS * sc.policy.retier_interval * ctx.kv_bytes_per_token
    assert t.hbm_bytes[-1] + room > ctx.hw.memory_bytes


def test_conservation_and_shares_of_what_leaves_t0():
    """Every token is in exactly one tier; what leaves T0 splits by evict_ratio and compressed_ratio."""
    sc = scenario("workload.batch_size=96", "workload.reasoning_tokens=4096")
    ctx = build_context(sc)
    c = capacity.batch_counts(ctx, 96)
    per_step = sc.workload.prompt_tokens + np.arange(1, 4097)
    np.testing.assert_array_equal(c.tiers_after.sum(axis=1), 96 * per_step)
    last = c.tiers_after[-1] / 96
    out = last[T1] + last[T2] + last[T3]
    assert out > 0
    assert last[T3] / out == pytest.approx(sc.policy.evict_ratio, abs=0.01)
    assert last[T2] / out == pytest.approx(sc.policy.compressed_ratio, abs=0.01)


def test_pressure_falls_as_sequences_finish():
    """Unequal lengths: once the long tail is alone, the share rises and T1/T2 tokens come back."""
    over = ["workload.batch_size=48", "workload.reasoning_tokens={dist: uniform, min: 200, max: 1500}"]
    sc = scenario(*over, reserve_for_kv(H200_70B, ["policy.hbm_ratio=auto", *over], 0.5))
    ctx = build_context(sc)
    pol = resolve(ctx, draw_lengths(sc.workload, 48))
    sched = np.array(pol.hbm_schedule)
    assert sched.min() < 1.0 and sched[-1] > sched.min()
    plan = plan_tiers(ctx)
    back = plan.retier_moves[:, MV_H2D_T1] + plan.retier_moves[:, MV_H2D_T2]
    low = int(np.argmin(sched))
    assert back[(low + 1) * sc.policy.retier_interval:].sum() > 0


PLANS = [  # (scenario, overrides, HBM left for this share of the full-HBM KV peak; None: the GPU's own)
    (H200_70B, ["workload.batch_size=96", "workload.reasoning_tokens=4096"], None),
    (H200_70B, ["workload.batch_size=140"], None),
    (H200_70B, ["workload.batch_size=16", "workload.reasoning_tokens=2048", "policy.importance.drift=0.3"], 0.4),
    (H200_70B, ["workload.batch_size=16", "workload.reasoning_tokens=2048", "policy.retier_interval=16"], 0.4),
    (H200_70B, ["workload.batch_size=16", "workload.reasoning_tokens=2048", "policy.scoring=recent"], 0.4),
    (H200_70B, ["workload.batch_size=24", "workload.reasoning_tokens={dist: lognormal, mean: 1500, std: 600}"], 0.7),
    (SCENARIOS / "h200-7b-batch.yaml", ["workload.batch_size=64", "workload.reasoning_tokens=2048"], 0.4),
]


@pytest.mark.parametrize("path,over,kv_share", PLANS, ids=[f"{p.stem}-{i}" for i, (p, _, _) in enumerate(PLANS)])
def test_token_level_plan_fits_where_counts_do(path, over, kv_share):
    """The schedule comes from counts (no churn); the transit room covers the token-level plan's
    churn, so a batch the counts fit also fits token for token, and the two agree on every count."""
    if kv_share is not None:
        over = [*over, reserve_for_kv(path, over, kv_share)]
    sc = scenario(*over, path=path)
    ctx = build_context(sc)
    counts = capacity.batch_counts(ctx, sc.workload.batch_size)
    assert capacity.fits(counts.trace(ctx), ctx)[0]
    assert counts.tiers_after[:, T1].max() > 0  # under pressure
    plan = plan_tiers(ctx)
    np.testing.assert_array_equal(plan.tiers_after, counts.tiers_after)
    att = plan.attended
    mem = memory_trace(ctx, att[:, 0], att[:, 1], att[:, 2], att[:, 3], plan.tiers_after,
                                plan.retier_moves[:, [MV_D2H_T1, MV_D2H_T2]])
    assert capacity.fits(mem, ctx)[0], (mem.hbm_peak_bytes - ctx.hw.memory_bytes) / 1e9


def test_auto_fits_more_than_full_hbm_and_evict_only():
    sc = scenario("workload.reasoning_tokens=2048")
    ctx = build_context(sc)
    base = capacity.baseline_max_batches(ctx)
    auto = capacity.max_batch(ctx)
    assert auto > base["full_hbm"] and auto >= base["evict_only"]
    assert capacity.fits(capacity.batch_memory_trace(ctx, auto), ctx)[0]
    assert not capacity.fits(capacity.batch_memory_trace(ctx, auto + 1), ctx)[0]


def test_levels_agree_under_pressure():
    over = ["workload.batch_size=16", "workload.reasoning_tokens=1024"]
    over.append(reserve_for_kv(H200_70B, over, 0.6))
    res = {d: simulate(scenario(*over, f"sim.detail={d}"), with_max_batch=False).summary for d in ("layer", "fast")}
    assert res["layer"].offloaded_tokens > 0
    for key in ("throughput_tok_per_s", "tpot_p50_s", "tpot_p99_s", "hbm_peak_bytes"):
        assert getattr(res["fast"], key) == pytest.approx(getattr(res["layer"], key), rel=0.01), key


@pytest.mark.parametrize("override,expected", [
    ("policy.hbm_ratio=automatic", "policy.hbm_ratio: expected a number from 0 to 1 or 'auto', got 'automatic'"),
    ("policy.hbm_ratio=1.5", "policy.hbm_ratio: expected a number from 0 to 1 or 'auto', got 1.5"),
])
def test_bad_ratio_is_one_line(tmp_path, override, expected):
    assert_refused(run_cli("run", str(H200_70B), "--set", override, "--out", str(tmp_path / "o")), expected)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("overrides,expected", [
    (["policy.semantics=paper_prototype"], "hbm_ratio 'auto' runs with semantics 'global'"),
    (["policy.evict_ratio=0.6", "policy.compressed_ratio=0.5"], "evict_ratio + compressed_ratio are shares"),
])
def test_auto_refusals(tmp_path, overrides, expected):
    args = ["--set", "policy.hbm_ratio=auto"]
    for o in overrides:
        args += ["--set", o]
    assert_refused(run_cli("run", str(H200_70B), *args, "--out", str(tmp_path / "o")), str(H200_70B.name), expected)


def test_batched_plan_equals_per_sequence_plan_under_pressure():
    """The batched tier evolution and hwprobe's per-sequence replay apply the same schedule, token for token."""
    from .test_batch_tiers import reference_plan

    over = ["workload.batch_size=6", "workload.reasoning_tokens={dist: uniform, min: 200, max: 900}",
            "policy.compressed_ratio=0.3", "policy.importance.drift=0.2"]
    over.append(reserve_for_kv(H200_70B, ["policy.hbm_ratio=auto", *over], 0.7))
    ctx = build_context(scenario(*over))
    plan = plan_tiers(ctx)
    attend, after, moves = reference_plan(ctx)
    np.testing.assert_array_equal(plan.attended, attend)
    np.testing.assert_array_equal(plan.tiers_after, after)
    np.testing.assert_array_equal(plan.retier_moves, moves)
    assert moves[:, MV_D2H_T2].any() and moves[:, MV_H2D_T1].any()  # pressure rose, then fell
