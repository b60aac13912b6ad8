"""MLA decode and MoE kernel tables (issue #22 item 6): the adapter reads AIConfigurator's
generation_mla and moe tables with its loader's units and keys (one row of each checked against the
raw parquet by hand), the measured calls return the table at its points and say when they stand in
for a shape, the held-out split removes whole lines, and the datasheet comparison runs with finite
errors and its formulas by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from sim.inputs import catalog
from sim.inputs.kernel_tables import moe_quant_for
from sim.studies.moe_mla_accuracy import balanced_rank0


@pytest.fixture(scope="module")
def h200():
    pytest.importorskip("aiconfigurator_core")
    from sim.inputs.kernel_tables import load_tables, with_moe_mla

    return with_moe_mla(load_tables("h200-sxm"))


@pytest.fixture(scope="module")
def mk():
    pytest.importorskip("aiconfigurator_core")
    from sim.device.measured_kernels import measured_kernels_for

    return measured_kernels_for("h200-sxm")


def _raw(path: str) -> pd.DataFrame:
    return _raw_system("h200_sxm", path)


def _raw_system(system: str, path: str) -> pd.DataFrame:
    from sim.inputs.kernel_tables import _package_root

    return pd.read_parquet(_package_root() / "systems" / "data" / system / path)


# ---- the adapter ---------------------------------------------------------------------------------
def test_an_mla_row_reads_as_the_loader_keys_it(h200):
    """TensorRT-LLM's generation_mla row (kv bfloat16, 16 heads, batch 64, isl 1, step 4095, 0.09088 ms)
    is batch 64 attending 4,096 tokens (isl + step: 4,095 cached and the new one) in seconds."""
    raw = _raw("mla/trtllm/1.3.0rc20/generation_mla_perf.parquet")
    r = raw[(raw.kv_cache_dtype == "bfloat16") & (raw.num_heads == 16) & (raw.batch_size == 64) & (raw.step == 4095)]
    assert len(r) == 1 and int(r.isl.iloc[0]) == 1 and float(r.latency.iloc[0]) == pytest.approx(0.09088, rel=1e-6)
    m = h200.mla_decode
    row = m[(m.kv_dtype == "bf16") & (m.heads == 16) & (m.batch == 64) & (m.kv_tokens == 4096)]
    assert len(row) == 1
    assert float(row.latency_s.iloc[0]) == pytest.approx(float(r.latency.iloc[0]) * 1e-3, rel=1e-12)
    assert float(row.latency_s.iloc[0]) == pytest.approx(90.88e-6, rel=1e-6)  # ms in the file, seconds here
    assert not len(m[m.kv_tokens == 4095])  # keyed at isl + step, never at step alone
    assert set(m.kv_dtype) == {"bf16", "fp8"} and set(m.heads) == {1, 2, 4, 8, 16, 32, 64, 128}
    assert "trtllm 1.3.0rc20 generation_mla" in h200.source("generation_mla")


def test_a_moe_row_reads_in_seconds_with_its_shape(h200):
    """vLLM's fused-experts row for DeepSeek-R1's shape at EP8 (fp8_block, 32 tokens, balanced):
    0.378757 ms in the file."""
    raw = _raw("moe/vllm/0.24.0/moe_perf.parquet")
    r = raw[(raw.moe_dtype == "fp8_block") & (raw.num_experts == 256) & (raw.topk == 8) & (raw.hidden_size == 7168)
            & (raw.inter_size == 2048) & (raw.moe_tp_size == 1) & (raw.moe_ep_size == 8)
            & (raw.distribution == "balanced") & (raw.num_tokens == 32)]
    assert len(r) == 1 and float(r.latency.iloc[0]) == pytest.approx(0.378757, rel=1e-6)
    e = h200.moe
    row = e[(e.quant == "fp8_block") & (e.experts == 256) & (e.top_k == 8) & (e.hidden == 7168) & (e.inter == 2048)
            & (e.tp == 1) & (e.ep == 8) & (e.distribution == "balanced") & (e.tokens == 32)]
    assert len(row) == 1
    assert float(row.latency_s.iloc[0]) == pytest.approx(float(r.latency.iloc[0]) * 1e-3, rel=1e-12)
    assert not len(e[(e.tp > 1) & (e.ep > 1)])  # vLLM never splits experts both ways
    assert set(e.quant) <= {"bfloat16", "fp8", "fp8_block", "int4_wo", "w4a16_mxfp4"}
    assert "vllm 0.24.0 moe" in h200.source("moe")


def test_the_families_are_read_only_when_asked_and_existing_tables_are_unchanged():
    pytest.importorskip("aiconfigurator_core")
    from sim.inputs.kernel_tables import load_tables, split_tables, with_moe_mla

    t = load_tables("h100-sxm")
    assert t.mla_decode is None and t.moe is None  # a run of a dense model never reads them
    full = with_moe_mla(t)
    assert len(full.mla_decode) and len(full.moe)
    for a, b in zip(split_tables(t), split_tables(full)):  # the existing tables split as before
        pd.testing.assert_frame_equal(a.gemm, b.gemm)
        pd.testing.assert_frame_equal(a.decode_attention, b.decode_attention)
        assert a.mla_decode.empty and a.moe.empty  # never completed later with the unsplit tables
        assert with_moe_mla(a).mla_decode.empty


def test_held_out_lines_of_mla_and_moe_are_left_out_of_the_tune_split(h200):
    from sim.inputs.kernel_tables import split_tables

    tune, held = split_tables(h200)
    assert set(held.mla_decode.kv_tokens) - set(tune.mla_decode.kv_tokens)
    assert set(held.moe.tokens) - set(tune.moe.tokens) and not set(held.moe.tokens) & set(tune.moe.tokens)
    assert len(tune.mla_decode) + len(held.mla_decode) == len(h200.mla_decode)
    assert len(tune.moe) + len(held.moe) == len(h200.moe)


def test_moe_weight_formats_for_kvtier_dtypes():
    assert moe_quant_for("bf16") == "bfloat16" and moe_quant_for("fp8") == "fp8_block"
    assert moe_quant_for("int4", 32) == "w4a16_mxfp4" and moe_quant_for("int4", 128) == "int4_wo"
    assert moe_quant_for("int8") is None


# ---- the measured calls ----------------------------------------------------------------------------
def test_mla_decode_at_table_points_is_the_table_and_between_is_between(mk, h200):
    m = h200.mla_decode
    t = m[(m.kv_dtype == "fp8") & (m.heads == 16) & (m.batch == 64)].set_index("kv_tokens")["latency_s"]
    got = mk.mla_decode_s(64, [2048, 4096], 16, "fp8")
    np.testing.assert_allclose(got.seconds, [t[2048], t[4096]], rtol=1e-12)
    assert got.inside.all() and got.note == ""
    mid = float(mk.mla_decode_s(64, 3000, 16, "fp8").seconds[0])
    assert min(t[2048], t[4096]) < mid < max(t[2048], t[4096])
    far = mk.mla_decode_s(64, 1_000_000, 16, "fp8")
    assert not far.inside[0] and far.seconds[0] > t[131072]


def test_mla_decode_says_which_slice_stood_in(mk):
    int8 = mk.mla_decode_s(8, 1024, 16, "int8")
    assert not int8.inside[0] and "kv int8" in int8.note and "bf16" in int8.note
    other = mk.mla_decode_s(8, 1024, 16, "bf16", kv_lora_rank=256)
    assert "256 + 64 not measured" in other.note
    assert mk.mla_kv_dtypes() == {"bf16", "fp16", "fp8"}


def test_moe_at_table_points_is_the_table(mk, h200):
    e = h200.moe
    s = e[(e.quant == "fp8_block") & (e.experts == 256) & (e.hidden == 7168) & (e.inter == 2048) & (e.tp == 8)
          & (e.ep == 1) & (e.distribution == "power_law_1.01")].set_index("tokens")["latency_s"]
    got = mk.moe_s([1, 64, 1024], 256, 8, 7168, 2048, tp=8, ep=1, quant="fp8_block", distribution="power_law_1.01")
    np.testing.assert_allclose(got.seconds, [s[1], s[64], s[1024]], rtol=1e-12)
    assert got.inside.all() and "fp8_block" in got.source
    mid = float(mk.moe_s(100, 256, 8, 7168, 2048, 8, 1, "fp8_block", "power_law_1.01").seconds[0])
    assert min(s[96], s[128]) <= mid <= max(s[96], s[128])
    beyond = mk.moe_s(10**6, 256, 8, 7168, 2048, 8, 1, "fp8_block", "power_law_1.01")
    assert not beyond.inside[0] and beyond.seconds[0] > s[16384]


def test_one_query_calls_give_the_array_calls_answer(mk):
    for b, n, h, kv in ((1, 2, 128, "bf16"), (64, 3000, 16, "fp8"), (1024, 10**6, 8, "bf16"), (8, 1024, 16, "int8")):
        assert mk.mla_decode_one_s(b, n, h, kv) == pytest.approx(float(mk.mla_decode_s(b, n, h, kv).seconds[0]), rel=1e-12)
    for t, tp, ep, q in ((1, 8, 1, "fp8_block"), (100, 1, 8, "fp8_block"), (50_000, 8, 1, "bfloat16")):
        one = mk.moe_one_s(t, 256, 8, 7168, 2048, tp, ep, q)
        assert one == pytest.approx(float(mk.moe_s(t, 256, 8, 7168, 2048, tp, ep, q).seconds[0]), rel=1e-12)


@pytest.mark.parametrize("system", ["b200", "gb200"])
def test_blackwell_trtllm_nvfp4_moe_takes_the_cutlass_kernel_at_every_batch(system):
    """TensorRT-LLM's Blackwell NVFP4 table times the CUTLASS fused MoE and trtllm-gen's min-latency kernel
    on the same keys; the engine runs the backend its options name at every batch (CUTLASS by default), so
    the CUTLASS rows are kept at every token count, whichever row the file lists first. Qwen3-30B-A3B's
    experts, one GPU, checked against the parquet."""
    pytest.importorskip("aiconfigurator_core")
    from sim.inputs.kernel_tables import MIN_LATENCY_LANE, load_tables, with_moe_mla

    path = {"b200": "b200_sxm", "gb200": "gb200"}[system]
    raw = _raw_system(path, "moe/trtllm/1.3.0rc20/moe_perf.parquet")
    raw = raw[(raw.moe_dtype == "nvfp4") & (raw.num_experts == 128) & (raw.hidden_size == 2048)
              & (raw.inter_size == 768) & (raw.moe_tp_size == 1) & (raw.moe_ep_size == 1)
              & (raw.distribution == "balanced")]
    lane = raw.set_index(["kernel_source", "num_tokens"])["latency"] * 1e-3
    e = with_moe_mla(load_tables(system, "trtllm")).moe
    assert not (e.kernel == MIN_LATENCY_LANE).any()
    s = e[(e.quant == "nvfp4") & (e.experts == 128) & (e.hidden == 2048) & (e.inter == 768) & (e.tp == 1)
          & (e.ep == 1) & (e.distribution == "balanced")].set_index("tokens")["latency_s"]
    for tokens in (1, 64, 128, 160, 1024):
        assert s[tokens] == lane["moe_torch_flow_cutlass", tokens]
    assert lane["moe_torch_flow_cutlass", 64] > 2 * lane[MIN_LATENCY_LANE, 64]  # what a mix-up costs


def test_non_gated_experts_are_not_loaded():
    """The TensorRT-LLM tables' non-gated lane (Nemotron-H's ReLU^2 experts, 2 h I weights) is another operator
    than kvtier's gated experts (3 h I): none of its rows is loaded, and no gated slice shares its shapes, so no
    lookup of kvtier's loses a row."""
    pytest.importorskip("aiconfigurator_core")
    from sim.inputs.kernel_tables import NONGATED_LANE, load_tables, with_moe_mla

    raw = _raw_system("b200_sxm", "moe/trtllm/1.3.0rc20/moe_perf.parquet")
    assert (raw.kernel_source == NONGATED_LANE).sum() > 0  # the table does time them
    e = with_moe_mla(load_tables("b200", "trtllm")).moe
    assert not (e.kernel == NONGATED_LANE).any()
    ng = raw[raw.kernel_source == NONGATED_LANE][["num_experts", "topk", "hidden_size", "inter_size"]].drop_duplicates()
    for experts, top_k, hidden, inter in ng.itertuples(index=False):  # their shapes: no gated lane times them
        assert not ((e.experts == experts) & (e.top_k == top_k) & (e.hidden == hidden) & (e.inter == inter)).any()


