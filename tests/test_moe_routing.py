"""Which routing of the measured fused-experts tables a mixture of experts reads (sim/inputs/moe_routing.py):
AIConfigurator's own alpha by model family, the cost the step takes from those rows, the scenario's
override, the fallback where a table times no such rows, and bad input as one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.decode.context import build_context
from sim.device.moe_mla_costs import measured_moe_s, moe_quant, moe_routing, moe_shape, source_line
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import tables_available
from sim.inputs.moe_routing import moe_routing_for
from sim.inputs.scenario import load_scenario

from .conftest import SCENARIOS

NEEDS_TABLES = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (.[measured]) not installed")
GPT_OSS = ["model.name=gpt-oss-120b", "model.expert_weight_dtype=mxfp4", "hardware.kernels=measured"]


def _ctx(*overrides: str):
    return build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*GPT_OSS, *overrides]))


@pytest.mark.parametrize("model_type, routing", [
    ("deepseek_v3", "power_law_1.01"), ("deepseek_v32", "power_law_1.01"), ("kimi_k2", "power_law_1.01"),
    ("llama4_text", "power_law_1.01"), ("nemotron_h", "power_law_1.01"),
    ("gpt_oss", "power_law_1.2"), ("qwen3_moe", "power_law_1.2"), ("mixtral", "power_law_1.2"),
    ("qwen3_next", "power_law_1.2"),
])
def test_the_default_routing_is_aiconfigurators_alpha_for_the_family(model_type, routing):
    assert moe_routing_for(model_type) == routing


def test_catalog_models_carry_their_familys_routing_and_dense_ones_balanced():
    assert catalog.model("gpt-oss-120b").moe_routing == "power_law_1.2"
    assert catalog.model("qwen3-30b-a3b").moe_routing == "power_law_1.2"
    assert catalog.model("deepseek-r1").moe_routing == "power_law_1.01"
    assert catalog.model("llama-4-maverick").moe_routing == "power_law_1.01"
    assert catalog.model("llama-3.1-8b").moe_routing == "balanced"


@NEEDS_TABLES
def test_the_routed_experts_cost_the_tables_rows_of_the_models_routing():
    """gpt-oss-120b on one H200 (W4A16 MXFP4 experts): the mean layer's routed experts at 1,024 rows are
    the power-law-1.2 row of TensorRT-LLM's table, not the balanced one; `moe_routing: balanced` reads that."""
    ctx = _ctx("engine.name=tensorrt-llm")
    m, hw = ctx.model, ctx.hw
    quant = moe_quant(m, hw, "bf16", 128)
    assert quant == "w4a16_mxfp4" and moe_routing(m, hw) == "power_law_1.2"
    rows = 1024
    power = hw.kernels.moe_one_s(rows, *moe_shape(m, hw), quant, "power_law_1.2")
    balanced = hw.kernels.moe_one_s(rows, *moe_shape(m, hw), quant, "balanced")
    assert m.moe_layers == m.num_layers
    assert measured_moe_s(m, hw, quant, rows) == pytest.approx(power, rel=1e-12)
    assert abs(power / balanced - 1) > 0.05  # the two rows differ: the choice matters
    even = _ctx("engine.name=tensorrt-llm", "model.moe_routing=balanced")
    assert measured_moe_s(even.model, even.hw, quant, rows) == pytest.approx(balanced, rel=1e-12)
    said = source_line(m, hw, "bf16", 128, "bf16")
    assert "power_law_1.2 routing (model.moe_routing" in said


@NEEDS_TABLES
def test_a_table_without_the_routing_falls_back_or_keeps_the_datasheet_model():
    """A100's TensorRT-LLM table times only power-law rows: a run asking balanced routing keeps the
    datasheet model there; a table with balanced rows alone (a profile's own) would be read balanced."""
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [
        "model.name=qwen3-30b-a3b", "hardware.gpu=a100-80gb-sxm", "hardware.kernels=measured",
        "engine.name=tensorrt-llm"]))
    m, hw = ctx.model, ctx.hw
    assert hw.kernels.moe_routings() == {"power_law_1.01", "power_law_1.2"}
    assert moe_routing(m, hw) == "power_law_1.2" and moe_quant(m, hw, "bf16", 128) == "bfloat16"
    even = replace(m, moe_routing="balanced")
    assert moe_routing(even, hw) is None and moe_quant(even, hw, "bf16", 128) is None
    assert "routed experts datasheet" in source_line(even, hw, "bf16", 128, "bf16")


