"""Layers by kind (issue #22, first increment): KV per token and per sequence by kind, MLA replicated
under tensor parallelism, window and linear state bounded and kept in HBM, mixture-of-experts models
from config.json (shared experts, dense first layers), the new catalog models by hand, and dense GQA
models exactly as before."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sim.decode.capacity import max_batch
from sim.decode.context import build_context
from sim.decode.simulate import simulate
from sim.device.physics import (
    attention_flop,
    attention_s,
    decode_attention_s,
    gqa_datasheet_attention_s,
    kind_attention_flop_per_token,
    kinds_prefill_flop,
    window_datasheet_attention_s,
)
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import load_scenario
from sim.model.layers import FULL, LINEAR, MLA, WINDOW
from sim.tiering.tiers import TierPolicy

from .conftest import SCENARIOS

BF16 = 2
# The new catalog models: KV bytes per token (bf16) by kind, by hand from each config.json.
KV_BY_HAND = {
    "deepseek-r1": 61 * (512 + 64) * BF16,  # one latent a token a layer: 70,272
    "gpt-oss-120b": 18 * 2 * 8 * 64 * BF16,  # the 18 full layers only: 36,864
    "gpt-oss-20b": 12 * 2 * 8 * 64 * BF16,  # 24,576
    "qwen3-235b-a22b": 2 * 94 * 4 * 128 * BF16,  # 192,512
    "qwen3-30b-a3b": 2 * 48 * 4 * 128 * BF16,  # 98,304
    "qwen3-next-80b-a3b": 12 * 2 * 2 * 256 * BF16,  # the 12 full layers only: 24,576
    "deepseek-v3.2": 61 * (512 + 64) * BF16,  # the latent, as R1's (its indexer keys stay in HBM: test_sparse_fetch)
    "llama-4-maverick": 48 * 2 * 8 * 128 * BF16,  # chunked layers keep every token, as the engines do: 196,608
}
WINDOW_BY_HAND = {  # window layers x 2 x Hkv x d x 2 B x 128 tokens: the most a sequence holds in them
    "gpt-oss-120b": 18 * 2 * 8 * 64 * BF16 * 128,  # 4,718,592
    "gpt-oss-20b": 12 * 2 * 8 * 64 * BF16 * 128,  # 3,145,728
}
# Qwen3-Next-80B-A3B's 36 linear (Gated DeltaNet) layers: per value head a key_head_dim x value_head_dim
# state (32 x 128 x 128) + the causal conv's last kernel - 1 = 3 inputs of its q, k, v channels
# (2 x 16 x 128 + 32 x 128 = 8,192), in 16 bits: 548,864 values = 1,097,728 B a layer, whatever the length.
STATE_BY_HAND = {"qwen3-next-80b-a3b": 36 * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * BF16}  # 39,518,208


def _write(tmp_path, cfg: dict, name: str = "config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def _gpt_oss_like(**over) -> dict:
    """gpt-oss-20b's config.json fields (sim/catalog/models.yaml)."""
    entry = next(e for e in catalog._read_catalog("models.yaml")["models"] if e["name"] == "gpt-oss-20b")
    return {**entry["config"], **over}


