"""Prefill (context) attention from the measured tables (issue #20: prefill attention was datasheet
only, -74% at ISL <= 1024 and +35% above): AIConfigurator's `context_attention_perf` - one layer's
causal attention of `batch_size` prompts of `isl` tokens, heads per GPU, ms - read per engine,
interpolated as the decode table is, and used by a step's prefill chunks and a closed batch's prefill."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from sim.decode.context import build_context
from sim.device.measured_kernels import context_roofline_s, measured_kernels_for
from sim.device.physics import measured_prefill_attention_s, prefill_attention_s, prefill_s, prompts_attention_s
from sim.inputs.kernel_tables import load_tables, tables_available
from sim.inputs.scenario import load_scenario
from sim.model.units import ATTN_MATMULS, FLOP_PER_MAC

from .conftest import SCENARIOS

pytestmark = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (the .[measured] extra) not installed")
SERVING = SCENARIOS / "serving-h100-70b-tp4.yaml"


def _row(gpu: str, heads: int, batch: int, isl: int, framework: str = "vllm") -> float:
    c = load_tables(gpu, framework).context_attention
    hit = c[(c.kv_dtype == "bf16") & (c.kv_heads == 8) & (c.head_dim == 128) & (c.window == 0) & (c.heads == heads)
            & (c.batch == batch) & (c.kv_tokens == isl)]
    assert len(hit) == 1
    return float(hit["latency_s"].iloc[0])


def test_at_a_measured_point_the_answer_is_the_measurement():
    mk = measured_kernels_for("h200-sxm")
    assert mk.context_attention_one_s(1, 1024, 64, 8, 128) == pytest.approx(_row("h200-sxm", 64, 1, 1024), rel=1e-9)
    assert mk.context_attention_one_s(2, 512, 32, 8, 128) == pytest.approx(_row("h200-sxm", 32, 2, 512), rel=1e-9)
    trt = measured_kernels_for("h200-sxm", "trtllm")  # each engine's own table
    assert trt.context_attention_one_s(1, 1024, 64, 8, 128) == pytest.approx(_row("h200-sxm", 64, 1, 1024, "trtllm"), rel=1e-9)


def _raw(system: str, framework: str, attn: str, kv: str, isl: int) -> float:
    """A row of the package's own parquet (ms -> s): RTX PRO 6000, Qwen3-30B-A3B's 32 / 4 heads of 128."""
    import aiconfigurator_core

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system / "attention" / framework
    df = pd.read_parquet(next(root.glob("*/context_attention_perf.parquet")))
    hit = df[(df.attn_dtype == attn) & (df.kv_cache_dtype == kv) & (df.num_heads == 32) & (df.num_key_value_heads == 4)
             & (df.head_dim == 128) & (df.window_size == 0) & (df.batch_size == 1) & (df.isl == isl) & (df.step == 0)]
    return float(hit["latency"].iloc[0]) * 1e-3


def test_tensorrt_llm_prefills_an_fp8_kv_cache_with_fp8_context_fmha():
    # thop attentionOp.cpp: mFP8ContextFMHA = is_fp8_out || is_fp4_out || (fp8 KV && paged context FMHA); the
    # table's fp8-attention rows are that kernel, ~1.9x its bf16 rows on the RTX PRO 6000 (sm_120)
    trt = measured_kernels_for("rtx-pro-6000-server", "trtllm")
    fp8 = _raw("rtx_pro_6000_server", "trtllm", "fp8", "fp8", 16384)
    assert trt.context_attention_one_s(1, 16384, 32, 4, 128, "fp8") == pytest.approx(fp8, rel=1e-9)
    assert fp8 < 0.6 * _raw("rtx_pro_6000_server", "trtllm", "bfloat16", "fp8", 16384)
    # a bf16 KV cache keeps the bf16 rows
    bf16 = _raw("rtx_pro_6000_server", "trtllm", "bfloat16", "bfloat16", 16384)
    assert trt.context_attention_one_s(1, 16384, 32, 4, 128, "bf16") == pytest.approx(bf16, rel=1e-9)


def test_the_roofline_by_hand():
    # 1 prompt of 4 tokens, 2 heads of 8, 1 KV head, bf16: FLOP 4 x 2 x 8 x (1+2+3+4) = 640;
    # bytes 4 tokens x (K and V: 2 x 1 x 8 x 2 B + Q and O: 2 x 2 x 8 x 2 B) = 4 x (32 + 64) = 384
    assert ATTN_MATMULS * FLOP_PER_MAC == 4
    assert context_roofline_s(1, 4, 2, 1, 8, 2.0, 640.0, 1e30) == pytest.approx(1.0)
    assert context_roofline_s(1, 4, 2, 1, 8, 2.0, 1e30, 384.0) == pytest.approx(1.0)


def test_a_steps_chunks_take_the_equivalent_prompt_length():
    ctx = build_context(load_scenario(SERVING, ["model.name=llama-3.1-70b", "parallel.tp=1", "hardware.gpu=h200-sxm",
                                                "hardware.kernels=measured"]))
    kv = ctx.kv_bytes_per_token_layer
    one = prefill_attention_s(ctx.model, ctx.hw, 1024 * 1025 / 2, 1024, kv, seqs=1)  # a whole prompt of 1024
    assert one == pytest.approx(_row("h200-sxm", 64, 1, 1024), rel=1e-9)
    two = prefill_attention_s(ctx.model, ctx.hw, 2 * 512 * 513 / 2, 1024, kv, seqs=2)  # two of 512
    assert two == pytest.approx(ctx.hw.kernels.context_attention_one_s(2, 512, 64, 8, 128), rel=1e-12)
    # a chunk of 512 behind a computed prefix of 512 attends sum 513..1024 pairs: the length n with n (n + 1) / 2 of them
    pairs = 512 * 512 + 512 * 513 / 2
    n = (math.sqrt(1 + 8 * pairs) - 1) / 2
    assert prefill_attention_s(ctx.model, ctx.hw, pairs, 1024, kv, seqs=1) == pytest.approx(
        ctx.hw.kernels.context_attention_one_s(1, n, 64, 8, 128), rel=1e-12)
    assert "context_attention" in ctx.hw.sources["prefill_attention"]
    assert "decode and prefill attention" in ctx.hw.sources["kernels"]


def test_a_closed_batch_prefill_uses_the_table():
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["hardware.kernels=measured"]))
    m, kv = ctx.model, ctx.kv_bytes_per_token_layer
    with_table = prefill_s(m, ctx.hw, "bf16", 128, 4, 1000, kv)
    formula = prefill_s(m, ctx.hw, "bf16", 128, 4, 1000)  # no KV bytes given: the datasheet FLOP rate
    table = ctx.hw.kernels.context_attention_one_s(4, 1000, m.num_heads, m.num_kv_heads, m.head_dim)
    causal = 4 * ATTN_MATMULS * FLOP_PER_MAC * m.num_heads * m.head_dim * 1000 * 1001 / 2
    p = ctx.hw.prefill_attention_shape.bf16  # the fitted rate at 1000 tokens, 4 x 28 heads x 8 query tiles
    tiles = 4 * m.num_heads * 8
    rate = ctx.hw.attention_flop_per_s * 1000 / (1000 + p.half_tokens) * tiles / (tiles + p.half_tiles)
    datasheet = p.floor_s + causal / rate + 4000 * m.num_kv_heads * p.kv_write_s  # one layer: floor + FLOP + cache writes
    assert with_table - formula == pytest.approx(m.num_layers * (table - datasheet), rel=1e-9)


def test_datasheet_where_the_table_does_not_apply():
    plain = build_context(load_scenario(SERVING, ["hardware.kernels=datasheet"]))
    assert measured_prefill_attention_s(plain.model, plain.hw, 1e6, 2, plain.kv_bytes_per_token_layer) is None
    assert "prefill_attention" not in plain.hw.sources
    linear = build_context(load_scenario(SCENARIOS / "serving-h200-gpt-oss-120b.yaml",
                                         ["hardware.kernels=measured", "model.name=qwen3-next-80b-a3b"]))
    assert measured_prefill_attention_s(linear.model, linear.hw, 1e6, 2, linear.kv_bytes_per_token_layer) is None
    assert linear.hw.sources["prefill_attention"].startswith("datasheet")  # (tests/test_window_kernels.py)


def test_the_datasheet_prefill_by_hand():
    """floor + max(FLOP / (bf16 peak x fitted efficiency x n / (n + half_tokens) x tiles / (tiles + half_tiles)),
    K/V bytes / (HBM x attention efficiency)) + new tokens x KV heads x cache write, tiles = b x heads x ceil(n /
    128), each figure fitted per KV dtype on the context tables (fitted_kernels.yaml prefill_attention)."""
    from sim.device.kernels import PrefillAttention, datasheet_cost
    from sim.inputs import catalog

    fit = catalog.fitted_kernels()["h200-sxm"].prefill_attention["bf16"]
    assert 5e-6 < fit.floor_s < 5e-5 and 0.3 < fit.flop_efficiency < 0.8 and 100 < fit.half_tokens < 5000
    gpu = catalog.gpu("h200-sxm")
    b, n, h, hkv, d = 2, 1000, 64, 8, 128
    flop = 4 * h * d * b * n * (n + 1) / 2
    nbytes = b * n * 2 * hkv * d * 2
    a_eff = catalog.fitted_kernels()["h200-sxm"].attention.hbm_efficiency
    tiles = b * h * 8  # ceil(1000 / 128) query tiles per prompt and head
    rate = gpu.bf16_flop_per_s * fit.flop_efficiency * n / (n + fit.half_tokens) * tiles / (tiles + fit.half_tiles)
    by_hand = fit.floor_s + max(flop / rate, nbytes / (gpu.hbm_bytes_per_s * a_eff)) + b * n * hkv * fit.kv_write_s
    assert datasheet_cost("h200-sxm", PrefillAttention(b, n, h, hkv, d)).seconds == pytest.approx(by_hand, rel=1e-12)
    # fp8 KV: its own fit (the cache write quantises), half the K/V bytes
    f8 = catalog.fitted_kernels()["h200-sxm"].prefill_attention["fp8"]
    rate8 = gpu.bf16_flop_per_s * f8.flop_efficiency * n / (n + f8.half_tokens) * tiles / (tiles + f8.half_tiles)
    by_hand8 = f8.floor_s + max(flop / rate8, nbytes / 2 / (gpu.hbm_bytes_per_s * a_eff)) + b * n * hkv * f8.kv_write_s
    assert datasheet_cost("h200-sxm", PrefillAttention(b, n, h, hkv, d, "fp8")).seconds == pytest.approx(by_hand8, rel=1e-12)
    # short prompts run at a lower FLOP rate: per (query, key) pair a 64-token prompt costs more than a 4096-token one
    def pair(p):
        c = datasheet_cost("h200-sxm", PrefillAttention(16, p, h, hkv, d)).seconds
        return (c - fit.floor_s - 16 * p * hkv * fit.kv_write_s) / (p * (p + 1) / 2)

    def tile_share(p):
        t = 16 * h * math.ceil(p / 128)
        return t / (t + fit.half_tiles)

    assert pair(64) / pair(4096) == pytest.approx((64 + fit.half_tokens) / 64 * 4096 / (4096 + fit.half_tokens)
                                                  * tile_share(4096) / tile_share(64), rel=1e-9)
    # a GPU the tables do not cover takes the medians of the fitted ones (efficiency.yaml)
    eff = catalog.efficiency_defaults()
    assert (eff.prefill_attention_floor_s, eff.attention_flop_efficiency) == (1.8e-5, 0.46)


def test_head_dim_64_prefill_runs_at_its_own_share_of_the_rate():
    """gpt-oss's head dim 64: the same form at the fitted head_dim_64_flop_scale x head dim 128's rate, the
    FLOP and bytes of d = 64 (B200's about 0.63: half the FLOP a key pair, about 0.8 of the time)."""
    from sim.device.kernels import PrefillAttention, datasheet_cost
    from sim.inputs import catalog

    fit = catalog.fitted_kernels()["b200"].prefill_attention["bf16"]
    assert 0.5 < fit.head_dim_64_flop_scale < 0.8 and fit.held_out_head_dim_64.median < 0.15
    gpu, a_eff = catalog.gpu("b200"), catalog.fitted_kernels()["b200"].attention.hbm_efficiency
    b, n, h, hkv, d = 1, 8192, 64, 8, 64
    flop, nbytes, tiles = 4 * h * d * b * n * (n + 1) / 2, b * n * 2 * hkv * d * 2, b * h * 64
    rate = (gpu.bf16_flop_per_s * fit.flop_efficiency * fit.head_dim_64_flop_scale * n / (n + fit.half_tokens)
            * tiles / (tiles + fit.half_tiles))
    by_hand = fit.floor_s + max(flop / rate, nbytes / (gpu.hbm_bytes_per_s * a_eff)) + b * n * hkv * fit.kv_write_s
    assert datasheet_cost("b200", PrefillAttention(b, n, h, hkv, d)).seconds == pytest.approx(by_hand, rel=1e-12)
    a100 = catalog.fitted_kernels()["a100-80gb-sxm"].prefill_attention["bf16"]
    assert a100.head_dim_64_flop_scale == 1.0  # its tables time no head dim 64


def test_attention_data_parallel_prefill_waits_for_the_busiest_rank():
    """Under attention data parallelism a step's chunks are spread whole over the ranks and the step
    waits for the rank with ceil(chunks / ranks) of them: one 1,024-token prompt over 4 ranks is one
    rank's whole prompt (the table's call for 1 prompt at that rank's 64 heads, its own KV bytes), 4
    are one each (the same call), 5 put 2 on the busiest rank; a closed batch's prompts alike."""
    ctx = build_context(load_scenario(SERVING, ["model.name=qwen3-235b-a22b", "model.weight_dtype=fp8", "parallel.tp=4",
                                                "parallel.ep=4", "parallel.attention_dp=4", "hardware.gpu=h200-sxm",
                                                "hardware.kernels=measured"]))
    m, kv = ctx.model, ctx.kv_bytes_per_token_layer
    assert (m.attention_dp, m.num_heads, m.num_kv_heads) == (4, 64, 4)  # attention tensor-parallel over 1 GPU
    pairs = 1024 * 1025 / 2
    one_prompt = ctx.hw.kernels.context_attention_one_s(1, 1024, 64, 4, 128, "bf16")
    assert prefill_attention_s(m, ctx.hw, pairs, 1024, kv, seqs=1) == pytest.approx(one_prompt, rel=1e-12)
    assert prefill_attention_s(m, ctx.hw, 4 * pairs, 4096, kv, seqs=4) == pytest.approx(one_prompt, rel=1e-12)
    two = ctx.hw.kernels.context_attention_one_s(2, 1024, 64, 4, 128, "bf16")
    assert prefill_attention_s(m, ctx.hw, 5 * pairs, 5120, kv, seqs=5) == pytest.approx(two, rel=1e-12)
    # a closed batch's whole prompts take the same rule
    assert prompts_attention_s(m, ctx.hw, 4, 1024, kv) == pytest.approx(one_prompt, rel=1e-12)
    assert prompts_attention_s(m, ctx.hw, 5, 1024, kv) == pytest.approx(two, rel=1e-12)
    assert "busiest rank" in ctx.hw.sources["prefill_attention"]
