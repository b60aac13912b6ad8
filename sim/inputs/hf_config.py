"""The fields of a Hugging Face config.json the simulator reads, typed as strictly as a scenario.

Other keys of a config.json are ignored. Every failure is a ConfigError naming the file and the
field: a missing field, a boolean or string where a count is expected, a zero or negative count,
heads that KV heads do not divide, a size beyond sim/inputs/limits.py, a layer kind kvtier does not
model, a layer kind without the fields that shape it.

Layers by kind (`sim/model/layers.py`): `layer_types` names each layer's attention
(`full_attention`, `sliding_attention` with `sliding_window`, `linear_attention` with the
`linear_*` fields; or Qwen3-Next's `full_attention_interval`); `kv_lora_rank` makes the attention
layers MLA (with `qk_rope_head_dim`, `qk_nope_head_dim`, `v_head_dim`, optional `q_lora_rank`), and
with `index_topk` (`index_n_heads`, `index_head_dim`) DeepSeek sparse attention: every MLA layer sparse;
Llama 4's `attention_chunk_size` makes its RoPE layers (`no_rope_layers`) chunked local attention.
A multimodal config.json's language model is read from its `text_config`.
Mixture of experts: `num_experts` / `num_local_experts` / `n_routed_experts`, `num_experts_per_tok`
(or gpt-oss's `experts_per_token`), `moe_intermediate_size` (else `intermediate_size`), shared
experts as `shared_expert_intermediate_size` or `n_shared_experts` x `moe_intermediate_size`, and
the layers whose MLP stays dense: DeepSeek's `first_k_dense_replace` and `moe_layer_freq`, Qwen's
`decoder_sparse_step` and `mlp_only_layers`, Llama 4's `moe_layers` or `interleave_moe_layer_step`
(its `intermediate_size` the experts' width, `intermediate_size_mlp` the dense MLP's, one shared expert).
The context an engine serves by default (`context_tokens`): `max_position_embeddings` scaled by
`rope_scaling` as vLLM derives it (`context_tokens`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.model.layers import CHUNKED, FULL, LINEAR, MLA, SPARSE, WINDOW, LinearShape, MlaShape, SparseShape
from sim.model.spec import ModelSpec

from .errors import ConfigError
from .limits import (
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    MAX_VOCAB,
)
from .moe_routing import BALANCED_ROUTING, moe_routing_for
from .reader import read_json


class RopeScaling(BaseModel):
    """config.json's rope_scaling: the keys that stretch the context (others ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    type: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    rope_type: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    factor: float | None = Field(None, gt=0.0, le=1024.0)
    original_max_position_embeddings: int | None = Field(None, ge=1, le=MAX_TOKENS)


# rope types whose max_position_embeddings is already the stretched context (vLLM's list)
UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3")


def context_tokens(max_position_embeddings: int | None, rope: RopeScaling | None) -> int | None:
    """The longest sequence an engine serves by default (vLLM's max_model_len; SGLang's context_len):
    vllm/config/model.py `_get_and_verify_max_len` - max_position_embeddings, times rope_scaling's
    factor unless the rope type is su, longrope or llama3, from original_max_position_embeddings for
    yarn. DeepSeek-R1: yarn 4,096 x 40 = 163,840; Llama-3.1: llama3, 131,072 as given. None where
    config.json has no max_position_embeddings (vLLM would assume 2,048; kvtier applies no context rule).
    vLLM reads a few other spellings (n_positions, seq_length, ...) too; kvtier reads this one."""
    if max_position_embeddings is None:
        return None
    tokens = float(max_position_embeddings)
    kind = rope and (rope.rope_type or rope.type)
    if rope is not None and kind not in UNSCALED_ROPE_TYPES:
        if kind == "yarn" and rope.original_max_position_embeddings is not None:
            tokens = float(rope.original_max_position_embeddings)
        tokens *= rope.factor or 1.0
    return int(tokens)


class HfConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, populate_by_name=True)

    num_hidden_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=MAX_HIDDEN)
    num_attention_heads: int = Field(ge=1, le=MAX_HEADS)
    num_key_value_heads: int | None = Field(None, ge=1, le=MAX_HEADS)  # absent or null: multi-head (= heads)
    head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)  # absent or null: hidden_size / heads
    intermediate_size: int | None = Field(None, ge=1, le=MAX_INTERMEDIATE)
    vocab_size: int = Field(ge=1, le=MAX_VOCAB)
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = None
    model_type: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    name_or_path: str | None = Field(None, alias="_name_or_path", max_length=MAX_TEXT_CHARS)
    # experts: the first of these given and non-zero (Qwen-MoE, Mixtral, DeepSeek spellings)
    num_experts: int | None = Field(None, ge=0, le=MAX_EXPERTS)
    num_local_experts: int | None = Field(None, ge=0, le=MAX_EXPERTS)
    n_routed_experts: int | None = Field(None, ge=0, le=MAX_EXPERTS)
    num_experts_per_tok: int | None = Field(None, ge=1, le=MAX_EXPERTS)
    moe_intermediate_size: int | None = Field(None, ge=1, le=MAX_INTERMEDIATE)
    shared_expert_intermediate_size: int | None = Field(None, ge=0, le=MAX_INTERMEDIATE)
    experts_per_token: int | None = Field(None, ge=1, le=MAX_EXPERTS)  # gpt-oss's spelling of num_experts_per_tok
    n_shared_experts: int | None = Field(None, ge=0, le=MAX_EXPERTS)  # DeepSeek: shared experts of moe_intermediate_size
    first_k_dense_replace: int | None = Field(None, ge=0, le=MAX_LAYERS)  # DeepSeek: the first k layers' MLP is dense
    moe_layer_freq: int | None = Field(None, ge=1, le=MAX_LAYERS)  # DeepSeek: every n-th layer past them is MoE
    decoder_sparse_step: int | None = Field(None, ge=1, le=MAX_LAYERS)  # Qwen MoE: every n-th layer is MoE
    interleave_moe_layer_step: int | None = Field(None, ge=1, le=MAX_LAYERS)  # Llama 4: every n-th layer is MoE
    moe_layers: list[int] | None = Field(None, max_length=MAX_LAYERS)  # Llama 4: these layers are MoE (else the step)
    intermediate_size_mlp: int | None = Field(None, ge=1, le=MAX_INTERMEDIATE)  # Llama 4: the dense MLP's width
    mlp_only_layers: list[int] | None = Field(None, max_length=MAX_LAYERS)  # Qwen MoE: these layers' MLP is dense
    # layers by kind
    layer_types: list[str] | None = Field(None, max_length=MAX_LAYERS)
    sliding_window: int | None = Field(None, ge=1, le=MAX_TOKENS)
    attention_chunk_size: int | None = Field(None, ge=1, le=MAX_TOKENS)  # Llama 4: the chunk of its RoPE layers
    no_rope_layers: list[int] | None = Field(None, max_length=MAX_LAYERS)  # Llama 4: 1 = RoPE (chunked), 0 = NoPE
    use_sliding_window: bool | None = None
    full_attention_interval: int | None = Field(None, ge=1, le=MAX_LAYERS)  # Qwen3-Next: every n-th layer is full
    kv_lora_rank: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    q_lora_rank: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    qk_rope_head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    qk_nope_head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    v_head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    linear_num_key_heads: int | None = Field(None, ge=1, le=MAX_HEADS)
    linear_num_value_heads: int | None = Field(None, ge=1, le=MAX_HEADS)
    linear_key_head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    linear_value_head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    linear_conv_kernel_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    index_topk: int | None = Field(None, ge=1, le=MAX_TOKENS)  # DeepSeek sparse attention (V3.2): tokens attended
    index_n_heads: int | None = Field(None, ge=1, le=MAX_HEADS)
    index_head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM)
    # the context: max_position_embeddings as rope_scaling stretches it (`context_tokens`)
    max_position_embeddings: int | None = Field(None, ge=1, le=MAX_TOKENS)
    rope_scaling: RopeScaling | None = None

    @property
    def experts(self) -> int:
        return self.num_experts or self.num_local_experts or self.n_routed_experts or 0

    @property
    def top_k(self) -> int | None:
        return self.num_experts_per_tok or self.experts_per_token


