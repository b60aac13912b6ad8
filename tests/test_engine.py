"""The simulator end to end: conservation, capacity, determinism, prefetch-mode ordering."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.decode.capacity import batch_memory_trace, fits, max_batch
from sim.decode.context import build_context
from sim.decode.projection import project
from sim.decode.simulate import simulate
from sim.inputs.scenario import load_scenario, scenario_from_dict
from sim.outputs.run_folder import to_json

from .conftest import SCENARIOS


def scen(d, *overrides):
    return scenario_from_dict(d, "test", list(overrides))


def test_deterministic_same_seed(small_scenario_dict):
    a = simulate(scen(small_scenario_dict))
    b = simulate(scen(small_scenario_dict))
    drop = ("versions",)
    assert to_json(a.summary.model_dump(exclude=set(drop))) == to_json(b.summary.model_dump(exclude=set(drop)))
    assert a.steps.equals(b.steps)


def test_seed_changes_which_tokens_move_not_how_many(small_scenario_dict):
    d = dict(small_scenario_dict, policy={**small_scenario_dict["policy"], "importance": {"drift": 0.5}})
    a = simulate(scen(d, "workload.seed=1")).steps
    b = simulate(scen(d, "workload.seed=2")).steps
    cols = ["tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3"]
    assert a[cols].equals(b[cols])  # tier sizes follow from the ratios
    assert not a["h2d_bytes"].equals(b["h2d_bytes"])  # churn depends on the drawn importance


def test_token_conservation_every_step(small_scenario_dict):
    r = simulate(scen(small_scenario_dict, "policy.compressed_ratio=0.2"))
    s = r.steps
    total = s[["tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3"]].sum(axis=1)
    assert (total == 2 * (64 + s["step"] + 1)).all()
    assert s["tokens_t2"].max() > 0 and s["tokens_t3"].max() > 0 and s["tokens_t1"].max() > 0


def test_conservation_with_length_distribution(small_scenario_dict):
    d = dict(small_scenario_dict, workload={"batch_size": 5, "prompt_tokens": 10, "seed": 4,
                                            "reasoning_tokens": {"dist": "uniform", "min": 50, "max": 200}})
    r = simulate(scen(d))
    lengths = np.array(r.summary.generated_tokens)
    s = r.steps
    assert int(s["batch_active"].iloc[0]) == 5 and int(s["batch_active"].iloc[-1]) >= 1
    assert r.summary.generated_tokens == int(s["batch_active"].sum())
    tot = s[["tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3"]].sum(axis=1)
    assert (tot == s["batch_active"] * (10 + s["step"] + 1)).all()
    assert lengths > 0


def test_full_hbm_keeps_everything_in_t0(small_scenario_dict):
    r = simulate(scen(small_scenario_dict, "policy.kind=full_hbm"))
    assert r.steps["tokens_t0"].iloc[-1] == 2 * (64 + 300)
    assert r.summary.h2d_bytes == 0 and r.summary.hbm_saved_bytes == 0
    assert r.summary.stall_share == 0


def test_hbm_saved_is_full_minus_policy_peak(small_scenario_dict):
    full = simulate(scen(small_scenario_dict, "policy.kind=full_hbm")).summary
    tiered = simulate(scen(small_scenario_dict)).summary
    assert tiered.hbm_saved_bytes == pytest.approx(full.hbm_peak_bytes - tiered.hbm_peak_bytes)
    assert tiered.hbm_saved_bytes > 0


def test_a_retiers_demoted_tokens_are_held_on_the_device_until_they_land(small_scenario_dict):
    """The offload gathers the demoted K/V on the device while their T0 slots are still held: at
    a re-tier step HBM holds both, hand arithmetic on the plan's moves."""
    sc = scen(small_scenario_dict, "policy.compressed_ratio=0.2", "policy.protect_prompt=false")
    r = simulate(sc)
    ctx = build_context(sc, None)
    from sim.tiering.tier_plan import MV_D2H_T1, MV_D2H_T2, plan_tiers

    moves = plan_tiers(ctx).retier_moves
    transit = moves[:, MV_D2H_T1] * ctx.kv_bytes_per_token + moves[:, MV_D2H_T2] * ctx.t2_bytes_per_token
    no_transit = simulate(scen(small_scenario_dict, "policy.compressed_ratio=0.2", "policy.protect_prompt=false",
                               "policy.retier_interval=100000")).steps  # same steps before any re-tier
    first = int(np.flatnonzero(transit)[0])
    assert r.steps["hbm_bytes"].iloc[first] - no_transit["hbm_bytes"].iloc[first] == pytest.approx(transit[first])
    assert r.summary.offload_in_flight_peak_bytes == pytest.approx(transit.max()) and transit.max() > 0
    assert r.summary.hbm_peak_bytes >= no_transit["hbm_bytes"].iloc[first] + transit[first]


