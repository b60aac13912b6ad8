"""Exact host-side attention over T1/T2 (policy.access host_attention / split, issue #12): the host
path's cost by hand, the split's choice, the engine's event order, layer/step agreement, memory."""

from __future__ import annotations

import dataclasses

import pytest

from sim.decode.context import build_context
from sim.decode.engine import DecodeSim
from sim.decode.simulate import simulate
from sim.device.hardware import HostCpu, resolve_host
from sim.device.physics import SPLIT_STEPS, decode_step_cost, host_path
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import load_scenario

from .conftest import SCENARIOS
from .test_engine_events import two_step_plan

SMALL = ["workload.batch_size=4", "workload.prompt_tokens=128", "workload.reasoning_tokens=320",
         "policy.retier_interval=32", "policy.recent_window=32"]


def ctx_for(*overrides: str, scenario: str = "h200-7b-batch.yaml"):
    return build_context(load_scenario(SCENARIOS / scenario, [*SMALL, *overrides]))


def test_host_roofline_by_hand():
    cpu = HostCpu("t", dram_bytes_per_s=100e9, flop_per_s=1e12, dispatch_s=1e-5)
    assert cpu.attention_s(1e9, 1e9) == pytest.approx(1e9 / 100e9 + 1e-5)  # bandwidth-bound
    assert cpu.attention_s(1e6, 1e12) == pytest.approx(1.0 + 1e-5)  # FLOP-bound
    assert cpu.attention_s(0.0, 0.0) == 0.0  # nothing on the host: no dispatch either
    epyc, sources = resolve_host("epyc-9654")
    assert epyc.dram_bytes_per_s == 460.8e9 * 0.80 and epyc.flop_per_s == 10.9e12 * 0.5
    assert "assumed" in sources["host_dram_bytes_per_s"]


def _host_profile(points, **host):
    from hwprobe.calibrate.host_attention import host_figures
    from sim.inputs.profile import HostAttentionPoint, HostProfile, Profile

    bytes_per_s, dispatch_s = host_figures([HostAttentionPoint(batch=1, tokens=n, kv_bytes=b, time_s=t)
                                            for n, b, t in points])
    section = HostProfile(cpu_name="Test CPU", threads=8, attention_kernel="k", attention_bytes_per_s=bytes_per_s,
                          attention_dispatch_s=dispatch_s, **host)
    return Profile(device="cpu", device_name="Test CPU", machine="m", created_utc="2025-01-02T00:00:00+00:00",
                   host=section)


def test_profile_host_section_replaces_the_catalog_dram_rate_and_dispatch():
    # an exact line: 20 us per layer + K/V bytes at 50 GB/s
    points = [(n, n * 2048.0, 20e-6 + n * 2048 / 50e9) for n in (256, 1024, 4096, 16384)]
    profile = _host_profile(points)
    cpu, sources = resolve_host("epyc-9654", profile)
    catalog_cpu, catalog_sources = resolve_host("epyc-9654")
    assert cpu.dram_bytes_per_s == pytest.approx(50e9) and cpu.dispatch_s == pytest.approx(20e-6)
    assert cpu.flop_per_s == catalog_cpu.flop_per_s and cpu.name == "Test CPU"  # FLOP/s not measured
    assert sources["host_dram_bytes_per_s"].startswith("profile: Test CPU (8 threads, 2025-01-02), host attention")
    assert sources["host_dispatch_s"].startswith("profile: Test CPU") and "intercept" in sources["host_dispatch_s"]
    assert sources["host_flop_per_s"] == catalog_sources["host_flop_per_s"]
    assert "host_dispatch_s" not in catalog_sources
    assert resolve_host("epyc-9654", profile.model_copy(update={"host": None})) == (catalog_cpu, catalog_sources)
    # build_context passes the profile on: the scenario's host path runs on the measured figures
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*SMALL, "policy.access=host_attention"]),
                        profile)
    assert ctx.hw.host_cpu == cpu and ctx.hw.sources["host_dispatch_s"] == sources["host_dispatch_s"]