def _qwen3_next_like(**over) -> dict:
    """A Qwen3-Next-shaped hybrid (linear attention, one layer in four full); a test fixture, not a catalog model."""
    return {"model_type": "qwen3_next", "num_hidden_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
            "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120, "vocab_size": 151936,
            "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, **over}


# ---- the catalog, by hand -------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(KV_BY_HAND))
def test_kv_bytes_per_token_of_the_new_models_by_hand(name):
    m = catalog.model(name)
    assert m.kv_bytes_per_token("bf16") == KV_BY_HAND[name]
    assert m.kv_bytes_per_token_layer("bf16") * m.num_layers == KV_BY_HAND[name]
    rows = m.kv_by_kind("bf16")
    assert sum(r["bytes_per_token"] for k, r in rows.items() if k != WINDOW) == KV_BY_HAND[name]
    if name in WINDOW_BY_HAND:
        assert rows[WINDOW]["max_bytes_per_sequence"] == WINDOW_BY_HAND[name]
        assert rows[WINDOW]["layers"] == rows[FULL]["layers"] == m.num_layers // 2


def test_kinds_read_from_each_config():
    r1, oss, qwen = catalog.model("deepseek-r1"), catalog.model("gpt-oss-120b"), catalog.model("qwen3-235b-a22b")
    assert r1.kind_counts == {MLA: 61} and (r1.num_kv_heads, r1.head_dim) == (1, 192) and r1.dense_mlp_layers == 3
    assert r1.shared_expert_intermediate_size == 2048 and (r1.num_experts, r1.experts_per_token) == (256, 8)
    assert oss.kinds[:4] == (WINDOW, FULL, WINDOW, FULL) and oss.sliding_window == 128 and oss.qkv_bias
    assert (oss.num_experts, oss.experts_per_token, oss.moe_intermediate_size) == (128, 4, 2880)
    assert qwen.uniform and qwen.qk_norm and qwen.intermediate_size == 0  # every layer MoE: no dense MLP
    assert catalog.model("DeepSeek-V3") is r1 and catalog.model("Qwen3-30B-A3B").num_layers == 48
    assert r1.kv_bytes_per_token("fp8") == 61 * 576


def _r1_params_by_hand() -> int:
    h, H, L, V = 7168, 128, 61, 129280
    attn = h * 1536 + 1536 * H * (128 + 64) + h * (512 + 64) + 512 * H * (128 + 128) + H * 128 * h
    small = 1536 + 512 + 2 * h  # q_a and kv_a norms, two RMSNorms
    dense_mlp = 3 * h * 18432
    moe = 256 * 3 * h * 2048 + 3 * h * 2048 + h * 256  # routed, one shared, router
    return L * (attn + small) + 3 * dense_mlp + 58 * moe + V * h + h + V * h


def _gpt_oss_params_by_hand(L: int, E: int) -> int:
    h, q, kv, V = 2880, 64 * 64, 8 * 64, 201088
    attn = h * q + 2 * h * kv + q * h + (q + 2 * kv)  # + q/k/v biases
    moe = E * 3 * h * 2880 + h * E
    return L * (attn + moe + 2 * h) + V * h + h + V * h


def _qwen3_moe_params_by_hand(L: int, h: int, H: int, I_moe: int) -> int:
    q, kv, V = H * 128, 4 * 128, 151936
    layer = h * q + 2 * h * kv + q * h + 2 * 128 + 128 * 3 * h * I_moe + h * 128 + 2 * h
    return L * layer + V * h + h + V * h


def _qwen3_next_params_by_hand() -> int:
    """Qwen3-Next-80B-A3B: 12 gated-attention layers (q 16 x 256, k/v 2 x 256, q/k norms), 36 Gated
    DeltaNet layers (in_proj_qkvz h -> 2 x 16 x 128 + 2 x 32 x 128, in_proj_ba h -> 2 x 32, out_proj
    32 x 128 -> h, conv weights 8,192 x 4, A_log and dt_bias per value head, a 128-wide gated norm), in
    every layer 512 experts of 512 + one shared expert of 512 + the router, two norms."""
    h, V = 2048, 151936
    full = h * 16 * 256 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256
    linear = h * (2 * 16 * 128 + 2 * 32 * 128) + h * 2 * 32 + 32 * 128 * h + 8192 * 4 + 2 * 32 + 128
    moe = 512 * 3 * h * 512 + 3 * h * 512 + h * 512
    return 12 * full + 36 * linear + 48 * (moe + 2 * h) + V * h + h + V * h


def _maverick_params_by_hand() -> int:
    """48 layers of q, k, v, o (40 x 128 query, 8 x 128 KV heads) and two norms; 24 MoE layers of 128
    experts of 8,192 + one shared expert of 8,192 + the router; 24 dense MLPs of 16,384; embedding, final
    norm and LM head of 202,048 x 5,120."""
    h, V = 5120, 202048
    attention = h * 40 * 128 + 2 * h * 8 * 128 + 40 * 128 * h
    moe = 128 * 3 * h * 8192 + 3 * h * 8192 + h * 128
    dense = 3 * h * 16384
    return 48 * (attention + 2 * h) + 24 * moe + 24 * dense + V * h + h + V * h


NEW_MODEL_PARAMS = {
    "deepseek-r1": _r1_params_by_hand(),
    "gpt-oss-120b": _gpt_oss_params_by_hand(36, 128),
    "gpt-oss-20b": _gpt_oss_params_by_hand(24, 32),
    "qwen3-235b-a22b": _qwen3_moe_params_by_hand(94, 4096, 64, 1536),
    "qwen3-30b-a3b": _qwen3_moe_params_by_hand(48, 2048, 32, 768),
    "qwen3-next-80b-a3b": _qwen3_next_params_by_hand(),
    # R1's + each layer's lightning indexer: wq_b 1536 -> 64 x 128, wk 7168 -> 128, weights_proj 7168 -> 64, k_norm
    "llama-4-maverick": _maverick_params_by_hand(),
    "deepseek-v3.2": _r1_params_by_hand() + 61 * (1536 * 64 * 128 + 7168 * 128 + 7168 * 64 + 2 * 128),
}


def test_parameters_of_the_new_models_by_hand_and_published():
    for name, params in NEW_MODEL_PARAMS.items():
        assert catalog.model(name).params == params, name
    # model cards: DeepSeek-V3/R1 671B, gpt-oss 116.83B / 20.91B (0.04B of biases and sinks not
    # counted here), Qwen3 235B and 30.5B
    # Qwen3-Next-80B-A3B's card says 80B: rounded to the billion, so within 0.5 B; kvtier counts 79.57 B,
    # leaving out the gated attention's output-gate half of q_proj (12 x 2048 x 4096 = 0.10 B), the
    # shared-expert gates (48 x 2048) and the multi-token-prediction layer
    published = {"deepseek-r1": (671, 0), "gpt-oss-120b": (116.8, 1), "gpt-oss-20b": (20.9, 1),
                 "qwen3-235b-a22b": (235, 0), "qwen3-30b-a3b": (30.5, 1), "qwen3-next-80b-a3b": (80, 0)}
    for name, (billions, digits) in published.items():
        assert round(catalog.model(name).params / 1e9, digits) == billions, name
    for name in published:
        m = catalog.model(name)
        assert m.weight_bytes("bf16") == 2 * m.params  # every parameter counted once in the bytes too


# ---- tensor parallelism -----------------------------------------------------------------------------
def test_mla_latent_is_replicated_under_tp_and_gqa_kv_is_split():
    r1 = catalog.model("deepseek-r1")
    for tp in (2, 4, 8, 16):
        s = r1.shard(tp)
        assert s.kv_bytes_per_token("bf16") == 70_272  # every GPU holds the whole latent
        assert s.num_heads == 128 // tp and r1.tp_problem(tp) is None
        assert kind_attention_flop_per_token(s, MLA) == 2 * (128 // tp) * (576 + 512)
    qwen = catalog.model("qwen3-235b-a22b")
    assert qwen.shard(4).kv_bytes_per_token("bf16") == 192_512 / 4
    assert qwen.shard(8).kv_bytes_per_token("bf16") == 192_512 / 4  # 4 KV heads: replicated past tp 4
    oss = catalog.model("gpt-oss-120b").shard(8)
    assert oss.kv_bytes_per_token("bf16") == 18 * 2 * 1 * 64 * BF16 and oss.kind_counts == {FULL: 18, WINDOW: 18}
    # per GPU: the q_a and kv_a projections replicated, the rest split
    h = 7168
    s = r1.shard(8)
    attn = h * 1536 + 1536 * 16 * 192 + h * 576 + 512 * 16 * 256 + 16 * 128 * h
    assert sum(r * c for r, c in s._attention_matrices(MLA)) == attn


def test_linear_heads_split_under_tp(tmp_path):
    m = catalog.model_from_hf_config(_write(tmp_path, _qwen3_next_like(linear_num_key_heads=8)))
    assert m.shard(2).state_bytes_per_sequence() == m.state_bytes_per_sequence() / 2
    assert m.tp_problem(16) == "linear_num_key_heads 8 is not divisible by tp 16"


# ---- bounded kinds --------------------------------------------------------------------------------
def test_window_and_state_bytes_are_bounded_by_hand(tmp_path):
    oss = catalog.model("gpt-oss-120b")
    per_token = 18 * 2 * 8 * 64 * BF16  # window layers' bytes per token
    assert oss.bounded_bytes(4 * 100, 4) == per_token * 400  # shorter than the window: every token
    assert oss.bounded_bytes(4 * 10_000, 4) == per_token * 4 * 128  # longer: the window only
    assert oss.bounded_bytes(np.array([400, 40_000]), np.array([4, 4])).tolist() == [per_token * 400, per_token * 512]
    nxt = catalog.model_from_hf_config(_write(tmp_path, _qwen3_next_like()))
    assert nxt.kind_counts == {FULL: 2, LINEAR: 6} and nxt.kinds[3] == FULL and nxt.kinds[0] == LINEAR
    state = 32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)  # recurrent + conv, per layer
    assert nxt.state_bytes_per_sequence() == 6 * state * 2
    assert nxt.bounded_bytes(10, 1) == nxt.bounded_bytes(10**6, 1) == 6 * state * 2  # does not grow
    assert nxt.kv_bytes_per_token("bf16") == 2 * 2 * 2 * 256 * BF16  # the two full layers only


def test_qwen3_next_catalog_model_by_hand():
    """Qwen3-Next-80B-A3B from its config.json: every 4th layer full (full_attention_interval 4), the
    rest Gated DeltaNet; KV per token from the 12 full layers only, a fixed state per sequence from the
    36 linear ones; tensor parallelism splits both (2 KV heads: replicated past tp 2)."""
    m = catalog.model("qwen3-next-80b-a3b")
    assert m.kind_counts == {FULL: 12, LINEAR: 36} and m.describe_kinds() == "12 full + 36 linear"
    assert [i for i, k in enumerate(m.kinds) if k == FULL] == list(range(3, 48, 4))
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size, m.shared_expert_intermediate_size) == (512, 10, 512, 512)
    assert m.moe_layers == 48 and m.intermediate_size == 0 and m.qk_norm and not m.qkv_bias
    state = STATE_BY_HAND["qwen3-next-80b-a3b"]
    assert state == 39_518_208 and m.state_bytes_per_sequence() == state
    assert m.bounded_bytes(1, 1) == m.bounded_bytes(10**6, 1) == state and m.bounded_bytes(500, 4) == 4 * state
    assert m.kv_by_kind("bf16") == {FULL: {"layers": 12, "bytes_per_token": 24_576.0},
                                    LINEAR: {"layers": 36, "bytes_per_token": 0.0, "max_bytes_per_sequence": float(state)}}
    # one linear-attention MoE layer as transformers builds it (Qwen3NextDecoderLayer: 1,648,531,648
    # parameters) less its shared_expert_gate (h -> 1), which kvtier does not count
    layer = (sum(r * c for r, c in m._attention_matrices(LINEAR)) + m._attention_small_params(LINEAR)
             + m._moe_mlp_params() + 2 * m.hidden_size)
    assert layer == 1_648_531_648 - 2048
    for tp in (1, 2, 4, 8, 16):
        assert m.tp_problem(tp) is None
    assert m.tp_problem(3) == "16 attention heads are not divisible by tp 3"
    assert m.tp_problem(32) == "16 attention heads are not divisible by tp 32"
    assert m.shard(2).state_bytes_per_sequence() == state / 2 and m.shard(2).kv_bytes_per_token("bf16") == 24_576 / 2
    assert m.shard(4).kv_bytes_per_token("bf16") == 24_576 / 2  # one KV head a GPU, replicated
    assert m.shard(4).state_bytes_per_sequence() == state / 4


