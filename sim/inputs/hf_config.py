"""The fields of a Hugging Face config.json the simulator reads, typed as strictly as a scenario.

Other keys of a config.json are ignored. Every failure is a ConfigError naming the file and the
field: a missing field, a boolean or string where a count is expected, a zero or negative count,
heads that KV heads do not divide, a size beyond sim/inputs/limits.py.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    MAX_VOCAB,
)
from .reader import read_json


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

    @property
    def experts(self) -> int:
        return self.num_experts or self.num_local_experts or self.n_routed_experts or 0


def _check_shapes(cfg: HfConfig, source: str) -> None:
    """What the fields must satisfy together."""
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if kv is not None and (kv > heads or heads % kv):
        raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                          source=source, field="num_key_value_heads")
    if cfg.head_dim is None and cfg.hidden_size % heads:
        raise ConfigError(f"hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads {heads} "
                          f"and no head_dim is given", source=source, field="hidden_size")
    if not cfg.experts:
        if cfg.intermediate_size is None:
            raise ConfigError("Field required (a dense model)", source=source, field="intermediate_size")
        return
    if cfg.num_experts_per_tok is None or cfg.num_experts_per_tok > cfg.experts:
        raise ConfigError(f"expected 1 to {cfg.experts} (the experts of a mixture-of-experts model)",
                          source=source, field="num_experts_per_tok")
    if cfg.moe_intermediate_size is None and cfg.intermediate_size is None:
        raise ConfigError("Field required (a mixture-of-experts model)", source=source, field="moe_intermediate_size")


def load_hf_config(path: str | Path) -> HfConfig:
    source = str(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", source=source)
    try:
        cfg = HfConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(first["msg"], source=source, field=field) from None
    _check_shapes(cfg, source)
    return cfg


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json on disk."""
    p = Path(path)
    cfg = load_hf_config(p)
    model_type = cfg.model_type or ""
    heads, n_experts, inter = cfg.num_attention_heads, cfg.experts, cfg.intermediate_size
    return ModelSpec(
        name=str(cfg.name_or_path or p.parent.name or p.stem),
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        num_heads=heads,
        num_kv_heads=cfg.num_key_value_heads or heads,
        intermediate_size=(inter or 0) if not n_experts else 0,
        vocab_size=cfg.vocab_size,
        tie_embeddings=bool(cfg.tie_word_embeddings),
        explicit_head_dim=cfg.head_dim,
        qkv_bias=cfg.attention_bias if cfg.attention_bias is not None else model_type.startswith("qwen2"),
        qk_norm=model_type.startswith("qwen3"),
        num_experts=n_experts,
        experts_per_token=cfg.num_experts_per_tok or 0,
        moe_intermediate_size=(cfg.moe_intermediate_size or (inter if n_experts else 0) or 0),
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size or 0,
        source=f"config.json at {p}",
    )
