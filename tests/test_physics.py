"""Cost formulas against hand arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from sim.device.elementwise import RMSNORM, ROPE, SILU_MUL
from sim.device.hardware import LinkModel, interp_log2, resolve_hardware
from sim.device.memory import activation_bytes, staging_bytes
from sim.device.physics import (
    attention_flop,
    decode_layer_cost,
    gemm_flop,
    host_pack_s,
    layerwise_pipeline_s,
    lm_head_s,
    roofline_s,
    step_tail_s,
)
from sim.inputs import catalog
from sim.inputs.profile import CopyCurve, CopyPoint
from sim.inputs.scenario import HardwareCfg


def hw(**over):
    """The H200 under the datasheet model (these tests check its formulas; hardware.kernels: auto would
    take the measured tables)."""
    return resolve_hardware(HardwareCfg(gpu="h200-sxm", kernels="datasheet", **over), "bf16", pinned=True)


def test_roofline_takes_the_slower_side():
    assert roofline_s(1e12, 1e9, 1e15, 1e12) == pytest.approx(1e-3)  # memory bound
    assert roofline_s(1e15, 1e9, 1e15, 1e12) == pytest.approx(1.0)  # compute bound


def test_decode_layer_cost_hand_arithmetic():
    m = catalog.model("deepseek-r1-distill-qwen-7b")
    h = hw()
    B, n = 4, 4 * 1000
    kv_layer = 2 * 4 * 128 * 2
    c = decode_layer_cost(m, h, "bf16", 128, B, n, kv_layer)
    params = 3584 * 3584 * 2 + 2 * 3584 * 512 + 3 * 3584 * 18944
    assert gemm_flop(m, B) == 2 * params * B
    weight_bytes = 2 * (params + 3584 + 2 * 512 + 2 * 3584)  # + q/k/v bias and two norms, bf16
    assert m.layer_weight_bytes("bf16") == weight_bytes
    fit = catalog.fitted_kernels()["h200-sxm"]  # the constants fitted on measured tables
    g, a = fit.gemm["bf16"], fit.attention
    # four GEMM calls (qkv, o, gate_up, down), each with its floor; their inputs (sum of k: 3,584 x 3 + 3,584 = h, h,
    # h, I) streamed with the weights, their outputs (sum of n: 3,584 + 2 x 512 + h + 2 I + h) written
    sum_k, sum_n = 3 * 3584 + 18944, (3584 + 2 * 512) + 3584 + 2 * 18944 + 3584
    streamed = weight_bytes + B * sum_k * 2
    gemm_s = (4 * g.floor_s + max(2 * params * B / h.gemm_flop_per_s(B), streamed / (4.8e12 * g.weight_hbm_efficiency))
              + B * sum_n / (4.8e12 * g.output_hbm_efficiency))
    assert c.gemm_s == pytest.approx(gemm_s)
    assert attention_flop(m, n) == 4 * n * 28 * 128
    attn_bytes = (n + B) * kv_layer  # read every attended token, write the new ones
    blocks = B * 4  # one thread block per (sequence, KV head): a small grid streams at 16 / (16 + half_ctas)
    assert c.attention_s == pytest.approx(max(4 * n * 28 * 128 / (989e12 * 0.40), a.floor_s + max(
        attn_bytes / (4.8e12 * a.hbm_efficiency * blocks / (blocks + a.half_ctas)), blocks * a.per_cta_s)))
    # the elementwise passes at 4 rows, each a row's latency (H200 takes H100's fit): two fused add + RMSNorms
    # over h, rope over 28 + 4 heads of 128, SiLU-and-mul over I
    norm, rope, act = (h.elementwise.fit(k) for k in (RMSNORM, ROPE, SILU_MUL))
    passes = (2 * (norm.floor_s + 3584 * norm.s_per_element) + rope.floor_s + 4096 * rope.s_per_element
              + act.floor_s + 18944 * act.s_per_element)
    assert c.overhead_s == pytest.approx(passes)
    assert c.total_s == pytest.approx(c.gemm_s + c.attention_s + passes)
    qkv = 3584 * (3584 + 2 * 512)
    assert c.pre_attention_s == pytest.approx(c.gemm_s * qkv / params)
    assert c.pre_attention_s + c.post_attention_s == pytest.approx(c.total_s)


def test_lm_head_reads_vocab_matrix():
    m = catalog.model("llama-3.1-8b")
    g = catalog.fitted_kernels()["h200-sxm"].gemm["bf16"]
    assert lm_head_s(m, hw(), 1) == pytest.approx(g.floor_s + 128256 * 4096 * 2 / (4.8e12 * g.weight_hbm_efficiency))


def test_gemm_efficiency_interpolates_on_log_rows():
    pts = [(1, 0.05), (8, 0.25), (32, 0.5)]
    assert interp_log2(pts, 1) == 0.05
    assert interp_log2(pts, 16) == pytest.approx(0.375)  # halfway between 8 and 32 in log2
    assert interp_log2(pts, 1000) == 0.5


def test_transfer_time_latency_plus_bandwidth():
    link = LinkModel(per_copy_latency_s=4e-6, bytes_per_s=50e9, bidirectional_bytes_per_s=40e9)
    assert link.transfer_time_s(100e6, 10) == pytest.approx(10 * 4e-6 + 100e6 / 50e9)
    assert link.transfer_time_s(100e6, 10, both_directions_busy=True) == pytest.approx(10 * 4e-6 + 100e6 / 40e9)
    assert link.transfer_time_s(0, 10) == 0.0


def test_datasheet_link_figures_used():
    h = hw()
    assert h.h2d.bytes_per_s == 55.4e9 and h.d2h.bytes_per_s == 55.2e9
    pageable = resolve_hardware(HardwareCfg(gpu="rtx-5080"), "int8", pinned=False)
    assert pageable.h2d.bytes_per_s == 15.7e9 and pageable.h2d.per_copy_latency_s == 3.3e-6


def test_profile_curve_interpolates_log_log_and_extrapolates_with_fit():
    pts = [CopyPoint(size_bytes=s, time_s=t, bytes_per_s=s / t) for s, t in [(1000, 1e-5), (100_000, 1e-4)]]
    c = CopyCurve(direction="h2d", memory="pinned", points=pts, fit_per_copy_latency_s=5e-6, fit_bytes_per_s=1e9)
    assert c.copy_time_s(10_000) == pytest.approx(10 ** -4.5)  # geometric midpoint
    assert c.copy_time_s(1e7) == pytest.approx(5e-6 + 1e7 / 1e9)


def test_pipeline_without_copies_is_sum_of_compute():
    assert layerwise_pipeline_s([0.5, 1.0, 1.5], [0.5, 1.0, 1.5], [0, 0, 0], 2) == (6.0, 0.0)


def test_pipeline_compute_bound_hides_all_but_first_copy():
    finish, stall = layerwise_pipeline_s([0.0] * 4, [1.0] * 4, [0.5] * 4, 2)
    assert finish == pytest.approx(0.5 + 4.0) and stall == pytest.approx(0.5)


def test_pipeline_qkv_projection_hides_the_first_copy():
    # attention waits for the copy, the QKV projection before it does not
    finish, stall = layerwise_pipeline_s([0.5] * 3, [0.5] * 3, [0.5] * 3, 2)
    assert finish == pytest.approx(3.0) and stall == pytest.approx(0.0)


def test_pipeline_link_bound():
    # copies 2 s, compute 1 s, 2 buffers: copy l ends at 2(l+1), layer l ends at 2(l+1) + 1
    finish, stall = layerwise_pipeline_s([0.0] * 3, [1.0] * 3, [2.0] * 3, 2)
    assert finish == pytest.approx(7.0) and stall == pytest.approx(4.0)


def test_pipeline_one_buffer():
    # copy l+1 may start only when layer l's attention has taken the single buffer's tokens:
    # copy0 [0, .5], layer0 [.5, 1.5], copy1 [.5, 1], layer1 [1.5, 2.5], copy2 [1.5, 2], layer2 [2.5, 3.5]
    finish, _ = layerwise_pipeline_s([0.0] * 3, [1.0] * 3, [0.5] * 3, 1)
    assert finish == pytest.approx(3.5)
    finish, _ = layerwise_pipeline_s([0.0] * 3, [0.2] * 3, [1.0] * 3, 1)  # link-bound: copies back to back
    assert finish == pytest.approx(3.0 + 0.2)


def test_staging_and_activation_bytes():
    assert staging_bytes("layerwise_async", 2, 28, 1e6) == 2e6
    assert staging_bytes("sync_per_step", 2, 28, 1e6) == 28e6
    m = catalog.model("deepseek-r1-distill-qwen-7b")
    assert activation_bytes(m, 2) == 2 * (2 * 2 * 18944 * 2 + 152064 * 4)


def test_copy_counts_follow_the_host_layout():
    from sim.device.physics import prefetch_copies_per_layer, retier_copies

    assert prefetch_copies_per_layer("layerwise_async", True, False) == 1  # one token-major block per layer
    assert prefetch_copies_per_layer("layerwise_async", True, True) == 3  # + int8 payload and scales
    assert prefetch_copies_per_layer("sync_per_step", True, False) == 2  # K and V apart
    assert prefetch_copies_per_layer("layerwise_async", False, False) == 0
    assert retier_copies("sync_per_step", 28, True, False) == 56  # the paper's 56 copies per all-layer move
    assert retier_copies("layerwise_async", 28, True, False) == 1  # gathered into one block


def test_sync_per_step_step_time_hand_arithmetic():
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import load_scenario

    from .conftest import SCENARIOS

    r = simulate(load_scenario(SCENARIOS / "paper-rtx5080-7b.yaml", ["workload.reasoning_tokens=400"]), with_max_batch=False)
    s = r.steps.set_index("step")
    k = 200  # after the first re-tier that moves tokens (step 191), before the next
    t1 = s.loc[k - 1, "tokens_t1"]
    assert t1 > 0
    kv_layer = 2 * 4 * 128 * 2  # fp16 KV, one layer
    # per layer: K and V packed on the host (assumed 8 GB/s), then copied apart (pageable Gen5)
    copy_s = 28 * (t1 * kv_layer / 8e9 + 2 * 3.3e-6 + t1 * kv_layer / 15.7e9)
    assert s.loc[k, "step_s"] == pytest.approx(s.loc[k, "compute_s"] + copy_s, rel=1e-9)
    assert s.loc[k, "stall_s"] == pytest.approx(copy_s, rel=1e-9)


def test_an_asynchronous_device_takes_the_longer_of_device_work_and_host_enqueue():
    m = catalog.model("deepseek-r1-distill-qwen-7b")
    kv_layer = 2 * 4 * 128 * 2
    fast = decode_layer_cost(m, hw(), "bf16", 128, 1, 1000, kv_layer)
    assert fast.host_s == 0 and fast.total_s == pytest.approx(fast.gemm_s + fast.attention_s + fast.overhead_s)
    host_s = 3 * fast.device_s  # the host needs longer to enqueue the layer than the device to run it
    slow = decode_layer_cost(m, hw(efficiency={"host_layer_s": host_s}), "bf16", 128, 1, 1000, kv_layer)
    assert slow.host_bound and slow.total_s == pytest.approx(host_s)  # max, not device + host
    assert slow.pre_attention_s == pytest.approx(3 * fast.pre_attention_s)  # stretched with the layer
    assert slow.pre_attention_s + slow.post_attention_s == pytest.approx(slow.total_s)
    big = decode_layer_cost(m, hw(efficiency={"host_layer_s": host_s}), "bf16", 128, 64, 64 * 30000, kv_layer)
    assert not big.host_bound and big.total_s == pytest.approx(big.device_s)  # the host runs ahead


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_measured_tiny_layer_time_is_host_time_on_cuda_and_device_time_on_the_cpu(device):
    from sim.inputs.profile import ComputeProfile, LinkProfile, Profile

    prof = Profile(device=device, device_name="test", machine="t", created_utc="2026-11-30T00:00:00Z",
                   link=LinkProfile(curves=[]), compute=ComputeProfile(layer_overhead_s=1.5e-4))
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=True, profile=prof)
    if device == "cuda":  # enqueued asynchronously: composes by max; the device's elementwise passes stay by bytes
        assert (h.host_layer_s, h.layer_overhead_s) == (1.5e-4, 0.0) and h.elementwise is not None
        assert "host-bound" in h.sources["host_layer_s"]
    else:  # synchronous: the host's time is the device's, and adds up
        assert (h.host_layer_s, h.layer_overhead_s) == (0.0, 1.5e-4)


def _profile_with_loops(device: str):
    from sim.inputs.profile import ComputeProfile, LinkProfile, Profile, StepOverhead

    loops = {"none": StepOverhead(layer_s=1e-4, step_s=5e-4), "layerwise_async": StepOverhead(layer_s=2e-4, step_s=6e-4)}
    return Profile(device=device, device_name="test", machine="t", created_utc="2026-11-30T00:00:00Z",
                   link=LinkProfile(curves=[]), compute=ComputeProfile(layer_overhead_s=9e-4, step_overheads=loops))


def test_decode_loop_costs_follow_the_staging_mode():
    cuda = _profile_with_loops("cuda")
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=True, profile=cuda, staging="layerwise_async")
    assert (h.host_layer_s, h.host_step_s, h.layer_overhead_s, h.step_overhead_s) == (2e-4, 6e-4, 0.0, 2e-4)
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=True, profile=cuda, staging="none")
    assert (h.host_layer_s, h.host_step_s) == (1e-4, 5e-4)
    # a mode the profile lacks falls back to the one-layer figure
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=True, profile=cuda, staging="per_interval")
    assert (h.host_layer_s, h.host_step_s) == (9e-4, 0.0)
    cpu = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=True, profile=_profile_with_loops("cpu"),
                           staging="layerwise_async")
    assert (cpu.host_layer_s, cpu.host_step_s, cpu.layer_overhead_s, cpu.step_overhead_s) == (0.0, 0.0, 2e-4, 6e-4)


def test_step_tail_is_the_longer_of_device_and_host():
    m = catalog.model("deepseek-r1-distill-qwen-7b")
    device_tail = lm_head_s(m, hw(), 4) + 2e-4
    assert step_tail_s(m, hw(), 4) == pytest.approx(device_tail)
    assert step_tail_s(m, hw(efficiency={"host_step_s": 10 * device_tail}), 4) == pytest.approx(10 * device_tail)


@pytest.mark.parametrize("kind, prefetch, staging", [("full_hbm", "layerwise_async", "none"),
                                                      ("evict_only", "layerwise_async", "none"),
                                                      ("tiered", "sync_per_step", "sync_per_step"),
                                                      ("tiered", "layerwise_async", "layerwise_async")])
def test_a_scenario_picks_the_loop_costs_of_its_staging(kind, prefetch, staging):
    from sim.decode.context import build_context
    from sim.inputs.scenario import scenario_from_dict

    sc = scenario_from_dict({"name": "s", "model": {"name": "deepseek-r1-distill-qwen-7b"},
                             "policy": {"kind": kind, "prefetch": prefetch, "pinned": prefetch != "sync_per_step"}}, "t")
    h = build_context(sc, _profile_with_loops("cuda")).hw
    expected = {"none": 1e-4, "layerwise_async": 2e-4}.get(staging, 9e-4)
    assert h.host_layer_s == expected


def test_a_measured_host_packing_rate_replaces_the_assumed_one():
    from sim.inputs.profile import ComputeProfile, LinkProfile, Profile

    assert hw().host_pack_bytes_per_s == 8e9 and "assumed" in hw().sources["host_pack_bytes_per_s"]
    prof = Profile(device="cuda", device_name="test", machine="t", created_utc="2026-11-30T00:00:00Z",
                   link=LinkProfile(curves=[], host_pack_bytes_per_s=3e9), compute=ComputeProfile())
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=False, profile=prof)
    assert h.host_pack_bytes_per_s == 3e9 and h.sources["host_pack_bytes_per_s"].startswith("profile")
    assert host_pack_s(h, 6e9) == pytest.approx(2.0)


def test_gqa_datasheet_attention_scalars_equal_arrays_and_the_flat_form_without_a_fit():
    from sim.device.physics import attention_s, gqa_datasheet_attention_s
    h = hw()
    points = [(1, 8, 4.0e8, 1.7e7), (32, 8, 1.6e10, 6.7e7), (2048, 8, 5.4e9, 1.3e8), (0, 8, 0.0, 0.0)]
    scalars = [gqa_datasheet_attention_s(h, b, kvh, f, nb, False) for b, kvh, f, nb in points]
    arrays = gqa_datasheet_attention_s(h, np.array([p[0] for p in points]), 8, np.array([p[2] for p in points]),
                                       np.array([p[3] for p in points]), False)
    assert arrays.tolist() == pytest.approx(scalars)
    assert scalars[3] == pytest.approx(h.attention_latency_s)  # nothing attended: the floor
    rtx = resolve_hardware(HardwareCfg(gpu="rtx-4090", kernels="datasheet"), "bf16", pinned=True,
                           fit_from=catalog.NO_FIT)  # no fit: flat
    assert gqa_datasheet_attention_s(rtx, 32, 8, 1.6e10, 6.7e7, True) == attention_s(1.6e10, 6.7e7, rtx)
    pinned = hw(efficiency={"attention_hbm_efficiency": 0.7})  # a scenario's rate stands alone: flat
    assert gqa_datasheet_attention_s(pinned, 32, 8, 1.6e10, 6.7e7, False) == attention_s(1.6e10, 6.7e7, pinned)


def test_gqa_datasheet_attention_with_xqas_split_scalars_equal_arrays():
    """TensorRT-LLM's H200 fit (XQA's sequence split on): scalars and arrays over steps agree, blocks and
    the per-query-head cost included; an empty batch costs the floor."""
    from sim.device.kernels import datasheet_hardware
    from sim.device.physics import gqa_datasheet_attention_s, xqa_ctas
    h = datasheet_hardware("h200-sxm", framework="trtllm")
    assert h.attention_shape.split_ctas == 1056
    # (batch, FLOP, KV bytes, query heads per KV head, tokens a sequence): short, split, capped, thin, empty
    points = [(1, 4.0e8, 1.7e7, 4.0, 100.0), (8, 1.6e10, 1.3e8, 4.0, 4096.0), (32, 1.6e10, 5.4e8, 8.0, 4096.0),
              (2048, 5.4e9, 1.3e8, 16.0, 16.0), (0, 0.0, 0.0, 4.0, 0.0)]
    for fp8 in (False, True):
        scalars = [gqa_datasheet_attention_s(h, b, 8, f, nb, fp8, heads_per_kv=g, tokens_per_seq=n)
                   for b, f, nb, g, n in points]
        b, f, nb, g, n = (np.array(col, dtype=float) for col in zip(*points))
        arrays = gqa_datasheet_attention_s(h, b, 8, f, nb, fp8, heads_per_kv=g, tokens_per_seq=n)
        assert arrays.tolist() == pytest.approx(scalars, rel=1e-12)
        assert scalars[4] == pytest.approx(h.attention_shape.fp8_floor_s if fp8 else h.attention_latency_s)
    assert xqa_ctas(np.array([8.0, 64.0, 256.0, 16384.0]), np.array([100.0, 4096.0, 4096.0, 16.0]), 1056).tolist() \
        == [8.0, 1024.0, 1056.0, 16384.0]  # no split under 128 tokens; m0 = 16 at 4,096; capped; a wide grid as is
    assert xqa_ctas(64.0, None, 1056) == 64.0  # tokens unknown: no split