def _scenario(model: str | None = None, hf_config=None, *extra: str):
    """A small run on one H200, datasheet kernels (so the hand arithmetic below is `attention_s`)."""
    over = ["hardware.kernels=datasheet", "workload.batch_size=4", "workload.prompt_tokens=128", "workload.reasoning_tokens=320",
            "policy.retier_interval=32", "policy.recent_window=32", "model.weight_dtype=int4", *extra]
    over += [f"model.name={model}"] if model else ["model.name=null", f"model.hf_config={hf_config}"]
    return load_scenario(SCENARIOS / "h200-7b-batch.yaml", over)


def test_memory_counts_window_bytes_in_hbm_and_tiers_only_full_layers():
    sc = _scenario("gpt-oss-20b")
    ctx = build_context(sc)
    assert ctx.kv_bytes_per_token == 24_576 and ctx.staged_bytes_per_token_layer == 2 * 8 * 64 * BF16
    res = simulate(sc).summary
    full = simulate(_scenario("gpt-oss-20b", None, "policy.kind=full_hbm")).summary
    tokens = 4 * (128 + 320)
    window = 12 * 2 * 8 * 64 * BF16 * 4 * 128  # four sequences past the window
    assert full.hbm_peak_bytes == pytest.approx(ctx.weights_bytes + ctx.hw.runtime_reserve_bytes + tokens * 24_576
                                                + window + 4 * _activation(ctx), rel=1e-9)
    assert res.hbm_saved_bytes > 0 and res.host_peak_bytes > 0
    assert res.host_peak_bytes <= 4 * (320 + 128) * 24_576  # the host holds full-layer tokens only