def _check_shapes(cfg: HfConfig, source: str) -> None:
    """What the fields must satisfy together."""
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if cfg.kv_lora_rank is not None:  # MLA: the latent is one KV head shared by all query heads
        kv = None
    if kv is not None and (kv > heads or heads % kv):
        raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                          source=source, field="num_key_value_heads")
    if cfg.head_dim is None and cfg.kv_lora_rank is None and cfg.hidden_size % heads:
        raise ConfigError(f"hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads {heads} "
                          f"and no head_dim is given", source=source, field="hidden_size")
    if not cfg.experts:
        if cfg.intermediate_size is None:
            raise ConfigError("Field required (a dense model)", source=source, field="intermediate_size")
        return
    if cfg.top_k is None or cfg.top_k > cfg.experts:
        raise ConfigError(f"expected 1 to {cfg.experts} (the experts of a mixture-of-experts model)",
                          source=source, field="num_experts_per_tok")
    if cfg.moe_intermediate_size is None and cfg.intermediate_size is None:
        raise ConfigError("Field required (a mixture-of-experts model)", source=source, field="moe_intermediate_size")
    if _dense_mlp_layers(cfg) and _dense_intermediate(cfg) is None:
        raise ConfigError("Field required (the dense MLP of first_k_dense_replace / mlp_only_layers)", source=source,
                          field="intermediate_size")


LAYER_TYPES = {"full_attention": FULL, "chunked_attention": CHUNKED, "sliding_attention": WINDOW,
               "linear_attention": LINEAR}
NO_ROPE_INTERVAL = 4  # Llama 4 without no_rope_layers: every 4th layer NoPE (transformers' Llama4TextConfig)
LLAMA4_SHARED_EXPERTS = 1  # Llama 4's MoE layers: one shared expert of intermediate_size beside the routed ones
MLA_FIELDS = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
SPARSE_FIELDS = ("kv_lora_rank", "index_n_heads", "index_head_dim")
LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")


def _layer_types(cfg) -> list[str]:
    """config.json's name of every layer's attention: `layer_types`, else every `full_attention_interval`-th
    layer full and the rest linear (Qwen3-Next), else with `attention_chunk_size` the RoPE layers of
    `no_rope_layers` chunked and its NoPE layers full (Llama 4; empty or absent: every 4th layer NoPE,
    as transformers' Llama4TextConfig fills it), else all full."""
    if cfg.layer_types is not None:
        return list(cfg.layer_types)
    n = cfg.num_hidden_layers
    if cfg.full_attention_interval is not None:
        return ["full_attention" if (i + 1) % cfg.full_attention_interval == 0 else "linear_attention" for i in range(n)]
    if cfg.attention_chunk_size is not None:
        rope = cfg.no_rope_layers or [int((i + 1) % NO_ROPE_INTERVAL != 0) for i in range(n)]
        return ["chunked_attention" if r else "full_attention" for r in rope]
    return ["full_attention"] * n


def layer_kinds(cfg) -> tuple[str, ...]:
    """Each layer's kind (sim/model/layers.py); full attention is MLA where the model has kv_lora_rank,
    sparse where it also has the indexer's index_topk."""
    full = (SPARSE if cfg.index_topk is not None else MLA) if cfg.kv_lora_rank is not None else FULL
    kinds = tuple(full if (k := LAYER_TYPES[t]) == FULL else k for t in _layer_types(cfg))
    return () if all(k == FULL for k in kinds) else kinds


