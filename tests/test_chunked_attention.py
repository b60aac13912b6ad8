"""Chunked local attention (Llama 4's RoPE layers, `layers.CHUNKED`): the chunk a token attends, the prefill
pairs by hand, the Llama 4 config.json fields, the decode attention that reads the current chunk only, and
vLLM's chunked-local KV manager, which holds that chunk alone in a serving run and a closed batch (TensorRT-LLM
every token)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.device.kernels import datasheet_hardware
from sim.device.physics import decode_layer_attention_s, kinds_prefill_flop
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import scenario_from_dict
from sim.model.layers import CHUNKED, FULL, chunk_attended, chunk_pairs
from sim.serving.engine import ServingSim
from sim.serving.kv_memory import kv_memory

MAVERICK = catalog.model("llama-4-maverick")
C = 8192


def test_a_token_attends_its_own_chunk():
    # position p (0-based) = tokens - 1 attends C floor(p / C) .. p
    assert chunk_attended(1, C) == 1
    assert chunk_attended(C, C) == C  # the last token of the first chunk attends all of it
    assert chunk_attended(C + 1, C) == 1  # the first of the second attends itself alone
    assert chunk_attended(8192 + 1024, C) == 1024
    assert list(chunk_attended(np.array([5, 8192, 8193, 20000]), C)) == [5, 8192, 1, 20000 - 2 * 8192]


def test_prefill_pairs_within_chunks_by_hand():
    assert chunk_pairs(100, C) == 100 * 101 / 2  # one partial chunk: causal as full attention
    assert chunk_pairs(C, C) == C * (C + 1) / 2
    assert chunk_pairs(20000, C) == 2 * C * (C + 1) / 2 + 3616 * 3617 / 2
    # the pairs are the sum of each token's chunk_attended
    assert chunk_pairs(20000, C) == sum(chunk_attended(np.arange(1, 20001), C))


def test_maverick_from_its_config_fields():
    m = MAVERICK
    assert m.kind_counts == {FULL: 12, CHUNKED: 36} and m.attention_chunk == C
    assert [i for i, k in enumerate(m.kinds) if k == FULL] == list(range(3, 48, 4))  # every 4th NoPE layer
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (128, 1, 8192)
    assert m.shared_expert_intermediate_size == 8192 and m.intermediate_size == 16384 and m.dense_mlp_layers == 24
    assert m.describe_kinds() == "12 full + 36 chunked (8192); 24 dense MLP"
    # every layer stores every token (the engines keep them): 48 x 2 x 8 x 128 x 2 B
    assert m.kv_bytes_per_token("bf16") == 48 * 2 * 8 * 128 * 2 == 196_608


def test_maverick_parameters_as_published():
    # by hand: test_layer_kinds.NEW_MODEL_PARAMS
    assert round(MAVERICK.params / 1e9, -1) == 400  # Meta: 400 B in all (the vision encoder not counted here)


def test_a_multimodal_config_json_reads_its_text_config(tmp_path):
    entry = next(e for e in catalog._read_catalog("models.yaml")["models"] if e["name"] == "llama-4-maverick")
    text = {**entry["config"], "no_rope_layers": [], "moe_layers": list(range(1, 48, 2))}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                                "text_config": text, "vision_config": {"hidden_size": 1408}}))
    m = catalog.model_from_hf_config(path)
    assert m.kind_counts == MAVERICK.kind_counts and m.params == MAVERICK.params
    text["no_rope_layers"] = [1, 1, 1, 0] * 11
    path.write_text(json.dumps({"model_type": "llama4", "text_config": text}))
    with pytest.raises(ConfigError) as err:
        catalog.model_from_hf_config(path)
    assert err.value.field == "no_rope_layers" and "44 entries for 48 layers" in err.value.message


def _all_full(model):
    return replace(model, layer_kinds=(), attention_chunk=0)


@pytest.mark.parametrize("gpu", ["h200-sxm", "b200"])
def test_decode_reads_the_current_chunk(gpu):
    hw = datasheet_hardware(gpu, "fp8")
    m = MAVERICK.shard(8, ep=8, attention_dp=8, dense_dp=True)
    kvl = m.kv_bytes_per_token_layer("fp8")
    batch = 512
    # within the first chunk a chunked layer attends what a full one does: the same time as all-full layers
    short = np.full(batch, 2000)
    t_chunked = decode_layer_attention_s(m, hw, batch, int(short.sum()), kvl,
                                         chunk_tokens=int(chunk_attended(short, C).sum()))
    assert t_chunked == pytest.approx(decode_layer_attention_s(_all_full(m), hw, batch, int(short.sum()), kvl), rel=1e-12)
    # past it (8k/1k: positions 8,192 .. 9,216) the 36 chunked layers read ~1/17 of what a full layer reads
    long = np.full(batch, 8192 + 512)
    exact = decode_layer_attention_s(m, hw, batch, int(long.sum()), kvl, chunk_tokens=int(chunk_attended(long, C).sum()))
    bound = decode_layer_attention_s(m, hw, batch, int(long.sum()), kvl)  # no per-sequence count: min(n, C) each
    full = decode_layer_attention_s(_all_full(m), hw, batch, int(long.sum()), kvl)
    assert exact < bound < full
    assert exact < 0.5 * full  # 12 of 48 layers read the whole context, the rest 512 tokens a sequence


def test_prefill_flop_attends_within_chunks():
    m = MAVERICK
    P = 32768
    chunked = kinds_prefill_flop(m, 1, P)
    full = kinds_prefill_flop(_all_full(m), 1, P)
    per_pair = 4 * 40 * 128  # QK^T and PV, 2 FLOP a MAC
    assert full == pytest.approx(per_pair * P * (P + 1) / 2, rel=1e-12)
    assert chunked == pytest.approx(per_pair * (12 * P * (P + 1) / 2 + 36 * 4 * C * (C + 1) / 2) / 48, rel=1e-12)


def test_a_serving_step_counts_each_decodes_chunk():
    sim = SimpleNamespace(ctx=SimpleNamespace(model=MAVERICK),
                          table=SimpleNamespace(prompt=np.array([1024, 8192, 32768]), generated=np.array([10, 100, 1])))
    assert ServingSim.chunk_tokens(sim, np.array([0, 1, 2])) == 1034 + 100 + 1
    assert ServingSim.chunk_tokens(sim, np.array([], dtype=np.int64)) is None
    sim.ctx.model = catalog.model("llama-3.1-8b")
    assert ServingSim.chunk_tokens(sim, np.array([0])) is None


def test_vllm_holds_the_current_chunk_alone():
    """ChunkedLocalAttentionManager frees the blocks before a chunk's start: a chunked layer holds
    ((n - 1) mod C) + 1 tokens. Maverick at TP 8 (one KV head of 128 a GPU, bf16): 512 B a token a layer;
    10,000 tokens hold 12 x 10,000 + 36 x 1,808 token-layers under vLLM, 48 x 10,000 under TensorRT-LLM."""
    assert chunk_attended(1, C) == 1 and chunk_attended(C, C) == C and chunk_attended(C + 1, C) == 1
    assert list(chunk_attended(np.array([10_000, 2 * C]), C)) == [10_000 - C, C]

    def memory(engine):
        data = {"name": "m", "model": {"name": "llama-4-maverick"}, "hardware": {"gpu": "h200-sxm"},
                "parallel": {"tp": 8},
                "workload": {"prompt_tokens": 1024, "reasoning_tokens": 4096, "seed": 1,
                             "arrivals": {"kind": "closed_loop", "concurrency": 8, "requests": 8}},
                "policy": {"kind": "full_hbm"}, "sim": {"detail": "step"}}
        data |= {"engine": {"name": engine}} if engine else {}
        return kv_memory(build_context(scenario_from_dict(data, "t.yaml")), 8192, 256)

    per_layer = 2 * 1 * 128 * 2
    for engine in (None, "vllm"):
        m = memory(engine)
        assert m.chunk_rule == (36 * per_layer, C)
        assert m.hbm_kv_bytes(10_000, 0, 10_000) == (12 * 10_000 + 36 * 1808) * per_layer
        assert m.hbm_kv_bytes(5000, 0, 5000) == 48 * 5000 * per_layer  # still in its first chunk
    trt = memory("tensorrt-llm")
    assert trt.chunk_rule is None and trt.hbm_kv_bytes(10_000, 0, 10_000) == 48 * 10_000 * per_layer


def test_a_closed_batch_under_vllm_holds_the_current_chunk_and_the_prefills_last():
    """The closed batch's trace applies vLLM's rule as the serving run does (`RunContext.chunk_freed_bytes`).
    Four sequences of 8,192 + 1,024 tokens, Maverick at TP 8 (bf16: F = 12 x 512 B full, S = 36 x 512 B
    chunked a token): the first decode step still holds the prompt's whole chunk (the trace has no prefill
    row; vLLM frees it as that step starts, so it is the peak), the next holds 2 tokens of the new chunk,
    the last 1,024; TensorRT-LLM every token."""
    from sim.decode.capacity import batch_memory_trace

    def trace(engine):
        data = {"name": "m", "model": {"name": "llama-4-maverick"}, "hardware": {"gpu": "h200-sxm"},
                "parallel": {"tp": 8}, "workload": {"batch_size": 4, "prompt_tokens": C, "reasoning_tokens": 1024},
                "policy": {"kind": "full_hbm"}} | ({"engine": {"name": engine}} if engine else {})
        return batch_memory_trace(build_context(scenario_from_dict(data, "t.yaml")), 4).kv_t0_bytes

    full, chunked = 12 * 512, 36 * 512
    for engine in (None, "vllm"):
        kv = trace(engine)
        assert kv[0] == 4 * (8193 * full + C * chunked) == kv.max()
        assert kv[1] == 4 * (8194 * full + 2 * chunked)
        assert kv[-1] == 4 * (9216 * full + 1024 * chunked)
    assert trace("tensorrt-llm")[-1] == 4 * 9216 * (full + chunked)


def test_tensorrt_llm_decodes_chunked_layers_on_mmha_below_sm100():
    """XQA refuses a chunk (kernelUtils.cpp supportConfigCommon) and attentionOp.cpp falls back to MMHA;
    compute capability 10.x decodes on trtllm-gen, which takes it; below max_seq_len = C no chunk is handed on."""
    from sim.device.engine_rules import trtllm_chunked_decode_on_mmha as on_mmha

    assert on_mmha("tensorrt-llm", "h200-sxm", C, 9216) and on_mmha("tensorrt-llm", "rtx-pro-6000-server", C, C)
    assert not on_mmha("tensorrt-llm", "h200-sxm", C, 2048)
    assert not on_mmha("tensorrt-llm", "b200", C, 9216) and not on_mmha("tensorrt-llm", "gb300", C, 9216)
    assert not on_mmha("vllm", "h200-sxm", C, 9216) and not on_mmha("sglang", "h100-sxm", C, 9216)
    assert not on_mmha("tensorrt-llm", "h200-sxm", 0, 9216) and not on_mmha("tensorrt-llm", "h200-sxm", C, None)


def _row_context(row_id: str):
    from sim.studies.accuracy import scenario_for
    from sim.studies.e2e_table import load_measurements

    return build_context(scenario_for(next(m for m in load_measurements() if m.id == row_id), "measured"))


def test_the_perf_overviews_h200_maverick_runs_decode_on_mmha_past_the_chunk():
    """trtllm-bench's max_seq_len is ISL + OSL: 9,216 at 1k/8k reaches the chunk, 2,048 at 1k/1k does not;
    B200 decodes the same on trtllm-gen."""
    from sim.inputs.kernel_tables import tables_available

    if not tables_available():
        pytest.skip("the .[measured] extra is not installed")
    ctx = _row_context("trt-h200-llama4-maverick-fp8-dep8-1k8k")
    assert ctx.max_model_len == 9216 and ctx.hw.chunked_decode_per_query_head
    assert "MMHA" in ctx.hw.sources["chunked_decode"] and "5x the reads" in ctx.hw.sources["chunked_decode"]
    assert not _row_context("trt-h200-llama4-maverick-fp8-dep8-1k1k").hw.chunked_decode_per_query_head
    assert not _row_context("trt-b200-llama4-maverick-nvfp4-dep4-1k8k").hw.chunked_decode_per_query_head


def test_a_chunked_layer_on_mmha_costs_the_tables_mha_row():
    """One block per query head: the measured tables time MMHA in their MHA rows (kv heads = heads). At 16
    sequences x 4,095 tokens, fp8 KV, H200's TensorRT-LLM table reads 313.8 us for 40 MHA heads, where XQA's
    40 / 8 GQA row reads 45.6; a layer of Maverick's chunked attention takes the first on MMHA."""
    from sim.device.physics import kinds_attention_s
    from sim.inputs.kernel_tables import tables_available

    if not tables_available():
        pytest.skip("the .[measured] extra is not installed")
    ctx = _row_context("trt-h200-llama4-maverick-fp8-dep8-1k8k")
    rank = replace(ctx.model, attention_dp=1, layer_kinds=(CHUNKED,) * ctx.model.num_layers)
    kvl = rank.kind_kv_bytes_per_token_layer(CHUNKED, "fp8")
    b, n = 16, 4095
    gqa_hw = replace(ctx.hw, chunked_decode_per_query_head=False)
    mmha, xqa = (kinds_attention_s(rank, hw, b, b * n, (b * n + b) * kvl, kvl) for hw in (ctx.hw, gqa_hw))
    assert mmha == pytest.approx(313.8e-6, abs=0.1e-6) and xqa == pytest.approx(45.6e-6, abs=0.1e-6)
    assert mmha == pytest.approx(ctx.hw.kernels.decode_attention_one_s(b, n, 40, 40, 128, "fp8"), rel=1e-12)