def _activation(ctx) -> float:
    from sim.device.memory import activation_bytes

    return activation_bytes(ctx.model, 1)


def test_a_hybrid_fits_more_than_the_same_model_all_full_attention(tmp_path):
    cfg = _gpt_oss_like()
    hybrid = _write(tmp_path, cfg, "hybrid.json")
    full = _write(tmp_path, {**cfg, "layer_types": ["full_attention"] * 24}, "full.json")
    extra = ["workload.reasoning_tokens=8192", "policy.kind=full_hbm"]
    b_hybrid = max_batch(build_context(_scenario(None, hybrid, *extra)))
    b_full = max_batch(build_context(_scenario(None, full, *extra)))
    assert b_hybrid > 1.9 * b_full  # half the layers keep 128 tokens instead of 8K
    assert catalog.model_from_hf_config(full).uniform  # all full: the plain model exactly


# ---- the step cost by kind --------------------------------------------------------------------------
def test_decode_attention_by_kind_by_hand():
    ctx = build_context(_scenario("gpt-oss-120b"))
    m, hw = ctx.model, ctx.hw
    batch, attended = 8, 8 * 3000
    full_layer = 2 * 8 * 64 * BF16
    kv_bytes = (attended + batch) * ctx.kv_bytes_per_token_layer  # the mean layer's, as the engines pass it
    t_full = gqa_datasheet_attention_s(hw, batch, 8, 4 * 3000 * 8 * 64 * 64, (attended + batch) * full_layer, False)
    # the window layers on their own datasheet fit (`physics.window_datasheet_attention_s`, tests/test_window_decode.py)
    assert hw.window_decode is not None
    t_window = window_datasheet_attention_s(hw, hw.window_decode, batch, 8, 8.0, 3000.0, 128,
                                            (8 * 128 + batch) * full_layer, 4 * 8 * 128 * 64 * 64, False)
    got = decode_attention_s(m, hw, batch, attended, kv_bytes, ctx.kv_bytes_per_token_layer)
    assert got == pytest.approx((18 * t_full + 18 * t_window) / 36)
    arrays = decode_attention_s(m, hw, np.array([batch, batch]), np.array([attended, attended]),
                                np.array([kv_bytes, kv_bytes]), ctx.kv_bytes_per_token_layer)
    assert arrays.tolist() == pytest.approx([got, got])
    assert attention_flop(m, 100) == 18 * 4 * 100 * 64 * 64 / 36  # the tiered layers' over all 36


