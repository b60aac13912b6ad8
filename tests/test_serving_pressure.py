"""`policy.hbm_ratio: auto` in serving (sim/serving/row_counts.py): no tiering without pressure,
tiering instead of preemption under it, full_hbm's admission, the share by hand."""

from __future__ import annotations

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.serving.kv_memory import KvMemory, kv_memory
from sim.serving.row_counts import PressureRows
from sim.tiering.tiers import T1, TierPolicy

from .test_serving import load, run, serving, workload

AUTO = {"kind": "tiered", "hbm_ratio": "auto", "evict_ratio": 0.0, "retier_interval": 32, "recent_window": 32}


def pressured(kind_policy: dict, seqs: int = 40) -> dict:
    """64 closed-loop clients against a KV budget of ~`seqs` sequences' final length (as the
    preemption test in test_serving.py)."""
    sc = serving(workload=workload(reasoning_tokens=512, arrivals={"kind": "closed_loop", "concurrency": 64,
                                                                   "requests": 160}))
    ctx = build_context(load(sc))
    mem = kv_memory(ctx, 8192, 256)
    reserve = mem.hbm_capacity_bytes - mem.weights_bytes - mem.activation_bytes - seqs * (256 + 512) * ctx.kv_bytes_per_token
    return {**sc, "hardware": {"gpu": "h100-sxm", "efficiency": {"runtime_reserve_bytes": reserve}}, "policy": kind_policy}


def test_without_pressure_auto_is_full_hbm():
    auto, full = run(serving(policy=AUTO)), run(serving())
    assert auto.summary.host_peak_bytes == 0
    a, f = auto.summary.model_dump(), full.summary.model_dump()
    for key in ("duration_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p99_s", "hbm_peak_bytes",
                "preemptions", "mean_running", "output_throughput_tok_per_s"):
        assert a[key] == f[key], key
    assert auto.requests.equals(full.requests)


def test_under_pressure_auto_tiers_instead_of_preempting():
    """Where full_hbm preempts (recompute), auto moves the coldest tokens of the growing requests to
    the host: no preemption, every request completes, HBM within capacity."""
    full, auto = run(pressured({"kind": "full_hbm"})), run(pressured(AUTO))
    f, a = full.summary, auto.summary
    assert f.preemptions > 0
    assert a.preemptions == 0 and a.host_peak_bytes > 0
    assert auto.requests["finish_s"].notna().all()
    assert (auto.timeline["hbm_bytes"] <= a.hbm_capacity_bytes).all()
    # not free: the tiered tokens cross the link every step (on this 8B, where a recomputed prefill
    # is cheap, that costs more than full_hbm's preemptions; the planner weighs the two)
    assert a.h2d_utilization > 0.1 and a.duration_s > f.duration_s


def test_littles_law_under_pressure():
    res = run(pressured(AUTO))
    s, req, tl = res.summary, res.requests, res.timeline
    until = np.append(tl["t_s"].to_numpy()[1:], s.duration_s)
    L = float(np.sum((tl["running"] + tl["waiting"]).to_numpy() * (until - tl["t_s"].to_numpy())) / s.duration_s)
    assert L == pytest.approx(len(req) / s.duration_s * float(req["e2e_s"].mean()), rel=0.02)


def memory(budget_tokens: float, staging_per_token: float = 0.0) -> KvMemory:
    """A KV budget of `budget_tokens` tokens at 1 byte per token."""
    return KvMemory(hbm_capacity_bytes=budget_tokens, weights_bytes=0.0, activation_bytes=0.0,
                    runtime_reserve_bytes=0.0, host_capacity_bytes=1e12, kv_bytes_per_token=1.0,
                    t2_bytes_per_token=0.5, staging_bytes_per_token=staging_per_token)


POLICY = TierPolicy(kind="tiered", hbm_ratio=1.0, evict_ratio=0.0, compressed_ratio=0.0, retier_interval=4,
                    sink_tokens=0, recent_window=0, protect_prompt=True, auto=True)


def test_share_by_hand():
    """Two requests of prompt 10; request 0 re-tiers after decode step 3 (14 tokens, 4 unprotected),
    request 1 runs decode step 1 (12 tokens in T0). Budget 30 tokens, minus growth room of one
    interval (4) per running request: 22. Request 1 holds 12, request 0's prompt 10: 22 - 22 = 0 left
    for request 0's 4 unprotected tokens -> share 0, all four to T1. With a budget of 32: 2 of 4."""
    rows, gen, dec = np.array([0, 1]), np.array([4, 2]), np.array([True, True])
    for budget, share, kept in ((30, 0.0, 0), (32, 0.5, 2), (100, 1.0, 4)):
        pr = PressureRows(POLICY, memory(budget), np.array([10, 10]))
        pr.begin_step(rows, gen, dec)
        assert pr.share == pytest.approx(share)
        att, aft = pr.step_counts(rows, gen, dec)
        assert att[0].tolist() == [14, 0, 0, 0] and att[1].tolist() == [12, 0, 0, 0]
        assert aft[0].tolist() == [10 + kept, 4 - kept, 0, 0] and aft[1].tolist() == att[1].tolist()
        pr.commit(rows, gen - 1, aft)
        assert pr.held(0, 5).tolist() == aft[0].tolist()  # between steps: what the re-tier left


def test_tokens_come_back_when_pressure_falls():
    pr = PressureRows(POLICY, memory(30), np.array([10, 10]))
    rows, dec = np.array([0, 1]), np.array([True, True])
    pr.begin_step(rows, np.array([4, 2]), dec)
    att, aft = pr.step_counts(rows, np.array([4, 2]), dec)
    pr.commit(rows, np.array([3, 1]), aft)
    assert aft[0, T1] == 4
    # request 1 has finished: request 0 alone re-tiers after step 7 with room for all its tokens
    one = np.array([0])
    pr.begin_step(one, np.array([8]), np.array([True]))
    att, aft = pr.step_counts(one, np.array([8]), np.array([True]))
    assert att[0].tolist() == [14, 4, 0, 0] and aft[0].tolist() == [18, 0, 0, 0]
    to_host, back = pr.retier_moves(att, aft)
    assert to_host.tolist() == [0, 0] and back.tolist() == [4, 0]
    assert pr.admission_bytes(att, np.zeros(1)).tolist() == [18.0]  # admission counts every token as T0