def test_moe_shape_the_table_lacks_takes_the_nearest_and_says_so(mk):
    r = mk.moe_s(32, 256, 8, 7168, 2048, tp=8, ep=1, quant="bfloat16")  # R1 in bf16: not in vLLM 0.24.0's table
    assert not r.inside[0] and "not measured" in r.note and "hidden 7168" in r.note and math.isfinite(r.seconds[0])
    with pytest.raises(KeyError):
        mk.moe_s(32, 256, 8, 7168, 2048, quant="nvfp4")
    assert {"bfloat16", "fp8_block", "w4a16_mxfp4"} <= mk.moe_quants()


def test_a_profile_has_no_mla_or_moe_table():
    from sim.device.kernels import profile_kernels

    from .test_kernels import _own_profile

    own = profile_kernels(_own_profile(), "h200-sxm")
    assert own.mla_kv_dtypes() == set() and own.moe_quants() == set()
    with pytest.raises(KeyError):
        own.mla_decode_s(1, 100, 16)


# ---- the comparison -----------------------------------------------------------------------------
def test_balanced_routing_by_hand():
    """DeepSeek's 256 experts top-8 over EP8 (rank 0 holds experts 0-31): 4 tokens pick 8i + 32j, one
    of them each on rank 0; 32 tokens cover every expert once; one GPU (ep 1) holds all 8 picks."""
    assert balanced_rank0(4, 256, 8, 8) == (4, 4)
    assert balanced_rank0(32, 256, 8, 8) == (32, 32)
    assert balanced_rank0(1, 256, 8, 1) == (8, 8)
    assert balanced_rank0(1024, 256, 8, 8) == (32, 1024)