def test_linear_layers_read_and_write_their_state_each_step(tmp_path):
    sc = _scenario(None, _write(tmp_path, _qwen3_next_like()))
    ctx = build_context(sc)
    m, hw = ctx.model, ctx.hw
    state = m.linear.state_bytes
    t_lin = attention_s(4 * m.linear.state_flop_per_token, 2 * 4 * state, hw)
    t_full = gqa_datasheet_attention_s(hw, 4, 2, 4 * 1000 * 16 * 256, (1000 + 4) * 2 * 2 * 256 * BF16, False)
    kv = (1000 + 4) * ctx.kv_bytes_per_token_layer
    assert decode_attention_s(m, hw, 4, 1000, kv, ctx.kv_bytes_per_token_layer) == pytest.approx((6 * t_lin + 2 * t_full) / 8)
    assert m.linear.state_flop_per_token == 7 * 32 * 128 * 128
    assert simulate(sc).summary.fits


def test_prefill_flop_by_kind_by_hand():
    m = catalog.model("gpt-oss-20b")
    P, W = 1000, 128
    per_pair = 4 * 64 * 64
    full = 12 * per_pair * P * (P + 1) / 2
    window = 12 * per_pair * (W * (W + 1) / 2 + (P - W) * W)
    assert kinds_prefill_flop(m, 2, P) == pytest.approx(2 * (full + window) / 24)