def test_cpu_tiny_profile_drives_the_host_path(cpu_tiny_profile):
    from sim.inputs.profile import load_profile

    result, out = cpu_tiny_profile  # `hwprobe calibrate --device cpu --tiny`, run once per session
    assert result.returncode == 0, result.stdout + result.stderr
    profile = load_profile(out)
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*SMALL, "policy.access=split"]), profile)
    host = ctx.hw.host_cpu
    assert (host.dram_bytes_per_s, host.dispatch_s) == (profile.host.attention_bytes_per_s,
                                                        profile.host.attention_dispatch_s)
    assert ctx.hw.sources["host_dram_bytes_per_s"].startswith(f"profile: {profile.host.cpu_name}")


def test_host_path_bytes_and_time_by_hand():
    ctx = ctx_for("policy.access=host_attention")
    m, hw = ctx.model, ctx.hw
    kv = ctx.kv_bytes_per_token_layer  # 7B: 2 * 4 * 128 * 2
    path = host_path(m, hw, 4, 1000, 0, kv, ctx.t2_bytes_per_token_layer)
    assert path.query_bytes == 4 * 28 * 128 * 2  # B x H x d bf16 queries
    assert path.partial_bytes == 4 * 28 * 129 * 4  # B x H x (d + 1) fp32 partials + LSE
    flop = 4 * 1000 * 28 * 128
    assert path.host_s == pytest.approx(max(1000 * kv / (460.8e9 * 0.8), flop / (10.9e12 * 0.5)) + 1e-5)
    assert path.time_s(hw) == pytest.approx(hw.d2h.transfer_time_s(path.query_bytes, 1) + path.host_s
                                            + hw.h2d.transfer_time_s(path.partial_bytes, 1))


def _cost(ctx, access, t0=400, t1=1600, t2=0, batch=4):
    m, p = ctx.scenario.model, ctx.scenario.policy
    return decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, p.prefetch, batch, t0, t1, t2,
                            ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, True, access, p.staging_buffers)


def test_host_attention_step_is_the_later_of_gpu_t0_attention_and_the_host_path():
    ctx = ctx_for("policy.access=host_attention")
    cost = _cost(ctx, "host_attention")
    assert cost.prefetch_bytes_per_layer == 0.0 and cost.host_fraction == 1.0 and cost.host.tokens == 1600
    prefetch = _cost(ctx, "prefetch")
    assert cost.layer.attention_s < prefetch.layer.attention_s  # the GPU attends T0 only
    layer = cost.layer.total_s - cost.layer.attention_s + max(cost.layer.attention_s, cost.host.time_s(ctx.hw))
    assert cost.closed_form_s(ctx.hw, 0.0, 2) == pytest.approx(ctx.num_layers * layer + cost.tail_s)


def test_split_chooses_the_fastest_fraction():
    ctx = ctx_for("policy.access=split")
    best = _cost(ctx, "split", t1=20000)
    hw, b = ctx.hw, 2
    chosen = best.closed_form_s(hw, best.prefetch_copy_s(hw.h2d), b)
    for access in ("host_attention", "prefetch"):
        other = _cost(ctx, access, t1=20000)
        copy_s = other.prefetch_copy_s(hw.h2d) if other.stages else 0.0
        assert chosen <= other.closed_form_s(hw, copy_s, b) + 1e-15
    assert best.host_fraction in {1 - i / SPLIT_STEPS for i in range(SPLIT_STEPS + 1)}


