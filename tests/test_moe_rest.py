"""The GEMMs around a mixture of experts' routed experts on measured tables (sim/device/moe_mla_costs.py
`measured_moe_rest_s`): a GQA model's attention projections, router, shared expert and dense MLP layers take
the measured GEMM tables as a dense model's do, each over its own rows; MLA models and formats without a
table keep the datasheet weight kernel, and the sources say which."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from sim.decode.context import build_context
from sim.device.moe_mla_costs import measured_moe_rest_s, measured_moe_s, moe_quant, moe_rest_gemms, source_line
from sim.device.physics import rank_rows, weight_gemm_s, weight_kernel_s
from sim.inputs import catalog
from sim.inputs.kernel_tables import tables_available
from sim.inputs.scenario import load_scenario
from sim.model.dtypes import WEIGHT_DTYPES

from .conftest import SCENARIOS

NEEDS_TABLES = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (.[measured]) not installed")
GPT_OSS = ["model.name=gpt-oss-120b", "model.expert_weight_dtype=mxfp4", "engine.name=tensorrt-llm"]
QWEN_DEP4 = ["model.name=qwen3-235b-a22b", "model.weight_dtype=fp8", "parallel.tp=4", "parallel.ep=4",
             "parallel.attention_dp=4", "engine.name=tensorrt-llm"]


def _ctx(*overrides: str):
    return build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", list(overrides)))


def _table_s(kernels, m: int, n: int, k: int, fmt: str) -> float:
    return float(kernels.gemm_s(m, n, k, fmt).seconds[0])


def _datasheet_call_s(hw, m: int, n: int, k: int, fmt: str) -> float:
    """One GEMM call by the datasheet weight kernel: n x k weights in `fmt` (groups of 128), 2 m n k FLOP."""
    return weight_gemm_s(hw, WEIGHT_DTYPES[fmt].bytes_for(n * k, 128), n * k, 2 * m * n * k, m, 1, ((n, k),))


def test_the_gemms_around_the_experts_by_hand():
    """Llama-4 Maverick at TP2, fp8: 40 query and 8 KV heads of 128 split in two, hidden 5,120; the router
    (5,120 -> 128 experts, bf16) and the shared expert (8,192 wide, split in two) in its 24 MoE layers of 48, a
    dense MLP (16,384 wide, split in two) in the other 24."""
    m = catalog.model("llama-4-maverick").shard(2)
    assert moe_rest_gemms(m, "fp8") == (
        (20 * 128 + 2 * 4 * 128, 5120, "fp8", True, 1.0), (5120, 20 * 128, "fp8", True, 1.0),
        (128, 5120, "bf16", True, 0.5),
        (2 * 4096, 5120, "fp8", False, 0.5), (5120, 4096, "fp8", False, 0.5),
        (2 * 8192, 5120, "fp8", False, 0.5), (5120, 8192, "fp8", False, 0.5))


def test_an_mla_model_keeps_the_datasheet_rest():
    assert moe_rest_gemms(catalog.model("deepseek-r1"), "fp8") is None


@NEEDS_TABLES
def test_a_measured_gqa_moe_layer_is_its_experts_plus_the_gemm_tables():
    """gpt-oss-120b on one H200 under TensorRT-LLM (bf16 attention, MXFP4 experts): the mean layer at 1,024 rows is
    the fused-experts table plus qkv (64 x 64 + 2 x 8 x 64 = 5,120 outputs), o and the router (2,880 -> 128) from
    the bf16 GEMM table at the same rows."""
    ctx = _ctx("hardware.kernels=measured", *GPT_OSS)
    m, hw = ctx.model, ctx.hw
    quant = moe_quant(m, hw, "bf16", 128)
    assert quant == "w4a16_mxfp4" and m.attention_dp == 1
    rows, k = 1024, hw.kernels
    rest = (_table_s(k, rows, 5120, 2880, "bf16") + _table_s(k, rows, 2880, 4096, "bf16")
            + _table_s(k, rows, 128, 2880, "bf16"))
    assert measured_moe_rest_s(m, hw, "bf16", rows, rows) == pytest.approx(rest, rel=1e-12)
    assert weight_kernel_s(m, hw, "bf16", 128, rows) == pytest.approx(rest + measured_moe_s(m, hw, quant, rows),
                                                                       rel=1e-12)
    said = source_line(m, hw, "bf16", 128, "bf16")
    assert "the layer's other GEMMs (attention projections, router) measured: the GEMM tables (bf16)" in said


@NEEDS_TABLES
def test_under_attention_data_parallelism_each_rank_multiplies_its_own_tokens():
    """Qwen3-235B fp8 at DEP4 on H200: 1,001 rows of the group run the projections and the router over the busiest
    rank's ceil(1,001 / 4) = 251 (whole attention weights: 64 x 128 query and 4 x 128 KV a rank, hidden 4,096)."""
    ctx = _ctx("hardware.kernels=measured", *QWEN_DEP4)
    m, hw = ctx.model, ctx.hw
    assert m.attention_dp == 4 and rank_rows(m, 1001) == 251
    k, r = hw.kernels, 251
    rest = (_table_s(k, r, 8192 + 2 * 512, 4096, "fp8") + _table_s(k, r, 4096, 8192, "fp8")
            + _table_s(k, r, 128, 4096, "bf16"))
    assert measured_moe_rest_s(m, hw, "fp8", 1001, rank_rows(m, 1001)) == pytest.approx(rest, rel=1e-12)
    quant = moe_quant(m, hw, "fp8", 128)
    assert weight_kernel_s(m, hw, "fp8", 128, 1001) == pytest.approx(rest + measured_moe_s(m, hw, quant, 1001),
                                                                     rel=1e-12)


@NEEDS_TABLES
def test_a_format_without_a_gemm_table_keeps_the_datasheet_rest_and_says_so():
    """int4 attention projections (no int4 GEMM table): the rest takes the datasheet weight kernel, one call per GEMM
    in its format (`physics.datasheet_moe_rest_s`), the experts still the fused-experts table."""
    ctx = _ctx("hardware.kernels=measured", *GPT_OSS)
    m, hw = replace(ctx.model, attention_weight_dtype="int4"), ctx.hw
    assert "int4" not in hw.kernels.gemm_dtypes()
    assert measured_moe_rest_s(m, hw, "bf16", 1024, 1024) is None
    quant = moe_quant(m, hw, "bf16", 128)
    rows = 1024
    rest = sum(_datasheet_call_s(hw, rows, n, k, fmt) for n, k, fmt in
               ((5120, 2880, "int4"), (2880, 4096, "int4"), (128, 2880, "bf16")))
    assert weight_kernel_s(m, hw, "bf16", 128, rows) == pytest.approx(rest + measured_moe_s(m, hw, quant, rows),
                                                                       rel=1e-12)
    assert "the layer's other GEMMs datasheet (no measured GEMM table for int4)" in source_line(m, hw, "bf16", 128,
                                                                                                "bf16")


def test_datasheet_mode_takes_no_table():
    ctx = _ctx("hardware.kernels=datasheet", *GPT_OSS)
    assert ctx.hw.kernels is None
    assert measured_moe_rest_s(ctx.model, ctx.hw, "bf16", 1024, 1024) is None
    assert math.isfinite(weight_kernel_s(ctx.model, ctx.hw, "bf16", 128, 1024))
