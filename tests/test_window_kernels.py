"""Layer kinds on the measured attention tables (issue #20: the tables drive what they cover). A model of
full, sliding-window and chunked layers takes its prefill attention from the context-attention table
kind by kind (`kinds_prefill.measured_kinds_prefill_s`), a window layer's decode from the table's rows
of that window (`physics._measured_window_s`); the window slices' rooflines count the window's tokens,
and their decode grids carry a ratio along the tokens past the window (`kernel_grid.fill_past_window`)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.device.kernel_grid import fill_past_window
from sim.device.kinds_prefill import measured_kinds_prefill_s
from sim.device.measured_kernels import attention_roofline_s, context_roofline_s, measured_kernels_for, windowed_tokens
from sim.device.physics import decode_attention_s, measured_prefill_attention_s, prefill_attention_s
from sim.inputs.kernel_tables import load_tables, tables_available
from sim.inputs.scenario import load_scenario
from sim.model.layers import window_pairs

from .conftest import SCENARIOS, run_cli

OSS = SCENARIOS / "serving-h200-gpt-oss-120b.yaml"  # vLLM's tables (no engine section), bf16 KV


def test_window_pairs_and_tokens_by_hand():
    assert window_pairs(100, 0) == 100 * 101 / 2
    assert window_pairs(100, 128) == 100 * 101 / 2  # inside the window: causal as full attention
    assert window_pairs(1000, 128) == 128 * 129 / 2 + 872 * 128  # then W keys a token
    assert window_pairs(1000, 128) == sum(min(i, 128) for i in range(1, 1001))
    assert windowed_tokens(1000, 128) == 128 and windowed_tokens(100, 128) == 100 and windowed_tokens(1000, 0) == 1000


def test_window_rooflines_count_the_window():
    # decode: 4 H d b min(n, W) FLOP; the KV read of min(n, W) tokens
    flop_bound = attention_roofline_s(2, 1000, 8, 1, 64, 2.0, 1.0, 1e30, window=128)
    assert flop_bound == pytest.approx(4 * 8 * 64 * 2 * 128)
    assert attention_roofline_s(2, 1000, 8, 1, 64, 2.0, 1.0, 1e30) == pytest.approx(4 * 8 * 64 * 2 * 1000)
    # prefill: 4 H d b pairs; past the window the pairs grow by W a token
    prefill = context_roofline_s(1, 1000, 8, 1, 64, 2.0, 1.0, 1e30, window=128)
    assert prefill == pytest.approx(4 * 8 * 64 * window_pairs(1000, 128))


def test_past_the_window_a_row_carries_its_ratio_along_the_tokens():
    nan = np.nan
    grid = np.log(np.array([[[2.0, 3.0, 4.0, nan, nan],      # batch 1: measured to index 2
                             [5.0, 6.0, nan, nan, nan]]]))   # batch 2: measured to index 1
    out = np.exp(fill_past_window(grid, window_index=2))
    assert out[0, 0].tolist() == pytest.approx([2, 3, 4, 4, 4])  # the last measured past the window
    # batch 2 has nothing measured past the window, so its own 6 is not carried: the cold side's fill takes
    # the smallest of the nearest cells below (batch 1's 4 at the same tokens, its own 6 before them)
    assert out[0, 1].tolist() == pytest.approx([5, 6, 4, 4, 4])


needs_tables = pytest.mark.skipif(not tables_available(),
                                  reason="aiconfigurator-core (the .[measured] extra) not installed")


def _raw(framework: str, window: int, batch: int, tokens: int, table: str = "context") -> float:
    t = load_tables("h200-sxm", framework)
    c = t.context_attention if table == "context" else t.decode_attention
    hit = c[(c.kv_dtype == "bf16") & (c.kv_heads == 8) & (c.head_dim == 64) & (c.heads == 64) & (c.window == window)
            & (c.batch == batch) & (c.kv_tokens == tokens)]
    assert len(hit) == 1
    return float(hit["latency_s"].iloc[0])


@needs_tables
def test_gpt_oss_prefill_is_its_full_and_window_rows_at_a_measured_point():
    ctx = build_context(load_scenario(OSS, ["hardware.kernels=measured"]))
    m, kv = ctx.model, ctx.kv_bytes_per_token_layer
    P = 2048  # one whole prompt: 2048 x 2049 / 2 pairs, the equivalent length 2048 exactly
    got = measured_prefill_attention_s(m, ctx.hw, P * (P + 1) / 2, 1, kv)
    assert got == pytest.approx((18 * _raw("vllm", 0, 1, P) + 18 * _raw("vllm", 128, 1, P)) / 36, rel=1e-9)
    assert prefill_attention_s(m, ctx.hw, P * (P + 1) / 2, P, kv, 1) == got
    assert ctx.hw.sources["prefill_attention"].endswith(
        "kind by kind: 18 full layers at the chunks' equivalent prompt length, 18 window layers on the table's rows "
        "of window 128")


@needs_tables
def test_chunked_layers_prefill_as_whole_chunks_and_the_rest():
    ctx = build_context(load_scenario(OSS, ["hardware.kernels=measured", "model.name=llama-4-maverick",
                                            "model.expert_weight_dtype=bf16", "parallel.tp=8"]))
    m, k = ctx.model, ctx.hw.kernels
    assert m.kind_counts == {"full": 12, "chunked": 36} and m.attention_chunk == 8192

    def one(b, n):
        return k.context_attention_one_s(b, n, m.num_heads, m.num_kv_heads, m.head_dim, "bf16")
    P = 20000  # two whole chunks of 8192 and 3616
    by_hand = (12 * one(2, P) + 36 * (one(2 * 2, 8192) + one(2, 3616))) / 48
    assert measured_kinds_prefill_s(m, k, P, 2, "bf16") == pytest.approx(by_hand, rel=1e-12)
    assert measured_kinds_prefill_s(m, k, 4096, 2, "bf16") == pytest.approx(one(2, 4096), rel=1e-12)  # one chunk


@needs_tables
def test_the_datasheet_where_the_table_lacks_a_kind_or_the_window():
    nxt = build_context(load_scenario(OSS, ["hardware.kernels=measured", "model.name=qwen3-next-80b-a3b"]))
    assert measured_prefill_attention_s(nxt.model, nxt.hw, 1e6, 2, nxt.kv_bytes_per_token_layer) is None
    assert nxt.hw.sources["prefill_attention"] == (
        "datasheet: physics.prefill_attention_s (the context-attention table has full, window and chunked layers "
        "only, not 12 full + 36 linear)")
    oss = build_context(load_scenario(OSS, ["hardware.kernels=measured"]))
    other_window = replace(oss.model, sliding_window=4096)  # no table times a 4096-token window at these heads
    assert measured_kinds_prefill_s(other_window, oss.hw.kernels, 3000, 2, "bf16") is None
    int8 = build_context(load_scenario(OSS, ["hardware.kernels=measured", "model.kv_dtype=int8"]))
    assert "has no rows of window 128 at KV int8), window layers on their own fit" in int8.hw.sources["prefill_attention"]


@needs_tables
def test_a_window_layer_decodes_on_its_windows_rows():
    ctx = build_context(load_scenario(OSS, ["hardware.kernels=measured"]))
    m, hw, kv = ctx.model, ctx.hw, ctx.kv_bytes_per_token_layer
    k = hw.kernels
    b, n = 32, 2047  # a measured point of both slices
    full = k.decode_attention_one_s(b, n, 64, 8, 64, "bf16")
    window = _raw("vllm", 128, b, n, "decode")
    assert k.decode_attention_one_s(b, n, 64, 8, 64, "bf16", window=128) == pytest.approx(window, rel=1e-9)
    kv_bytes = (b * n + b) * kv  # the mean layer's bytes, as the engines pass them
    got = decode_attention_s(m, hw, b, b * n, kv_bytes, kv)
    assert got == pytest.approx((18 * full + 18 * window) / 36, rel=1e-9)
    arrays = decode_attention_s(m, hw, np.array([b, b]), np.array([b * n, b * n]), np.array([kv_bytes, kv_bytes]), kv)
    assert arrays.tolist() == pytest.approx([got, got], rel=1e-9)


@needs_tables
def test_past_its_measured_tokens_a_window_decode_stays_flat():
    trt = measured_kernels_for("h200-sxm", "trtllm")
    at = [trt.decode_attention_one_s(512, n, 64, 8, 64, "bf16", window=128) for n in (255, 1500, 20000)]
    # the table's 512-sequence window rows stop at 255 cached tokens; past the window the work does not grow
    assert at[0] == pytest.approx(_raw("trtllm", 128, 512, 255, "decode"), rel=1e-9)
    assert at[1] == pytest.approx(at[0], rel=1e-9) and at[2] == pytest.approx(at[0], rel=1e-9)


def test_datasheet_window_layers_prefill_on_their_own_fit_by_hand():
    """floor + max(4 H d x the window's pairs / (peak x efficiency x w / (w + half_tokens) x tiles / (tiles +
    half_tiles)), K/V bytes / attention HBM) + new tokens x KV heads x cache write, w = min(n, W), the window
    fit's figures (fitted_kernels.yaml window_prefill); the full layers keep the head-dim-128 fit's call."""
    from sim.device.physics import datasheet_prefill_attention_s, prompts_attention_s
    from sim.inputs import catalog

    ctx = build_context(load_scenario(OSS, ["hardware.kernels=datasheet"]))
    m, hw, kv = ctx.model, ctx.hw, ctx.kv_bytes_per_token_layer
    fit = catalog.fitted_kernels()["h200-sxm"].window_prefill["bf16"]
    seqs, n = 2, 3000
    S = seqs * n * (n + 1) / 2
    flop = 4 * 64 * 64 * seqs * (128 * 129 / 2 + (n - 128) * 128)
    tiles = seqs * 64 * math.ceil(n / 128)
    rate = (hw.gpu.bf16_flop_per_s * fit.flop_efficiency * 128 / (128 + fit.half_tokens)
            * tiles / (tiles + fit.half_tiles))
    written = seqs * n * 2 * 8 * 64 * 2
    window = fit.floor_s + max(flop / rate, written / hw.attention_hbm_bytes_per_s) + seqs * n * 8 * fit.kv_write_s
    full = datasheet_prefill_attention_s(hw, 4 * 64 * 64 * S, written, n, seqs, seqs * n, 64, 8, False, 64)
    got = prefill_attention_s(m, hw, S, seqs * n, kv, seqs)
    assert got == pytest.approx((18 * full + 18 * window) / 36, rel=1e-9)
    assert prompts_attention_s(m, hw, seqs, n, kv) == pytest.approx(got, rel=1e-12)  # a closed batch's whole prompts
    assert hw.prefill_attention_shape.window_said.startswith("window layers on their own fit")


def test_ops_prices_a_window_as_the_step_does():
    from sim.device.kernels import PrefillAttention, datasheet_cost
    from sim.device.physics import _window_prefill_s

    ctx = build_context(load_scenario(OSS, ["hardware.kernels=datasheet"]))
    op = datasheet_cost("h200-sxm", PrefillAttention(2, 3000, 64, 8, 64, "bf16", window=128))
    # `kvsim ops prefill --window 128` is the step's call of one window layer
    step = _window_prefill_s(ctx.model, ctx.hw, 2 * 3000 * 3001 / 2, 3000, 2, 6000, ctx.kv_bytes_per_token_layer)
    assert op.seconds == pytest.approx(step, rel=1e-12) and "the window fit" in op.source


def test_window_prompt_tokens_inverts_the_pairs():
    from sim.model.layers import window_prompt_tokens

    for n in (1, 50, 128, 129, 1000, 20000):
        assert window_prompt_tokens(window_pairs(n, 128), 128) == pytest.approx(n, rel=1e-12)


@needs_tables
def test_a_chunk_behind_a_prefix_asks_a_window_layer_for_its_own_tokens():
    from sim.model.layers import window_prompt_tokens

    ctx = build_context(load_scenario(OSS, ["hardware.kernels=measured"]))
    m, k = ctx.model, ctx.hw.kernels
    c, prefix = 2048, 30000  # one chunk of 2,048 new tokens behind 30,000 computed ones
    S = c * prefix + c * (c + 1) / 2
    n = (math.sqrt(1 + 8 * S) - 1) / 2  # the full layers' equivalent whole prompt (~11,300 tokens)
    full = k.context_attention_one_s(1, n, 64, 8, 64, "bf16")
    # the window layers attend W keys a new token: the prompt that attends c x W pairs, ~2,111 tokens
    window = k.context_attention_one_s(1, window_prompt_tokens(c * 128, 128), 64, 8, 64, "bf16", window=128)
    got = measured_prefill_attention_s(m, ctx.hw, S, 1, ctx.kv_bytes_per_token_layer, new_tokens=c)
    assert got == pytest.approx((18 * full + 18 * window) / 36, rel=1e-12)
    assert got < measured_prefill_attention_s(m, ctx.hw, S, 1, ctx.kv_bytes_per_token_layer)  # new tokens unknown


@needs_tables
def test_a_chunk_behind_a_prefix_asks_a_chunked_layer_for_at_most_c_keys_a_token():
    ctx = build_context(load_scenario(OSS, ["hardware.kernels=measured", "model.name=llama-4-maverick",
                                            "model.expert_weight_dtype=bf16", "parallel.tp=8"]))
    m, k = ctx.model, ctx.hw.kernels

    def one(b, n):
        return k.context_attention_one_s(b, n, m.num_heads, m.num_kv_heads, m.head_dim, "bf16")

    c, prefix = 2048, 30000
    S = c * prefix + c * (c + 1) / 2
    n = (math.sqrt(1 + 8 * S) - 1) / 2  # ~11,300: one whole chunk and ~3,100 as the equivalent prompt
    # 2,048 new tokens attend at most 2,048 x 8,192 pairs in a chunked layer: no whole chunk, one prompt of
    # r tokens with r (r + 1) / 2 = that, ~5,793
    r = (math.sqrt(1 + 8 * c * 8192) - 1) / 2
    by_hand = (12 * one(1, n) + 36 * one(1, r)) / 48
    assert measured_kinds_prefill_s(m, k, n, 1, "bf16", new_tokens=c) == pytest.approx(by_hand, rel=1e-12)
    whole = n // 8192
    assert measured_kinds_prefill_s(m, k, n, 1, "bf16") == pytest.approx(
        (12 * one(1, n) + 36 * (one(whole, 8192) + one(1, n - whole * 8192))) / 48, rel=1e-12)


def test_the_datasheet_bounds_a_chunked_layers_pairs_by_c_keys_a_new_token():
    from sim.device.physics import _bounded_prefill_flop, kind_attention_flop_per_token
    from sim.inputs import catalog

    m = catalog.model("llama-4-maverick")
    c, prefix = 2048, 30000
    S = c * prefix + c * (c + 1) / 2
    per_pair = kind_attention_flop_per_token(m, "chunked")
    capped = _bounded_prefill_flop(m, S, prefix + c, 1, new_tokens=c)
    assert capped == pytest.approx(36 * per_pair * c * 8192 / 48, rel=1e-12)
    n = (math.sqrt(1 + 8 * S) - 1) / 2  # without the new tokens: the equivalent whole prompt's chunk pairs
    whole = n // 8192
    uncapped = 36 * per_pair * (whole * 8192 * 8193 / 2 + (n - whole * 8192) * (n - whole * 8192 + 1) / 2) / 48
    assert _bounded_prefill_flop(m, S, prefix + c, 1) == pytest.approx(uncapped, rel=1e-9)


@needs_tables
def test_kvsim_ops_asks_a_window(tmp_path):
    res = run_cli("ops", "attention", "--batch", "32", "--kv-tokens", "2047", "--heads", "64", "--kv-heads", "8",
                  "--head-dim", "64", "--window", "128", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["measured_s"] == pytest.approx(_raw("vllm", 128, 32, 2047, "decode"), rel=1e-9)
    assert out["measured_inside"] and "the window fit at head dim 64" in out["datasheet_source"]
    src = tmp_path / "ops.csv"
    src.write_text("op,batch,kv_tokens,heads,kv_heads,head_dim,window\nprefill,1,2048,64,8,64,128\n")
    res = run_cli("ops", "--csv", str(src), "--kernels", "measured")
    assert res.returncode == 0, res.stderr
    header, row = res.stdout.splitlines()[:2]
    got = dict(zip(header.split(","), row.split(",")))
    assert float(got["measured_s"]) == pytest.approx(_raw("vllm", 128, 1, 2048), rel=1e-9)
    bad = run_cli("ops", "attention", "--batch", "1", "--kv-tokens", "9", "--heads", "8", "--kv-heads", "8",
                  "--head-dim", "64", "--window", "-1")
    assert bad.returncode == 2 and "window" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_kernel_that_masks_the_window_prefills_the_whole_causal_prompt():
    """SGLang's L40S window rows fit a kernel that masks the key tiles outside the window (`skips_window`
    false): the datasheet asks the window fit for the whole causal prompt's pairs at n's rate."""
    from sim.device.kernels import PrefillAttention, datasheet_cost, datasheet_hardware
    from sim.device.physics import datasheet_prefill_attention_s
    from sim.inputs import catalog

    assert not catalog.fitted_kernels_for("l40s", "sglang").window_prefill["bf16"].skips_window
    assert catalog.fitted_kernels_for("l40s", "trtllm").window_prefill["bf16"].skips_window
    hw = datasheet_hardware("l40s", framework="sglang")
    got = datasheet_cost("l40s", PrefillAttention(2, 3000, 64, 8, 64, "bf16", window=128), framework="sglang").seconds
    want = datasheet_prefill_attention_s(hw, 4 * 64 * 64 * 2 * 3000 * 3001 / 2, 2 * 3000 * 2 * 8 * 64 * 2, 3000, 2, 6000,
                                         64, 8, False, 64, window=True)
    assert got == pytest.approx(want, rel=1e-12)


def test_window_prefill_work_by_hand_for_a_skipping_and_a_masking_kernel():
    """A prompt of 300 tokens under a window of 128: a kernel that skips the tiles outside the window attends
    128 x 129 / 2 + 172 x 128 pairs at a 128-token key loop; one that masks them the whole 300 x 301 / 2 at 300.
    Arrays of prompts and windows (the fit script's rows) give the same figures."""
    from sim.model.layers import window_prefill_work

    assert window_prefill_work(300, 128, True) == (128 * 129 / 2 + 172 * 128, 128)
    assert window_prefill_work(300, 128, False) == (300 * 301 / 2, 300)
    pairs, length = window_prefill_work(np.array([100.0, 300.0]), np.array([128.0, 128.0]), True)
    assert pairs.tolist() == [100 * 101 / 2, 128 * 129 / 2 + 172 * 128] and length.tolist() == [100, 128]
