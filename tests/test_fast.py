"""The fast level of detail (`sim.detail: fast`, sim/decode/fast.py) against the SimPy layer level, the
reference: every shipped closed-batch scenario and a seeded sample of sweep points agree within 1% on
throughput, TPOT p50/p99 and peak HBM; step costs equal `physics.decode_step_cost`; the plan's
counts are the token-level plan's; steps next to re-tiers contend as the layer level's do. Host
access (sim/decode/fast_host.py) follows the layer level step for step where the plan is exact."""

from __future__ import annotations

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.decode.fast import fast_plan
from sim.decode.fast_arrays import step_arrays
from sim.decode.fast_host import host_step_arrays
from sim.decode.simulate import simulate
from sim.device.physics import attention_s, attention_s_array, decode_step_cost
from sim.inputs.reader import read_yaml
from sim.inputs.scenario import load_scenario
from sim.tiering.tier_plan import ACTIVE, ATT_T0, ATT_T1, ATT_T2, plan_tiers

from .conftest import SCENARIOS

AGREEMENT = 0.01  # the bar: fast within 1% of the layer level
METRICS = ("throughput_tok_per_s", "tpot_p50_s", "tpot_p99_s", "hbm_peak_bytes")


def _closed_batch_scenarios() -> list[str]:
    out = []
    for path in sorted(SCENARIOS.glob("*.yaml")):
        data = read_yaml(path)
        if not (data.get("workload") or {}).get("arrivals"):
            out.append(path.name)
    return out


def _disagreement(path, overrides: list[str]) -> dict[str, float]:
    runs = {d: simulate(load_scenario(path, overrides + [f"sim.detail={d}"]), with_max_batch=False).summary
            for d in ("fast", "layer")}
    assert runs["layer"].fits == runs["fast"].fits
    if not runs["layer"].fits:
        return {}
    return {k: getattr(runs["fast"], k) / getattr(runs["layer"], k) - 1 for k in METRICS}


@pytest.mark.parametrize("name", _closed_batch_scenarios())
def test_fast_agrees_with_layer_level_on_shipped_scenarios(name):
    gaps = _disagreement(SCENARIOS / name, [])
    assert gaps, f"{name} does not fit: nothing to compare"
    assert all(abs(g) <= AGREEMENT for g in gaps.values()), f"{name}: fast vs layer {gaps}"


def _sweep_point(rng: np.random.Generator) -> list[str]:
    hbm = float(rng.choice([0.25, 0.5, 0.75]))
    return [
        f"hardware.gpu={rng.choice(['h100-sxm', 'h200-sxm', 'l40s', 'rtx-4090', 'rtx-5080', 'a100-80gb-sxm'])}",
        f"model.name={rng.choice(['deepseek-r1-distill-qwen-7b', 'llama-3.1-8b'])}",
        f"model.weight_dtype={rng.choice(['bf16', 'int4'])}",
        f"workload.batch_size={int(rng.choice([1, 3, 8, 16]))}",
        (f"workload.reasoning_tokens={int(rng.choice([300, 900]))}" if rng.random() < 0.7
         else "workload.reasoning_tokens={dist: uniform, min: 100, max: 900}"),
        f"policy.kind={rng.choice(['tiered', 'tiered', 'evict_only', 'full_hbm'])}",
        f"policy.hbm_ratio={hbm}", f"policy.compressed_ratio={0.2 if hbm < 0.7 and rng.random() < 0.5 else 0.0}",
        f"policy.prefetch={rng.choice(['layerwise_async', 'layerwise_async', 'sync_per_step', 'per_interval'])}",
        f"policy.pinned={rng.choice(['true', 'true', 'false'])}",
        f"policy.semantics={rng.choice(['global', 'paper_prototype'])}",
        f"policy.retier_interval={int(rng.choice([16, 64]))}", f"policy.staging_buffers={int(rng.choice([1, 2, 3]))}",
        f"hardware.copy_engines={int(rng.choice([1, 2]))}",
    ]


def test_fast_agrees_with_layer_level_on_sampled_sweep_points():
    rng = np.random.default_rng(2026)
    compared = 0
    for _ in range(10):
        point = _sweep_point(rng)
        gaps = _disagreement(SCENARIOS / "h200-7b-batch.yaml", point)
        compared += bool(gaps)
        assert all(abs(g) <= AGREEMENT for g in gaps.values()), f"{' '.join(point)}: fast vs layer {gaps}"
    assert compared >= 6  # most sampled points fit


