"""A decoder layer's elementwise passes by bytes (issue #20 item 3, sim/device/elementwise.py): each pass
max(floor + width x per-element cost, rows x bytes a row / (HBM x efficiency)), the passes as the engine
runs them, the constants fitted on Vidur's Llama-2-7B profiles and held out on Llama-2-70B's."""

from __future__ import annotations

import pytest

from sim.decode.context import build_context
from sim.device.elementwise import (
    ADD,
    ADD_RMSNORM,
    HEAD_NORMS,
    RMSNORM,
    ROPE,
    SILU_MUL,
    VLLM_SGLANG_PASSES,
    PassFit,
    elementwise_for,
    engine_passes,
    layer_passes_s,
    pass_s,
)
from sim.device.physics import elementwise_widths, layer_overhead_s
from sim.inputs import catalog
from sim.inputs.scenario import load_scenario

from .conftest import REPO, SCENARIOS

SERVING = SCENARIOS / "serving-h100-70b-tp4.yaml"
H100_HBM = catalog.gpu("h100-sxm").hbm_bytes_per_s


def test_a_pass_is_a_rows_latency_or_its_streaming():
    fit = PassFit(2e-6, 0.5e-9, 0.5)
    assert pass_s(fit, 1, 4096, 4 * 4096, 1e12) == pytest.approx(2e-6 + 4096 * 0.5e-9)  # one row: its latency
    assert pass_s(fit, 8192, 4096, 4 * 4096, 1e12) == pytest.approx(8192 * 4 * 4096 / 0.5e12)  # many: streamed


def test_llama_8b_layer_by_hand_on_h100():
    """vLLM's four passes of Llama-3.1-8B (h 4,096, 32 + 8 heads of 128, I 14,336) at H100's fitted
    constants: at 1 row each pass's latency; at 8,192 rows each streams its bytes (the fused add + RMSNorm
    4 h, rope 2 (q + k), SiLU-and-mul 3 I, at 2 B) at its share of HBM."""
    ew = elementwise_for("h100-sxm", "vllm")
    norm, rope, act = ew.fit(RMSNORM), ew.fit(ROPE), ew.fit(SILU_MUL)
    model = catalog.model("llama-3.1-8b")
    widths = elementwise_widths(model)
    assert widths == {RMSNORM: ((4096, 1.0),), ADD: ((4096, 1.0),), ROPE: ((40 * 128, 1.0),), SILU_MUL: ((14336, 1.0),),
                      HEAD_NORMS: ()}  # Llama's attention has no norms of its own
    one = 2 * (norm.floor_s + 4096 * norm.s_per_element) + rope.floor_s + 5120 * rope.s_per_element \
        + act.floor_s + 14336 * act.s_per_element
    assert layer_passes_s(ew, 1, widths, H100_HBM) == pytest.approx(one)
    many = 8192 * 2 * (2 * 4 * 4096 / norm.hbm_efficiency + 2 * 5120 / rope.hbm_efficiency
                       + 3 * 14336 / act.hbm_efficiency) / H100_HBM
    assert layer_passes_s(ew, 8192, widths, H100_HBM) == pytest.approx(many)
    assert 15e-6 < one < 25e-6  # about the flat 20 us it replaces, for a decode step
    assert many > 20 * one  # a prefill step's passes are no flat figure


def test_the_engines_passes():
    assert engine_passes("vllm") == engine_passes("sglang") == engine_passes(None) == VLLM_SGLANG_PASSES
    assert VLLM_SGLANG_PASSES == (ADD_RMSNORM, ROPE, ADD_RMSNORM, SILU_MUL, HEAD_NORMS)  # no add apart: in the norms
    assert engine_passes("tensorrt-llm") == ()


def test_a_run_costs_its_passes_unless_a_figure_is_given():
    """Without `engine:` and under vLLM or SGLang a layer's overhead is its passes at the step's rows; a
    scenario's hardware.efficiency.layer_overhead_s, and TensorRT-LLM, keep one flat figure."""
    ctx = build_context(load_scenario(SERVING))
    assert ctx.hw.elementwise is not None and ctx.hw.layer_overhead_s == 0.0
    assert "elementwise passes by bytes" in ctx.hw.sources["layer_overhead_s"]
    small, large = layer_overhead_s(ctx.model, ctx.hw, 1), layer_overhead_s(ctx.model, ctx.hw, 8192)
    assert small == pytest.approx(layer_passes_s(ctx.hw.elementwise, 1, elementwise_widths(ctx.model), H100_HBM))
    assert large > 20 * small
    flat = build_context(load_scenario(SERVING, ["hardware.efficiency.layer_overhead_s=3e-05"]))
    assert flat.hw.elementwise is None and layer_overhead_s(flat.model, flat.hw, 8192) == 3e-05
    trt = build_context(load_scenario(SERVING, ["engine.name=tensorrt-llm"]))
    assert trt.hw.elementwise is None and layer_overhead_s(trt.model, trt.hw, 8192) == pytest.approx(2e-05)


