"""Serving with layer kinds: each running request holds its window and linear layers' bounded bytes
in HBM (min(tokens, W) tokens of window KV, as vLLM frees the blocks that left the window, + its
linear state), admission reserves them, and the run's HBM peak includes them - by hand for
gpt-oss-20b and Qwen3-Next. A dense model reserves nothing (its goldens are byte-identical).
Under TensorRT-LLM and SGLang the window layers' KV lives in a pool of its own, half the budget for
gpt-oss under TensorRT-LLM, 0.8 / 1.8 of it under SGLang (`device.memory.trtllm_window_tokens`,
`device.memory.sglang_swa_pool_shares`, `serving.kv_memory.window_pools`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import sim.serving.run as serving_run
from sim.decode.context import build_context
from sim.device.memory import sglang_swa_pool_shares, trtllm_temporary_window, trtllm_window_tokens
from sim.inputs.scenario import scenario_from_dict
from sim.serving.kv_memory import engine_scheduler, kv_memory
from sim.serving.run import simulate_serving

BF16 = 2
OSS20_KV = 12 * 2 * 8 * 64 * BF16  # gpt-oss-20b: 12 full layers x K,V x 8 heads x 64: 24,576 B a token
OSS20_WINDOW = 12 * 2 * 8 * 64 * BF16  # ... and its 12 window layers, per token held: 24,576 B
W = 128
PROMPT, OUTPUT, BATCHED = 1024, 4, 65_536


def _scenario(model: str = "gpt-oss-20b", reserve: float | None = None, tp: int = 1) -> dict:
    """Closed loop of 64 requests of 1,024 + 4 tokens, full_hbm, every prompt prefilled in the first step."""
    hw = {"gpu": "h100-sxm"} | ({"efficiency": {"runtime_reserve_bytes": reserve}} if reserve is not None else {})
    return {"name": "serving-bounded", "model": {"name": model}, "hardware": hw, "parallel": {"tp": tp},
            "workload": {"prompt_tokens": PROMPT, "reasoning_tokens": OUTPUT, "seed": 1,
                         "arrivals": {"kind": "closed_loop", "concurrency": 64, "requests": 64}},
            "scheduler": {"max_num_batched_tokens": BATCHED},
            "policy": {"kind": "full_hbm"}, "sim": {"detail": "step"}}


def _memory(data: dict):
    ctx = build_context(scenario_from_dict(data, "test.yaml"))
    return ctx, kv_memory(ctx, BATCHED, 256)


def test_a_request_holds_min_tokens_w_of_window_kv():
    ctx, mem = _memory(_scenario())
    assert mem.kv_bytes_per_token == OSS20_KV
    assert mem.bounded_bytes(100) == 100 * OSS20_WINDOW  # shorter than the window: every token
    assert mem.bounded_bytes(1_000) == mem.bounded_bytes() == W * OSS20_WINDOW == 3_145_728  # the window only
    assert mem.hbm_kv_bytes(100, 0, 100) == 100 * OSS20_KV + 100 * OSS20_WINDOW
    assert mem.hbm_kv_bytes(1_000, 0, 1_000) == 1_000 * OSS20_KV + 3_145_728
    assert mem.hbm_kv_bytes(0, 0) == 3_145_728  # no token count: the most a request holds


def test_a_linear_layer_request_holds_its_state_whatever_its_length():
    """Qwen3-Next at TP 2: 36 linear layers x (32 x 128 x 128 + 3 x (2 x 16 x 128 + 32 x 128)) x 2 B,
    the heads split two ways; the 12 full layers' 1 KV head of 256 a GPU tier per token."""
    state = 36 * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * BF16 // 2
    _, mem = _memory(_scenario("qwen3-next-80b-a3b", tp=2))
    assert state == 19_759_104 and mem.kv_bytes_per_token == 12 * 2 * 1 * 256 * BF16
    assert mem.bounded_bytes(1) == mem.bounded_bytes(100_000) == mem.bounded_bytes() == state


