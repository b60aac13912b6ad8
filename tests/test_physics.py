"""Cost formulas against hand arithmetic."""

from __future__ import annotations

import pytest

from sim import catalog
from sim.hardware import LinkModel, interp_log2, resolve_hardware
from sim.memory import activation_bytes, staging_bytes
from sim.physics import attention_flop, decode_layer_cost, gemm_flop, layerwise_pipeline_s, lm_head_s, roofline_s
from sim.profile import CopyCurve, CopyPoint
from sim.scenario import HardwareCfg


def hw(**over):
    return resolve_hardware(HardwareCfg(gpu="h200-sxm", **over), "bf16", pinned=True)


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
    gemm_s = max(2 * params * B / h.gemm_flop_per_s(B), weight_bytes / (4.8e12 * 0.80))
    assert c.gemm_s == pytest.approx(gemm_s)
    assert attention_flop(m, n) == 4 * n * 28 * 128
    attn_bytes = (n + B) * kv_layer  # read every attended token, write the new ones
    assert c.attention_s == pytest.approx(max(4 * n * 28 * 128 / (989e12 * 0.40), attn_bytes / (4.8e12 * 0.70)))
    assert c.total_s == pytest.approx(c.gemm_s + c.attention_s + 2e-5)
    qkv = 3584 * (3584 + 2 * 512)
    assert c.pre_attention_s == pytest.approx(c.gemm_s * qkv / params)
    assert c.pre_attention_s + c.post_attention_s == pytest.approx(c.total_s)


def test_lm_head_reads_vocab_matrix():
    m = catalog.model("llama-3.1-8b")
    assert lm_head_s(m, hw(), 1) == pytest.approx(128256 * 4096 * 2 / (4.8e12 * 0.80))


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
    from sim.physics import prefetch_copies_per_layer, retier_copies

    assert prefetch_copies_per_layer("layerwise_async", True, False) == 1  # one token-major block per layer
    assert prefetch_copies_per_layer("layerwise_async", True, True) == 3  # + int8 payload and scales
    assert prefetch_copies_per_layer("sync_per_step", True, False) == 2  # K and V apart
    assert prefetch_copies_per_layer("layerwise_async", False, False) == 0
    assert retier_copies("sync_per_step", 28, True, False) == 56  # the paper's 56 copies per all-layer move
    assert retier_copies("layerwise_async", 28, True, False) == 1  # gathered into one block


def test_sync_per_step_step_time_hand_arithmetic():
    from sim.engine import simulate
    from sim.scenario import load_scenario

    from .conftest import SCENARIOS

    r = simulate(load_scenario(SCENARIOS / "paper-rtx5080-7b.yaml", ["workload.reasoning_tokens=400"]), with_max_batch=False)
    s = r.steps.set_index("step")
    k = 200  # after the first re-tier that moves tokens (step 191), before the next
    t1 = s.loc[k - 1, "tokens_t1"]
    assert t1 > 0
    kv_layer = 2 * 4 * 128 * 2  # fp16 KV, one layer
    copy_s = 28 * (2 * 3.3e-6 + t1 * kv_layer / 15.7e9)  # per layer: K and V copies, pageable Gen5
    assert s.loc[k, "step_s"] == pytest.approx(s.loc[k, "compute_s"] + copy_s, rel=1e-9)
    assert s.loc[k, "stall_s"] == pytest.approx(copy_s, rel=1e-9)