def test_widths_of_moe_mla_and_linear_layers():
    """DeepSeek-R1 on one GPU: rope over each of its 128 heads' 64 rotated dims and the latent's key; the
    SiLU-and-mul of the 3 dense layers' MLP (18,432) and of the 58 MoE layers' shared expert (2,048); its
    q_a / kv_a norms over q_lora_rank 1,536 and kv_lora_rank 512. Qwen3-Next: no rope in its 36
    linear-attention layers of 48."""
    r1 = elementwise_widths(catalog.model("deepseek-r1"))
    assert r1[ROPE] == ((129 * 64, 1.0),)
    assert r1[SILU_MUL] == ((18432, 3 / 61), (2048, 58 / 61))
    assert r1[HEAD_NORMS] == ((1536, 1.0), (512, 1.0))
    nxt = catalog.model("qwen3-next-80b-a3b")
    assert elementwise_widths(nxt)[ROPE][0][1] == pytest.approx(1 - 36 / 48)


def test_the_committed_fit_matches_the_data_and_holds_out():
    """scripts/fit_elementwise.py --check: the committed constants are the fit's; a layer of Vidur's five
    passes is within 5% (H100) and 13% (A100) in median on Llama-2-70B, never fitted."""
    import subprocess
    import sys

    pytest.importorskip("scipy")  # the fit's solver (the .[measured] extra brings it)
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "fit_elementwise.py"), "--check"], check=False,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    held = {g: v["layer_error_held_out"] for g, v in catalog.fitted_elementwise()["gpus"].items()}
    assert held["h100-sxm"]["median"] < 0.05 and held["a100-80gb-sxm"]["median"] < 0.13
    assert max(v["worst"] for v in held.values()) < 0.25


def test_kvsim_ops_costs_one_pass():
    """`kvsim ops elementwise`: one pass from flags (its latency at one row, by hand), the datasheet model
    under --kernels measured too (no table times these passes), and a missing width refused in one line."""
    import json

    from .conftest import run_cli

    res = run_cli("ops", "elementwise", "--kind", "silu_mul", "--m", "1", "--width", "28672", "--gpu", "h100-sxm",
                  "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    act = elementwise_for("h100-sxm", None).fit(SILU_MUL)
    assert doc["datasheet_s"] == pytest.approx(act.floor_s + 28672 * act.s_per_element)
    assert doc["measured_s"] == doc["datasheet_s"] and "no measured elementwise table" in doc["measured_note"]
    bad = run_cli("ops", "elementwise", "--m", "4")
    assert bad.returncode != 0 and bad.stderr.strip().endswith("elementwise needs m, width; missing width")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_qwen3s_per_head_norms_by_hand():
    """Qwen3-8B (32 query and 8 KV heads of 128) at TP 2: q_norm and k_norm run a row of 128 per head -
    at one token each a row's latency; at 8,192 tokens (16 + 4) x 8,192 rows of 2 x 128 x 2 B streamed."""
    model = catalog.model("qwen3-8b").shard(2)
    assert elementwise_widths(model)[HEAD_NORMS] == ((128, 1.0, 16), (128, 1.0, 4))
    ew = elementwise_for("h100-sxm", "vllm")
    norm = ew.fit(RMSNORM)
    only = {HEAD_NORMS: elementwise_widths(model)[HEAD_NORMS]}
    one_row = norm.floor_s + 128 * norm.s_per_element
    assert layer_passes_s(ew, 1, only, H100_HBM, (HEAD_NORMS,)) == pytest.approx(2 * one_row)
    assert layer_passes_s(ew, 8192, only, H100_HBM, (HEAD_NORMS,)) == pytest.approx(
        20 * 8192 * 2 * 128 * 2 / (H100_HBM * norm.hbm_efficiency))