def test_steps_after_a_retier_contend_as_at_layer_level():
    """Big offloads (a short re-tier interval, pageable and pinned, one and two copy engines): the
    fast level's per-step times follow the layer level's step for step, not on average."""
    step_level_differs = []
    for overrides in (["hardware.copy_engines=1"], ["hardware.copy_engines=2"], ["policy.pinned=false"]):
        base = ["workload.batch_size=4", "workload.reasoning_tokens=400", "policy.retier_interval=8"] + overrides
        steps = {d: simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", base + [f"sim.detail={d}"]),
                             with_max_batch=False).steps["step_s"].to_numpy() for d in ("fast", "layer", "step")}
        assert np.allclose(steps["fast"], steps["layer"], rtol=1e-9, atol=0), overrides
        step_level_differs.append(not np.allclose(steps["step"], steps["layer"], rtol=1e-6, atol=0))
    assert any(step_level_differs)  # the cases do contend: the step level's once-per-step view misses it


def test_step_arrays_equal_the_physics_step_cost():
    for name, overrides in (("h200-70b-int4.yaml", ["workload.batch_size=3", "workload.reasoning_tokens=300"]),
                            ("paper-rtx5080-7b.yaml", ["workload.reasoning_tokens=200"])):
        ctx = build_context(load_scenario(SCENARIOS / name, overrides))
        plan = plan_tiers(ctx)
        a = step_arrays(ctx, plan.attended)
        m, p = ctx.scenario.model, ctx.scenario.policy
        for s in range(0, plan.steps, 37):
            row = plan.attended[s]
            c = decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, p.prefetch, int(row[ACTIVE]),
                                 int(row[ATT_T0]), int(row[ATT_T1]), int(row[ATT_T2]), ctx.kv_bytes_per_token_layer,
                                 ctx.t2_bytes_per_token_layer, ctx.policy.tiering and p.prefetch != "per_interval")
            assert (a.pre_s[s], a.post_s[s], a.tail_s[s], a.compute_s[s]) == (
                c.layer.pre_attention_s, c.layer.post_attention_s, c.tail_s, c.compute_s)
            assert (a.prefetch_bytes[s], a.prefetch_copies[s], a.pack_s[s]) == (
                c.prefetch_bytes_per_layer, c.prefetch_copies_per_layer, c.pack_s_per_layer)


def test_attention_array_equals_scalar():
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml"))
    flop = np.array([0.0, 1e6, 3.3e12])
    kv = np.array([0.0, 5e9, 1e3])
    assert attention_s_array(flop, kv, ctx.hw).tolist() == [attention_s(f, b, ctx.hw) for f, b in zip(flop, kv)]


def test_fast_plan_counts_are_the_token_plans_and_churn_is_sampled():
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["workload.batch_size=16",
                                                                          "workload.reasoning_tokens=600"]))
    fast, full = fast_plan(ctx), plan_tiers(ctx)
    assert np.array_equal(fast.attended, full.attended) and np.array_equal(fast.tiers_after, full.tiers_after)
    first = np.flatnonzero(full.retier_due)[0]
    assert np.array_equal(fast.retier_moves[first], full.retier_moves[first])  # every sequence demotes alike
    churn_fast, churn_full = fast.retier_moves[:, 2:4].sum(), full.retier_moves[:, 2:4].sum()
    assert churn_full > 0 and abs(churn_fast / churn_full - 1) < 0.25  # 4 of 16 sequences stand for the batch


def test_fast_plan_is_the_token_plan_when_the_batch_fits_its_rows():
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [
        "workload.batch_size=4", "workload.reasoning_tokens={dist: uniform, min: 50, max: 500}"]))
    fast, full = fast_plan(ctx), plan_tiers(ctx)
    for f in ("attended", "tiers_after", "retier_moves", "retier_due", "lengths"):
        assert np.array_equal(getattr(fast, f), getattr(full, f)), f


# host access: cases that reach each branch of the closed form and of the windows next to re-tiers
# (policy.protect_prompt=false and a quarter in HBM: much of a long prompt lands in T1)
HOST_BASE = ["workload.reasoning_tokens=100", "policy.hbm_ratio=0.25", "policy.protect_prompt=false",
             "policy.retier_interval=16"]
