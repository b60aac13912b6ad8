"""Model sizes against hand arithmetic and the published figures in FACTS.md."""

from __future__ import annotations

import json

import pytest

from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.model.dtypes import KV_DTYPES, WEIGHT_DTYPES

from .conftest import run_cli
from .test_layer_kinds import KV_BY_HAND, NEW_MODEL_PARAMS

# FACTS.md model table: KV bytes per token, bf16, all layers; then the models with layer kinds and
# experts (issue #22), by hand from their config.json in tests/test_layer_kinds.py (tiered layers only).
KV_BYTES_BF16 = {
    "deepseek-r1-distill-qwen-7b": 57_344,
    "deepseek-r1-distill-qwen-14b": 196_608,
    "deepseek-r1-distill-qwen-32b": 262_144,
    "qwen2.5-72b": 327_680,
    "llama-3.1-8b": 131_072,
    "llama-3.1-70b": 327_680,
    "qwen3-8b": 147_456,
    "qwen3-32b": 262_144,
    **KV_BY_HAND,
}


def hand_params(L, h, H, Hkv, d, I, V, bias, qknorm, tied=False):
    """Independent re-derivation: q,k,v,o + bias + q/k norm + gated MLP + 2 norms per layer;
    embedding + final norm + LM head."""
    attn = h * H * d + 2 * h * Hkv * d + H * d * h
    b = (H * d + 2 * Hkv * d) if bias else 0
    qk = 2 * d if qknorm else 0
    layer = attn + b + qk + 3 * h * I + 2 * h
    return L * layer + V * h + h + (0 if tied else V * h)


# Hand-derived from the FACTS.md shapes; the Llama totals equal Meta's published exact counts.
PARAMS = {
    "deepseek-r1-distill-qwen-7b": hand_params(28, 3584, 28, 4, 128, 18944, 152064, True, False),
    "deepseek-r1-distill-qwen-14b": hand_params(48, 5120, 40, 8, 128, 13824, 152064, True, False),
    "deepseek-r1-distill-qwen-32b": hand_params(64, 5120, 40, 8, 128, 27648, 152064, True, False),
    "qwen2.5-72b": hand_params(80, 8192, 64, 8, 128, 29568, 152064, True, False),
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "qwen3-8b": hand_params(36, 4096, 32, 8, 128, 12288, 151936, False, True),
    "qwen3-32b": hand_params(64, 5120, 64, 8, 128, 25600, 151936, False, True),
    **NEW_MODEL_PARAMS,
}


@pytest.mark.parametrize("name", sorted(KV_BYTES_BF16))
def test_kv_bytes_per_token_exact(name):
    assert catalog.model(name).kv_bytes_per_token("bf16") == KV_BYTES_BF16[name]


def test_gqa_not_mha_for_7b():
    m = catalog.model("deepseek-r1-distill-qwen-7b")
    assert m.kv_bytes_per_token("fp16") == 2 * 28 * 4 * 128 * 2
    # the paper's figure counts 28 query heads: 401,408 B, seven times too large
    assert 2 * 28 * 28 * 128 * 2 / m.kv_bytes_per_token("fp16") == 7
    assert m.kv_bytes_per_token("fp8") == 28_672


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_parameter_counts_exact(name):
    assert catalog.model(name).params == PARAMS[name]


def test_published_rounded_totals():
    # model cards: Qwen2.5-7B 7.61B, 14B 14.7B, 32B 32.5B non-embedding + embeddings, 72B 72.7B
    assert round(catalog.model("qwen2.5-7b").params / 1e9, 2) == 7.62
    assert round(catalog.model("qwen2.5-72b").params / 1e9, 1) == 72.7


def test_weight_bytes_bf16_is_two_bytes_per_param():
    m = catalog.model("llama-3.1-8b")
    assert m.weight_bytes("bf16") == 2 * m.params


def test_weight_bytes_int4_with_group_scales_hand_arithmetic():
    m = catalog.model("llama-3.1-8b")
    h, I, L = 4096, 14336, 32
    linear = L * (h * 4096 + 2 * h * 1024 + 4096 * h + 3 * h * I)
    scales = linear // 128 * 2  # one fp16 scale per group of 128 (all dims divisible)
    high_precision = (m.params - linear) * 2  # embeddings, LM head, norms in bf16
    assert m.weight_bytes("int4", 128) == linear / 2 + scales + high_precision
    assert m.weight_bytes("int8", 64) == linear + linear // 64 * 2 + high_precision


def test_dtype_group_scale_overhead():
    assert WEIGHT_DTYPES["int4"].bytes_for(256, 128) == 128 + 2 * 2
    assert WEIGHT_DTYPES["bf16"].bytes_for(256, 128) == 512
    assert KV_DTYPES["int8"].bytes_for(100, 64) == 100 + 2 * 2  # ceil(100/64) = 2 groups


def test_hf_config_matches_catalog(tmp_path):
    cfg = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
           "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = catalog.model_from_hf_config(p)
    ref = catalog.model("qwen3-8b")
    assert (m.params, m.kv_bytes_per_token(), m.head_dim) == (ref.params, ref.kv_bytes_per_token(), 128)


