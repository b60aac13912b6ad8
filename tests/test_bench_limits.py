"""trtllm-bench's batch-limit heuristic (sim/device/bench_limits.py) against hand arithmetic from
tensorrt_llm/bench/build/tuning.py, and the accuracy table's rows that take it."""

from __future__ import annotations

import math

import pytest
import yaml

from sim.device.bench_limits import (
    BenchCheckpoint,
    finetune_setting,
    kv_cache_max_requests,
    trtllm_bench_limits,
    unchunked_max_num_tokens,
)
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.studies.e2e_table import bench_checkpoint, checkpoint_elements, default_path, load_measurements

GIB = 1024**3
H200_BYTES = 143771 * 1024**2  # NVML's total of an H200, as the catalog holds it


@pytest.mark.parametrize(("requests", "isl", "osl", "pp", "limits"), [
    (141.9, 1024, 1024, 1, (160, 2048)),  # below 256: a multiple of 32; tokens at least 2048
    (20.0, 1024, 1024, 1, (64, 2048)),  # at least 64
    (653.9, 1024, 1024, 1, (768, 2048)),  # 256..1023: a multiple of 128
    (1773.1, 1024, 1024, 1, (1792, 3584)),  # 1024 and above: a multiple of 256; tokens 3546 -> 14 x 256
    (516.2, 2048, 128, 1, (640, 9216)),  # tokens 516.2 x 17 = 8775 -> 9 x 1024
    (3000.0, 1000, 3000, 1, (3072, 4096)),  # tokens 4000 -> 8 x 512
    (9000.0, 1024, 1024, 1, (4096, 8192)),  # requests capped at 4096
    (9000.0, 8192, 128, 2, (2048, 32768)),  # over two pipeline stages: 2048 each; tokens capped at 32768
])
def test_finetune_rounds_up_as_trtllm_bench_does(requests, isl, osl, pp, limits):
    assert finetune_setting(requests, isl, osl, pp) == limits


def test_the_kv_estimate_is_the_hand_arithmetic():
    ckpt = BenchCheckpoint(num_kv_heads=8, head_size=128, attention_layers=80, params=70.0e9, weight_dtype="fp8",
                           kv_dtype="fp8")
    per_token_gib = 2 * 80 * 8 * 128 * 1 / GIB
    want = (H200_BYTES / GIB * 2 - 70.0e9 / GIB) * 0.95 / (per_token_gib * 2048)
    assert kv_cache_max_requests(ckpt, 2, 1, H200_BYTES, 1024, 1024) == pytest.approx(want, rel=1e-12)
    # bf16 weights take twice the bytes, a bf16 KV twice a token; at least one KV head a tensor-parallel GPU
    bf16 = BenchCheckpoint(1, 128, 80, 70.0e9, "bf16", "bf16")
    want = (H200_BYTES / GIB * 4 - 140.0e9 / GIB) * 0.95 / (2 * 80 * 4 * 128 * 2 / GIB * 2048)
    assert kv_cache_max_requests(bf16, 4, 1, H200_BYTES, 1024, 1024) == pytest.approx(want, rel=1e-12)


def test_deepseek_r1_on_eight_h200s_gets_160_sequences_a_rank():
    """config.json's 128 KV heads of 7168 / 128 = 56 at bf16 (the checkpoint quantises no KV), 671 B fp8
    parameters: 142 requests of 2048 tokens estimated for the group, 160 after rounding up."""
    ckpt = bench_checkpoint(catalog.model("deepseek-r1"), "fp8", "bf16")
    assert (ckpt.num_kv_heads, ckpt.head_size, ckpt.attention_layers) == (128, 56, 61)
    limits = trtllm_bench_limits(ckpt, 8, 1, catalog.gpu("h200-sxm").memory_bytes, 1024, 1024)
    assert limits.kv_cache_max_requests == pytest.approx(141.9, abs=0.1)
    assert (limits.max_batch_size, limits.max_num_tokens) == (160, 2048)
    assert "142 requests estimated -> max_batch_size 160, max_num_tokens 2048" in limits.describe()


