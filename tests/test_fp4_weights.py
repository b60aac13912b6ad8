"""FP4 weights. NVFP4 (W4A4 on Blackwell's FP4 tensor cores, weight-only elsewhere): the format's bytes,
the peak it runs at, the fitted W4A4 GEMM by hand, the bf16 LM head, the measured tables that time it, and
the launch lines' notes. MXFP4 (gpt-oss's experts: W4A8 with MXFP8 activations on Blackwell, W4A16
before it): its bytes, paths and MoE table formats."""

from __future__ import annotations

import json

import pytest

from sim.device.kernels import Gemm, datasheet_cost, datasheet_hardware
from sim.device.measured_kernels import measured_kernels_for, moe_peak_flop_per_s
from sim.inputs import catalog
from sim.inputs.kernel_tables import load_tables, moe_quant_for, tables_available
from sim.model.dtypes import WEIGHT_DTYPES
from sim.plan import launch as L

needs_tables = pytest.mark.skipif(not tables_available(), reason="the .[measured] extra is not installed")


def test_nvfp4_bytes_are_four_bits_and_one_fp8_scale_per_16_whatever_the_group_asked():
    f4 = WEIGHT_DTYPES["nvfp4"]
    assert f4.bytes_for(32, 128) == 32 / 2 + 2 * 1  # two groups of 16, a 1-byte scale each
    assert f4.bytes_for(17, 4) == 17 / 2 + 2  # ceil(17 / 16) = 2 scales; the scenario's group of 4 is ignored
    assert f4.bytes_for(2**20, 128) / 2**20 == 0.5625  # 4.5 bits a weight
    assert WEIGHT_DTYPES["int4"].bytes_for(32, 16) == 16 + 2 * 2  # int4 keeps its 2-byte scale and the group asked


def test_mxfp4_bytes_are_four_bits_and_one_e8m0_scale_per_32():
    mx = WEIGHT_DTYPES["mxfp4"]
    assert mx.bytes_for(64, 128) == 64 / 2 + 2 * 1
    assert mx.bytes_for(2**20, 16) / 2**20 == 0.53125  # 4.25 bits; int4 in groups of 32 (its old stand-in): 4.5
    assert WEIGHT_DTYPES["int4"].bytes_for(2**20, 32) / 2**20 == 0.5625


def test_mxfp4_runs_w4a8_at_the_fp8_peak_on_blackwell_and_weight_only_before_it():
    assert catalog.gpu("b200").matmul_peak("mxfp4") == (4500e12, "fp8")
    assert catalog.gpu("h200-sxm").matmul_peak("mxfp4") == (989e12, "bf16")  # has fp8, lacks the FP4 MMA
    b200 = datasheet_hardware("b200", "mxfp4")
    assert b200.weight_kernel == "mxfp4 W4A8 GEMM at the b200 fp8 tensor-core peak"
    assert b200.gemm_io.activation_bytes == 1.0 and b200.lm_head_gemm is not None
    assert "fp8 GEMMs" in b200.sources["gemm_flop_per_s"]  # no mxfp4 dense table: the fp8 fit
    h200 = datasheet_hardware("h200-sxm", "mxfp4")
    assert h200.weight_kernel.startswith("mxfp4 weight-only (W4A16)") and "no fp4 tensor cores" in h200.weight_kernel
    assert h200.dequant_ops_per_weight == 2.0
    from sim.device.moe_mla_costs import moe_format
    assert moe_format(b200, "mxfp4", 32) == "w4a8_mxfp4_mxfp8" and moe_format(h200, "mxfp4", 32) == "w4a16_mxfp4"
    assert moe_format(b200, "int4", 32) == "w4a16_mxfp4"  # the integer stand-in keeps its W4A16 table
    assert moe_peak_flop_per_s(catalog.gpu("b200"), "w4a8_mxfp4_mxfp8") == 4500e12
    assert moe_peak_flop_per_s(catalog.gpu("h200-sxm"), "w4a8_mxfp4_mxfp8") == 989e12


def test_nvfp4_runs_at_the_fp4_peak_where_the_gpu_has_fp4_tensor_cores():
    assert catalog.gpu("b200").matmul_peak("nvfp4") == (9000e12, "fp4")
    assert catalog.gpu("b200").matmul_peak("fp8") == (4500e12, "fp8")
    assert catalog.gpu("b200").matmul_peak("int4") == (2250e12, "bf16")  # weight-only: bf16 MMA
    assert catalog.gpu("h200-sxm").matmul_peak("nvfp4") == (989e12, "bf16")  # Hopper: no FP4 tensor cores
    assert catalog.gpu("a100-80gb-sxm").matmul_peak("fp8") == (312e12, "bf16")


def test_b200_w4a4_gemm_by_hand():
    """The W8A8 form at the fp4 peak: 4.5-bit weights and inputs streamed, the input quantised, the tiles."""
    f4 = catalog.fitted_kernels()["b200"].gemm["nvfp4"]
    hbm = catalog.gpu("b200").hbm_bytes_per_s
    one = datasheet_cost("b200", Gemm(1, 5120, 8192, "nvfp4")).seconds
    fill = 40 / (40 + f4.half_tiles_decode)  # one row tile x 40 column tiles, the small-M kernel's half point
    stream = (5120 * 8192 * 0.5625 + 8192 * 0.5625) / (hbm * f4.weight_hbm_efficiency * fill)
    assert one == pytest.approx(f4.floor_s + stream + 5120 / (hbm * f4.output_hbm_efficiency) + f4.quant_row_s
                                + 8192 / (hbm * f4.quant_hbm_efficiency))
    big = datasheet_cost("b200", Gemm(8192, 8192, 8192, "nvfp4")).seconds
    mma = 2 * 8192**3 / (9000e12 * f4.flop_efficiency)  # 8,192 rows: the curve's plateau
    fill = 64 * 64 / (64 * 64 + f4.half_tiles)
    big_stream = (8192 * 8192 * 0.5625 * (1 + f4.weight_reread * 63) + 8192 * 8192 * 0.5625) / \
        (hbm * f4.weight_hbm_efficiency * fill)
    quant = 8192 * f4.quant_row_s + 8192 * 8192 / (hbm * f4.quant_hbm_efficiency)
    assert big == pytest.approx(f4.floor_s + max(mma, big_stream) + 8192 * 8192 / (hbm * f4.output_hbm_efficiency)
                                + quant)
    assert f4.held_out.median < 0.10  # the fit's held-out error on vLLM's B200 table