@pytest.mark.parametrize("name,access,kernels", [("deepseek-r1", "prefetch", "datasheet"),
                                                 ("deepseek-r1", "host_attention", "auto"),
                                                 ("gpt-oss-20b", "prefetch", "datasheet"),
                                                 ("gpt-oss-20b", "split", "auto")])
def test_the_engine_levels_agree_on_kind_models(name, access, kernels):
    """Layer, step and fast levels (and measured GQA kernels for the full and window layers) agree."""
    extra = ["parallel.tp=8", "model.weight_dtype=fp8"] if name == "deepseek-r1" else []
    extra += [f"policy.access={access}", f"hardware.kernels={kernels}"]
    runs = {d: simulate(_scenario(name, None, *extra, f"sim.detail={d}")).summary for d in ("layer", "step", "fast")}
    assert all(r.fits for r in runs.values())
    base = runs["layer"].throughput_tok_per_s
    for d in ("step", "fast"):
        assert runs[d].throughput_tok_per_s == pytest.approx(base, rel=0.01), d


# ---- MoE from config.json ---------------------------------------------------------------------------
def _tiny_deepseek(**over) -> dict:
    return {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 96,
            "moe_intermediate_size": 16, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8,
            "n_shared_experts": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "q_lora_rank": 24, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
            "vocab_size": 100, **over}


def test_moe_dense_first_layers_and_shared_experts_by_hand(tmp_path):
    m = catalog.model_from_hf_config(_write(tmp_path, _tiny_deepseek()))
    h, H = 64, 4
    assert (m.dense_mlp_layers, m.moe_layers, m.shared_expert_intermediate_size) == (1, 3, 32)  # 2 shared x 16
    attn = h * 24 + 24 * H * 24 + h * 40 + 32 * H * 32 + H * 16 * h
    moe = 8 * 3 * h * 16 + 3 * h * 32 + h * 8
    assert m.params == 4 * (attn + 24 + 32 + 2 * h) + 3 * h * 96 + 3 * moe + 100 * h + h + 100 * h
    moe_active = 2 * 3 * h * 16 + 3 * h * 32 + h * 8
    assert m.active_linear_params_layer() == pytest.approx(attn + (3 * h * 96 + 3 * moe_active) / 4)
    one_expert = 3 * h * 16 * BF16
    untouched = 8 - m.expected_experts_touched(1)
    assert m.layer_weight_bytes_read("bf16", 1) == pytest.approx(m.layer_weight_bytes("bf16") - 3 / 4 * untouched * one_expert)
    assert m.kv_bytes_per_token("bf16") == 4 * 40 * BF16
    # Qwen's spelling: every second layer MoE, layer 0 dense by mlp_only_layers
    qwen = {"model_type": "qwen3_moe", "num_hidden_layers": 6, "hidden_size": 32, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64, "moe_intermediate_size": 16,
            "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 50, "decoder_sparse_step": 2,
            "mlp_only_layers": [1]}
    assert catalog.model_from_hf_config(_write(tmp_path, qwen, "q.json")).dense_mlp_layers == 4  # 0, 1, 2, 4


# ---- config.json errors ------------------------------------------------------------------------------
BAD = [
    (_gpt_oss_like(layer_types=["full_attention"] * 3), "layer_types", "3 entries for 24 layers"),
    (_gpt_oss_like(layer_types=["full_attention", "mamba"] * 12), "layer_types.1", "not a layer kind"),
    (_gpt_oss_like(layer_types=["full_attention", "chunked_attention"] * 12), "attention_chunk_size",
     "Field required (chunked_attention layers)"),
    (_gpt_oss_like(sliding_window=None), "sliding_window", "Field required (sliding_attention layers)"),
    (_gpt_oss_like(sliding_window=0), "sliding_window", "greater than or equal to 1"),
    (_gpt_oss_like(layer_types="sliding_attention"), "layer_types", "list"),
    (_tiny_deepseek(qk_rope_head_dim=None), "qk_rope_head_dim", "Field required (MLA"),
    (_tiny_deepseek(kv_lora_rank=True), "kv_lora_rank", "integer"),
    (_tiny_deepseek(intermediate_size=None), "intermediate_size", "first_k_dense_replace"),
    (_tiny_deepseek(first_k_dense_replace=-1), "first_k_dense_replace", "greater than or equal to 0"),
    (_qwen3_next_like(linear_value_head_dim=None), "linear_value_head_dim", "Field required (linear_attention"),
    ({**_qwen3_next_like(), "full_attention_interval": None, "use_sliding_window": True, "sliding_window": 4096},
     "use_sliding_window", "not modelled"),
]