def test_hf_config_qwen2_has_bias_llama_not(tmp_path):
    base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128, "vocab_size": 100}
    (tmp_path / "q.json").write_text(json.dumps({**base, "model_type": "qwen2"}))
    (tmp_path / "l.json").write_text(json.dumps({**base, "model_type": "llama"}))
    q = catalog.model_from_hf_config(tmp_path / "q.json")
    ll = catalog.model_from_hf_config(tmp_path / "l.json")
    assert q.params - ll.params == 2 * (64 + 2 * 32)  # q bias 64, k and v bias 32 each, 2 layers


def test_hf_config_moe_counts_all_experts(tmp_path):
    cfg = {"model_type": "mixtral", "num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 2,
           "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 10, "num_local_experts": 4,
           "num_experts_per_tok": 2}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    m = catalog.model_from_hf_config(tmp_path / "c.json")
    attn = 8 * 8 + 2 * 8 * 4 + 8 * 8
    assert m.params == attn + 4 * 3 * 8 * 16 + 8 * 4 + 2 * 8 + 10 * 8 + 8 + 10 * 8
    assert m.active_linear_params_layer() == attn + 2 * 3 * 8 * 16 + 8 * 4
    assert m.expected_experts_touched(1) == pytest.approx(2.0)


def test_hf_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        catalog.model_from_hf_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="invalid JSON"):
        catalog.model_from_hf_config(tmp_path / "bad.json")
    (tmp_path / "nolayers.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        catalog.model_from_hf_config(tmp_path / "nolayers.json")


def test_unknown_names_list_choices():
    with pytest.raises(ConfigError, match="unknown model 'gpt-9'.*llama-3.1-8b"):
        catalog.model("gpt-9")
    with pytest.raises(ConfigError, match="unknown GPU"):
        catalog.gpu("voodoo2")
    assert catalog.gpu("H200").name == "h200-sxm"
    assert catalog.model("DeepSeek-R1-Distill-Llama-70B").name == "llama-3.1-70b"


def test_every_catalog_entry_has_a_source():
    assert all(m.source for m in catalog.models().values())
    assert all(g.source for g in catalog.gpus().values())
    assert all(ln.source for ln in catalog.links().values())
    for g in catalog.gpus().values():
        catalog.link(g.link)  # every GPU names a known link


def test_kvsim_models_json():
    res = run_cli("models", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert set(rows) == set(KV_BYTES_BF16)
    for name, row in rows.items():
        assert row["kv_bytes_per_token"] == KV_BYTES_BF16[name]
        assert row["params"] == PARAMS[name]
        assert row["weight_bytes"] == 2 * PARAMS[name]


def test_kvsim_models_shows_layers_kv_and_bounded_bytes_by_kind():
    """Layers by kind, KV per token by kind and the most a sequence holds in its window and linear
    layers, in --json (new keys beside the old) and in the table; by hand (docs/models.md table)."""
    res = run_cli("models", "--json", "--kv-dtype", "fp8")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    r1, oss, nxt = rows["deepseek-r1"], rows["gpt-oss-120b"], rows["qwen3-next-80b-a3b"]
    assert r1["layers_by_kind"] == "61 mla; 3 dense MLP"
    assert r1["kv_by_kind"] == {"mla": {"layers": 61, "bytes_per_token": 61 * 576 * 1}}  # fp8: one byte a value
    assert r1["kv_bytes_per_token"] == 61 * 576 * 2 == 70_272 and r1["bounded_bytes_per_sequence"] == 0
    assert oss["layers_by_kind"] == "18 full + 18 window (128)"
    assert oss["kv_bytes_per_token"] == 18 * 2 * 8 * 64 * 2 == 36_864
    assert oss["bounded_bytes_per_sequence"] == 18 * 2 * 8 * 64 * 2 * 128 == 4_718_592
    assert oss["bounded_bytes_per_sequence_fp8"] == 4_718_592 / 2
    assert oss["kv_by_kind"]["window"] == {"layers": 18, "bytes_per_token": 18 * 2 * 8 * 64, "window_tokens": 128,
                                           "max_bytes_per_sequence": 18 * 2 * 8 * 64 * 128}
    assert nxt["layers_by_kind"] == "12 full + 36 linear" and nxt["bounded_bytes_per_sequence"] == 39_518_208
    assert nxt["bounded_bytes_per_sequence_fp8"] == 39_518_208  # a linear state is 16-bit whatever the KV dtype
    assert rows["llama-3.1-8b"]["bounded_bytes_per_sequence"] == 0
    assert {"name", "layers", "heads", "kv_heads", "head_dim", "params", "kv_bytes_per_token", "kv_bytes_per_token_fp8",
            "weight_bytes", "weight_bytes_by_dtype", "source"} <= set(oss)  # the keys it always had
    table = run_cli("models")
    assert table.returncode == 0, table.stderr
    assert "bounded per sequence" in table.stdout  # the title (columns wrap at this width)
    from sim.cli.main import _kv_by_kind_cell, _model_rows

    cells = {r["name"]: _kv_by_kind_cell(r["kv_by_kind"]) for r in _model_rows("bf16")}
    assert cells["gpt-oss-120b"] == "full 36,864 + window 36,864" and cells["deepseek-r1"] == "mla 70,272"
    assert cells["qwen3-next-80b-a3b"] == "full 24,576"  # its linear layers hold nothing per token


def test_kvsim_gpus_json():
    res = run_cli("gpus", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows["h200-sxm"]["hbm_bytes_per_s"] == 4.8e12
    assert rows["h200-sxm"]["link_theoretical_bytes_per_s"] == 63e9
