"""Which all-reduce an engine runs over its tensor-parallel group (issue #20, the 4 x L40S TP4 row):
over NVLink the engine's own custom all-reduce, over PCIe only NCCL's beyond two GPUs (vLLM and
SGLang: custom_all_reduce.py, "not supported on more than two PCIe-only GPUs") and at any size for
TensorRT-LLM (AllreducePlugin::selectImplementation: AUTO without NVLink is NCCL). Before, every
run took the custom all-reduce table, which on 4 x L40S is a kernel neither engine runs there
(3.7 GB/s busbw on large messages against NCCL's 5.1 GB/s on the same machine)."""

from __future__ import annotations

import pytest

from sim.decode.context import build_context
from sim.device.engine_rules import CUSTOM_ALLREDUCE, NCCL_ALLREDUCE, engine_allreduce_impl
from sim.inputs import catalog
from sim.inputs.kernel_tables import tables_available
from sim.inputs.scenario import load_scenario

from .conftest import SCENARIOS

TP4_70B = SCENARIOS / "serving-h100-70b-tp4.yaml"


def _ctx(*overrides):
    return build_context(load_scenario(TP4_70B, ["model.weight_dtype=fp8", *overrides]))


@pytest.mark.parametrize("engine,gpus,nvlink,impl", [
    ("vllm", 4, True, CUSTOM_ALLREDUCE), ("sglang", 8, True, CUSTOM_ALLREDUCE), ("tensorrt-llm", 4, True, CUSTOM_ALLREDUCE),
    ("vllm", 2, False, CUSTOM_ALLREDUCE), ("sglang", 2, False, CUSTOM_ALLREDUCE),  # two PCIe GPUs: custom (P2P)
    ("vllm", 4, False, NCCL_ALLREDUCE), ("sglang", 8, False, NCCL_ALLREDUCE),
    ("tensorrt-llm", 2, False, NCCL_ALLREDUCE), ("tensorrt-llm", 4, False, NCCL_ALLREDUCE),
])
def test_the_engines_rule(engine, gpus, nvlink, impl):
    assert engine_allreduce_impl(engine, gpus, nvlink) == impl


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine must be one of"):
        engine_allreduce_impl("tgi", 4, False)


def test_the_catalog_says_which_fabrics_are_nvlink():
    assert {n: s.nvlink for n, s in catalog.interconnects().items()} == {
        "nvlink4": True, "nvlink3": True, "nvlink5": True, "pcie-gen4-p2p": False, "pcie-gen5-p2p": False,
        "pcie-host": False}


def test_datasheet_l40s_tp4_takes_the_nccl_fit_by_hand():
    hw = _ctx("hardware.gpu=l40s", "hardware.kernels=datasheet").hw
    ar = catalog.fitted_kernels()["l40s"].allreduce["nccl"]
    assert hw.allreduce_impl == NCCL_ALLREDUCE
    nbytes = 300 * 8192 * 2  # 300 sequences x hidden x bf16: 4.9 MB
    # the faster of two protocols at N = 4, each floor + 2 (N - 1) / N x bytes / its busbw
    p = ar.by_gpus[4]
    ring = 1.5 * nbytes
    expect = min(p.latency_floor_s + ring / p.latency_bus_bytes_per_s, p.bandwidth_floor_s + ring / p.bandwidth_bus_bytes_per_s)
    assert hw.allreduce_s(nbytes) == pytest.approx(expect)
    # the table's own neighbours (4 MiB 1.235 ms, 8 MiB 2.459 ms at 4 GPUs, nccl_perf l40s) bracket 4.7 MiB
    assert 1.235e-3 < expect < 2.459e-3
    assert hw.sources["interconnect"].startswith("fitted on measured NCCL all-reduces")


def test_nvlink_keeps_the_custom_all_reduce():
    assert _ctx("hardware.gpu=h100-sxm", "hardware.kernels=datasheet").hw.allreduce_impl == CUSTOM_ALLREDUCE
    assert _ctx("hardware.gpu=h100-sxm", "hardware.kernels=datasheet",
                "engine.name=tensorrt-llm").hw.allreduce_impl == CUSTOM_ALLREDUCE


def test_two_pcie_gpus_are_custom_under_vllm_and_nccl_under_tensorrt_llm():
    two = ["hardware.gpu=l40s", "hardware.kernels=datasheet", "parallel.tp=2"]
    assert _ctx(*two).hw.allreduce_impl == CUSTOM_ALLREDUCE
    assert _ctx(*two, "engine.name=tensorrt-llm").hw.allreduce_impl == NCCL_ALLREDUCE


@pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (the .[measured] extra) not installed")
def test_measured_l40s_tp4_reads_the_nccl_table_at_its_points():
    hw = _ctx("hardware.gpu=l40s", "hardware.kernels=measured").hw
    assert hw.allreduce_impl == NCCL_ALLREDUCE
    # aiconfigurator-core 0.12.0 l40s nccl_perf (NCCL 2.27.3, all_reduce, half, 4 GPUs): message in
    # elements -> ms; bytes = 2 x elements
    assert hw.allreduce_s(2 * 67_108_864) == pytest.approx(39.325e-3, rel=1e-9)  # a 8,192-token prefill step's
    assert hw.allreduce_s(2 * 4_194_304) == pytest.approx(2.4588e-3, rel=1e-9)
    # the custom table's same point (a kernel vLLM and TensorRT-LLM do not run on 4 PCIe GPUs): 54.406 ms
    custom = hw.kernels.allreduce_s(2 * 67_108_864, 4, CUSTOM_ALLREDUCE).seconds[0]
    assert custom == pytest.approx(54.406436e-3, rel=1e-6)
    assert "NCCL 2.27.3 all-reduce" in hw.sources["kernels"]
