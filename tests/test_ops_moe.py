"""`kvsim ops moe`: one GPU's fused routed experts through the operator seam (sim/device/moe_op.py) - the
measured answer is the tables' slice of the call's format and routing, the datasheet answer kvtier's fit of
that routing (by hand), the CSV path asks the same, and bad input is one line."""

from __future__ import annotations

import json

import pytest

from sim.device.kernels import datasheet_cost, datasheet_hardware, measured_cost
from sim.device.moe_op import MoeExperts, table_format
from sim.inputs.kernel_tables import tables_available
from sim.model.experts import expected_experts_touched
from sim.model.power_law import power_law_load
from sim.model.spec import MLP_MATRICES

from .conftest import run_cli

NEEDS_TABLES = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (.[measured]) not installed")
GPT_OSS_120B = {"experts": 128, "top_k": 4, "hidden": 2880, "inter": 2880}  # one MoE layer's shape


def test_a_weight_dtype_runs_as_its_table_format_on_each_gpu():
    assert table_format(datasheet_hardware("b200"), "mxfp4") == "w4a8_mxfp4_mxfp8"  # Blackwell: MXFP8 activations
    assert table_format(datasheet_hardware("h200-sxm"), "mxfp4") == "w4a16_mxfp4"
    assert table_format(datasheet_hardware("h200-sxm"), "fp8") == "fp8_block"
    assert table_format(datasheet_hardware("h200-sxm"), "int4") == "int4_wo"
    assert table_format(datasheet_hardware("h200-sxm"), "int8") is None


def test_the_datasheet_answer_is_the_fused_experts_fit_of_the_calls_routing_by_hand():
    """Qwen3-30B-A3B's experts in bf16 on one H200, 64 tokens: balanced asks the fit on balanced rows at uniform
    routing, E (1 - (1 - k/E)^T) experts touched and T k pairs (`moe_fit.datasheet_moe_s`); power-law 1.2 asks
    the fit on the power-law rows at that draw's expected experts and pairs (`power_law_load`)."""
    from sim.device.moe_fit import datasheet_moe_s

    hw = datasheet_hardware("h200-sxm", "bf16")
    fit = dict(hw.moe_fits)["bfloat16"]
    expert = MLP_MATRICES * 2048 * 768
    want = datasheet_moe_s(fit, expected_experts_touched(128, 8, 64), 64 * 8, expert, 2.0, 2048, 768, 64)
    op = MoeExperts(64, 128, 8, 2048, 768)
    got = datasheet_cost("h200-sxm", op)
    assert got.seconds == pytest.approx(want, rel=1e-12) and "bfloat16 fused-experts fit" in got.source
    touched, pairs = power_law_load(64, 128, 8, 1, 1.2)
    assert touched < expected_experts_touched(128, 8, 64) and pairs == 64 * 8
    fit_pl = dict(hw.moe_power_law_fits)["bfloat16"]
    skewed = datasheet_cost("h200-sxm", MoeExperts(64, 128, 8, 2048, 768, routing="power_law_1.2"))
    assert skewed.seconds == pytest.approx(datasheet_moe_s(fit_pl, touched, pairs, expert, 2.0, 2048, 768, 64), rel=1e-12)
    assert f"at the power_law_1.2 draw's load: {touched:.1f} experts, 512 pairs on the busiest GPU" in skewed.source
    assert "fit on power-law rows" in skewed.source and not skewed.note
    # A100's tables time power-law rows alone: a power-law query takes that fit, a balanced one the GEMM model
    a100 = [datasheet_cost("a100-80gb-sxm", MoeExperts(64, 128, 8, 2048, 768, routing=r))
            for r in ("power_law_1.2", "balanced")]
    assert "fit on power-law rows" in a100[0].source and "no fused-experts fit: the GEMM model" in a100[1].source