def _dense_mlp_layers(cfg) -> int:
    """Layers of a mixture-of-experts model whose MLP is dense: DeepSeek's first_k_dense_replace (and
    moe_layer_freq), Qwen's decoder_sparse_step and mlp_only_layers, Llama 4's moe_layers (else every
    interleave_moe_layer_step-th layer MoE)."""
    if not cfg.experts:
        return 0
    n, k = cfg.num_hidden_layers, min(cfg.first_k_dense_replace or 0, cfg.num_hidden_layers)
    if cfg.moe_layers:
        return n - len({i for i in cfg.moe_layers if 0 <= i < n})
    freq, step, only = cfg.moe_layer_freq or 1, cfg.decoder_sparse_step or 1, set(cfg.mlp_only_layers or ())
    step *= cfg.interleave_moe_layer_step or 1
    moe = [i >= k and i % freq == 0 and (i + 1) % step == 0 and i not in only for i in range(n)]
    return n - sum(moe)


def _dense_intermediate(cfg) -> int | None:
    """The dense MLP's width: Llama 4's intermediate_size_mlp (its intermediate_size is the experts'), else
    intermediate_size."""
    return cfg.intermediate_size_mlp or cfg.intermediate_size


def _shared_intermediate(cfg, moe_inter: int) -> int:
    """The shared experts' width: shared_expert_intermediate_size, DeepSeek's n_shared_experts x
    moe_intermediate_size, Llama 4's one shared expert of intermediate_size."""
    if cfg.shared_expert_intermediate_size:
        return cfg.shared_expert_intermediate_size
    if (cfg.model_type or "").startswith("llama4") and cfg.experts:
        return LLAMA4_SHARED_EXPERTS * moe_inter
    return (cfg.n_shared_experts or 0) * moe_inter


def mla_shape(cfg) -> MlaShape | None:
    if cfg.kv_lora_rank is None:
        return None
    return MlaShape(kv_lora_rank=cfg.kv_lora_rank, qk_rope_head_dim=cfg.qk_rope_head_dim,
                    qk_nope_head_dim=cfg.qk_nope_head_dim, v_head_dim=cfg.v_head_dim, q_lora_rank=cfg.q_lora_rank or 0)


def sparse_shape(cfg) -> SparseShape | None:
    if cfg.index_topk is None:
        return None
    return SparseShape(cfg.index_topk, cfg.index_n_heads, cfg.index_head_dim)


def linear_shape(cfg) -> LinearShape | None:
    if cfg.linear_num_key_heads is None:
        return None
    return LinearShape(cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                       cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim or 4)


def check_kinds(cfg, source: str) -> None:
    """Every layer kind named is one kvtier models and comes with the fields that shape it."""
    def need(fields, why: str) -> None:
        for f in fields:
            if getattr(cfg, f) is None:
                raise ConfigError(f"Field required ({why})", source=source, field=f)

    if cfg.no_rope_layers and cfg.layer_types is None and len(cfg.no_rope_layers) != cfg.num_hidden_layers:
        raise ConfigError(f"{len(cfg.no_rope_layers)} entries for {cfg.num_hidden_layers} layers (num_hidden_layers)",
                          source=source, field="no_rope_layers")
    types = _layer_types(cfg)
    if len(types) != cfg.num_hidden_layers:
        raise ConfigError(f"{len(types)} entries for {cfg.num_hidden_layers} layers (num_hidden_layers)",
                          source=source, field="layer_types")
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise ConfigError(f"{t!r} is not a layer kind kvtier models; expected one of {', '.join(LAYER_TYPES)}",
                              source=source, field=f"layer_types.{i}")
    if cfg.use_sliding_window and cfg.layer_types is None:
        raise ConfigError("sliding windows without layer_types are not modelled; give layer_types",
                          source=source, field="use_sliding_window")
    if "sliding_attention" in types:
        need(["sliding_window"], "sliding_attention layers")
    if "chunked_attention" in types:
        need(["attention_chunk_size"], "chunked_attention layers")
    if "linear_attention" in types:
        need(LINEAR_FIELDS, "linear_attention layers")
    if cfg.kv_lora_rank is not None:
        need(MLA_FIELDS, "MLA: kv_lora_rank is given")
    if cfg.index_topk is not None:
        need(SPARSE_FIELDS, "sparse attention: index_topk is given")