def test_host_peak_counts_the_last_retiers_offload(small_scenario_dict):
    """The host holds what a re-tier demotes even when no later step reads it: 320 steps end on a
    re-tier (interval 32), so the peak is the state after it, not the last forward's."""
    r = simulate(scen(small_scenario_dict, "workload.reasoning_tokens=320", "policy.compressed_ratio=0.2"))
    ctx = build_context(r.scenario, None)
    last = r.steps.iloc[-1]
    after_bytes = last["tokens_t1"] * ctx.kv_bytes_per_token + last["tokens_t2"] * ctx.t2_bytes_per_token
    assert r.summary.host_peak_bytes == pytest.approx(after_bytes)
    assert r.summary.host_peak_bytes > r.steps["host_bytes"].iloc[-2]


def _decode_bounds(d, *overrides):
    r = simulate(scen(d, *overrides))
    return r.summary.decode_s, float(r.steps["compute_s"].sum())


@pytest.mark.parametrize("detail", ["step", "layer"])
def test_layerwise_between_compute_bound_and_sync(small_scenario_dict, detail):
    d = dict(small_scenario_dict, workload={**small_scenario_dict["workload"], "batch_size": 8, "reasoning_tokens": 600})
    lw, lw_compute = _decode_bounds(d, f"sim.detail={detail}", "policy.pinned=true")
    sync, _ = _decode_bounds(d, f"sim.detail={detail}", "policy.prefetch=sync_per_step", "policy.pinned=true")
    assert lw >= lw_compute  # never faster than its own compute
    assert lw < sync  # overlapping copies beats waiting for all of them


def test_layer_and_step_detail_agree(small_scenario_dict):
    a = simulate(scen(small_scenario_dict, "sim.detail=layer")).summary
    b = simulate(scen(small_scenario_dict, "sim.detail=step")).summary
    assert a.decode_s == pytest.approx(b.decode_s, rel=0.02)
    assert a.h2d_bytes == b.h2d_bytes


def test_step_stride_approximates_full_run(small_scenario_dict):
    a = simulate(scen(small_scenario_dict)).summary
    b = simulate(scen(small_scenario_dict, "sim.step_stride=8")).summary
    assert b.decode_s == pytest.approx(a.decode_s, rel=0.03)


def test_does_not_fit_is_a_result():
    sc = load_scenario(SCENARIOS / "h200-70b-int4.yaml", ["workload.batch_size=512", "policy.kind=full_hbm"])
    r = simulate(sc, with_max_batch=False)
    assert r.summary.fits is False
    assert r.summary.hbm_shortfall_bytes == pytest.approx(r.summary.hbm_peak_bytes - 143771 * 2**20)  # what an H200 reports (gpus.yaml)
    assert r.summary.throughput_tok_per_s is None


def test_max_batch_is_the_edge():
    sc = load_scenario(SCENARIOS / "h200-70b-int4.yaml", ["workload.reasoning_tokens=2048"])
    ctx = build_context(sc)
    mb = max_batch(ctx)
    assert fits(batch_memory_trace(ctx, mb), ctx)[0]
    assert not fits(batch_memory_trace(ctx, mb + 1), ctx)[0]
    full_ctx = build_context(load_scenario(SCENARIOS / "h200-70b-int4.yaml", ["workload.reasoning_tokens=2048", "policy.kind=full_hbm"]))
    assert max_batch(full_ctx) < mb  # tiering fits more sequences


def test_sync_per_step_copies_every_t1_token_every_step(small_scenario_dict):
    r = simulate(scen(small_scenario_dict, "policy.prefetch=sync_per_step", "policy.semantics=paper_prototype"))
    s = r.steps
    kv_layer = 2 * 4 * 128 * 2
    # prefetch bytes of step k = tokens in T1 after step k-1 x all layers (no T2 here)
    prefetch = s["h2d_bytes"].iloc[1:].to_numpy()
    expected = s["tokens_t1"].iloc[:-1].to_numpy() * kv_layer * 28
    retier = s["d2h_bytes"].iloc[1:].to_numpy() > 0
    assert np.allclose(prefetch[~retier], expected[~retier])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model=st.sampled_from(["deepseek-r1-distill-qwen-7b", "llama-3.1-8b", "qwen3-32b"]),
    gpu=st.sampled_from(["rtx-4090", "l40s", "h100-sxm"]),
    batch=st.integers(1, 64),
    length=st.integers(20, 400),
    kind=st.sampled_from(["full_hbm", "evict_only", "tiered"]),
    semantics=st.sampled_from(["global", "paper_prototype"]),
    hbm=st.sampled_from([0.2, 0.5, 0.8]),
    prefetch=st.sampled_from(["layerwise_async", "sync_per_step", "per_interval"]),
)
def test_random_scenarios_conserve_tokens_and_respect_capacity(model, gpu, batch, length, kind, semantics, hbm, prefetch):
    d = {"model": {"name": model, "weight_dtype": "int4"}, "hardware": {"gpu": gpu},
         "workload": {"batch_size": batch, "prompt_tokens": 32, "reasoning_tokens": length},
         "policy": {"kind": kind, "semantics": semantics, "hbm_ratio": hbm, "evict_ratio": 0.1,
                    "retier_interval": 16, "recent_window": 16, "prefetch": prefetch},
         "sim": {"detail": "step"}}
    r = simulate(scen(d), with_max_batch=False)
    s = r.steps
    tot = s[["tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3"]].sum(axis=1)
    assert (tot == batch * (32 + s["step"] + 1)).all()
    if r.summary.fits:
        assert (s["hbm_bytes"] <= r.summary.hbm_capacity_bytes).all()
        assert r.summary.decode_s >= s["compute_s"].sum() - 1e-9
    else:
        assert s["hbm_bytes"].max() > r.summary.hbm_capacity_bytes or s["host_bytes"].max() > r.summary.host_capacity_bytes