HOST_CASES = {
    # split attends 3/4 on the host; its prefetch copies (55 GB/s) slow the stream, not the other way
    "70b-split-server": ("h200-70b-int4.yaml", ["workload.batch_size=8", "workload.prompt_tokens=4096",
                                                "policy.access=split"]),
    # a two-channel desktop socket: a Gen5 copy is above the fair share, copy and stream both slow down
    "7b-split-desktop": ("h200-7b-batch.yaml", ["workload.batch_size=8", "workload.prompt_tokens=2048",
                                                "policy.access=split", "hardware.host=ryzen-7950x"]),
    # two copy engines: partial outputs queue behind prefetches, queries behind offloads
    "7b-split-two-engines": ("h200-7b-batch.yaml", ["workload.batch_size=8", "workload.prompt_tokens=4096",
                                                    "policy.access=split", "hardware.gpu=l40s",
                                                    "hardware.host=ryzen-7950x"]),
    "7b-host-two-engines": ("h200-7b-batch.yaml", ["workload.batch_size=8", "workload.prompt_tokens=4096",
                                                   "policy.access=host_attention", "hardware.gpu=l40s"]),
}


@pytest.mark.parametrize("case", sorted(HOST_CASES))
def test_host_access_steps_follow_the_layer_level_step_for_step(case):
    """With every sequence's churn traced (fast_rows = batch) the fast level times each step as the
    step level does, and the step level as the layer level's SimPy events do."""
    name, overrides = HOST_CASES[case]
    runs = {d: simulate(load_scenario(SCENARIOS / name, [*HOST_BASE, *overrides, "sim.fast_rows=8", f"sim.detail={d}"]),
                        with_max_batch=False) for d in ("fast", "step", "layer")}
    layer = runs["layer"].steps["step_s"].to_numpy()
    for d in ("fast", "step"):
        assert np.allclose(runs[d].steps["step_s"].to_numpy(), layer, rtol=1e-9, atol=0), (case, d)
        for k in (*METRICS, "h2d_utilization", "d2h_utilization", "transfer_share", "host_attention_share"):
            got, ref = getattr(runs[d].summary, k), getattr(runs["layer"].summary, k)
            assert got == pytest.approx(ref, rel=1e-9), (case, d, k)
    assert runs["layer"].summary.host_attention_share > 0


def test_host_access_cases_reach_the_contended_branches():
    """The cases above do what their names say: split attends part on the host while it prefetches
    the rest, and the DRAM slows the stream (and, beside a desktop socket, the copies)."""
    from sim.decode.fast_host import pair_speeds

    for case in ("70b-split-server", "7b-split-desktop", "7b-split-two-engines"):
        name, overrides = HOST_CASES[case]
        ctx = build_context(load_scenario(SCENARIOS / name, [*HOST_BASE, *overrides]))
        att = fast_plan(ctx).attended
        a = host_step_arrays(ctx, att[-1:], np.array([len(att) - 1]))
        assert 0 < a.fraction[0] < 1, case
    server, desktop = (build_context(load_scenario(SCENARIOS / HOST_CASES[c][0], [*HOST_BASE, *HOST_CASES[c][1]]))
                       for c in ("70b-split-server", "7b-split-desktop"))
    link = server.hw.h2d.bytes_per_s
    s_host, s_copy = pair_speeds(np.array([server.hw.host_cpu.dram_bytes_per_s]), np.array([link]),
                                 server.hw.host_cpu.shared_bytes_per_s)
    assert s_copy[0] == 1.0 and s_host[0] == pytest.approx(1 - link / server.hw.host_cpu.dram_bytes_per_s)
    cap = desktop.hw.host_cpu.shared_bytes_per_s
    s_host, s_copy = pair_speeds(np.array([cap]), np.array([link]), cap)
    assert (s_host[0], s_copy[0]) == pytest.approx((cap / 2 / cap, cap / 2 / link))  # both at half the socket


def test_fast_host_access_agrees_with_layer_level_with_sampled_churn():
    """Batches wider than fast_rows: churn from representative sequences, as for prefetch - within 1%."""
    for name, overrides in (("h200-70b-int4.yaml", ["workload.reasoning_tokens=1024", "policy.access=split"]),
                            ("h200-7b-batch.yaml", ["workload.reasoning_tokens=1024", "policy.access=host_attention"]),
                            ("h200-7b-batch.yaml", [*HOST_BASE, "workload.batch_size=16", "workload.prompt_tokens=2048",
                                                    "policy.access=split", "hardware.gpu=l40s"])):
        gaps = _disagreement(SCENARIOS / name, overrides)
        assert gaps and all(abs(g) <= AGREEMENT for g in gaps.values()), f"{name} {overrides}: fast vs layer {gaps}"