def load_hf_config(path: str | Path) -> HfConfig:
    source = str(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", source=source)
    return config_from_mapping(data, source)


def config_from_mapping(data: dict, source: str) -> HfConfig:
    """config.json's fields (a file's, or a catalog entry's `config:`) validated strictly, kinds and shapes checked.
    A multimodal config.json (Llama 4's Llama4ForConditionalGeneration) gives the language model's fields
    under `text_config`: read from there."""
    text = data.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in data:
        data = {**text, **{k: data[k] for k in ("_name_or_path",) if k in data}}
        source = f"{source} (text_config)"
    try:
        cfg = HfConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(first["msg"], source=source, field=field) from None
    check_kinds(cfg, source)
    _check_shapes(cfg, source)
    return cfg


def kind_fields(cfg) -> dict:
    """The ModelSpec fields of layers by kind and experts, from config.json's names (or a catalog entry
    that uses them): layer_kinds, sliding_window, attention_chunk, mla, linear, dense_mlp_layers, experts,
    shared experts."""
    n_experts, inter = cfg.experts, _dense_intermediate(cfg)
    moe_inter = cfg.moe_intermediate_size or (cfg.intermediate_size if n_experts else 0) or 0
    shared = _shared_intermediate(cfg, moe_inter)
    dense = _dense_mlp_layers(cfg)
    mla = mla_shape(cfg)
    kinds = layer_kinds(cfg)
    return dict(layer_kinds=kinds, sliding_window=(cfg.sliding_window or 0) if WINDOW in kinds else 0, mla=mla,
                attention_chunk=(cfg.attention_chunk_size or 0) if CHUNKED in kinds else 0,
                linear=linear_shape(cfg) if LINEAR in kinds else None, dense_mlp_layers=dense,
                sparse=sparse_shape(cfg) if SPARSE in kinds else None,
                num_experts=n_experts, experts_per_token=cfg.top_k or 0, moe_intermediate_size=moe_inter,
                shared_expert_intermediate_size=shared,
                intermediate_size=(inter or 0) if (not n_experts or dense) else 0,
                **({"num_kv_heads": 1, "explicit_head_dim": mla.qk_head_dim} if mla else {}))


def spec_from_config(cfg: HfConfig, name: str, source: str) -> ModelSpec:
    """The ModelSpec of a validated config.json: shapes, biases and norms by model_type, kinds, experts."""
    model_type = cfg.model_type or ""
    heads = cfg.num_attention_heads
    fields = {"num_kv_heads": cfg.num_key_value_heads or heads, "explicit_head_dim": cfg.head_dim} | kind_fields(cfg)
    return ModelSpec(
        name=name,
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        num_heads=heads,
        vocab_size=cfg.vocab_size,
        tie_embeddings=bool(cfg.tie_word_embeddings),
        qkv_bias=cfg.attention_bias if cfg.attention_bias is not None else model_type.startswith("qwen2"),
        qk_norm=model_type.startswith("qwen3"),
        source=source,
        context_tokens=context_tokens(cfg.max_position_embeddings, cfg.rope_scaling),
        moe_routing=moe_routing_for(model_type) if fields["num_experts"] else BALANCED_ROUTING,
        **fields,
    )


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json on disk."""
    p = Path(path)
    cfg = load_hf_config(p)
    return spec_from_config(cfg, str(cfg.name_or_path or p.parent.name or p.stem), f"config.json at {p}")
