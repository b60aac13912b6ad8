"""TensorRT-LLM's MoE backend (engine.moe_backend): which backend timed each lane of its measured MoE table,
and what a run's sources say where the run's backend is not the table's."""

from __future__ import annotations

import pytest

from sim.decode.context import build_context
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import trtllm_moe_backend
from sim.inputs.scenario import scenario_from_dict
from sim.studies.accuracy import engine_for, scenario_for
from sim.studies.e2e_table import load_measurements


@pytest.mark.parametrize("kernel, quant, sm100, backend", [
    ("moe_torch_flow_cutlass", "nvfp4", True, "CUTLASS"),
    ("moe_torch_flow_cutlass", "fp8_block", False, "CUTLASS"),  # Hopper fp8_block: CUTLASS (FP32 scales)
    ("moe_torch_flow_nongated", "fp8", False, "CUTLASS"),
    ("moe_torch_flow_min_latency", "nvfp4", True, "TRTLLM"),  # trtllm-gen's min-latency kernel
    ("deepgemm", "fp8_block", True, "DEEPGEMM"),
    ("moe_torch_flow_triton_fp8_block", "fp8_block", False, "TRITON"),
    ("moe_torch_flow", "w4a16_mxfp4", False, "TRITON"),  # gpt-oss on Hopper
    ("moe_torch_flow", "w4a8_mxfp4_mxfp8", True, "TRTLLM"),  # gpt-oss on datacenter Blackwell
    ("moe_torch_flow", "bfloat16", False, None),  # an older collector's lane: not named
    ("vllm_fused_moe", "fp8_block", False, None),
])
def test_each_table_lane_names_the_backend_the_collector_ran(kernel, quant, sm100, backend):
    assert trtllm_moe_backend(kernel, quant, sm100) == backend


def _engine(**keys) -> dict:
    return {"name": "llama-3.1-8b-b1", "model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "h100-sxm"},
            "workload": {"batch_size": 1, "prompt_tokens": 128, "reasoning_tokens": 64}, "engine": keys}


def test_moe_backend_is_tensorrt_llms_alone():
    chosen = scenario_from_dict(_engine(name="tensorrt-llm", moe_backend="CUTLASS"), "test.yaml")
    assert chosen.engine.moe_backend == "CUTLASS"
    with pytest.raises(ConfigError, match="moe_backend is TensorRT-LLM's"):
        scenario_from_dict(_engine(name="vllm", moe_backend="CUTLASS"), "test.yaml")
    with pytest.raises(ConfigError, match="moe_backend"):
        scenario_from_dict(_engine(name="tensorrt-llm", moe_backend="MARLIN"), "test.yaml")


def test_an_unset_moe_backend_dumps_as_before():
    dumped = scenario_from_dict(_engine(name="tensorrt-llm"), "test.yaml").model_dump()
    assert "moe_backend" not in dumped["engine"]


def _row(rid: str):
    return {m.id: m for m in load_measurements()}[rid]


def _moe_source(m) -> str:
    return build_context(scenario_for(m, "measured")).hw.sources["kernels_moe_mla"]


@pytest.fixture()
def tables():
    from sim.inputs.kernel_tables import tables_available

    if not tables_available():
        pytest.skip("the .[measured] extra is not installed")


def test_the_rows_pass_their_moe_backend_to_the_engine():
    assert engine_for(_row("trt-b200-gpt-oss-20b-tp1-1k8k"))["moe_backend"] == "CUTLASS"
    assert engine_for(_row("trt-h200-gpt-oss-20b-tp1-1k8k"))["moe_backend"] == "TRITON"
    assert "moe_backend" not in engine_for(_row("trt-h200-qwen3-235b-dep4-1k1k"))  # its options leave the default


def test_blackwell_gpt_oss_runs_cutlass_where_the_table_timed_trtllm(tables):
    """The perf overview's GPT-OSS options set moe_config.backend CUTLASS on Blackwell; AIConfigurator's
    collector times MXFP4 there on TRTLLMGenFusedMoE: the source says the table's kernel stands in."""
    m = _row("trt-b200-gpt-oss-20b-tp1-1k8k")
    said = _moe_source(m)
    assert "w4a8_mxfp4_mxfp8 on TensorRT-LLM's TRTLLM backend" in said
    assert "the run's CUTLASS backend (engine.moe_backend) is not measured for w4a8_mxfp4_mxfp8" in said
    unnamed = m.model_copy(update={"moe_backend": None})  # no backend named: nothing to compare
    assert "stands in" not in _moe_source(unnamed)


def test_hopper_gpt_oss_runs_the_tables_triton_kernel(tables):
    said = _moe_source(_row("trt-h200-gpt-oss-120b-tp1-1k1k"))
    assert "w4a16_mxfp4 on TensorRT-LLM's TRITON backend" in said and "stand" not in said


def test_blackwell_nvfp4_runs_the_tables_cutlass_kernel_and_a_trtllm_run_is_told_it_stands_in(tables):
    """Blackwell's NVFP4 slices hold the CUTLASS rows alone (trtllm-gen's min-latency lane is left out); a run
    that names the TRTLLM backend is told the CUTLASS kernel stands in."""
    m = _row("trt-b200-deepseek-r1-nvfp4-dep4-1k8k")
    said = _moe_source(m)
    assert "nvfp4 on TensorRT-LLM's CUTLASS backend" in said and "stand" not in said
    trtllm = _moe_source(m.model_copy(update={"moe_backend": "TRTLLM"}))
    assert ("the run's TRTLLM backend (engine.moe_backend) is not measured for nvfp4: the table's CUTLASS kernel"
            in trtllm)