def test_a_gqa_checkpoint_reads_its_kv_heads_and_head_dim():
    ckpt = bench_checkpoint(catalog.model("qwen3-235b-a22b"), "fp8", "fp8")
    assert (ckpt.num_kv_heads, ckpt.head_size, ckpt.attention_layers) == (4, 128, 94)  # head_dim, not 4096 / 64


def test_without_chunked_prefill_the_token_limit_holds_the_longest_prompt_beside_a_full_batch():
    """get_settings: max_num_tokens = max(the heuristic's, max ISL + max_batch_size) with chunking off."""
    assert unchunked_max_num_tokens(2048, 160, 1024) == 2048  # 1,184 fits under the heuristic's 2,048
    assert unchunked_max_num_tokens(2048, 160, 8192) == 8352
    ckpt = BenchCheckpoint(8, 128, 80, 70.6e9, "fp8", "fp8")  # Llama-70B FP8 on two H200s, 8192/1024
    raised = trtllm_bench_limits(ckpt, 2, 1, H200_BYTES, 8192, 1024)
    assert (raised.max_batch_size, raised.max_num_tokens) == (160, 8352)
    assert "max_num_tokens 8352 (raised from 2048: max ISL + max_batch_size, chunked prefill off)" in raised.describe()
    chunked = trtllm_bench_limits(ckpt, 2, 1, H200_BYTES, 8192, 1024, chunked_prefill=True)
    assert (chunked.max_batch_size, chunked.max_num_tokens) == (160, 2048) and "raised" not in chunked.describe()
    # the heuristic reads the mean ISL, get_settings the longest prompt
    assert trtllm_bench_limits(ckpt, 2, 1, H200_BYTES, 1024, 1024, max_isl=4096).max_num_tokens == 4096 + 768


def test_weights_it_does_not_tune_take_build_config_defaults():
    limits = trtllm_bench_limits(BenchCheckpoint(8, 128, 32, 8e9, "int4", "fp8"), 1, 1, H200_BYTES, 1024, 1024)
    assert (limits.max_batch_size, limits.max_num_tokens) == (2048, 8192) and math.isnan(limits.kv_cache_max_requests)
    assert "does not tune" in limits.describe()


def test_a_checkpoint_that_leaves_no_room_is_refused():
    with pytest.raises(ValueError, match="too little memory"):
        trtllm_bench_limits(BenchCheckpoint(8, 128, 80, 160e9, "fp8", "fp8"), 1, 1, H200_BYTES, 1024, 1024)