def test_datasheet_calls_by_hand():
    from sim.device.kernels import datasheet_hardware
    from sim.studies.moe_mla_accuracy import mla_datasheet_s, moe_datasheet_s

    assert datasheet_hardware("h200-sxm").mla_fit is not None
    # R1 at TP8: 16 heads, 2 x 16 x (576 + 512) FLOP and 576 x 2 B per attended token, on the MLA fit
    # (fitted_kernels.yaml mla_attention): 32 sequences x ceil(16 / 64) = 32 blocks
    m = catalog.fitted_kernels()["h200-sxm"].mla_attention
    gpu = catalog.gpu("h200-sxm")
    b, n = 32, 4096
    stream = (b * n + b) * 1152 / (gpu.hbm_bytes_per_s * m.hbm_efficiency * 32 / (32 + m.half_blocks))
    want = m.floor_s + max(stream, 2 * 16 * 1088 * b * n / (gpu.bf16_flop_per_s * m.flop_efficiency))
    assert mla_datasheet_s("h200-sxm", b, n, 16, "bf16") == pytest.approx(want, rel=1e-12)
    # a GPU without the MLA fit keeps the generic form
    rtx = datasheet_hardware("rtx-4090", fit_from=catalog.NO_FIT)
    assert rtx.mla_fit is None
    # qwen3-30b-a3b's experts in bf16 on one GPU, 8 tokens: E (1 - (1 - k/E)^T) experts streamed, 64 pairs
    # routed, at the fused-experts fit (fitted_kernels.yaml moe bfloat16): r = 64 / touched rows per expert
    f = catalog.fitted_kernels()["h200-sxm"].moe["bfloat16"]
    touched = 128 * (1 - (1 - 8 / 128) ** 8)
    expert = 3 * 2048 * 768
    r = 64 / touched
    stream = touched * expert * 2 / (gpu.hbm_bytes_per_s * f.weight_hbm_efficiency)
    mma = 2 * 64 * expert / (gpu.bf16_flop_per_s * f.flop_efficiency * r / (r + f.half_rows))
    moved = (64 * (2048 + 768) * 2 / (gpu.hbm_bytes_per_s * f.pair_hbm_efficiency)
             + 8 * 2048 * 2 / (gpu.hbm_bytes_per_s * f.token_hbm_efficiency))
    want = f.floor_s + touched * f.per_expert_s + max(stream, mma) + moved
    assert moe_datasheet_s("h200-sxm", 8, 128, 8, 2048, 768, 1, 1, "bfloat16") == pytest.approx(want, rel=1e-12)
    # where no MoE table was fitted (A100: its tables time only power-law routing), the dense GEMM model stays
    a100 = datasheet_hardware("a100-80gb-sxm")
    assert a100.moe_fits == ()
    flop = 2 * 8 * 8 * expert
    dense = 2 * a100.gemm_floor_s + max(touched * expert * 2 / a100.weight_hbm_bytes_per_s, flop / a100.gemm_flop_per_s(8))
    assert moe_datasheet_s("a100-80gb-sxm", 8, 128, 8, 2048, 768, 1, 1, "bfloat16") == pytest.approx(dense, rel=1e-12)