def test_engine_layer_waits_for_the_host_path():
    """Event order in one step: each layer's host interval sits between its queries and its partials."""
    ctx = ctx_for("policy.access=host_attention", scenario="cpu-tiny.yaml")
    ctx = dataclasses.replace(ctx, hw=dataclasses.replace(ctx.hw, copy_engines=3))
    sim = DecodeSim(ctx, two_step_plan())
    sim.run()
    tl = [r for r in sim.timeline if r.get("step") == 1]
    for layer in range(ctx.num_layers):
        q = next(r for r in tl if r["what"] == f"queries L{layer}")
        h = next(r for r in tl if r["what"] == f"host attention L{layer}")
        p = next(r for r in tl if r["what"] == f"partials L{layer}")
        c = next(r for r in tl if r["what"] == f"layer {layer}")
        assert c["start_s"] <= q["start_s"] and q["end_s"] <= h["start_s"] and h["end_s"] <= p["start_s"]
        assert p["end_s"] <= c["end_s"]  # the layer ends after the merge
    cost = sim.step_cost(1)
    assert sim.records[1].step_s == pytest.approx(cost.closed_form_s(ctx.hw, 0.0, 2))  # nothing contends here


@pytest.mark.parametrize("access", ["host_attention", "split"])
def test_layer_and_step_detail_agree(access):
    a = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*SMALL, f"policy.access={access}"]), with_max_batch=False)
    b = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*SMALL, f"policy.access={access}", "sim.detail=step"]),
                 with_max_batch=False)
    assert b.summary.throughput_tok_per_s == pytest.approx(a.summary.throughput_tok_per_s, rel=0.01)
    assert a.summary.access == access and 0 <= a.summary.host_attention_share < 1
    if access == "host_attention":
        assert a.summary.host_attention_share > 0


def test_host_attention_moves_kilobytes_not_the_t1_set_and_stages_nothing():
    pre = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", SMALL), with_max_batch=False).summary
    host = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*SMALL, "policy.access=host_attention"]),
                    with_max_batch=False).summary
    # per layer B x H x (d + 1) x 4 B of partials instead of every T1 token (what remains is promotions)
    assert host.h2d_bytes < 0.2 * pre.h2d_bytes
    assert host.hbm_peak_bytes < pre.hbm_peak_bytes  # no staging buffers
    assert host.offloaded_tokens == pre.offloaded_tokens and host.evicted_tokens == pre.evicted_tokens  # same tiers


def test_a_desktop_host_saturates_where_a_server_socket_does_not():
    over = ["workload.batch_size=32", "workload.reasoning_tokens=1024", "policy.access=host_attention", "sim.detail=step"]
    server = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*over, "hardware.host=epyc-9654"]),
                      with_max_batch=False).summary
    desktop = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*over, "hardware.host=ryzen-7950x"]),
                       with_max_batch=False).summary
    assert desktop.throughput_tok_per_s < server.throughput_tok_per_s
    assert desktop.host_attention_share > server.host_attention_share
    assert desktop.sources["host_dram_bytes_per_s"].startswith("catalog ryzen-7950x")


def test_bad_access_inputs_name_the_field():
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["policy.access=host_attention", "policy.prefetch=sync_per_step"])
    assert err.value.field == "policy" and "layerwise_async" in err.value.message
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["hardware.host=pentium"])
    assert err.value.field == "hardware.host" and "epyc-9654" in err.value.message


def test_every_gpu_names_a_catalog_host():
    for gpu in catalog.gpus().values():
        assert catalog.host(gpu.host).name == gpu.host


def test_access_study_ranks_the_strategies_and_names_what_binds():
    from sim.studies.access_strategies import access_table, binding_resource

    df = access_table("deepseek-r1-distill-qwen-7b", "bf16", ("h200-sxm",), 1024).set_index("access")
    assert df.loc["prefetch", "binds"] == "host link"  # every T1 token crosses PCIe every step
    assert df.loc["host_attention", "throughput_tok_per_s"] > df.loc["prefetch", "throughput_tok_per_s"]
    assert df.loc["split", "throughput_tok_per_s"] >= 0.99 * df[["throughput_tok_per_s"]].max().iloc[0]
    assert df.loc["host_attention", "max_batch"] >= df.loc["prefetch", "max_batch"]  # no staging buffers
    assert binding_resource(0.95, 0.1) == "host link" and binding_resource(0.1, 0.95) == "host CPU"
    assert binding_resource(0.85, 0.85) == "host link + host CPU" and binding_resource(0.5, 0.5) == "GPU"