def test_bad_routing_input_is_one_clear_error():
    with pytest.raises(ConfigError) as err:  # a dense model has no experts to route
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["model.moe_routing=balanced"])
    assert err.value.field == "model.moe_routing" and "mixture-of-experts" in str(err.value)
    with pytest.raises(ConfigError) as err:  # the datasheet model's skew and the tables' routing: one or the other
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*GPT_OSS, "model.routing_skew=1",
                                                           "model.moe_routing=balanced"])
    assert err.value.field == "model.moe_routing" and "not both" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*GPT_OSS, "model.moe_routing=zipf"])
    assert "moe_routing" in str(err.value) and "power_law_1.2" in str(err.value)
    dumped = load_scenario(SCENARIOS / "h200-7b-batch.yaml", GPT_OSS).model_dump(mode="json")["model"]
    assert "moe_routing" not in dumped  # a quiet default: old scenarios dump as before


def test_the_datasheet_prices_a_power_law_model_at_its_draws_load_by_hand():
    """gpt-oss-20b on one H200 in datasheet mode, 512 rows: the layer's routed experts are the fit on the
    tables' power-law rows at the alpha-1.2 draw's expected experts and pairs; `moe_routing: balanced` takes
    the fit on balanced rows at uniform routing. The rest of the layer is the same in both."""
    from sim.device.kernels import datasheet_hardware
    from sim.device.moe_fit import datasheet_moe_s
    from sim.device.physics import weight_kernel_s
    from sim.model.experts import expected_experts_touched
    from sim.model.power_law import power_law_load

    hw = datasheet_hardware("h200-sxm", "bf16")
    m = catalog.model("gpt-oss-20b")
    even = replace(m, moe_routing="balanced")
    rows, e, k = 512, m.num_experts, m.experts_per_token
    expert, h, inter = m.expert_params(), m.hidden_size, m.moe_intermediate_size
    touched, pairs = power_law_load(rows, e, k, 1, 1.2)
    power = datasheet_moe_s(dict(hw.moe_power_law_fits)["bfloat16"], touched, pairs, expert, 2.0, h, inter, rows)
    uniform = datasheet_moe_s(dict(hw.moe_fits)["bfloat16"], expected_experts_touched(e, k, rows), rows * k, expert,
                              2.0, h, inter, rows)
    assert m.moe_layers == m.num_layers and touched < expected_experts_touched(e, k, rows)
    got = weight_kernel_s(m, hw, "bf16", 128, rows) - weight_kernel_s(even, hw, "bf16", 128, rows)
    assert got == pytest.approx(power - uniform, rel=1e-9)
    assert abs(power / uniform - 1) > 0.02  # the routing moves the figure


def test_a_datasheet_run_says_which_fit_and_routing_its_routed_experts_take():
    """`sources.routed_experts` of a datasheet run: gpt-oss-20b's power-law fit at its draw; `moe_routing: balanced`
    the balanced fit at uniform routing; a dense model, or a run whose experts a measured table costs, says nothing."""
    from sim.device.kernels import datasheet_hardware
    from sim.device.moe_datasheet import datasheet_moe_source

    hw = datasheet_hardware("h200-sxm", "bf16")
    m = catalog.model("gpt-oss-20b")
    said = datasheet_moe_source(m, hw, "bf16", 128)
    assert said.startswith("datasheet: the bfloat16 fused-experts fit on the tables' power-law rows, at the "
                           "power_law_1.2 draw's expected experts and pairs")
    even = datasheet_moe_source(replace(m, moe_routing="balanced"), hw, "bf16", 128)
    assert even.endswith("balanced rows, at uniform routing (moe_routing balanced)")
    skewed = datasheet_moe_source(replace(m, routing_skew=1.0), hw, "bf16", 128)
    assert skewed.endswith("at uniform routing (routing_skew)")
    assert datasheet_moe_source(catalog.model("llama-3.1-8b"), hw, "bf16", 128) is None
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["model.name=gpt-oss-20b",
                                                                        "hardware.kernels=datasheet"]))
    assert ctx.hw.sources["routed_experts"] == said
    if tables_available():  # measured: kernels_moe_mla names the table; no datasheet line
        measured = _ctx()
        assert "routed_experts" not in measured.hw.sources and "kernels_moe_mla" in measured.hw.sources