@NEEDS_TABLES
def test_the_measured_answer_is_the_tables_slice_of_the_calls_routing():
    """gpt-oss-120b's experts on B200 (W4A8 MXFP4) at 1,024 tokens: the balanced and power-law-1.2 slices of
    TensorRT-LLM's table as `MeasuredKernels.moe_s` reads them, each naming its routing, and they differ."""
    from sim.device.measured_kernels import measured_kernels_for

    mk = measured_kernels_for("b200", "trtllm")
    shape = tuple(GPT_OSS_120B.values()) + (1, 1)
    for routing in ("balanced", "power_law_1.2"):
        op = MoeExperts(1024, **GPT_OSS_120B, dtype="mxfp4", routing=routing)
        got = measured_cost("b200", op, framework="trtllm")
        want = float(mk.moe_s(1024, *shape, quant="w4a8_mxfp4_mxfp8", distribution=routing).seconds[0])
        assert got.seconds == pytest.approx(want, rel=1e-12) and got.inside
        assert f"moe w4a8_mxfp4_mxfp8, {routing} routing" in got.source
    even = measured_cost("b200", MoeExperts(1024, **GPT_OSS_120B, dtype="mxfp4"), framework="trtllm").seconds
    assert got.seconds / even > 1.1  # at 1,024 tokens the busiest expert waits
    a100 = measured_cost("a100-80gb-sxm", MoeExperts(64, 128, 8, 2048, 768), framework="trtllm")  # no balanced rows
    assert not a100.inside and "no measured bfloat16 fused experts with balanced routing" in a100.note
    assert a100.seconds == datasheet_cost("a100-80gb-sxm", MoeExperts(64, 128, 8, 2048, 768), "trtllm").seconds


def test_ops_flags_and_a_csv_row_ask_the_same(tmp_path):
    args = ["ops", "moe", "--tokens", "64", "--experts", "128", "--top-k", "8", "--hidden", "2048", "--inter", "768",
            "--kernels", "datasheet"]
    res = run_cli(*args, "--json")
    assert res.returncode == 0, res.stderr
    want = datasheet_cost("h200-sxm", MoeExperts(64, 128, 8, 2048, 768)).seconds
    assert json.loads(res.stdout)["datasheet_s"] == pytest.approx(want)
    shown = run_cli(*args)
    assert "fused experts: 64 tokens, top-8 of 128 experts, hidden 2048 x inter 768, bf16 weights" in shown.stdout
    src = tmp_path / "ops.csv"
    src.write_text("op,gpu,tokens,experts,top_k,hidden,inter,ep,routing\nmoe,h200-sxm,64,128,8,2048,768,4,balanced\n")
    res = run_cli("ops", "--csv", str(src), "--kernels", "datasheet")
    assert res.returncode == 0, res.stderr
    header, row = res.stdout.splitlines()[:2]
    got = float(row.split(",")[header.split(",").index("datasheet_s")])
    assert got == pytest.approx(datasheet_cost("h200-sxm", MoeExperts(64, 128, 8, 2048, 768, ep=4)).seconds)


@pytest.mark.parametrize("extra,expected", [
    (["--dtype", "int8"], "moe: no fused-experts format for int8 weights"),
    (["--tp", "2", "--ep", "2"], "split the experts by tp or by ep, not both"),
    (["--ep", "3"], "ep (3) must divide the experts"),
    (["--routing", "zipf"], "routing: Input should be 'balanced', 'power_law_1.01' or 'power_law_1.2'"),
])
def test_ops_moe_bad_input_is_one_line(extra, expected):
    res = run_cli("ops", "moe", "--tokens", "64", "--experts", "128", "--top-k", "8", "--hidden", "2048", "--inter",
                  "768", *extra)
    assert res.returncode == 2 and expected in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    missing = run_cli("ops", "moe", "--tokens", "64", "--experts", "128")
    assert missing.returncode == 2
    assert "moe needs tokens, experts, top_k, hidden, inter; missing top_k" in missing.stderr
