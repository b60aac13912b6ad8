"""Model architecture and the sizes derived from it (parameters, weight bytes, KV bytes).

All counts follow the Hugging Face config.json conventions of Qwen2/Qwen3/Llama/Mixtral-style
decoder-only models: per layer q/k/v/o projections (GQA shapes, optional q/k/v bias, optional q/k
RMSNorm), a gated MLP (gate, up, down) or a mixture of such experts, two RMSNorms; an embedding,
a final norm and an LM head (tied or not).
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import KV_DTYPES, WEIGHT_DTYPES
from .units import KV_TENSORS

MLP_MATRICES = 3  # gate, up, down
NORMS_PER_LAYER = 2  # input and post-attention RMSNorm
HIGH_PRECISION_BITS = 16  # embeddings, LM head, norms and biases stay in bf16 when weights are quantised


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    explicit_head_dim: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    source: str = ""

    # ---- shapes -------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Explicit `head_dim` if config.json has one, else hidden / heads."""
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # ---- tensor parallelism -------------------------------------------------------------
    def tp_problem(self, tp: int) -> str | None:
        """Why this model cannot be sharded over `tp` GPUs (vLLM's rules), or None."""
        if self.num_heads % tp:
            return f"{self.num_heads} attention heads are not divisible by tp {tp}"
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            return f"tp {tp} must divide the {self.num_kv_heads} KV heads or be a multiple of them"
        for name, size in (("intermediate_size", self.intermediate_size), ("moe_intermediate_size", self.moe_intermediate_size),
                           ("shared_expert_intermediate_size", self.shared_expert_intermediate_size)):
            if size % tp:
                return f"{name} {size} is not divisible by tp {tp}"
        return None

    def shard(self, tp: int) -> "ModelSpec":
        """What one GPU of a `tp`-way tensor-parallel group holds: H/tp query heads, max(1, Hkv/tp)
        KV heads (replicated where tp > Hkv), I/tp of each MLP, V/tp of the embedding and LM head
        (vocab-parallel); hidden size, layers and norms unchanged. tp = 1 is the model itself."""
        if tp == 1:
            return self
        from dataclasses import replace

        return replace(self, num_heads=self.num_heads // tp, num_kv_heads=max(1, self.num_kv_heads // tp),
                       intermediate_size=self.intermediate_size // tp, moe_intermediate_size=self.moe_intermediate_size // tp,
                       shared_expert_intermediate_size=self.shared_expert_intermediate_size // tp,
                       vocab_size=-(-self.vocab_size // tp), explicit_head_dim=self.head_dim)

    # ---- KV -----------------------------------------------------------------------------
    def kv_bytes_per_token_layer(self, kv_dtype: str = "bf16") -> float:
        """K and V of one token in one layer: 2 * Hkv * d * bytes (+ one scale per head for int8)."""
        dt = KV_DTYPES[kv_dtype]
        per_head = dt.bytes_for(self.head_dim, self.head_dim)
        return KV_TENSORS * self.num_kv_heads * per_head

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """K and V of one token over all layers: 2 * L * Hkv * d * bytes(kv_dtype)."""
        return self.num_layers * self.kv_bytes_per_token_layer(kv_dtype)

    # ---- parameters ---------------------------------------------------------------------
    def attention_linear_params_layer(self) -> int:
        """q, k, v, o weight matrices: h*(H*d) + 2*h*(Hkv*d) + (H*d)*h."""
        h = self.hidden_size
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h

    def expert_params(self) -> int:
        return MLP_MATRICES * self.hidden_size * self.moe_intermediate_size

    def mlp_linear_params_layer(self) -> int:
        """Dense: 3*h*I. MoE: E*3*h*I_moe + 3*h*I_shared + router h*E."""
        h = self.hidden_size
        if not self.is_moe:
            return MLP_MATRICES * h * self.intermediate_size
        return (
            self.num_experts * self.expert_params()
            + MLP_MATRICES * h * self.shared_expert_intermediate_size
            + h * self.num_experts
        )

    def small_params_layer(self) -> int:
        """Biases and norms of one layer (kept in high precision)."""
        bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return bias + qk_norm + NORMS_PER_LAYER * self.hidden_size

    def params_layer(self) -> int:
        return self.attention_linear_params_layer() + self.mlp_linear_params_layer() + self.small_params_layer()

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """Total parameter count: layers + embedding + final norm + LM head."""
        return (
            self.num_layers * self.params_layer()
            + self.embedding_params()
            + self.hidden_size
            + self.lm_head_params()
        )

    # ---- weight bytes -------------------------------------------------------------------
    def _linear_bytes(self, rows_x_cols: list[tuple[int, int]], weight_dtype: str, group_size: int) -> float:
        dt = WEIGHT_DTYPES[weight_dtype]
        return sum(dt.bytes_for(r * c, group_size) for r, c in rows_x_cols)

    def _attention_matrices(self) -> list[tuple[int, int]]:
        h = self.hidden_size
        return [(h, self.q_dim), (h, self.kv_dim), (h, self.kv_dim), (self.q_dim, h)]

    def _dense_mlp_matrices(self, inter: int) -> list[tuple[int, int]]:
        h = self.hidden_size
        return [(h, inter), (h, inter), (inter, h)] if inter else []

    def layer_gemm_shapes(self) -> list[tuple[int, int]]:
        """(n outputs, k inputs) of a dense layer's GEMMs as engines fuse them (vLLM's
        QKVParallelLinear and MergedColumnParallelLinear): qkv, o, gate_up, down. Per GPU once sharded."""
        h, inter = self.hidden_size, self.intermediate_size
        return [(self.q_dim + 2 * self.kv_dim, h), (h, self.q_dim), (2 * inter, h), (h, inter)]

    def layer_weight_bytes(self, weight_dtype: str, group_size: int = 128) -> float:
        """All weights of one layer: quantised linear matrices + bf16 biases, norms, router."""
        hp = HIGH_PRECISION_BITS / 8
        b = self._linear_bytes(self._attention_matrices(), weight_dtype, group_size)
        if self.is_moe:
            b += self.num_experts * self._linear_bytes(
                self._dense_mlp_matrices(self.moe_intermediate_size), weight_dtype, group_size
            )
            b += self._linear_bytes(self._dense_mlp_matrices(self.shared_expert_intermediate_size), weight_dtype, group_size)
            b += self.hidden_size * self.num_experts * hp
        else:
            b += self._linear_bytes(self._dense_mlp_matrices(self.intermediate_size), weight_dtype, group_size)
        return b + self.small_params_layer() * hp

    def non_layer_weight_bytes(self) -> float:
        """Embedding, final norm and LM head, kept in bf16."""
        hp = HIGH_PRECISION_BITS / 8
        return (self.embedding_params() + self.hidden_size + self.lm_head_params()) * hp

    def lm_head_bytes(self) -> float:
        """Bytes the LM head reads per step (the embedding matrix when tied)."""
        return self.vocab_size * self.hidden_size * HIGH_PRECISION_BITS / 8

    def weight_bytes(self, weight_dtype: str = "bf16", group_size: int = 128) -> float:
        return self.num_layers * self.layer_weight_bytes(weight_dtype, group_size) + self.non_layer_weight_bytes()

    # ---- decode work per layer ----------------------------------------------------------
    def expected_experts_touched(self, batch: int) -> float:
        """Distinct experts a batch reads per layer, tokens routed uniformly: E * (1 - (1 - k/E)^B)."""
        if not self.is_moe:
            return 0.0
        e, k = self.num_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** batch)

    def layer_weight_bytes_read(self, weight_dtype: str, batch: int, group_size: int = 128) -> float:
        """Weight bytes one decode step reads in one layer (MoE: only the experts touched)."""
        full = self.layer_weight_bytes(weight_dtype, group_size)
        if not self.is_moe:
            return full
        dt = WEIGHT_DTYPES[weight_dtype]
        one_expert = dt.bytes_for(self.expert_params(), group_size)
        untouched = self.num_experts - self.expected_experts_touched(batch)
        return full - untouched * one_expert

    def layer_linear_params_read(self, batch: int) -> float:
        """Linear weights one decode step reads (and a weight-only kernel dequantises) in one layer:
        every matrix of a dense layer; an MoE layer's untouched experts are skipped."""
        full = self.attention_linear_params_layer() + self.mlp_linear_params_layer()
        if not self.is_moe:
            return full
        return full - (self.num_experts - self.expected_experts_touched(batch)) * self.expert_params()

    def active_linear_params_layer(self) -> int:
        """Linear parameters one token multiplies through in one layer (MoE: k experts + shared)."""
        if not self.is_moe:
            return self.attention_linear_params_layer() + self.mlp_linear_params_layer()
        h = self.hidden_size
        return (
            self.attention_linear_params_layer()
            + self.experts_per_token * self.expert_params()
            + MLP_MATRICES * h * self.shared_expert_intermediate_size
            + h * self.num_experts
        )