def test_host_step_arrays_equal_the_physics_step_cost():
    """The split's choice and the closed form as arrays: the same floats as `decode_step_cost` and
    `StepCost.closed_form_s` step by step."""
    for name, overrides in HOST_CASES.values():
        ctx = build_context(load_scenario(SCENARIOS / name, [*HOST_BASE, *overrides]))
        att = plan_tiers(ctx).attended
        rows = np.flatnonzero(att[:, ATT_T1] + att[:, ATT_T2] > 0)
        a = host_step_arrays(ctx, att[rows], rows)
        m, p = ctx.scenario.model, ctx.scenario.policy
        for j in range(0, len(rows), 7):
            row = att[rows[j]]
            c = decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, p.prefetch, int(row[ACTIVE]),
                                 int(row[ATT_T0]), int(row[ATT_T1]), int(row[ATT_T2]), ctx.kv_bytes_per_token_layer,
                                 ctx.t2_bytes_per_token_layer, True, p.access, p.staging_buffers)
            copy_s = c.prefetch_copy_s(ctx.hw.h2d) if c.stages else 0.0
            assert (a.step_s[j], a.compute_s[j]) == (c.closed_form_s(ctx.hw, copy_s, p.staging_buffers), c.compute_s)
            assert a.fraction[j] == (c.host_fraction if c.host is not None else 0.0)


def test_host_access_with_one_copy_engine_is_timed_at_step_level():
    """One copy engine queues the queries behind copies: not vectorised, the step level times it."""
    name, overrides = HOST_CASES["7b-host-two-engines"]
    base = [*HOST_BASE, *overrides, "hardware.copy_engines=1", "sim.fast_rows=8"]
    fast = simulate(load_scenario(SCENARIOS / name, base + ["sim.detail=fast"]), with_max_batch=False)
    step = simulate(load_scenario(SCENARIOS / name, base + ["sim.detail=step"]), with_max_batch=False)
    assert fast.summary.throughput_tok_per_s == step.summary.throughput_tok_per_s
    assert fast.summary.host_attention_share > 0


def test_host_pipeline_arrays_equal_the_scalar_closed_form():
    """Random layers (copies slowed or not, partials behind copies or not, buffers 1-3): the arrays
    give `host_pipeline`'s finish and busy time exactly."""
    from sim.decode.fast_host import host_pipeline_arrays
    from sim.device.host_pipeline import HostLayer, host_pipeline

    rng = np.random.default_rng(7)
    n = 400
    x = {k: rng.uniform(0.1, 3.0, n) for k in ("pre_s", "attention_s", "after_s", "query_s", "dispatch_s",
                                                "stream_s", "partials_s")}
    x["query_shared_s"] = x["query_s"] * rng.uniform(1.0, 2.0, n)
    x["copy_s"] = np.where(rng.random(n) < 0.2, 0.0, rng.uniform(0.1, 6.0, n))
    x["copy_bytes"] = x["copy_s"] * rng.uniform(0.5, 3.0, n)
    x["stream_bytes"] = x["stream_s"] * rng.uniform(0.5, 3.0, n)
    for layers, buffers, behind in ((5, 1, False), (6, 2, True), (4, 3, False), (2, 3, True)):
        a = host_pipeline_arrays(*(x[k] for k in ("pre_s", "attention_s", "after_s", "copy_s", "copy_bytes", "query_s",
                                                  "query_shared_s", "dispatch_s", "stream_s", "stream_bytes",
                                                  "partials_s")), layers, buffers, 3.5, behind)
        for i in range(n):
            t = host_pipeline(HostLayer(**{k: float(v[i]) for k, v in x.items()}), layers, buffers, 3.5, behind)
            assert a.finish_s[i] == t.finish_s
            assert a.host_busy_s[i] == pytest.approx(sum(e - s for s, e in t.host), rel=1e-12)
            copies = [c for c in t.copies if c is not None]
            assert a.copy_busy_s[i] == pytest.approx(sum(e - s for s, e in copies), rel=1e-12, abs=1e-15)


def test_transfer_times_array_equals_the_link_model():
    from sim.decode.fast_host import transfer_times_s
    from sim.device.hardware import behind_switch

    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml"))
    nbytes = np.array([0.0, 1e3, 3.3e6, 5e8, 7e9])
    copies = np.array([1, 1, 3, 2, 0])
    for link in (ctx.hw.h2d, behind_switch(ctx.hw.h2d, 40e9, 2)):
        for both in (False, True):
            assert transfer_times_s(link, nbytes, copies, both).tolist() == [
                link.transfer_time_s(b, int(c), both) for b, c in zip(nbytes, copies)]