def test_nvfp4_paths_and_the_bf16_lm_head():
    b200 = datasheet_hardware("b200", "nvfp4")
    assert b200.weight_kernel == "nvfp4 W4A4 GEMM at the b200 fp4 tensor-core peak"
    assert b200.peak_flop_per_s == 9000e12 and b200.dequant_ops_per_weight == 0.0
    assert b200.gemm_io.activation_bytes == 0.5625
    assert b200.lm_head_gemm.peak_flop_per_s == 2250e12  # ModelOpt leaves the LM head bf16
    assert "nvfp4 GEMMs" in b200.sources["gemm_flop_per_s"]
    h200 = datasheet_hardware("h200-sxm", "nvfp4")  # before Blackwell: a weight-only W4A16 kernel
    assert h200.weight_kernel.startswith("nvfp4 weight-only (W4A16)")
    assert "h200-sxm has no fp4 tensor cores" in h200.weight_kernel
    assert h200.dequant_ops_per_weight == catalog.efficiency_defaults().dequant_ops_per_weight["nvfp4"] == 2.0
    assert h200.peak_flop_per_s == 989e12 and h200.lm_head_gemm is None


def test_moe_format_and_peak():
    assert moe_quant_for("nvfp4", 128) == "nvfp4"
    b200 = catalog.gpu("b200")
    assert moe_peak_flop_per_s(b200, "nvfp4") == 9000e12
    assert moe_peak_flop_per_s(b200, "fp8_block") == 4500e12
    assert moe_peak_flop_per_s(b200, "w4a16_mxfp4") == 2250e12
    assert moe_peak_flop_per_s(catalog.gpu("h100-sxm"), "nvfp4") == 989e12


@needs_tables
@pytest.mark.parametrize("framework", ["vllm", "sglang", "trtllm"])
def test_blackwell_tables_time_nvfp4_gemms_and_a_measured_point_is_returned(framework):
    for gpu in ("b200", "rtx-pro-6000-server"):
        kernels = measured_kernels_for(gpu, framework)
        assert "nvfp4" in kernels.gemm_dtypes()
        t = load_tables(gpu, framework).gemm
        row = t[(t["dtype"] == "nvfp4") & (t["m"] == 64) & (t["n"] >= 4096)].iloc[0]
        got = kernels.gemm_s(row["m"], row["n"], row["k"], "nvfp4")
        assert got.inside[0] and got.seconds[0] == pytest.approx(row["latency_s"], rel=1e-9)
        assert got.source.endswith("gemm nvfp4")
    assert "nvfp4" not in measured_kernels_for("h200-sxm").gemm_dtypes()


def test_launch_lines_say_nvfp4_needs_a_quantised_checkpoint():
    layout = ("nvidia/Llama-3.3-70B-Instruct-FP4", 1, 1, 256, 8192, 0.9, True)
    out = L.launch_commands(*layout, "full_hbm", None, "nvfp4", "fp8")
    for line in out.values():
        command, _, comment = line.partition("  # ")
        assert "--quantization" not in command
        assert "weight_dtype nvfp4: serve an NVFP4 checkpoint" in comment
    trt = L.trtllm_serve_command(*layout, "full_hbm", None, "nvfp4", "fp8")
    assert "ModelOpt NVFP4" in trt
    mx = L.launch_commands("openai/gpt-oss-120b", 1, 1, 256, 8192, 0.9, True, "full_hbm", None, "mxfp4", "fp8")
    assert all("weight_dtype mxfp4: serve an MXFP4 checkpoint (e.g. gpt-oss's)" in line for line in mx.values())


def test_the_catalog_commands_show_fp4():
    """`kvsim gpus --json` carries each GPU's FP4 peak (none before Blackwell); `kvsim models --json` the
    weight bytes in both FP4 formats: the same linear weights at 4.5 and 4.25 bits, the rest bf16."""
    from .conftest import run_cli

    gpus = {g["name"]: g for g in json.loads(run_cli("gpus", "--json").stdout)}
    assert gpus["b200"]["fp4_flop_per_s"] == 9000e12 and gpus["gb200"]["fp4_flop_per_s"] == 10000e12
    assert gpus["h200-sxm"]["fp4_flop_per_s"] is None
    row = next(m for m in json.loads(run_cli("models", "--json").stdout) if m["name"] == "llama-3.1-70b")
    w = row["weight_bytes_by_dtype"]
    assert w["fp8"] > w["nvfp4"] > w["mxfp4"] > w["int4"]  # int4: a 2-byte scale per 128, 4.125 bits
    linear = (w["bf16"] - w["nvfp4"]) / (2 - 0.5625)  # the quantised weights, whichever format prices them
    assert (w["bf16"] - w["mxfp4"]) / (2 - 0.53125) == pytest.approx(linear)