@pytest.mark.parametrize("name", ["paper-rtx5080-7b", "h200-7b-batch", "h200-70b-int4"])
def test_projection_tracks_full_simulation(name):
    # step detail: the closed-form pipeline (test_layer_and_step_detail_agree ties it to the SimPy layer events)
    sc = load_scenario(SCENARIOS / f"{name}.yaml", ["sim.step_stride=4", "sim.detail=step"])
    full = simulate(sc).summary
    fast = project(sc)
    # the projection's re-tier transient counts net demotions (no churn): within a percent
    assert fast.hbm_peak_bytes == pytest.approx(full.hbm_peak_bytes, rel=0.01)
    assert fast.hbm_peak_bytes <= full.hbm_peak_bytes
    assert fast.max_batch == full.max_batch
    assert fast.throughput_tok_per_s == pytest.approx(full.throughput_tok_per_s, rel=0.06)


def test_paper_scenario_reproduces_paper_full_cache_rate():
    sc = load_scenario(SCENARIOS / "paper-rtx5080-7b.yaml", ["policy.kind=full_hbm"])
    s = simulate(sc).summary
    assert s.throughput_tok_per_s == pytest.approx(21.8, rel=0.02)  # the efficiency was set from it


def test_summary_json_is_plain_json(small_scenario_dict):
    r = simulate(scen(small_scenario_dict))
    data = json.loads(to_json(r.summary))
    assert data["resolved_scenario"]["workload"]["batch_size"] == 2


def test_record_every_thins_the_csv_not_the_summary(small_scenario_dict):
    full = simulate(scen(small_scenario_dict))
    thin = simulate(scen(small_scenario_dict, "sim.record_every=10"))
    assert list(thin.steps["step"]) == list(range(0, 300, 10)) + [299]
    assert thin.summary.throughput_tok_per_s == full.summary.throughput_tok_per_s


def test_timeline_window_shows_first_offload_and_following_prefetch():
    sc = load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["workload.reasoning_tokens=512", "workload.batch_size=4"])
    layer = simulate(sc, with_max_batch=False).timeline
    step = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["workload.reasoning_tokens=512", "workload.batch_size=4",
                                                                       "sim.detail=step"]), with_max_batch=False).timeline
    for t in (layer, step):
        kinds = t["kind"].value_counts().to_dict()
        assert kinds.get("d2h", 0) >= 1 and kinds.get("h2d", 0) >= 28 and kinds.get("compute", 0) >= 28
        assert (t["end_s"] >= t["start_s"]).all()
    assert len(layer) == len(step)
    # the closed form and the SimPy events place every interval at the same time
    key = ["step", "kind", "what"]
    merged = layer.merge(step, on=key, suffixes=("_layer", "_step"))
    assert len(merged) == len(layer)
    assert merged["start_s_layer"].to_numpy() == pytest.approx(merged["start_s_step"].to_numpy(), rel=1e-6)


def test_max_batch_reported_for_every_policy():
    overrides = ["workload.reasoning_tokens=512", "workload.batch_size=2"]
    s = simulate(load_scenario(SCENARIOS / "h200-70b-int4.yaml", [*overrides, "sim.detail=step"])).summary
    by = s.max_batch_by_policy
    for kind in ("full_hbm", "evict_only"):
        # each policy's own max batch: the capacity search a run of that policy reports (no timing involved)
        assert by[kind] == max_batch(build_context(load_scenario(SCENARIOS / "h200-70b-int4.yaml",
                                                                 [*overrides, f"policy.kind={kind}"])))
    assert s.max_batch == max_batch(build_context(load_scenario(SCENARIOS / "h200-70b-int4.yaml", overrides)))
    assert by["full_hbm"] <= by["evict_only"] <= s.max_batch