def test_the_rows_that_take_the_heuristic():
    rows = {m.id: m for m in load_measurements() if m.batch_limits == "trtllm-bench"}
    assert len(rows) == 150 and all(not m.chunked_prefill and m.admission == "no_evict" for m in rows.values())
    # gpt-oss's MXFP4 (W4A16_MXFP4 below SM100) is not among the heuristic's tuned quantisations: the defaults,
    # max_num_tokens raised to hold a 32,768-token prompt beside a full batch of 2,048
    assert rows["trt-h200-gpt-oss-120b-tp1-1k1k"].rank_limits()[:2] == (2048, 8192)
    assert rows["trt-h200-gpt-oss-120b-tp1-32k1k"].rank_limits()[:2] == (2048, 32768 + 2048)
    assert rows["trt-h200-deepseek-r1-dep8-1k1k"].rank_limits()[:2] == (160, 2048)
    # DeepSeek-R1 NVFP4 on 4 x B200 (tuned, 0.5 B an element of its 378.3 B packed elements: 176.2 GiB): a token
    # 2 x 61 x 128 x 56 x 1 B = 8.144e-4 GiB (MLA read as 128 KV heads of 7168 / 128), (4 x 179.06 - 176.2) x 0.95
    # / (8.144e-4 x 2048) = 308 requests -> 384 sequences (a multiple of 128 below 1,024), 768 tokens -> 2,048
    assert checkpoint_elements(catalog.model("deepseek-r1"), "nvfp4") == pytest.approx(378.31e9, rel=1e-5)
    assert rows["trt-b200-deepseek-r1-nvfp4-dep4-1k1k"].rank_limits()[:2] == (384, 2048)
    assert rows["trt-h200-70b-fp8-tp2-1k1k"].rank_limits()[:2] == (768, 2048)
    assert rows["trt-h200-70b-fp8-tp2-32k1k"].rank_limits()[:2] == (64, 32768 + 64)  # raised to hold a prompt
    # pipeline stages: the KV estimate takes tp x pp GPUs, the batch is divided by pp (finetune_setting). Llama-3.3-70B
    # NVFP4 on 2 RTX PRO 6000 (97,887 MiB each), TP1 PP2, 1024/1024: a token 2 x 80 x 8 x 128 x 1 B = 1.526e-4 GiB,
    # (2 x 95.59 - 18.91) x 0.95 / (1.526e-4 x 2048) = 524 requests; 524 / 2 = 262 -> 384 sequences, 524 tokens -> 2,048
    pipelined = rows["trt-rtxpro6000-70b-nvfp4-tp1pp2-1k1k"]
    assert pipelined.rank_limits()[:2] == (384, 2048) and "524 requests" in pipelined.rank_limits()[2]
    assert rows["trt-rtxpro6000-70b-nvfp4-tp1-1k1k"].rank_limits()[:2] == (256, 2048)  # one GPU: 233 requests


def test_an_nvfp4_checkpoint_is_tuned_over_its_packed_element_count():
    """NVFP4 is among TUNED_QUANTS at 0.5 bytes a parameter, over the safetensors element count: the packed
    FP4 weights (two a uint8) and their fp8 scales (one per 16) count 0.5625 a weight, the rest one each."""
    from sim.studies.e2e_table import checkpoint_elements

    m = catalog.model("llama-3.1-70b")
    assert checkpoint_elements(m, "fp8") == m.params
    bf16_rest = m.embedding_params() + m.lm_head_params() + m.hidden_size + m.num_layers * m.small_params_layer()
    assert checkpoint_elements(m, "nvfp4") == pytest.approx(bf16_rest + (m.params - bf16_rest) * 0.5625)
    assert checkpoint_elements(m, "mxfp4") == pytest.approx(bf16_rest + (m.params - bf16_rest) * 0.53125)  # per 32
    b200 = catalog.gpu("b200").memory_bytes
    ckpt = bench_checkpoint(m, "nvfp4", "fp8")
    kv_gib_token = 2 * 80 * 8 * 128 * 1.0 / GIB
    requests = (b200 / GIB - checkpoint_elements(m, "nvfp4") * 0.5 / GIB) * 0.95 / (kv_gib_token * 2048)
    limits = trtllm_bench_limits(ckpt, 1, 1, b200, 1024, 1024)
    assert limits.kv_cache_max_requests == pytest.approx(requests) and 486 < requests < 488
    assert (limits.max_batch_size, limits.max_num_tokens) == (512, 2048)  # 128 x 4; max(2048, 1024 + 512)


def test_a_row_gives_its_limits_or_takes_the_heuristic_not_both(tmp_path):
    data = yaml.safe_load(default_path().read_text())
    row = next(r for r in data["measurements"] if r["id"] == "trt-h200-deepseek-r1-dep8-1k1k")
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump({"measurements": [{**row, "max_num_seqs": 64}]}))
    with pytest.raises(ConfigError, match="batch_limits trtllm-bench sets max_num_seqs and max_num_batched_tokens"):
        load_measurements(path)
    path.write_text(yaml.safe_dump({"measurements": [{**row, "batch_limits": "row"}]}))
    with pytest.raises(ConfigError, match="an offline workload needs max_num_seqs, max_num_batched_tokens"):
        load_measurements(path)
