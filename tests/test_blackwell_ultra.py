"""Blackwell Ultra (B300 HGX, GB300 NVL72) in the catalog: their datasheet figures as sourced, their
AIConfigurator tables driving measured mode by default, the datasheet constants fitted on those
tables, and the engine rules that follow the compute capability (10.3, SM100's family)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sim.decode.context import build_context
from sim.device.kernels import Gemm, measured_cost
from sim.inputs import catalog
from sim.inputs.kernel_tables import SYSTEMS, load_tables, tables_available, with_moe_mla
from sim.inputs.scenario import load_scenario

from .conftest import SCENARIOS, run_cli

ULTRA = {"b300": "b300_sxm", "gb300": "gb300"}
needs_tables = pytest.mark.skipif(not tables_available(), reason="the .[measured] extra is not installed")


def test_the_catalog_holds_their_datasheet_figures():
    """Per GPU: B300 275,040 MiB, 7.75 TB/s (62 TB/s over 8), 2,250 / 4,500 / 14,000 TFLOP/s BF16 / FP8 /
    FP4 dense, INT8 cut to 153.5 TOPS; GB300 284,208 MiB, 8 TB/s, 2,500 / 5,000 / 15,000, INT8 165."""
    b, g = catalog.gpu("b300"), catalog.gpu("gb300")
    assert b.memory_bytes == 275040 * 2**20 and g.memory_bytes == 284208 * 2**20
    assert (b.hbm_bytes_per_s, b.bf16_flop_per_s, b.fp8_flop_per_s, b.fp4_flop_per_s, b.int8_op_per_s) == (
        7.75e12, 2250e12, 4500e12, 14000e12, 153.5e12)
    assert (g.hbm_bytes_per_s, g.bf16_flop_per_s, g.fp8_flop_per_s, g.fp4_flop_per_s, g.int8_op_per_s) == (
        8.0e12, 2500e12, 5000e12, 15000e12, 165e12)
    assert "HGX B300 datasheet" in b.source and "GB300 NVL72 datasheet" in g.source
    assert (b.link, g.link, g.host) == ("pcie-gen6-x16", "nvlink-c2c", "grace")
    gpus = {r["name"]: r for r in json.loads(run_cli("gpus", "--json").stdout)}
    assert gpus["b300"]["fp4_flop_per_s"] == 14000e12 and gpus["gb300"]["fp4_flop_per_s"] == 15000e12


@needs_tables
@pytest.mark.parametrize("gpu", sorted(ULTRA))
def test_their_tables_drive_measured_mode_by_default(gpu):
    """`hardware.kernels: auto` takes the tables of the system SYSTEMS names; a GEMM at a table point is
    the table's time (ms in the file)."""
    assert SYSTEMS[gpu] == ULTRA[gpu]
    sc = load_scenario(SCENARIOS / "h200-7b-batch.yaml", [f"hardware.gpu={gpu}", "policy.kind=full_hbm"])
    ctx = build_context(sc)
    assert ctx.hw.kernels is not None and ULTRA[gpu] in ctx.hw.sources["kernels"]
    t = load_tables(gpu)
    row = t.gemm[(t.gemm.dtype == "nvfp4") & (t.gemm.m == 64) & (t.gemm.n == 8192) & (t.gemm.k == 8192)]
    assert len(row) == 1
    c = measured_cost(gpu, Gemm(64, 8192, 8192, "nvfp4"))
    assert c.seconds == pytest.approx(float(row.latency_s.iloc[0]), rel=1e-12) and c.inside


@needs_tables
@pytest.mark.parametrize("gpu", sorted(ULTRA))
def test_their_trtllm_moe_tables_time_each_key_once(gpu):
    """Unlike B200's and GB200's, these TensorRT-LLM tables hold no min-latency lane beside CUTLASS: every
    (slice, tokens) key is one kernel's row, so the lane rule picks nothing and NVFP4 is CUTLASS's at every
    batch (Qwen3-30B-A3B's experts on one GPU, checked against the parquet)."""
    from sim.inputs.kernel_tables import _package_root

    raw = pd.read_parquet(_package_root() / "systems" / "data" / ULTRA[gpu] / "moe/trtllm/1.3.0rc20/moe_perf.parquet")
    assert "moe_torch_flow_min_latency" not in set(raw.kernel_source)
    sel = raw[(raw.moe_dtype == "nvfp4") & (raw.num_experts == 128) & (raw.hidden_size == 2048)
              & (raw.inter_size == 768) & (raw.moe_tp_size == 1) & (raw.moe_ep_size == 1)
              & (raw.distribution == "balanced")]
    assert set(sel.kernel_source) == {"moe_torch_flow_cutlass"}
    e = with_moe_mla(load_tables(gpu, "trtllm")).moe
    s = e[(e.quant == "nvfp4") & (e.experts == 128) & (e.hidden == 2048) & (e.inter == 768) & (e.tp == 1)
          & (e.ep == 1) & (e.distribution == "balanced")].set_index("tokens")["latency_s"]
    lane = sel.set_index("num_tokens")["latency"] * 1e-3
    assert s[64] == lane[64] and s[1024] == lane[1024]


@needs_tables
def test_their_datasheet_constants_are_fitted_on_their_own_tables():
    """Each engine's fit file holds B300 and GB300, scored on their held-out lines: fp8 GEMMs within 10%
    median, as on B200 (4-6%)."""
    for framework in ("vllm", "sglang", "trtllm"):
        for gpu in ULTRA:
            fp8 = catalog.fitted_kernels_for(gpu, framework).gemm["fp8"]
            assert not fp8.borrowed and fp8.held_out.median <= 0.10, (framework, gpu)


def test_vllm_captures_graphs_to_1024_on_them_as_on_sm100():
    """vLLM's default capture limit is 1,024 on compute capability 10.x (B300 is 10.3), 512 on Hopper."""
    def largest(gpu):
        sc = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml",
                           ["engine.name=vllm", f"hardware.gpu={gpu}", "scheduler.max_num_seqs=1024"])
        return build_context(sc).hw.launch.graph_max_batch

    assert largest("b300") == largest("gb300") == 1024 and largest("h200-sxm") == 512


def test_a_profile_of_either_gpu_finds_its_catalog_entry():
    """The device names their tables record ("NVIDIA B300 SXM6 AC", "NVIDIA GB300") match the new entries,
    in hwprobe's check and in the report's measured column - not B200's or GB200's."""
    from hwprobe.calibrate.checks import match_gpu
    from sim.inputs.profile import Profile
    from sim.studies.projection_grid import profile_base_gpu

    for device, gpu in (("NVIDIA B300 SXM6 AC", "b300"), ("NVIDIA GB300", "gb300"), ("NVIDIA GB200", "gb200")):
        assert match_gpu(device).name == gpu
        prof = Profile(device="cuda", device_name=device, machine="t", created_utc="2026-12-06T00:00:00Z")
        assert profile_base_gpu(prof) == gpu