def test_datasheet_mode_costs_mmha_by_its_own_fit():
    """Datasheet mode takes MMHA's own fit (`catalog.FittedKernels.mha_attention`, TensorRT-LLM's one-query-
    head-per-KV-head rows) for the chunked layers, not XQA's: floor + bytes / (HBM x fp8 efficiency x c /
    (c + half)), c = 16 x 40 blocks, by hand; measured mode has none (the tables' MHA rows), nor has a
    scenario that sets the decode-attention rate."""
    from sim.device.physics import kinds_attention_s
    from sim.studies.accuracy import scenario_for
    from sim.studies.e2e_table import load_measurements

    row = next(m for m in load_measurements() if m.id == "trt-h200-llama4-maverick-fp8-dep8-1k8k")
    sc = scenario_for(row, "datasheet")
    ctx = build_context(sc)
    fit = catalog.fitted_kernels_for("h200-sxm", "trtllm").mha_attention
    hbm = catalog.gpu("h200-sxm").hbm_bytes_per_s
    k = ctx.hw.mha_decode
    assert k.floor_s == fit.floor_s and k.hbm_bytes_per_s == hbm * fit.hbm_efficiency
    assert k.shape.fp8_hbm_bytes_per_s == hbm * fit.fp8_hbm_efficiency and fit.held_out.points > 100
    assert "MMHA decode attention" in ctx.hw.sources["chunked_decode"]
    rank = replace(ctx.model, attention_dp=1, layer_kinds=(CHUNKED,) * ctx.model.num_layers)
    kvl = rank.kind_kv_bytes_per_token_layer(CHUNKED, "fp8")
    b, n = 16, 4095
    ctas, nbytes = b * 40, (b * n + b) * kvl * 5  # 40 query heads a rank, each its KV head's cache: 5x the bytes
    by_hand = fit.fp8_floor_s + max(nbytes / (k.shape.fp8_hbm_bytes_per_s * ctas / (ctas + fit.half_ctas)),
                                    fit.fp8_per_cta_s * ctas)
    assert kinds_attention_s(rank, ctx.hw, b, b * n, (b * n + b) * kvl, kvl) == pytest.approx(by_hand, rel=1e-12)
    assert build_context(scenario_for(row, "measured")).hw.mha_decode is None
    pinned = sc.model_copy(update={"hardware": sc.hardware.model_copy(update={
        "efficiency": sc.hardware.efficiency.model_copy(update={"attention_hbm_efficiency": 0.8})})})
    assert build_context(pinned).hw.mha_decode is None
