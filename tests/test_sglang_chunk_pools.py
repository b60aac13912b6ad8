"""SGLang keeps Llama 4's chunked layers in its window pool (`device.memory.sglang_chunk_pools`): the 12 NoPE
full-attention layers hold every token in the full pool, the 36 chunked layers their last C = 8,192 tokens in
the window pool, and swa_full_tokens_ratio splits the KV memory between the two - by hand for Maverick at
TP 8 (one KV head of 128 a GPU, bf16: 512 B a token a layer), in the serving run's memory and the closed
batch's. vLLM and TensorRT-LLM keep one pool (tests/test_chunked_attention.py)."""

from __future__ import annotations

import pytest

from sim.decode.capacity import baseline_max_batches
from sim.decode.context import build_context
from sim.device.memory import sglang_chunk_pools
from sim.inputs.scenario import scenario_from_dict
from sim.serving.kv_memory import engine_scheduler, kv_memory
from sim.serving.run import simulate_serving

C = 8192
PER_LAYER = 2 * 1 * 128 * 2
FULL = 12 * PER_LAYER  # 6,144 B a token in the full pool
CHUNKED = 36 * PER_LAYER  # 18,432 B a token in the window pool
D = FULL + 0.8 * CHUNKED  # _resolve_hybrid_swa_tokens: full_tokens x F + 0.8 full_tokens x S = M


def _data(engine: str | None, ratio: float | None = None, serving: bool = True) -> dict:
    e = ({"name": engine} | ({"swa_full_tokens_ratio": ratio} if ratio else {})) if engine else None
    work = {"prompt_tokens": 1024, "reasoning_tokens": 8192}
    if serving:
        work |= {"seed": 1, "arrivals": {"kind": "closed_loop", "concurrency": 8, "requests": 8}}
    else:
        work |= {"batch_size": 64}
    data = {"name": "m", "model": {"name": "llama-4-maverick"}, "hardware": {"gpu": "h200-sxm"}, "parallel": {"tp": 8},
            "workload": work, "policy": {"kind": "full_hbm"}} | ({"sim": {"detail": "step"}} if serving else {})
    return data | ({"engine": e} if e else {})


def _memory(engine: str | None, ratio: float | None = None):
    ctx = build_context(scenario_from_dict(_data(engine, ratio), "t.yaml"))
    return ctx, kv_memory(ctx, 8192, 256)


def test_the_pools_by_hand():
    """Shares F / D and 0.8 S / D; a request holds min(tokens, C) tokens of the chunked layers' KV."""
    pools = sglang_chunk_pools(FULL + CHUNKED, CHUNKED, C)
    assert pools.shares == pytest.approx((FULL / D, 0.8 * CHUNKED / D))
    assert pools.shares == pytest.approx((1 / 3.4, 2.4 / 3.4))
    assert pools.batch_bytes(5000) == 5000 * CHUNKED and pools.batch_bytes(20_000) == C * CHUNKED
    assert pools.batch_bytes(3 * 20_000, 3) == 3 * C * CHUNKED
    assert pools.full_bytes(10 * (FULL + CHUNKED), 10) == 10 * FULL
    assert sglang_chunk_pools(FULL + CHUNKED, CHUNKED, C, 0.5).shares == pytest.approx((FULL / (FULL + 0.5 * CHUNKED),
                                                                                      0.5 * CHUNKED / (FULL + 0.5 * CHUNKED)))


def test_a_serving_request_counts_against_the_fuller_pool():
    """Past ~10.6k tokens the full pool binds (tokens x F x 3.4), below it the window pool's C x S x 3.4 / 2.4;
    under its first chunk a request holds more than one pool would (4 F a token) since the window pool holds
    0.8 of the full pool's tokens. SGLang's token pool (max_total_num_tokens) is the full pool's."""
    _, m = _memory("sglang")
    assert m.pool_shares == pytest.approx((1 / 3.4, 2.4 / 3.4)) and m.chunk_rule is None
    assert m.pool_bytes_per_token == pytest.approx(3.4 * FULL)
    assert m.hbm_kv_bytes(30_000, 0, 30_000) == pytest.approx(30_000 * FULL * 3.4)
    assert m.hbm_kv_bytes(10_000, 0, 10_000) == pytest.approx(C * CHUNKED * 3.4 / 2.4)
    assert m.hbm_kv_bytes(5000, 0, 5000) == pytest.approx(5000 * CHUNKED * 3.4 / 2.4)
    assert m.hbm_kv_bytes(5000, 0, 5000) > 5000 * (FULL + CHUNKED)
    _, half = _memory("sglang", 0.5)
    assert half.pool_bytes_per_token == pytest.approx(FULL + 0.5 * CHUNKED)


