"""Routed experts in their own weight format (`model.expert_weight_dtype`, docs/models.md): gpt-oss's MXFP4
experts beside bf16 attention. Bytes by hand, the MoE kernel the experts take, the checkpoint's packed element
count trtllm-bench reads, and the refusal for a dense model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.device.kernels import datasheet_hardware
from sim.device.moe_datasheet import moe_fit_for
from sim.device.moe_mla_costs import moe_format, routed_work
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import load_scenario
from sim.studies.e2e_table import checkpoint_elements

GPT_OSS_20B = catalog.model("gpt-oss-20b")
MIXED = replace(GPT_OSS_20B, expert_weight_dtype="mxfp4")
# gpt-oss-20b: 24 MoE layers x 32 experts x 3 matrices of 2,880 x 2,880
MATRICES, MATRIX = 24 * 32 * 3, 2880 * 2880
MXFP4_MATRIX_BYTES = MATRIX // 2 + MATRIX // 32  # 4 bits a weight + one E8M0 byte per 32: 4,406,400 B


def test_experts_in_mxfp4_the_rest_in_bf16_by_hand():
    assert MXFP4_MATRIX_BYTES == 4_406_400
    bf16 = GPT_OSS_20B.weight_bytes("bf16")
    assert MIXED.weight_bytes("bf16") == pytest.approx(bf16 - MATRICES * MATRIX * 2 + MATRICES * MXFP4_MATRIX_BYTES,
                                                       rel=1e-12)
    assert MIXED.weight_bytes("bf16") == pytest.approx(13.748e9, rel=1e-4)  # the checkpoint: 13.8 GB
    # without its own format the experts take weight_dtype, as before
    assert GPT_OSS_20B.expert_format("bf16") == "bf16" and MIXED.expert_format("bf16") == "mxfp4"
    assert replace(GPT_OSS_20B, expert_weight_dtype=None).weight_bytes("mxfp4") == GPT_OSS_20B.weight_bytes("mxfp4")


def test_a_step_reads_its_touched_experts_in_their_format():
    rows = 4  # 4 tokens x top-4 of 32 experts: the expected distinct experts touched
    touched = MIXED.expected_experts_touched(rows)
    full = MIXED.layer_weight_bytes_read("bf16", 10**6)
    untouched = (32 - touched) * 3 * MXFP4_MATRIX_BYTES
    assert MIXED.layer_weight_bytes_read("bf16", rows) == pytest.approx(full - untouched, rel=1e-12)
    nbytes, params, _ = routed_work(MIXED, "bf16", 128, rows)
    assert nbytes == pytest.approx(touched * 3 * MXFP4_MATRIX_BYTES, rel=1e-12)
    assert params == pytest.approx(touched * 3 * MATRIX, rel=1e-12)


def test_the_experts_take_their_formats_kernel():
    b200, h200 = datasheet_hardware("b200", "bf16"), datasheet_hardware("h200-sxm", "bf16")
    # W4A8 with MXFP8 activations on Blackwell, W4A16 before it - whatever the rest runs as
    assert moe_format(b200, MIXED.expert_format("bf16"), 128) == "w4a8_mxfp4_mxfp8"
    assert moe_format(h200, MIXED.expert_format("bf16"), 128) == "w4a16_mxfp4"
    # gpt-oss routes as a power law (alpha 1.2): the fit on the tables' power-law rows of its experts' format
    power_law = dict(h200.moe_power_law_fits)
    assert moe_fit_for(MIXED, h200, "bf16", 128) == (power_law["w4a16_mxfp4"], 1.2)
    assert moe_fit_for(GPT_OSS_20B, h200, "bf16", 128) == (power_law["bfloat16"], 1.2)
    # balanced routing (an EPLB-evened run) takes the fit on balanced rows, at uniform routing
    balanced = replace(GPT_OSS_20B, moe_routing="balanced")
    assert moe_fit_for(balanced, h200, "bf16", 128) == (dict(h200.moe_fits)["bfloat16"], None)


def test_trtllm_bench_counts_only_the_packed_experts_elements():
    experts = MATRICES * MATRIX
    assert checkpoint_elements(MIXED, "bf16") == pytest.approx(GPT_OSS_20B.params - experts * (1 - 0.53125), rel=1e-12)
    assert checkpoint_elements(GPT_OSS_20B, "bf16") == GPT_OSS_20B.params


def test_a_run_carries_it_and_a_dense_model_refuses_it(tmp_path):
    from sim.decode.context import build_context

    path = tmp_path / "s.yaml"
    path.write_text("model: {name: gpt-oss-20b, weight_dtype: bf16, expert_weight_dtype: mxfp4}\n"
                    "hardware: {gpu: h200-sxm}\nworkload: {batch_size: 4, prompt_tokens: 128, reasoning_tokens: 64}\n")
    ctx = build_context(load_scenario(path))
    assert ctx.weights_bytes == pytest.approx(MIXED.weight_bytes("bf16"), rel=1e-12)
    path.write_text("model: {name: llama-3.1-8b, expert_weight_dtype: mxfp4}\nhardware: {gpu: h200-sxm}\n"
                    "workload: {batch_size: 4, prompt_tokens: 128, reasoning_tokens: 64}\n")
    with pytest.raises(ConfigError, match="expert_weight_dtype applies to a mixture-of-experts model"):
        build_context(load_scenario(path))
