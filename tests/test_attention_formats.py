"""Attention projections in their own weight format (`model.attention_weight_dtype`,
`attention_output_weight_dtype`; docs/models.md): ModelOpt's NVFP4 DeepSeek-R1 keeps self_attn in bf16, its
-0528-NVFP4-v2 quantises the output projection (wo). Bytes by hand, the measured GEMMs each in its format, the
absorbed BMMs' kv_b, the checkpoint's element count trtllm-bench reads, and a run's weights."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.decode.context import build_context
from sim.device.moe_mla_costs import absorbed_bmm_swap
from sim.device.physics import weight_kernel_s
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import scenario_from_dict
from sim.model.dtypes import WEIGHT_DTYPES
from sim.studies.e2e_table import checkpoint_elements, load_measurements

R1 = catalog.model("deepseek-r1").shard(4, 4, 4)  # DEP4: every GPU holds the whole attention
V2 = replace(R1, attention_weight_dtype="bf16", attention_output_weight_dtype="nvfp4")
# one MLA layer's input projections: q_a 7168 x 1536, q_b 1536 x 128 x 192, kv_a 7168 x 576, kv_b 512 x 128 x 256
INPUTS = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256
OUTPUT = 128 * 128 * 7168  # wo


def _nvfp4(params: int) -> float:
    return WEIGHT_DTYPES["nvfp4"].bytes_for(params, 16)


def test_r1_v2_keeps_its_input_projections_bf16_by_hand():
    assert INPUTS == 69_664_768 and _nvfp4(INPUTS) == INPUTS * 0.5625
    extra = 61 * (2 * INPUTS - _nvfp4(INPUTS))  # 61 layers, bf16 where nvfp4 was
    assert V2.weight_bytes("nvfp4", 16) == pytest.approx(R1.weight_bytes("nvfp4", 16) + extra, rel=1e-12)
    assert extra == pytest.approx(6.11e9, rel=1e-3)  # ~6.1 GB more a GPU: less KV
    whole = replace(R1, attention_weight_dtype="bf16")  # the output projection follows the attention's
    assert whole.attention_formats("nvfp4") == ("bf16", "bf16") and V2.attention_formats("nvfp4") == ("bf16", "nvfp4")
    assert whole.weight_bytes("nvfp4", 16) == pytest.approx(
        V2.weight_bytes("nvfp4", 16) + 61 * (2 * OUTPUT - _nvfp4(OUTPUT)), rel=1e-12)
    assert R1.attention_formats("fp8") == ("fp8", "fp8")  # unset: the layers' format, as before


def test_trtllm_bench_counts_the_bf16_projections_as_one_element_each():
    packed = (R1.weight_bytes("bf16") - R1.weight_bytes("nvfp4")) / (2 - 0.5625)  # every quantised weight
    assert checkpoint_elements(V2, "nvfp4") == pytest.approx(
        R1.params - (packed - 61 * INPUTS) * (1 - 0.5625), rel=1e-12)


def test_measured_dense_gemms_take_each_format():
    """llama-3.1-8b fp8 with bf16 attention on H200's tables: qkv and o from the bf16 table, gate_up and down
    from the fp8 one."""
    sc = scenario_from_dict({"model": {"name": "llama-3.1-8b", "weight_dtype": "fp8", "attention_weight_dtype": "bf16"},
                             "hardware": {"gpu": "h200-sxm", "kernels": "measured"},
                             "workload": {"batch_size": 8, "prompt_tokens": 128, "reasoning_tokens": 64}}, "t")
    ctx = build_context(sc)
    k, m, rows = ctx.hw.kernels, ctx.model, 64
    (qkv, o, gate_up, down) = m.layer_gemm_shapes()

    def table(shape, dtype):
        return float(k.gemm_s([rows], [shape[0]], [shape[1]], dtype).seconds[0])

    by_hand = table(qkv, "bf16") + table(o, "bf16") + table(gate_up, "fp8") + table(down, "fp8")
    assert weight_kernel_s(m, ctx.hw, "fp8", 128, rows) == pytest.approx(by_hand, rel=1e-12)
    plain = replace(m, attention_weight_dtype=None)
    assert weight_kernel_s(plain, ctx.hw, "fp8", 128, rows) == pytest.approx(
        sum(table(s, "fp8") for s in (qkv, o, gate_up, down)), rel=1e-12)
    assert ctx.weights_bytes == pytest.approx(m.weight_bytes("fp8"), rel=1e-12)
    assert m.weight_bytes("fp8") > plain.weight_bytes("fp8")


def test_the_absorbed_bmms_kv_b_is_the_attentions():
    sc = scenario_from_dict({"model": {"name": "deepseek-r1", "weight_dtype": "nvfp4", "weight_group_size": 16,
                                       "attention_weight_dtype": "bf16", "attention_output_weight_dtype": "nvfp4"},
                             "hardware": {"gpu": "b200", "kernels": "measured"}, "parallel": {"tp": 4, "ep": 4,
                                                                                              "attention_dp": 4},
                             "workload": {"batch_size": 8, "prompt_tokens": 128, "reasoning_tokens": 64}}, "t")
    ctx = build_context(sc)
    swap = absorbed_bmm_swap(ctx.model, ctx.hw, "nvfp4", 16, 64)
    plain = absorbed_bmm_swap(replace(ctx.model, attention_weight_dtype=None), ctx.hw, "nvfp4", 16, 64)
    # (kv_b's bytes, its params, ...) the GEMM would carry: bf16's 2 bytes a weight, not nvfp4's 0.5625
    assert swap[1] == plain[1] == 512 * 128 * 256 and swap[0] == 2 * swap[1] and plain[0] == 0.5625 * plain[1]
    assert swap[3] == plain[3]  # the BMMs run in bf16 either way (no fp8 kv_b)


def test_the_r1_nvfp4_v2_rows_carry_it_and_bad_input_is_one_line():
    from sim.studies.accuracy import scenario_for

    rows = [m for m in load_measurements() if m.source_model == "nvidia/DeepSeek-R1-0528-NVFP4-v2"]
    assert len(rows) == 10 and all((m.attention_weight_dtype, m.attention_output_weight_dtype) == ("bf16", "nvfp4")
                                   for m in rows)
    sc = scenario_for(rows[0], "measured")
    assert (sc.model.attention_weight_dtype, sc.model.attention_output_weight_dtype) == ("bf16", "nvfp4")
    with pytest.raises(ConfigError) as bad:
        scenario_from_dict({"model": {"name": "deepseek-r1", "attention_weight_dtype": "bf17"},
                            "hardware": {"gpu": "b200"}}, "s.yaml")
    assert "model.attention_weight_dtype" in str(bad.value) and "\n" not in str(bad.value)
