"""MLA prefill from TensorRT-LLM's context-MLA table: the adapter reads its rows in the loader's units
(checked against the raw parquet), the measured call returns the table at its points, a DeepSeek step's
prefill attention takes it in measured mode, the held-out split removes whole lines, datasheet mode costs
it on its own fit of that table, and the run's sources say so."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sim.decode.context import build_context
from sim.device.physics import prefill_attention_s
from sim.inputs.scenario import scenario_from_dict


@pytest.fixture(scope="module")
def h200():
    pytest.importorskip("aiconfigurator_core")
    from sim.inputs.kernel_tables import load_tables, with_moe_mla

    return with_moe_mla(load_tables("h200-sxm", "trtllm"))


def _raw() -> pd.DataFrame:
    from sim.inputs.kernel_tables import _package_root

    return pd.read_parquet(_package_root() / "systems" / "data" / "h200_sxm" / "mla" / "trtllm" / "1.3.0rc20"
                           / "context_mla_perf.parquet")


def test_a_context_mla_row_reads_in_seconds_per_gpu_heads(h200):
    raw = _raw()
    row = raw[(raw.kv_cache_dtype == "bfloat16") & (raw.num_heads == 16) & (raw.batch_size == 1) & (raw.isl == 4096)]
    assert len(row) == 1
    t = h200.mla_context
    ours = t[(t.kv_dtype == "bf16") & (t.heads == 16) & (t.batch == 1) & (t.tokens == 4096)]
    assert ours.latency_s.item() == pytest.approx(row.latency.item() / 1e3, rel=1e-12)
    assert set(t.kv_dtype) == {"bf16", "fp8"} and set(t.heads) == {1, 2, 4, 8, 16, 32, 64, 128}
    assert h200.table_sources["context_mla"] == h200.table_sources["generation_mla"]  # one version for both


def test_the_measured_call_returns_the_table_at_its_points(h200):
    from sim.device.measured_kernels import measured_kernels_for

    mk = measured_kernels_for("h200-sxm", "trtllm")
    t = h200.mla_context
    for heads, batch, tokens in ((16, 1, 4096), (128, 4, 1024), (16, 8, 8192)):
        row = t[(t.kv_dtype == "fp8") & (t.heads == heads) & (t.batch == batch) & (t.tokens == tokens)]
        assert mk.mla_context_one_s(batch, tokens, heads, "fp8") == pytest.approx(row.latency_s.item(), rel=1e-9)
    between = mk.mla_context_one_s(1, 5000, 16, "bf16")  # between the 4,096 and 6,144 points
    assert mk.mla_context_one_s(1, 4096, 16, "bf16") < between < mk.mla_context_one_s(1, 6144, 16, "bf16")


def test_the_held_out_split_removes_whole_context_mla_lines(h200):
    from sim.inputs.kernel_tables import split_tables

    tune, held = split_tables(h200)
    assert len(tune.mla_context) + len(held.mla_context) == len(h200.mla_context)
    assert set(held.mla_context.tokens) - set(tune.mla_context.tokens)
    assert set(held.mla_context.batch) - set(tune.mla_context.batch)


def _r1(kernels: str) -> object:
    return build_context(scenario_from_dict(
        {"name": "r1", "model": {"name": "deepseek-r1", "weight_dtype": "fp8", "kv_dtype": "fp8"},
         "hardware": {"gpu": "h200-sxm", "kernels": kernels}, "parallel": {"tp": 8},
         "engine": {"name": "tensorrt-llm"}, "policy": {"kind": "full_hbm"},
         "workload": {"batch_size": 1, "prompt_tokens": 1024, "reasoning_tokens": 16}}, "r1.yaml"))


def test_a_deepseek_step_takes_the_table_in_measured_mode_only(h200):
    """4 whole prompts of 1,024 tokens: the position sum 4 x 1,024 x 1,025 / 2 attends as 4 prompts of
    1,024, the table's (16 heads a GPU at TP 8, fp8 KV) point; datasheet mode keeps its formula."""
    ctx = _r1("measured")
    assert ctx.model.num_heads == 16
    pos = 4 * 1024 * 1025 / 2
    got = prefill_attention_s(ctx.model, ctx.hw, pos, 4 * 1024, ctx.kv_bytes_per_token_layer, seqs=4, new_tokens=4096)
    t = h200.mla_context
    row = t[(t.kv_dtype == "fp8") & (t.heads == 16) & (t.batch == 4) & (t.tokens == 1024)]
    assert got == pytest.approx(row.latency_s.item(), rel=1e-6)
    ds = _r1("datasheet")
    other = prefill_attention_s(ds.model, ds.hw, pos, 4 * 1024, ds.kv_bytes_per_token_layer, seqs=4, new_tokens=4096)
    assert not math.isclose(other, got, rel_tol=1e-3)


def test_the_sources_name_the_context_mla_table(h200):
    s = _r1("measured").hw.sources
    assert "trtllm 1.3.0rc20 context_mla" in s["prefill_attention"]
    assert "MLA decode and prefill where their tables hold the format" in s["kernels"]
    assert "MLA prefill, " not in s["kernels"]
    assert "MLA prefill measured" in s["kernels_moe_mla"]
    assert _r1("datasheet").hw.sources["prefill_attention"].startswith("datasheet: physics.prefill_attention_s, MLA")


def test_datasheet_mode_costs_mla_prefill_on_its_own_fit():
    """datasheet: floor + max(FLOP / rate, KV bytes / HBM) + each new token's write, the MLA fit's figures
    (rate = peak x its FLOP efficiency x n / (n + half tokens) x tiles / (tiles + half tiles)), by hand."""
    ctx = _r1("datasheet")
    hw, model = ctx.hw, ctx.model
    p = hw.prefill_attention_shape.of(True, mla=True)
    assert p is hw.prefill_attention_shape.mla[1] and p is not hw.prefill_attention_shape.fp8
    b, n = 4, 1024
    pos = b * n * (n + 1) / 2
    flop = 2 * 16 * (192 + 128) * pos  # 16 heads a GPU: QK^T over 192, PV over 128, a multiply-add each
    rate = hw.attention_flop_per_s * p.flop_scale * n / (n + p.half_tokens)
    tiles = b * 16 * math.ceil(n / 128)
    rate *= tiles / (tiles + p.half_tiles)
    kv_bytes = b * n * ctx.kv_bytes_per_token_layer
    want = p.floor_s + max(flop / rate, kv_bytes / hw.attention_hbm_bytes_per_s) + p.kv_write_s * b * n * 1
    got = prefill_attention_s(model, hw, pos, b * n, ctx.kv_bytes_per_token_layer, seqs=b, new_tokens=b * n)
    assert got == pytest.approx(want, rel=1e-9)
    assert "MLA prefill on its own fit" in hw.sources["prefill_attention"]