def test_the_other_engines_keep_one_pool():
    for engine in (None, "vllm", "tensorrt-llm"):
        ctx, m = _memory(engine)
        assert ctx.window_pools is None and m.pool_shares is None and m.pool_bytes_per_token == FULL + CHUNKED


def test_the_run_says_how_its_engine_holds_the_chunked_layers():
    """The sources' `kv_layout`: SGLang's pool and its share, vLLM's chunked-local rule (no engine: vLLM's rules),
    nothing under TensorRT-LLM, which keeps every token as for a full layer."""
    said = {e: _memory(e)[0].hw.sources.get("kv_layout") for e in ("sglang", "vllm", None, "tensorrt-llm")}
    assert said["sglang"].startswith("SGLang's own pool for the 36 chunked layers, 0.706 of the KV budget")
    assert "min(tokens, 8,192)" in said["sglang"]
    assert said["vllm"] == said[None] and "ChunkedLocalAttentionManager: the 36 chunked layers" in said["vllm"]
    assert said["tensorrt-llm"] is None


def test_sglangs_running_cap_counts_the_full_pool():
    """max_running_requests from the full pool's tokens (budget / 3.4 F), not the whole budget over 4 F."""
    ctx, m = _memory("sglang")
    pool_tokens = m.kv_budget_bytes / (3.4 * FULL)
    cap = min(max(int(pool_tokens / ctx.max_model_len * 512), 2048), 4096)
    assert engine_scheduler(ctx, m).max_num_seqs == min(ctx.scenario.scheduler.max_num_seqs, cap)


def test_a_closed_batch_holds_the_chunked_layers_last_c_tokens():
    """1,024 + 8,192 tokens a sequence: the window pool binds (C x S / (2.4 / 3.4) = 213.9 MB against 9,216 x F x
    3.4 = 192.5 MB), so floor(budget / 213.9 MB) sequences fit, where one pool of 4 F a token would fit
    floor(budget / 226.5 MB), fewer."""
    sglang = build_context(scenario_from_dict(_data("sglang", serving=False), "t"))
    hw = sglang.hw
    budget = hw.memory_bytes - sglang.weights_bytes - hw.held_activation_bytes - hw.runtime_reserve_bytes
    per_sequence = max(9216 * FULL / sglang.window_pools.shares[0], C * CHUNKED / sglang.window_pools.shares[1])
    assert per_sequence == pytest.approx(C * CHUNKED * 3.4 / 2.4)
    fits = baseline_max_batches(sglang)
    assert fits["full_hbm"] == budget // per_sequence > budget // (9216 * (FULL + CHUNKED))
    assert fits["evict_only"] == fits["full_hbm"]  # evicting frees the full pool, which does not bind


def test_a_serving_run_conserves_its_tokens_within_the_pools():
    """Eight requests of 1,024 + 8,192 tokens run to the end under SGLang's pools: every output token is
    generated and the HBM peak stays within capacity."""
    r = simulate_serving(scenario_from_dict(_data("sglang"), "t.yaml"))
    s = r.summary
    assert s.fits and s.requests == 8 and s.total_output_tokens == 8 * 8192
    assert s.hbm_peak_bytes <= s.hbm_capacity_bytes


def test_the_planners_screen_counts_a_running_request_at_its_own_length():
    """`plan.screen.concurrency_caps` holds the mean running request at its context (1,536 tokens for 1k + 1k):
    under SGLang's pools its chunked layers hold those 1,536 tokens, not the 8,192 a request holds at most,
    so the HBM cap is budget / max(1,536 F / (1 / 3.4), 1,536 S / (2.4 / 3.4))."""
    from sim.inputs.serving_config import SchedulerCfg
    from sim.plan.screen import Moments, concurrency_caps

    _, m = _memory("sglang")
    caps = concurrency_caps(m, SchedulerCfg(), Moments(1024, 1024, 1536, 100, 2048), (1.0, 0.0, 0.0), 1)
    per_request = max(1536 * FULL * 3.4, 1536 * CHUNKED * 3.4 / 2.4)
    assert caps["HBM capacity"] == pytest.approx(m.kv_budget_bytes / per_request)