def test_dense_requests_reserve_nothing_more():
    _, mem = _memory(_scenario("llama-3.1-8b"))
    assert mem.request_bounded is None and mem.bounded_bytes(5_000) == 0.0
    assert mem.hbm_kv_bytes(10, 0, 10) == 10 * mem.kv_bytes_per_token


def test_admission_reserves_the_window_so_fewer_requests_run_and_the_peak_holds_them(monkeypatch):
    """A KV budget of 40.25 prompts' KV (1,024 x 24,576 B each): without the window reservation the
    first step admits 40 prompts; each also holds 128 tokens x 24,576 B = 3,145,728 B in its window
    layers, so floor(40.25 x 25,165,824 / (25,165,824 + 3,145,728)) = 35 run. They decode in lockstep
    to 1,027 tokens (no preemption: 35 x 28,385,280 B < the budget), the HBM peak's step."""
    _, mem = _memory(_scenario())
    budget = 40.25 * PROMPT * OSS20_KV
    reserve = mem.hbm_capacity_bytes - mem.weights_bytes - mem.activation_bytes - budget
    data = _scenario(reserve=reserve)
    res = simulate_serving(scenario_from_dict(data, "test.yaml")).summary
    assert res.kv_budget_bytes == pytest.approx(budget, rel=1e-12)
    per_request = PROMPT * OSS20_KV + W * OSS20_WINDOW  # 28,311,552 B at admission
    assert int(budget // per_request) == 35 and res.max_running == 35
    assert res.fits and res.preemptions == 0
    fixed = mem.hbm_capacity_bytes - budget  # weights + activations + reserve
    last = 35 * ((PROMPT + OUTPUT - 1) * OSS20_KV + W * OSS20_WINDOW)  # the first wave's last decode step
    assert last == 993_484_800
    assert res.hbm_peak_bytes == pytest.approx(fixed + last, rel=1e-12)
    assert res.hbm_peak_bytes - fixed - 35 * (PROMPT + OUTPUT - 1) * OSS20_KV == pytest.approx(35 * 3_145_728, rel=1e-9)

    def without_bounded(ctx, *args):  # the same run, the window bytes not reserved (what serving did before)
        return replace(kv_memory(ctx, *args), bounded_bytes_per_request=0.0, request_bounded=None)

    monkeypatch.setattr(serving_run, "kv_memory", without_bounded)
    unreserved = simulate_serving(scenario_from_dict(data, "test.yaml")).summary
    assert unreserved.max_running == 40  # floor(40.25)


def test_trtllm_window_reserve_by_hand():
    """calculateTemporaryAttentionWindow: min(max_num_tokens, max_seq_len - 1 - W), 0 where the input fits
    the window; getRemainingBlocksToCompletion: min(tokens, W + that) + one 32-token block past W."""
    assert trtllm_temporary_window(128, 2048, 8192) == 1919  # trtllm-bench's 1k/1k: max_seq_len 2,048
    assert trtllm_temporary_window(128, 131_072, 8192) == 8192  # the model's context: max_num_tokens binds
    assert trtllm_temporary_window(4096, 2048, 8192) == 0  # every input fits the window
    assert trtllm_window_tokens(100, 128, 131_072, 8192) == 100  # inside the window: no extra block
    assert trtllm_window_tokens(2048, 128, 131_072, 8192) == 2048 + 32
    assert trtllm_window_tokens(20_000, 128, 131_072, 8192) == 128 + 8192 + 32
    assert list(trtllm_window_tokens(np.array([100, 20_000]), 128, 2048, 8192)) == [100, 128 + 1919 + 32]


def _trtllm(data: dict, non_torch_bytes: float = 1e9) -> dict:
    return data | {"engine": {"name": "tensorrt-llm", "non_torch_bytes": non_torch_bytes}}


def test_trtllm_counts_a_request_against_the_fuller_of_two_equal_pools():
    """gpt-oss-20b (12 full + 12 window layers of 24,576 B a token): TensorRT-LLM gives each window size
    half the budget, so a request counts as twice what it holds in the fuller pool; max_num_tokens
    65,536 and the model's 131,072-token context leave W + 65,536 tokens for the window's."""
    _, mem = _memory(_trtllm(_scenario()))
    assert mem.pool_shares == (0.5, 0.5) and mem.kv_bytes_per_token == OSS20_KV
    assert mem.bounded_bytes(1_000) == (1_000 + 32) * OSS20_WINDOW  # past W: the window's reserve + a block
    assert mem.hbm_kv_bytes(1_000, 0, 1_000) == 2 * (1_000 + 32) * OSS20_WINDOW  # the window pool is the fuller
    assert mem.hbm_kv_bytes(100_000, 0, 100_000) == 2 * 100_000 * OSS20_KV  # the full pool is
    assert mem.bounded_bytes() == (W + 65_536 + 32) * OSS20_WINDOW  # the most one holds
    _, dense = _memory(_trtllm(_scenario("llama-3.1-8b")))
    assert dense.pool_shares is None and dense.request_bounded is None  # no window layers: one pool, as before


def test_trtllm_admits_whole_requests_against_the_window_pools():
    """GUARANTEED_NO_EVICT under the two pools: each request of 1,024 + 4 tokens reserves 2 x (1,028 + 32)
    x 24,576 B, so floor(budget / that) run at once; vLLM's rule (one pool, W tokens of window KV)
    would fit nearly twice as many in the same budget. 34 GB outside torch leaves a budget that binds."""
    data = _trtllm(_scenario(), non_torch_bytes=34e9)
    res = simulate_serving(scenario_from_dict(data, "test.yaml")).summary
    per_request = 2 * (PROMPT + OUTPUT + 32) * OSS20_WINDOW
    fits = int(res.kv_budget_bytes // per_request)
    assert 8 <= fits < 64 and res.max_running == fits and res.preemptions == 0
    one_pool = (PROMPT + OUTPUT) * OSS20_KV + W * OSS20_WINDOW
    assert int(res.kv_budget_bytes // one_pool) >= 1.8 * fits


def test_sglang_splits_by_swa_full_tokens_ratio():
    """_resolve_hybrid_swa_tokens: full_tokens = M / (F n_full + r S n_swa), swa_tokens = r full_tokens, so
    the full pool has F n_full / (F n_full + r S n_swa) of the memory: 1 / 1.8 for gpt-oss-20b at r = 0.8."""
    assert sglang_swa_pool_shares(3.0, 1.0) == (3.0 / 3.8, 0.8 / 3.8)
    assert sglang_swa_pool_shares(1.0, 1.0, 0.5) == (1 / 1.5, 0.5 / 1.5)
    _, mem = _memory(_scenario() | {"engine": {"name": "sglang"}})
    assert mem.pool_shares == pytest.approx((1 / 1.8, 0.8 / 1.8))
    assert mem.pool_bytes_per_token == pytest.approx(1.8 * OSS20_KV)
    assert mem.hbm_kv_bytes(1_000, 0, 1_000) == pytest.approx(1.8 * 1_000 * OSS20_KV)  # the full pool binds
    assert mem.hbm_kv_bytes(100, 0, 100) == pytest.approx(1.8 / 0.8 * 100 * OSS20_WINDOW)  # under W: the window's
    _, half = _memory(_scenario() | {"engine": {"name": "sglang", "swa_full_tokens_ratio": 0.5}})
    assert half.pool_bytes_per_token == pytest.approx(1.5 * OSS20_KV)


def test_sglangs_running_cap_counts_the_full_pool():
    """max_running_requests = clamp(int(max_total_num_tokens / context x 512), 2048, 4096), the pool being
    the full one's tokens (budget / (1.8 x 24,576 B)); a budget of ~34.8 GB puts it between the two:
    ~786k tokens -> 3,072 where the whole budget's 1.42M tokens would give the ceiling."""
    over = {"model": {"name": "gpt-oss-20b", "expert_weight_dtype": "mxfp4"}, "hardware": {"gpu": "h200-sxm"},
            "engine": {"name": "sglang", "mem_fraction_static": 0.344}, "scheduler": {"max_num_batched_tokens": 8192}}
    data = _scenario() | over
    ctx = build_context(scenario_from_dict(data, "test.yaml"))
    mem = kv_memory(ctx, 8192, 4096)
    full_pool = mem.kv_budget_bytes / (1.8 * OSS20_KV)
    assert 4 * 131_072 < full_pool < 8 * 131_072 < 1.8 * full_pool
    assert engine_scheduler(ctx, mem).max_num_seqs == int(full_pool / 131_072 * 512)


def test_swa_full_tokens_ratio_is_sglangs_alone():
    from sim.inputs.errors import ConfigError
    with pytest.raises(ConfigError, match="swa_full_tokens_ratio is SGLang's"):
        scenario_from_dict(_scenario() | {"engine": {"name": "vllm", "swa_full_tokens_ratio": 0.5}}, "test.yaml")


def _closed_batch(engine: str) -> dict:
    """gpt-oss-120b on one H200, a closed batch of 1,024 + 1,024 tokens, under `engine` serving 2,048 tokens."""
    return {"name": "closed-pools", "model": {"name": "gpt-oss-120b", "weight_dtype": "bf16",
                                              "expert_weight_dtype": "mxfp4", "kv_dtype": "bf16"},
            "hardware": {"gpu": "h200-sxm", "kernels": "datasheet"}, "policy": {"kind": "full_hbm"},
            "workload": {"batch_size": 64, "prompt_tokens": 1024, "reasoning_tokens": 1024},
            "engine": {"name": engine, "max_model_len": 2048}}


def test_a_closed_batch_holds_the_window_layers_in_the_engines_pools():
    """The closed batch's memory trace applies the pools the serving run does (`RunContext.window_pools`):
    under TensorRT-LLM gpt-oss-120b's 18 full layers (36,864 B a token) and 18 window layers each get half
    the KV budget, and at 2,048 tokens a sequence reserves 2,047 + 32 tokens in the window's pool (a
    temporary window of min(max_num_tokens, 2,048 - 1 - 128) = 1,919): 2 x 2,079 x 36,864 B, the fuller
    pool, so floor(budget / 153.3 MB) = 482 fit where vLLM's one pool fits 846; under SGLang the full pool
    (1 / (1 + 0.8) of the budget) binds."""
    from sim.decode.capacity import baseline_max_batches

    ctx = build_context(scenario_from_dict(_closed_batch("tensorrt-llm"), "t"))
    pools = ctx.window_pools
    assert pools.shares == (0.5, 0.5) and pools.reach == 128 + 1919 and pools.per_token == 36_864
    assert ctx.hw.sources["kv_layout"].startswith("TensorRT-LLM's own pool for the 18 window layers, 0.500 of the KV")
    budget = ctx.hw.memory_bytes - ctx.weights_bytes - ctx.hw.held_activation_bytes - ctx.hw.runtime_reserve_bytes
    per_sequence = 2 * (2047 + 32) * 36_864
    assert baseline_max_batches(ctx)["full_hbm"] == budget // per_sequence == 482
    assert baseline_max_batches(ctx)["evict_only"] == 482  # evicting full-layer tokens frees nothing that binds
    vllm = build_context(scenario_from_dict(_closed_batch("vllm"), "t"))  # one pool: W tokens of window KV beside
    budget = vllm.hw.memory_bytes - vllm.weights_bytes - vllm.hw.held_activation_bytes - vllm.hw.runtime_reserve_bytes
    assert vllm.window_pools is None and baseline_max_batches(vllm)["full_hbm"] == budget // ((2048 + 128) * 36_864)
    sglang = build_context(scenario_from_dict(_closed_batch("sglang"), "t"))
    full_share = sglang.window_pools.shares[0]
    assert full_share == pytest.approx(1 / 1.8) and sglang.window_pools.reach == 128
    budget = (sglang.hw.memory_bytes - sglang.weights_bytes - sglang.hw.held_activation_bytes
              - sglang.hw.runtime_reserve_bytes)
    assert baseline_max_batches(sglang)["full_hbm"] == budget // (2048 * 36_864 / full_share)