def test_a_datasheet_moe_layer_is_its_dense_rest_plus_the_fitted_experts():
    """qwen3-30b-a3b (128 experts, top-8, every layer MoE) in bf16 on one H200, datasheet, routed evenly
    (`moe_routing: balanced`; its power-law default: tests/test_moe_routing.py): the fused-experts fit costs the
    routed experts at 64 tokens, 512 pairs; the rest is the datasheet weight kernel one call a GEMM - qkv
    (32 x 128 + 2 x 4 x 128 outputs), o and the router (2,048 -> 128) - each with its own floor, grid and
    activation terms (`physics.datasheet_moe_rest_s`)."""
    from sim.device.kernels import datasheet_hardware
    from sim.device.moe_fit import datasheet_moe_s
    from sim.device.physics import weight_gemm_s, weight_kernel_s

    m, hw = replace(catalog.model("qwen3-30b-a3b"), moe_routing="balanced"), datasheet_hardware("h200-sxm")
    assert m.moe_layers == m.num_layers and hw.kernels is None
    rows = 64
    rest = sum(weight_gemm_s(hw, 2.0 * n * k, n * k, 2 * rows * n * k, rows, 1, ((n, k),))
               for n, k in ((5120, 2048), (2048, 4096), (128, 2048)))
    expert = 3 * 2048 * 768
    experts = dict(hw.moe_fits)["bfloat16"]
    routed = datasheet_moe_s(experts, m.expected_experts_touched(rows), rows * 8, expert, 2.0, 2048, 768, rows)
    assert weight_kernel_s(m, hw, "bf16", 128, rows) == pytest.approx(rest + routed, rel=1e-12)
    assert routed > 0 and rest > 0