@pytest.mark.parametrize("cfg,field,words", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_kind_fields_are_one_line_naming_the_field(tmp_path, cfg, field, words):
    p = _write(tmp_path, {k: v for k, v in cfg.items() if v is not None})  # None: the field left out
    with pytest.raises(ConfigError) as err:
        catalog.model_from_hf_config(p)
    assert err.value.field == field and words in err.value.message
    assert "\n" not in str(err.value) and str(p) in str(err.value)


def test_a_bad_kind_in_a_scenario_names_model_hf_config(tmp_path):
    p = _write(tmp_path, _gpt_oss_like(layer_types=["mystery"] * 24))
    with pytest.raises(ConfigError) as err:
        _scenario(None, p)
    assert err.value.field == "model.hf_config" and "layer_types.0" in err.value.message


# ---- dense models exactly as before -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["deepseek-r1-distill-qwen-7b", "llama-3.1-70b", "qwen3-32b"])
def test_dense_models_are_uniform_and_sized_as_before(name, tmp_path):
    m = catalog.model(name)
    assert m.uniform and m.layer_kinds == () and m.kind_counts == {FULL: m.num_layers}
    assert m.kv_bytes_per_token_layer("bf16") == 2 * m.num_kv_heads * m.head_dim * BF16
    assert m.tiered_kv_bytes_per_token_layer("bf16") == m.kv_bytes_per_token_layer("bf16")
    assert not m.has_bounded_layers and m.gqa_gemms
    assert m.qkv_params_layer() == m.hidden_size * (m.q_dim + 2 * m.kv_dim)
    # explicit layer_types all full: the very same spec
    assert replace(m, layer_kinds=(FULL,) * m.num_layers) == m
    ctx = build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [f"model.name={name}", "model.weight_dtype=int4",
                                                                          "hardware.kernels=datasheet"]))
    assert ctx.staged_bytes_per_token_layer is ctx.kv_bytes_per_token_layer and ctx.bounded_bytes(100, 1) == 0.0
    kvl = ctx.kv_bytes_per_token_layer
    old = gqa_datasheet_attention_s(ctx.hw, 8, m.num_kv_heads, 4 * 5000 * m.num_heads * m.head_dim, 5008 * kvl, False)
    assert decode_attention_s(m, ctx.hw, 8, 5000, 5008 * kvl, kvl) == old  # the GQA formula, whatever the kinds code


def test_policy_baselines_still_fit_a_kinds_model():
    ctx = build_context(_scenario("gpt-oss-120b"))
    assert max_batch(ctx, policy=TierPolicy(kind="full_hbm")) < max_batch(ctx)


def test_mla_prefill_attends_unabsorbed_and_decode_absorbed():
    """DeepSeek-V3 shapes (128 heads, qk 128 + 64, v 128, latent 512 + 64): a prefill (query, key) pair
    costs 2 x 128 x (192 + 128) = 81,920 FLOP, as vLLM's MLA prefill runs it (the latent up-projected);
    a decode token 2 x 128 x (576 + 512) = 278,528, absorbed."""
    from sim.device.physics import kind_prefill_flop_per_pair, prefill_attention_flop

    m = catalog.model("deepseek-r1")
    assert (m.num_heads, m.mla.qk_head_dim, m.mla.v_head_dim) == (128, 192, 128)
    assert kind_prefill_flop_per_pair(m, MLA) == 2 * 128 * (192 + 128) == 81_920
    assert kind_attention_flop_per_token(m, MLA) == 2 * 128 * (576 + 512) == 278_528
    P = 1024
    dense = m.kind_counts[MLA]  # every layer MLA: the mean layer's FLOP is the MLA layer's
    assert dense == m.num_layers
    assert kinds_prefill_flop(m, 2, P) == pytest.approx(2 * 81_920 * P * (P + 1) / 2)
    assert prefill_attention_flop(m, P * (P + 1) / 2) == pytest.approx(81_920 * P * (P + 1) / 2)
