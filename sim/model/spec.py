"""Model architecture and the sizes derived from it (parameters, weight bytes, KV bytes).

All counts follow the Hugging Face config.json conventions of Qwen2/Qwen3/Llama/Mixtral-style
decoder-only models: per layer q/k/v/o projections (GQA shapes, optional q/k/v bias, optional q/k
RMSNorm), a gated MLP (gate, up, down) or a mixture of such experts, two RMSNorms; an embedding,
a final norm and an LM head (tied or not).

Layers by kind (`sim/model/layers.py`): a model may list one attention kind per layer (full, MLA,
sliding window, linear) and, if it is a mixture of experts, a number of layers whose MLP stays
dense (DeepSeek's first_k_dense_replace). A model with neither (`layer_kinds` empty,
`dense_mlp_layers` 0) is sized by exactly the formulas it always was. The simulator's engines run
L identical layers, so the per-layer figures of a model with kinds are the mean over its L layers
(`kv_bytes_per_token_layer`, `layer_weight_bytes`, ...); totals (`kv_bytes_per_token`, `params`,
`weight_bytes`) are sums over the layers, kind by kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from .dtypes import KV_DTYPES, WEIGHT_DTYPES, DType
from .experts import (
    busiest_rank_experts_touched,
    busiest_routing_share,
    expected_experts_touched,
    skewed_busiest_rank,
    skewed_experts_touched,
)
from .layers import (
    BOUNDED_KINDS,
    CHUNKED,
    FULL,
    GQA_KINDS,
    KINDS,
    LINEAR,
    MLA,
    SPARSE,
    TIERED_KINDS,
    WINDOW,
    LinearShape,
    MlaShape,
    SparseShape,
    kind_counts,
)
from .units import KV_TENSORS

MLP_MATRICES = 3  # gate, up, down
NORMS_PER_LAYER = 2  # input and post-attention RMSNorm
HIGH_PRECISION_BITS = 16  # embeddings, LM head, norms and biases stay in bf16 when weights are quantised
LINEAR_GATES = 2  # a linear-attention layer's per-value-head gates b and a (in_proj_ba)


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
    layer_kinds: tuple[str, ...] = ()  # one kind per layer (sim/model/layers.py); () = every layer full attention
    sliding_window: int = 0  # W of the `window` layers
    attention_chunk: int = 0  # C of the `chunked` layers (Llama 4's attention_chunk_size)
    mla: MlaShape | None = None  # the `mla` layers' shape
    linear: LinearShape | None = None  # the `linear` layers' shape
    sparse: SparseShape | None = None  # the `sparse` layers' indexer (their latent is `mla`)
    dense_mlp_layers: int = 0  # MoE models: layers whose MLP is dense (intermediate_size), e.g. first_k_dense_replace
    # one GPU's shard under expert / attention data parallelism (`shard`); 1 = the model itself, or TP only
    expert_parallel: int = 1  # the routed experts are split whole over this many GPUs: num_experts / it per GPU
    attention_dp: int = 1  # attention data-parallel ranks: a GPU holds the KV of 1 / this of the group's sequences
    dense_dp: bool = False  # under attention DP the dense MLPs, shared experts and vocab run data-parallel too (`shard`)
    embedding_vocab_size: int | None = None  # rows of the embedding a GPU holds where not the LM head's (`shard`)
    routing_skew: float = 0.0  # Zipf exponent of expert popularity (sim/model/experts.py); 0: uniform routing
    # the fused-experts tables' routing: the rows measured mode reads and the fit datasheet mode takes (a power law's at
    # its draw's load, sim/model/power_law.py; sim/inputs/moe_routing.py); routing_skew instead: the datasheet's Zipf
    moe_routing: str = "balanced"
    # the routed experts' weight format where a checkpoint quantises them apart from the rest (gpt-oss: MXFP4
    # experts, bf16 attention); None: the scenario's weight_dtype for every linear layer (`expert_format`)
    expert_weight_dtype: str | None = None
    # the attention projections' own format where a checkpoint keeps them apart (ModelOpt's NVFP4 checkpoints of
    # DeepSeek-R1 exclude self_attn*: bf16), and the output projection's where it differs again (R1 NVFP4-v2
    # quantises wo); None: weight_dtype (`attention_formats`)
    attention_weight_dtype: str | None = None
    attention_output_weight_dtype: str | None = None
    pipeline_stages: int = 1  # one pipeline stage of a model split over this many (`stage`); 1 = every layer
    # the longest sequence an engine serves by default: config.json's max_position_embeddings as rope
    # scaling stretches it (`inputs.hf_config.context_tokens`); None: config.json gives none
    context_tokens: int | None = None

    def __post_init__(self):
        """Layer kinds all `full` are the plain model (normalised to ()); each kind used needs its shape."""
        if self.layer_kinds and all(k == FULL for k in self.layer_kinds):
            object.__setattr__(self, "layer_kinds", ())
        problem = self._kinds_problem()
        if problem:
            raise ValueError(f"model {self.name!r}: {problem}")

    def _kinds_problem(self) -> str | None:
        kinds = self.layer_kinds
        if kinds and len(kinds) != self.num_layers:
            return f"{len(kinds)} layer kinds for {self.num_layers} layers"
        if set(kinds) - set(KINDS):
            return f"unknown layer kinds {sorted(set(kinds) - set(KINDS))}; expected {', '.join(KINDS)}"
        needs = {WINDOW: self.sliding_window > 0, CHUNKED: self.attention_chunk > 0, MLA: self.mla is not None,
                 LINEAR: self.linear is not None,
                 SPARSE: self.mla is not None and self.sparse is not None}
        missing = [k for k, ok in needs.items() if k in kinds and not ok]
        if missing:
            return (f"{', '.join(missing)} layers without their shape (sliding_window, attention_chunk, mla, linear, "
                    "mla + sparse)")
        if self.dense_mlp_layers and not (self.is_moe and self.dense_mlp_layers <= self.num_layers):
            return "dense_mlp_layers applies to a mixture-of-experts model, at most its layers"
        return None

    # ---- shapes -------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Explicit `head_dim` if config.json has one, else hidden / heads (MLA: qk_nope + qk_rope)."""
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of a token's K (or V) projection; MLA: the latent's (kv_lora_rank + qk_rope_head_dim)."""
        if self.mla is not None:
            return self.mla.latent_dim
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dense_gqa(self) -> bool:
        """Every layer full GQA attention and one dense MLP: a Llama-shaped model (no experts, MLA,
        windows or linear layers)."""
        return not self.is_moe and not self.layer_kinds and self.mla is None

    @property
    def local_experts(self) -> int:
        """Routed experts one GPU holds per MoE layer: all of them (each 1/tp wide under tensor
        parallelism), or num_experts / expert_parallel whole ones under expert parallelism."""
        return self.num_experts // self.expert_parallel

    # ---- layers by kind -----------------------------------------------------------------
    @property
    def kinds(self) -> tuple[str, ...]:
        """The attention kind of every layer."""
        return self.layer_kinds or (FULL,) * self.num_layers

    @property
    def kind_counts(self) -> Mapping[str, int]:
        """{kind: layers}, e.g. {'full': 18, 'window': 18} for gpt-oss-120b."""
        return _counts(self.kinds)

    @property
    def uniform(self) -> bool:
        """Every layer full attention with one kind of MLP: the model as sized before layer kinds."""
        return not self.layer_kinds and not self.dense_mlp_layers

    @property
    def tiered_layers(self) -> int:
        """Layers whose KV grows per token and tiers per token (full attention, MLA)."""
        if not self.layer_kinds:
            return self.num_layers
        return sum(n for k, n in self.kind_counts.items() if k in TIERED_KINDS)

    @property
    def chunked_tier_share(self) -> float:
        """The chunked layers' share of a token's tiered bytes (Llama 4 Maverick: 36 of 48 equal layers,
        0.75); 0 without chunked layers. A host-tier token is staged, held and moved for these layers only
        where it lies in its sequence's current chunk (`decode.context.RunContext.chunk_kept`)."""
        if CHUNKED not in self.kind_counts:
            return 0.0
        return self.kind_kv_bytes_per_token(CHUNKED) / self.kv_bytes_per_token()

    @property
    def has_bounded_layers(self) -> bool:
        """Any window or linear layer (per-sequence bytes) or sparse layer (its indexer keys): bytes that
        never leave HBM (`bounded_bytes`)."""
        return any(k in BOUNDED_KINDS or k == SPARSE for k in self.kind_counts)

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.num_layers - self.dense_mlp_layers if self.is_moe else 0

    def describe_kinds(self) -> str:
        """'18 full + 18 window (128)', '61 mla', '36 linear + 12 full'; MoE models add their dense-MLP layers."""
        label = {WINDOW: f" ({self.sliding_window})", CHUNKED: f" ({self.attention_chunk})",
                 SPARSE: f" (top-{self.sparse.index_topk})" if self.sparse else ""}
        parts = [f"{n} {k}" + label.get(k, "") for k, n in self.kind_counts.items()]
        text = " + ".join(parts)
        return f"{text}; {self.dense_mlp_layers} dense MLP" if self.dense_mlp_layers else text

    # ---- tensor parallelism -------------------------------------------------------------
    def parallel_problem(self, tp: int, ep: int = 1, attention_dp: int = 1) -> tuple[str, str] | None:
        """(field, why) this model cannot run over `tp` GPUs with expert parallelism `ep` (1, or tp:
        the experts split whole over the group) and `attention_dp` attention data-parallel ranks
        (attention tensor-parallel over tp / attention_dp GPUs each), or None."""
        if ep not in (1, tp):
            if tp == 1:
                return "parallel.ep", f"ep {ep} needs parallel.tp {ep}: the experts split over the tensor-parallel group"
            return "parallel.ep", f"expected 1 (experts split by tensor parallelism) or {tp} (the tp group), got {ep}"
        if ep > 1 and not self.is_moe:
            return "parallel.ep", f"expert parallelism needs a mixture-of-experts model; {self.name} is dense"
        if ep > 1 and self.num_experts % ep:
            return "parallel.ep", f"{self.num_experts} experts are not divisible by ep {ep}"
        if tp % attention_dp:
            return "parallel.attention_dp", f"attention_dp {attention_dp} must divide tp {tp}"
        if attention_dp > 1 and ep != tp:
            return "parallel.attention_dp", f"attention data parallelism needs expert parallelism over the group (ep: {tp})"
        problem = self.tp_problem(tp, attention_tp=tp // attention_dp, experts_split=ep == 1)
        return ("parallel.tp", problem) if problem else None

    def tp_problem(self, tp: int, attention_tp: int | None = None, experts_split: bool = True) -> str | None:
        """Why this model cannot be sharded over `tp` GPUs (vLLM's rules), or None: attention heads over
        `attention_tp` (tp unless attention is data-parallel), MLP widths over tp (experts' only when
        tensor parallelism splits them)."""
        attention_tp = tp if attention_tp is None else attention_tp
        if self.num_heads % attention_tp:
            return f"{self.num_heads} attention heads are not divisible by tp {attention_tp}"
        if self.num_kv_heads % attention_tp and attention_tp % self.num_kv_heads:
            return f"tp {attention_tp} must divide the {self.num_kv_heads} KV heads or be a multiple of them"
        widths = [("intermediate_size", self.intermediate_size),
                  ("shared_expert_intermediate_size", self.shared_expert_intermediate_size)]
        if experts_split:
            widths.insert(1, ("moe_intermediate_size", self.moe_intermediate_size))
        for name, size in widths:
            if size % tp:
                return f"{name} {size} is not divisible by tp {tp}"
        return self.linear.tp_problem(attention_tp) if self.linear is not None else None

    def shard(self, tp: int, ep: int = 1, attention_dp: int = 1, dense_dp: bool = False,
              whole_embedding: bool = False) -> "ModelSpec":
        """What one GPU of a `tp`-way tensor-parallel group holds: H/tp query heads, max(1, Hkv/tp)
        KV heads (replicated where tp > Hkv), I/tp of each MLP, V/tp of the embedding and LM head
        (vocab-parallel); hidden size, layers and norms unchanged. tp = 1 is the model itself.
        MLA's latent is one KV head (`num_kv_heads` 1): every GPU holds all of it (replicated, as
        engines do), with its q_a/kv_a projections; linear layers split their heads tp ways.
        Expert parallelism (`ep` = tp): each GPU holds E / ep whole experts instead of 1/tp of each.
        Attention data parallelism (`attention_dp` D, as SGLang's --enable-dp-attention and vLLM's
        data-parallel attention with expert parallelism): attention heads split over tp / D GPUs, each
        attention rank holding its own 1/D of the sequences, so the shard's per-token KV, attention work
        and attention projections' FLOP are 1/D of a rank's (the batch the engines carry stays the group's).
        The dense MLPs, shared experts, embedding and LM head split over all tp GPUs (SGLang's default
        moe_dense_tp_size), or with `dense_dp` over each rank's tp / D like its attention, each rank
        running them on its own tokens (TensorRT-LLM: "If using attention DP, the MLP also uses DP
        instead of TP", the shared experts likewise, embedding and LM head unsplit; vLLM's data-parallel
        ranks are whole replicas of everything but the experts). `whole_embedding`: under attention DP
        every GPU holds the whole embedding while the LM head stays split (SGLang: VocabParallelEmbedding
        enable_tp=not is_dp_attention_enabled(); `embedding_vocab_size`)."""
        if tp == 1:
            return self
        from dataclasses import replace

        a_tp = tp // attention_dp
        dense_dp = dense_dp and attention_dp > 1
        dense_tp = a_tp if dense_dp else tp
        return replace(self, num_heads=self.num_heads // a_tp, num_kv_heads=max(1, self.num_kv_heads // a_tp),
                       intermediate_size=self.intermediate_size // dense_tp,
                       moe_intermediate_size=self.moe_intermediate_size // (1 if ep > 1 else tp),
                       shared_expert_intermediate_size=self.shared_expert_intermediate_size // dense_tp,
                       vocab_size=-(-self.vocab_size // dense_tp), explicit_head_dim=self.head_dim,
                       linear=self.linear.shard(a_tp) if self.linear is not None else None,
                       expert_parallel=ep, attention_dp=attention_dp, dense_dp=dense_dp,
                       embedding_vocab_size=self.vocab_size if whole_embedding and attention_dp > 1 else None)

    # ---- pipeline parallelism -----------------------------------------------------------
    def pipeline_problem(self, pp: int) -> str | None:
        """Why this model cannot be split into `pp` pipeline stages as kvtier models them, or None:
        a stage is ceil(L / pp) alike layers, so the layers must all be alike and at least pp."""
        if pp == 1:
            return None
        if not self.uniform:
            return (f"pipeline stages of {self.name} ({self.describe_kinds()}) would differ in kind: only models whose "
                    f"layers are all alike are split into stages (not modelled)")
        if self.num_layers < pp:
            return f"{self.num_layers} layers cannot make {pp} pipeline stages"
        return None

    def stage(self, pp: int) -> "ModelSpec":
        """The largest of `pp` pipeline stages (vLLM's get_pp_indices splits the layers evenly, the
        remainder to some stages): ceil(L / pp) layers. The end stages hold the embedding (first) and
        the final norm and LM head (last; with tied embeddings, the same matrix again), so a stage's
        non-layer weights are one vocab x hidden matrix (`non_layer_weight_bytes`). pp = 1 is the
        model itself. Only for models whose layers are all alike (`pipeline_problem`)."""
        if pp == 1:
            return self
        from dataclasses import replace

        return replace(self, num_layers=-(-self.num_layers // pp), pipeline_stages=pp)

    # ---- KV -----------------------------------------------------------------------------
    def kind_kv_bytes_per_token_layer(self, kind: str, kv_dtype: str = "bf16") -> float:
        """One token in one layer of `kind`: full, chunked and window 2 * Hkv * d * bytes (+ one scale per head
        for int8); MLA one latent of kv_lora_rank + qk_rope_head_dim values (+ one scale); linear 0
        (its state is per sequence: `state_bytes_per_sequence`)."""
        dt = KV_DTYPES[kv_dtype]
        if kind in GQA_KINDS:
            per_head = dt.bytes_for(self.head_dim, self.head_dim)
            out = KV_TENSORS * self.num_kv_heads * per_head
        elif kind in (MLA, SPARSE):
            out = dt.bytes_for(self.mla.latent_dim, self.mla.latent_dim)
        else:
            return 0.0
        return out / self.attention_dp if self.attention_dp > 1 else out

    def kv_bytes_per_token_layer(self, kv_dtype: str = "bf16") -> float:
        """K and V of one token in one layer: 2 * Hkv * d * bytes (+ one scale per head for int8).
        With layer kinds: the tiered kinds' per-token bytes over all layers / L, the mean layer the
        engines carry (window and linear layers add nothing per token; they are per sequence)."""
        if not self.layer_kinds:
            return self.kind_kv_bytes_per_token_layer(FULL, kv_dtype)
        return self.kv_bytes_per_token(kv_dtype) / self.num_layers

    def kind_kv_bytes_per_token(self, kind: str, kv_dtype: str = "bf16") -> float:
        """One token over all the layers of `kind` (`kind_kv_bytes_per_token_layer` x their count; 0 without)."""
        return self.kind_counts.get(kind, 0) * self.kind_kv_bytes_per_token_layer(kind, kv_dtype)

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """K and V of one token over all layers: 2 * L * Hkv * d * bytes(kv_dtype). With layer kinds:
        the sum over the layers that grow per token (full, MLA) - what tiers per token."""
        if not self.layer_kinds:
            return self.num_layers * self.kv_bytes_per_token_layer(kv_dtype)
        return sum(self.kind_kv_bytes_per_token(k, kv_dtype) for k in self.kind_counts if k in TIERED_KINDS)

    def tiered_kv_bytes_per_token_layer(self, kv_dtype: str = "bf16") -> float:
        """One token in one tiered layer (what a staging buffer holds per token): `kv_bytes_per_token_layer`
        without kinds; with them, the tiered bytes per token / tiered layers (0 with none)."""
        if not self.layer_kinds:
            return self.kv_bytes_per_token_layer(kv_dtype)
        return self.kv_bytes_per_token(kv_dtype) / self.tiered_layers if self.tiered_layers else 0.0

    def compressed_bytes_per_token_layer(self, dtype: DType, group_size: int) -> float:
        """One token's T2 (compressed) copy in one layer, groups within a head vector: 2 * Hkv *
        bytes_for(d); MLA bytes_for(latent). With layer kinds: the mean over all L layers, as
        `kv_bytes_per_token_layer`."""
        if not self.layer_kinds:
            out = KV_TENSORS * self.num_kv_heads * dtype.bytes_for(self.head_dim, min(group_size, self.head_dim))
            return out / self.attention_dp if self.attention_dp > 1 else out
        total = 0.0
        for kind, n in self.kind_counts.items():
            if kind in (FULL, CHUNKED):
                total += n * KV_TENSORS * self.num_kv_heads * dtype.bytes_for(self.head_dim, min(group_size, self.head_dim))
            elif kind in (MLA, SPARSE):
                total += n * dtype.bytes_for(self.mla.latent_dim, min(group_size, self.mla.latent_dim))
        return total / self.num_layers / self.attention_dp

    def state_bytes_per_sequence(self) -> int:
        """Linear layers' recurrent + conv state of one sequence: linear layers x `LinearShape.state_bytes`
        (/ attention_dp: a GPU holds the states of its attention rank's sequences only)."""
        n = self.kind_counts.get(LINEAR, 0)
        if not n:
            return 0
        return n * self.linear.state_bytes / self.attention_dp if self.attention_dp > 1 else n * self.linear.state_bytes

    def bounded_bytes(self, tokens, sequences, kv_dtype: str = "bf16"):
        """HBM the bounded kinds hold for `sequences` sequences of `tokens` tokens in all (scalars or
        arrays): window layers x bytes/token/layer x min(tokens, sequences x W) + sequences x state
        bytes. min(sum, B x W) is sum_b min(n_b, W) exactly when every sequence is at least W long
        (or all are shorter), and an upper bound otherwise. Sparse layers add every token's indexer key
        (`indexer_bytes_per_token`): the indexer scores all tokens each step, so its keys stay in HBM."""
        out = np.asarray(sequences, dtype=float) * self.state_bytes_per_sequence()
        if WINDOW in self.kind_counts:
            held = np.minimum(np.asarray(tokens, dtype=float), np.asarray(sequences, dtype=float) * self.sliding_window)
            out = out + self.kind_kv_bytes_per_token(WINDOW, kv_dtype) * held
        if SPARSE in self.kind_counts:
            out = out + self.indexer_bytes_per_token() * np.asarray(tokens, dtype=float)
        return out if np.ndim(out) else float(out)

    def indexer_bytes_per_token(self) -> float:
        """Sparse layers' indexer keys of one token over all of them (`SparseShape.key_bytes_per_token`,
        fp8 + scales whatever the KV dtype; / attention_dp as the latent)."""
        n = self.kind_counts.get(SPARSE, 0)
        return n * self.sparse.key_bytes_per_token / self.attention_dp if n else 0.0

    def kv_by_kind(self, kv_dtype: str = "bf16") -> dict[str, dict]:
        """Per kind: its layers; per-token bytes over those layers (full, MLA, window) and the most one
        sequence holds in them (window: W tokens' worth; linear: its state)."""
        rows = {}
        for kind, n in self.kind_counts.items():
            per_token = self.kind_kv_bytes_per_token(kind, kv_dtype)
            row = {"layers": n, "bytes_per_token": per_token}
            if kind == CHUNKED:
                row.update(chunk_tokens=self.attention_chunk)
            if kind == WINDOW:
                row.update(window_tokens=self.sliding_window, max_bytes_per_sequence=per_token * self.sliding_window)
            if kind == LINEAR:
                row.update(bytes_per_token=0.0, max_bytes_per_sequence=float(n * self.linear.state_bytes))
            if kind == SPARSE:
                row.update(indexer_bytes_per_token=self.indexer_bytes_per_token(), top_k=self.sparse.index_topk)
            rows[kind] = row
        return rows

    # ---- parameters ---------------------------------------------------------------------
    def _attention_matrices(self, kind: str = FULL) -> list[tuple[int, int]]:
        """(rows, cols) of one layer's attention weights. Full, chunked and window: q, k, v, o. MLA: q (through
        q_lora_rank when it has one), kv_a (h -> latent, shared by the heads), kv_b (kv_lora_rank ->
        H x (qk_nope + v)), o. Linear (Gated DeltaNet): in_proj_qkvz (h -> conv channels + Hv x dv),
        in_proj_ba (h -> 2 Hv gates), out_proj."""
        h = self.hidden_size
        if kind in GQA_KINDS:
            return [(h, self.q_dim), (h, self.kv_dim), (h, self.kv_dim), (self.q_dim, h)]
        if kind == SPARSE:  # the indexer's projections, then the MLA layer's
            return [*self._indexer_matrices(), *self._attention_matrices(MLA)]
        if kind == MLA:
            a, heads = self.mla, self.num_heads
            q = [(h, a.q_lora_rank), (a.q_lora_rank, heads * a.qk_head_dim)] if a.q_lora_rank else [(h, heads * a.qk_head_dim)]
            return [*q, (h, a.latent_dim), (a.kv_lora_rank, heads * (a.qk_nope_head_dim + a.v_head_dim)),
                    (heads * a.v_head_dim, h)]
        lin = self.linear
        values = lin.value_heads * lin.value_head_dim
        return [(h, lin.conv_dim + values), (h, LINEAR_GATES * lin.value_heads), (values, h)]

    def _indexer_matrices(self) -> list[tuple[int, int]]:
        """A sparse layer's lightning indexer (DeepSeek-V3.2 inference/model.py `Indexer`): wq_b
        (q_lora_rank -> H_I x d_I), wk (h -> d_I), weights_proj (h -> H_I); replicated under TP."""
        i, h = self.sparse, self.hidden_size
        return [(self.mla.q_lora_rank or h, i.index_n_heads * i.index_head_dim), (h, i.index_head_dim), (h, i.index_n_heads)]

    def _attention_small_params(self, kind: str = FULL) -> int:
        """Biases and norms of one layer's attention (high precision). Full, chunked and window: q/k/v bias,
        q/k RMSNorm. MLA: the q_a and kv_a RMSNorms. Linear: conv weights, A_log and dt_bias per value
        head, the output norm."""
        if kind in GQA_KINDS:
            bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
            return bias + (2 * self.head_dim if self.qk_norm else 0)
        if kind == MLA:
            return self.mla.q_lora_rank + self.mla.kv_lora_rank
        if kind == SPARSE:  # + the indexer's k_norm (a LayerNorm: weight and bias)
            return self.mla.q_lora_rank + self.mla.kv_lora_rank + 2 * self.sparse.index_head_dim
        lin = self.linear
        return lin.conv_dim * lin.conv_kernel + 2 * lin.value_heads + lin.value_head_dim

    def _per_kind_mean(self, per_layer) -> float:
        """Sum over the layers of `per_layer(kind)`, / L."""
        return sum(n * per_layer(k) for k, n in self.kind_counts.items()) / self.num_layers

    def attention_linear_params_layer(self) -> int:
        """q, k, v, o weight matrices: h*(H*d) + 2*h*(Hkv*d) + (H*d)*h (layer kinds: the mean layer's)."""
        h = self.hidden_size
        if self.layer_kinds:
            return self._per_kind_mean(lambda k: sum(r * c for r, c in self._attention_matrices(k)))
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h

    def expert_params(self) -> int:
        return MLP_MATRICES * self.hidden_size * self.moe_intermediate_size

    def _moe_mlp_params(self) -> int:
        """E*3*h*I_moe + 3*h*I_shared + router h*E (E: the GPU's `local_experts`; the router scores all)."""
        h = self.hidden_size
        return (
            self.local_experts * self.expert_params()
            + MLP_MATRICES * h * self.shared_expert_intermediate_size
            + h * self.num_experts
        )

    def mlp_linear_params_layer(self) -> int:
        """Dense: 3*h*I. MoE: E*3*h*I_moe + 3*h*I_shared + router h*E (dense-MLP layers: the mean layer's)."""
        h = self.hidden_size
        if not self.is_moe:
            return MLP_MATRICES * h * self.intermediate_size
        if self.dense_mlp_layers:
            dense = MLP_MATRICES * h * self.intermediate_size
            return (self.dense_mlp_layers * dense + self.moe_layers * self._moe_mlp_params()) / self.num_layers
        return self._moe_mlp_params()

    def small_params_layer(self) -> int:
        """Biases and norms of one layer (kept in high precision)."""
        if self.layer_kinds:
            return self._per_kind_mean(self._attention_small_params) + NORMS_PER_LAYER * self.hidden_size
        bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return bias + qk_norm + NORMS_PER_LAYER * self.hidden_size

    def params_layer(self) -> int:
        return self.attention_linear_params_layer() + self.mlp_linear_params_layer() + self.small_params_layer()

    def embedding_params(self) -> int:
        return (self.embedding_vocab_size or self.vocab_size) * self.hidden_size

    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def _layers_params(self) -> int:
        """Parameters of all layers, kind by kind, as an exact integer."""
        h = self.hidden_size
        attention = sum(n * (sum(r * c for r, c in self._attention_matrices(k)) + self._attention_small_params(k))
                        for k, n in self.kind_counts.items())
        dense = MLP_MATRICES * h * self.intermediate_size
        mlp = self.moe_layers * self._moe_mlp_params() + (self.num_layers - self.moe_layers) * dense
        return attention + mlp + self.num_layers * NORMS_PER_LAYER * h

    @property
    def params(self) -> int:
        """Total parameter count: layers + embedding + final norm + LM head."""
        layers = self.num_layers * self.params_layer() if self.uniform else self._layers_params()
        return (
            layers
            + self.embedding_params()
            + self.hidden_size
            + self.lm_head_params()
        )

    # ---- weight bytes -------------------------------------------------------------------
    def _linear_bytes(self, rows_x_cols: list[tuple[int, int]], weight_dtype: str, group_size: int) -> float:
        dt = WEIGHT_DTYPES[weight_dtype]
        return sum(dt.bytes_for(r * c, group_size) for r, c in rows_x_cols)

    def _dense_mlp_matrices(self, inter: int) -> list[tuple[int, int]]:
        h = self.hidden_size
        return [(h, inter), (h, inter), (inter, h)] if inter else []

    def layer_gemm_shapes(self) -> list[tuple[int, int]]:
        """(n outputs, k inputs) of a dense layer's GEMMs as engines fuse them (vLLM's
        QKVParallelLinear and MergedColumnParallelLinear): qkv, o, gate_up, down. Per GPU once sharded.
        Dense GQA layers (full, chunked or window) only: `gqa_gemms`."""
        h, inter = self.hidden_size, self.intermediate_size
        return [(self.q_dim + 2 * self.kv_dim, h), (h, self.q_dim), (2 * inter, h), (h, inter)]

    def layer_gemm_formats(self, weight_dtype: str) -> list[str]:
        """The weight format of each of `layer_gemm_shapes`: qkv and o in the attention's (`attention_formats`),
        gate_up and down in `weight_dtype`."""
        return [*self.attention_formats(weight_dtype), weight_dtype, weight_dtype]

    @property
    def gqa_gemms(self) -> bool:
        """Every layer a dense GQA layer (full, chunked or window attention, dense MLP): `layer_gemm_shapes` holds."""
        return not self.is_moe and all(k in GQA_KINDS for k in self.kind_counts)

    def attention_formats(self, weight_dtype: str) -> tuple[str, str]:
        """(the attention's input projections' format - q, k, v; MLA's q_a, q_b, kv_a, kv_b; a linear layer's
        in_proj; a sparse layer's indexer -, its output projection's): `attention_weight_dtype` and
        `attention_output_weight_dtype` where the checkpoint sets them apart, else the layers' `weight_dtype`
        (the output projection: the input projections' unless set)."""
        inputs = self.attention_weight_dtype or weight_dtype
        return inputs, self.attention_output_weight_dtype or inputs

    def _attention_bytes(self, kind: str, weight_dtype: str, group_size: int) -> float:
        """One layer of `kind`'s attention matrices in their formats (`attention_formats`): every one but the
        last (the output projection) in the first, the last in the second."""
        matrices, (inputs, output) = self._attention_matrices(kind), self.attention_formats(weight_dtype)
        return (self._linear_bytes(matrices[:-1], inputs, group_size)
                + self._linear_bytes(matrices[-1:], output, group_size))

    def expert_format(self, weight_dtype: str) -> str:
        """The routed experts' weight format: `expert_weight_dtype` where the checkpoint sets one apart, else
        the layers' `weight_dtype`. Shared experts, dense MLPs, attention and the router keep the latter."""
        return self.expert_weight_dtype or weight_dtype

    def one_expert_bytes(self, weight_dtype: str, group_size: int) -> float:
        """One routed expert's weights in its format (`expert_format`)."""
        return WEIGHT_DTYPES[self.expert_format(weight_dtype)].bytes_for(self.expert_params(), group_size)

    def _routed_experts_bytes(self, weight_dtype: str, group_size: int) -> float:
        """The GPU's routed experts (`local_experts`), matrix by matrix, in their format (`expert_format`)."""
        return self.local_experts * self._linear_bytes(self._dense_mlp_matrices(self.moe_intermediate_size),
                                                       self.expert_format(weight_dtype), group_size)

    def _moe_mlp_bytes(self, weight_dtype: str, group_size: int) -> float:
        hp = HIGH_PRECISION_BITS / 8
        b = self._routed_experts_bytes(weight_dtype, group_size)
        b += self._linear_bytes(self._dense_mlp_matrices(self.shared_expert_intermediate_size), weight_dtype, group_size)
        return b + self.hidden_size * self.num_experts * hp

    def layer_weight_bytes(self, weight_dtype: str, group_size: int = 128) -> float:
        """All weights of one layer: quantised linear matrices + bf16 biases, norms, router (layer
        kinds or dense-MLP layers: the mean layer's, `_layers_weight_bytes` / L)."""
        if not self.uniform:
            return self._layers_weight_bytes(weight_dtype, group_size) / self.num_layers
        hp = HIGH_PRECISION_BITS / 8
        b = self._attention_bytes(FULL, weight_dtype, group_size)
        if self.is_moe:
            b += self._routed_experts_bytes(weight_dtype, group_size)
            b += self._linear_bytes(self._dense_mlp_matrices(self.shared_expert_intermediate_size), weight_dtype, group_size)
            b += self.hidden_size * self.num_experts * hp
        else:
            b += self._linear_bytes(self._dense_mlp_matrices(self.intermediate_size), weight_dtype, group_size)
        return b + self.small_params_layer() * hp

    def _layers_weight_bytes(self, weight_dtype: str, group_size: int) -> float:
        """All layers' weights, kind by kind: attention matrices and small parameters per kind, MoE
        and dense MLPs by their counts, two norms a layer."""
        hp = HIGH_PRECISION_BITS / 8
        b = sum(n * (self._attention_bytes(k, weight_dtype, group_size) + self._attention_small_params(k) * hp)
                for k, n in self.kind_counts.items())
        if self.moe_layers:
            b += self.moe_layers * self._moe_mlp_bytes(weight_dtype, group_size)
        dense = self.num_layers - self.moe_layers
        b += dense * self._linear_bytes(self._dense_mlp_matrices(self.intermediate_size), weight_dtype, group_size)
        return b + self.num_layers * NORMS_PER_LAYER * self.hidden_size * hp

    def non_layer_weight_bytes(self) -> float:
        """Embedding, final norm and LM head, kept in bf16; a pipeline stage (`stage`) holds one vocab
        x hidden matrix (the first stage its embedding, the last its LM head) and the norm."""
        hp = HIGH_PRECISION_BITS / 8
        if self.pipeline_stages > 1:
            return (self.embedding_params() + self.hidden_size) * hp
        return (self.embedding_params() + self.hidden_size + self.lm_head_params()) * hp

    def lm_head_bytes(self) -> float:
        """Bytes the LM head reads per step (the embedding matrix when tied)."""
        return self.vocab_size * self.hidden_size * HIGH_PRECISION_BITS / 8

    def weight_bytes(self, weight_dtype: str = "bf16", group_size: int = 128) -> float:
        if not self.uniform:
            return self._layers_weight_bytes(weight_dtype, group_size) + self.non_layer_weight_bytes()
        return self.num_layers * self.layer_weight_bytes(weight_dtype, group_size) + self.non_layer_weight_bytes()

    # ---- decode work per layer ----------------------------------------------------------
    def expected_experts_touched(self, batch: int) -> float:
        """Distinct experts, of this GPU's `local_experts`, a batch reads per MoE layer, tokens routed
        uniformly: E_local * (1 - (1 - k/E)^B) (`sim.model.experts`; the batch is the group's, every
        token routed over all E). Under expert parallelism the step waits for the busiest GPU, so this
        is that GPU's expected count (`busiest_rank_experts_touched`); tensor parallelism splits every
        expert evenly and has no such imbalance."""
        if not self.is_moe:
            return 0.0
        e, k, ep = self.num_experts, self.experts_per_token, self.expert_parallel
        if self.routing_skew > 0:  # popular experts: fewer distinct ones, unevenly spread over EP ranks
            return skewed_busiest_rank(e, k, batch, ep, self.routing_skew) if ep > 1 else skewed_experts_touched(
                e, k, batch, self.routing_skew)
        if ep > 1:
            return busiest_rank_experts_touched(e, k, batch, ep)
        return expected_experts_touched(e, k, batch, self.local_experts)

    def layer_weight_bytes_read(self, weight_dtype: str, batch: int, group_size: int = 128) -> float:
        """Weight bytes one decode step reads in one layer (MoE: only the experts touched; with
        dense-MLP layers, the mean layer's: MoE layers / L of the untouched experts skipped)."""
        full = self.layer_weight_bytes(weight_dtype, group_size)
        if not self.is_moe:
            return full
        one_expert = self.one_expert_bytes(weight_dtype, group_size)
        untouched = self.local_experts - self.expected_experts_touched(batch)
        if self.dense_mlp_layers:
            return full - self.moe_layers * untouched * one_expert / self.num_layers
        return full - untouched * one_expert

    def layer_linear_params_read(self, batch: int) -> float:
        """Linear weights one decode step reads (and a weight-only kernel dequantises) in one layer:
        every matrix of a dense layer; an MoE layer's untouched experts are skipped."""
        full = self.attention_linear_params_layer() + self.mlp_linear_params_layer()
        if not self.is_moe:
            return full
        skipped = (self.local_experts - self.expected_experts_touched(batch)) * self.expert_params()
        if self.dense_mlp_layers:
            return full - self.moe_layers * skipped / self.num_layers
        return full - skipped

    def active_linear_params_layer(self) -> int:
        """Linear parameters one token multiplies through in one layer (MoE: k experts + shared;
        dense-MLP layers and layer kinds: the mean layer's). A shard under expert or attention data
        parallelism (`shard`) counts one GPU's share of a token of the group's batch: its attention
        projections and router for 1/attention_dp of the tokens, k / expert_parallel whole experts."""
        if not self.is_moe:
            return self.attention_linear_params_layer() + self.mlp_linear_params_layer()
        if self.expert_parallel > 1 or self.attention_dp > 1:
            return self._parallel_active_params()
        h = self.hidden_size
        moe = (self.experts_per_token * self.expert_params() + MLP_MATRICES * h * self.shared_expert_intermediate_size
               + h * self.num_experts)
        if self.dense_mlp_layers:
            dense = MLP_MATRICES * h * self.intermediate_size
            return self.attention_linear_params_layer() + (self.moe_layers * moe + self.dense_mlp_layers * dense) / self.num_layers
        return (
            self.attention_linear_params_layer()
            + self.experts_per_token * self.expert_params()
            + MLP_MATRICES * h * self.shared_expert_intermediate_size
            + h * self.num_experts
        )

    def _parallel_active_params(self) -> float:
        """`active_linear_params_layer` of an expert- or attention-data-parallel shard."""
        h, dp, ep = self.hidden_size, self.attention_dp, self.expert_parallel
        busiest = busiest_routing_share(self.num_experts, self.experts_per_token, ep, self.routing_skew) if ep > 1 else 1.0
        local = dp if self.dense_dp else 1  # data-parallel dense parts run on the rank's 1/D of the tokens
        moe = (self.experts_per_token * self.expert_params() / ep * busiest
               + MLP_MATRICES * h * self.shared_expert_intermediate_size / local + h * self.num_experts / dp)
        dense = MLP_MATRICES * h * self.intermediate_size / local
        mlp = (self.moe_layers * moe + self.dense_mlp_layers * dense) / self.num_layers
        return self.attention_linear_params_layer() / dp + mlp

    def qkv_params_layer(self) -> int:
        """Linear parameters of what runs before attention needs the cache: h * (q_dim + 2 kv_dim) for
        GQA; MLA its q path, kv_a and the W_UK half of kv_b (absorbed into the query); linear layers
        in_proj_qkvz and in_proj_ba. Layer kinds: the mean layer's."""
        if not self.layer_kinds:
            out = self.hidden_size * (self.q_dim + 2 * self.kv_dim)
            return out / self.attention_dp if self.attention_dp > 1 else out

        def pre(kind: str) -> int:
            if kind in (MLA, SPARSE):  # (a sparse layer's indexer runs before its attention too)
                a = self.mla
                indexer = sum(r * c for r, c in self._indexer_matrices()) if kind == SPARSE else 0
                return (indexer + sum(r * c for r, c in self._attention_matrices(MLA)[:-2])
                        + a.kv_lora_rank * self.num_heads * a.qk_nope_head_dim)
            return sum(r * c for r, c in self._attention_matrices(kind)[:-1])

        return self._per_kind_mean(pre) / self.attention_dp


@lru_cache(maxsize=256)
def _counts(kinds: tuple[str, ...]) -> Mapping[str, int]:
    """`kind_counts`, once per distinct kinds (read-only: shared by every model that has them)."""
    return MappingProxyType(kind_counts(kinds))