def test_the_comparison_runs_with_finite_errors_and_the_tables_track_the_held_out_points():
    pytest.importorskip("aiconfigurator_core")
    from sim.studies.moe_mla_accuracy import deepseek_summary, held_out_points, sign_pattern, summary

    pts, _ = held_out_points("h200-sxm")
    assert {"mla decode", "moe balanced", "moe power_law_1.01"} <= set(pts.family)
    for col in ("measured_s", "datasheet_s", "tables_s", "datasheet_err", "tables_err"):
        assert np.isfinite(pts[col]).all(), col
    assert (pts["datasheet_s"] > 0).all() and (pts["measured_s"] > 0).all()
    s = summary(pts)
    assert (s.points >= 100).all()
    assert (s.tables_median <= 0.05).all()  # across a held-out gap the tables stay within the 5% goal
    assert len(sign_pattern(pts)) and set(deepseek_summary(pts).layout) == {"TP8", "EP8"}
    bal = pts[pts.family == "moe balanced"]
    assert np.isfinite(bal["routed_err"]).all() and pts.loc[pts.family == "mla decode", "routed_err"].isna().all()


# ---- absorbed MLA's batched matmuls (the engine's mla_bmm table) ------------------------------------
def test_an_mla_bmm_row_reads_in_seconds_and_is_the_answer_at_its_point():
    pytest.importorskip("aiconfigurator_core")
    from sim.device.measured_kernels import measured_kernels_for

    raw = _raw("mla_bmm/trtllm/1.3.0rc20/mla_bmm_perf.parquet")
    r = raw[(raw.op_name == "mla_gen_pre") & (raw.bmm_dtype == "fp8") & (raw.num_tokens == 128) & (raw.num_heads == 128)]
    mk = measured_kernels_for("h200-sxm", "trtllm")
    assert mk.mla_bmm_dtypes() == {"bf16", "fp8"}
    assert mk.mla_bmm_one_s("pre", "fp8", 128, 128) == pytest.approx(float(r.latency.iloc[0]) * 1e-3, rel=1e-9)
    assert measured_kernels_for("h200-sxm", "vllm").mla_bmm_dtypes() == {"bf16"}  # vLLM times torch's bf16 bmm only


