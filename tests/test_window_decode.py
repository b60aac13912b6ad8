"""A sliding window's datasheet decode attention on its own fit (issue #20 item 3): per head dim, fitted on the
tables' window rows (scripts/fit_datasheet.py `window_attention`), the decode form over the window's tokens plus
a floor and a per-block cost once a sequence is longer than its window, XQA's split counted over the whole
sequence (`physics.window_datasheet_attention_s`, `hardware.window_decode`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.device.hardware import window_decode
from sim.device.kernels import DecodeAttention, datasheet_cost, datasheet_hardware
from sim.device.physics import decode_attention_s, gqa_datasheet_attention_s, window_datasheet_attention_s
from sim.inputs import catalog
from sim.inputs.scenario import EfficiencyCfg, load_scenario

from .conftest import SCENARIOS

OSS = SCENARIOS / "serving-h200-gpt-oss-120b.yaml"  # vLLM's fits (no engine section), bf16 KV, head dim 64
H200 = catalog.gpu("h200-sxm")


def _by_hand(fit, b: int, kv_heads: int, n: int, window: int, head_dim: int) -> float:
    """The overlapping form over the window's bf16 tokens, + the past-the-window terms where n > W."""
    ctas = b * kv_heads
    nbytes = (b * min(n, window) + b) * 2 * kv_heads * head_dim * 2
    rate = H200.hbm_bytes_per_s * fit.hbm_efficiency * ctas / (ctas + fit.half_ctas)
    t = fit.floor_s + max(nbytes / rate, fit.per_cta_s * ctas)
    return t + (fit.past_window_floor_s + fit.past_window_per_cta_s * ctas if n > window else 0.0)


def test_the_window_fit_by_hand_within_and_past_the_window():
    fit = catalog.fitted_kernels()["h200-sxm"].window_attention[64]
    assert not fit.sequence_split and fit.past_window_floor_s > 0 and fit.held_out.points > 1000
    kernel = window_decode(H200, EfficiencyCfg(), "vllm", 64).value
    hw = datasheet_hardware("h200-sxm")
    for n in (100, 2048):
        w = min(n, 128)
        got = window_datasheet_attention_s(hw, kernel, 64, 8, 8.0, float(n), 128, (64 * w + 64) * 2 * 8 * 64 * 2,
                                           4.0 * 64 * w * 64 * 64, False)
        assert got == pytest.approx(_by_hand(fit, 64, 8, n, 128, 64), rel=1e-12)
    arrays = window_datasheet_attention_s(hw, kernel, np.array([64.0, 64.0]), 8, 8.0, np.array([100.0, 2048.0]), 128,
                                          np.array([(64 * 100 + 64) * 2048.0, (64 * 128 + 64) * 2048.0]),
                                          np.array([0.0, 0.0]), False)
    assert arrays.tolist() == pytest.approx([_by_hand(fit, 64, 8, n, 128, 64) for n in (100, 2048)], rel=1e-12)


def test_xqa_splits_a_window_call_by_the_whole_sequence():
    """TensorRT-LLM's window call grows with the sequence though it reads only the window (the tables: 23 us
    at 64 sequences within 128 tokens, 43 us past them, H200): its fit keeps XQA's split, counted over n."""
    fit = catalog.fitted_kernels("trtllm")["h200-sxm"].window_attention[64]
    assert fit.sequence_split and fit.per_cta_head_s > 0
    kernel = window_decode(H200, EfficiencyCfg(), "trtllm", 64).value
    assert kernel.shape.split_ctas == 8 * H200.sm_count
    hw = datasheet_hardware("h200-sxm", framework="trtllm")
    nbytes, flop = (4 * 128 + 4) * 2 * 8 * 64 * 2, 4.0 * 4 * 128 * 64 * 64
    calls = [window_datasheet_attention_s(hw, kernel, 4, 8, 8.0, float(n), 128, nbytes, flop, False)
             for n in (256, 2048, 16384)]
    assert calls[0] < calls[1] < calls[2]  # the same bytes, more blocks
    def gqa(n):
        return gqa_datasheet_attention_s(hw, 4, 8, flop, nbytes, False, heads_per_kv=8.0, tokens_per_seq=n, kernel=kernel)

    assert calls[2] - calls[1] == pytest.approx(gqa(16384.0) - gqa(2048.0), rel=1e-12)


def test_a_window_layer_decodes_on_the_window_fit_in_the_step():
    ctx = build_context(load_scenario(OSS, ["hardware.kernels=datasheet"]))
    m, hw, kv = ctx.model, ctx.hw, ctx.kv_bytes_per_token_layer
    assert hw.window_decode is not None and "window decode attention at head dim 64" in hw.sources["window_decode"]
    b, n = 32, 2047
    kv_bytes = (b * n + b) * kv
    full = replace(hw, window_decode=None)
    fit = catalog.fitted_kernels()["h200-sxm"].window_attention[64]
    # full layers as before; the 18 window layers' call by hand on the window fit
    only_full = decode_attention_s(replace(m, layer_kinds=("full",) * 36), full, b, b * n, (b * n + b) * 2 * 8 * 64 * 2,
                                   2 * 8 * 64 * 2.0)
    got = decode_attention_s(m, hw, b, b * n, kv_bytes, kv)
    assert got == pytest.approx((18 * only_full + 18 * _by_hand(fit, b, 8, n, 128, 64)) / 36, rel=1e-9)
    arrays = decode_attention_s(m, hw, np.array([b, b]), np.array([b * n, b * n]), np.array([kv_bytes, kv_bytes]), kv)
    assert arrays.tolist() == pytest.approx([got, got], rel=1e-9)
    assert decode_attention_s(m, full, b, b * n, kv_bytes, kv) < got  # the decode fit over 128 tokens is too fast


def test_the_window_fit_stands_down_where_it_does_not_apply():
    measured = build_context(load_scenario(OSS, ["hardware.kernels=measured"]))
    assert measured.hw.window_decode is None and "window_decode" not in measured.hw.sources
    pinned = build_context(load_scenario(OSS, ["hardware.kernels=datasheet",
                                               "hardware.efficiency.attention_latency_s=0.00001"]))
    assert pinned.hw.window_decode is None
    assert pinned.hw.sources["window_decode"].startswith("datasheet: the decode fit's figures over the window")
    assert window_decode(H200, EfficiencyCfg(), "vllm", 96).value is None  # no table times head dim 96
    assert window_decode(catalog.gpu("a100-80gb-sxm"), EfficiencyCfg(), "vllm", 64).value is None  # nor A100's


def test_ops_prices_a_window_decode_as_the_step_does():
    fit = catalog.fitted_kernels()["h200-sxm"].window_attention[64]
    op = datasheet_cost("h200-sxm", DecodeAttention(64, 2048, 64, 8, 64, "bf16", window=128))
    assert op.seconds == pytest.approx(_by_hand(fit, 64, 8, 2048, 128, 64), rel=1e-12)
    assert op.source == "datasheet: physics.window_datasheet_attention_s (the window fit at head dim 64)"
    other = datasheet_cost("h200-sxm", DecodeAttention(64, 2048, 64, 8, 96, "bf16", window=128))
    assert other.source.endswith("over the window")  # no window fit at head dim 96: the decode fit's