def _dpa(engine: str, kernels: str = "measured"):
    from sim.decode.context import build_context
    from sim.inputs.scenario import load_scenario

    from .conftest import SCENARIOS

    over = ["model.name=deepseek-r1", "model.weight_dtype=fp8", "parallel.tp=8", "parallel.ep=8",
            "parallel.attention_dp=8", f"hardware.kernels={kernels}", f"engine.name={engine}"]
    return build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", over))


def test_an_absorbed_decode_runs_kv_b_as_the_engines_bmms_by_hand():
    """DeepSeek-R1 DEP8 under TensorRT-LLM: kv_b (512 x 128 heads x 256 per GPU, every layer MLA) leaves the
    GEMMs - its fp8 bytes, params and one rank's 2 x tokens x params FLOP - and its fp8 block-scaled BMMs
    (pre + post, 130 tokens a rank) come in; vLLM's run them in bf16; a prefill (not absorbed) keeps the GEMM."""
    pytest.importorskip("aiconfigurator_core")
    from dataclasses import replace

    from sim.device.moe_mla_costs import absorbed_bmm_swap
    from sim.device.physics import weight_kernel_s
    from sim.model.dtypes import WEIGHT_DTYPES

    ctx = _dpa("tensorrt-llm")
    m, hw = ctx.model, ctx.hw
    params = 512 * 128 * 256
    swap = absorbed_bmm_swap(m, hw, "fp8", 128, 1040)
    bmm = hw.kernels.mla_bmm_one_s("pre", "fp8", 130, 128) + hw.kernels.mla_bmm_one_s("post", "fp8", 130, 128)
    assert swap == pytest.approx((WEIGHT_DTYPES["fp8"].bytes_for(params, 128), params, 2 * 130 * params, bmm))
    assert 40e-6 < bmm < 100e-6  # TensorRT-LLM's fp8 block-scaled BMMs on Hopper: ~28 + ~35 us at 128 tokens
    assert weight_kernel_s(m, hw, "fp8", 128, 1040, absorbed=True) != weight_kernel_s(m, hw, "fp8", 128, 1040)
    vllm = _dpa("vllm").hw
    assert absorbed_bmm_swap(m, vllm, "fp8", 128, 1040)[3] == pytest.approx(
        vllm.kernels.mla_bmm_one_s("pre", "bf16", 130, 128) + vllm.kernels.mla_bmm_one_s("post", "bf16", 130, 128))
    # datasheet: vLLM's fit of its bf16 BMMs, pre and post alike, by hand
    ds = _dpa("vllm", "datasheet").hw
    (dtype, floor, ef, eh), = ds.mla_bmm_fits
    flop, nbytes = 2 * 130 * 128 * 128 * 512, 128 * 128 * 512 * 2 + 130 * 128 * (128 + 512) * 2
    one = floor + max(flop / (989e12 * ef), nbytes / (4.8e12 * eh))
    assert dtype == "bf16" and absorbed_bmm_swap(m, ds, "fp8", 128, 1040)[3] == pytest.approx(2 * one)
    assert absorbed_bmm_swap(m, replace(ds, mla_bmm_fits=()), "fp8", 128, 1040) is None  # no fit: the GEMM
