"""Layer kinds: what one layer's attention stores per token or per sequence, and the shapes that say it.

A model is a list of layers, each of one kind (read from config.json's `layer_types`, MLA fields,
linear-attention fields; `sim/inputs/hf_config.py`):

| kind     | what it stores                                               | grows with the sequence? |
| -------- | ------------------------------------------------------------ | ------------------------ |
| `full`   | K and V of every token: 2 x Hkv x d values (MHA / GQA)       | yes: tiers per token     |
| `chunked`| K and V of every token, as `full`; a token at position p attends only its own chunk of C, positions C floor(p / C) .. p (Llama 4's chunked local attention) | yes: tiers per token (what HBM holds follows the engine, below) |
| `mla`    | one latent of kv_lora_rank + qk_rope_head_dim values a token, shared by every query head (DeepSeek multi-head latent attention) | yes: tiers per token |
| `sparse` | MLA's latent (tiered per token) + the indexer's small fp8 key of every token (kept in HBM); a step attends only the top-k tokens the indexer picks (DeepSeek sparse attention, V3.2) | yes: the latent tiers, the indexer keys stay in HBM |
| `window` | K and V of the last W tokens only (sliding window)           | no: min(tokens, W), stays in HBM |
| `linear` | a fixed recurrent state (linear attention, Gated DeltaNet)  | no: fixed bytes, stays in HBM |

A chunked layer stores every token as a full one does; which of them HBM holds follows the engine
(`decode.context.RunContext.chunk_rule` / `window_pools`): TensorRT-LLM's KV cache manager sizes every
layer for max_seq_len (`resource_manager.py`, no per-layer window for Llama 4), vLLM's hybrid KV cache
manager frees the blocks before a chunk (ChunkedLocalAttentionManager) and SGLang keeps the chunked
layers' last C tokens in its window pool (docs/models.md, docs/scenarios.md "Window pools"). Decode
reads the current chunk alone (TensorRT-LLM passes the chunk size to its decode kernels,
`attentionOp.cpp`; vLLM splits each request into virtual batches by chunk), and prefill attends
causally within each chunk: `chunk_attended`, `chunk_pairs`.

Only the kinds in `TIERED_KINDS` hold per-token KV that the tier policy moves between T0..T3; the
bounded kinds (`BOUNDED_KINDS`) are per-sequence and stay in HBM, as do a sparse layer's indexer keys. Pure shapes and counts here; the
sizes per model are `ModelSpec`'s (`sim/model/spec.py`), the costs `sim/device/physics.py`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FULL = "full"
CHUNKED = "chunked"
MLA = "mla"
WINDOW = "window"
LINEAR = "linear"
SPARSE = "sparse"
KINDS = (FULL, CHUNKED, MLA, SPARSE, WINDOW, LINEAR)
TIERED_KINDS = (FULL, CHUNKED, MLA, SPARSE)  # per-token KV: tiered per token as the policy says
GQA_KINDS = (FULL, CHUNKED, WINDOW)  # GQA attention (q, k, v, o; 2 x Hkv x d values a token)
BOUNDED_KINDS = (WINDOW, LINEAR)  # per-sequence, bounded: kept in HBM

STATE_BYTES_PER_ELEMENT = 2  # a linear layer's recurrent and conv state, kept in 16-bit (the model dtype)
# FLOP per element of a linear layer's recurrent state per decoded token (Gated DeltaNet): the gate's
# decay S <- a S (1), retrieval S^T k (2), the delta rule's rank-1 update S += b k (v - S^T k)^T (2),
# the output S^T q (2).
LINEAR_STATE_FLOP_PER_ELEMENT = 7


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention (DeepSeek-V2/V3, config.json names). Decode runs absorbed, as
    engines do: each query head attends the latent itself, QK over kv_lora_rank + qk_rope_head_dim
    values and PV over kv_lora_rank, so a token's cache is one latent whatever the head count."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0  # 0: queries projected straight from the hidden state (no q LoRA)

    @property
    def latent_dim(self) -> int:
        """Values a token stores per layer: kv_lora_rank + qk_rope_head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """One query head's width before absorption: qk_nope_head_dim + qk_rope_head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


INDEXER_KEY_BYTES_PER_ELEMENT = 1  # fp8 e4m3 indexer keys ...
INDEXER_SCALE_BYTES = 4  # ... with one fp32 scale per INDEXER_QUANT_BLOCK values
INDEXER_QUANT_BLOCK = 128  # (LightLLM Deepseek3_2MemoryManager, vLLM's DeepSeek-V3.2 indexer cache: 128 + 4 B a token)


@dataclass(frozen=True)
class SparseShape:
    """DeepSeek sparse attention's lightning indexer (config.json's `index_*` fields): per token a key
    of index_head_dim values, scored by index_n_heads query heads; each query attends the top
    `index_topk` tokens by score. The latent attention itself is the model's `MlaShape`. The indexer's
    projections and keys are replicated over a tensor-parallel group (one index, like MLA's latent)."""

    index_topk: int
    index_n_heads: int
    index_head_dim: int

    @property
    def key_bytes_per_token(self) -> float:
        """One token's indexer key in one layer: d_I fp8 values + one fp32 scale per 128 of them."""
        return (self.index_head_dim * INDEXER_KEY_BYTES_PER_ELEMENT
                + -(-self.index_head_dim // INDEXER_QUANT_BLOCK) * INDEXER_SCALE_BYTES)

    @property
    def flop_per_token(self) -> int:
        """FLOP one query spends scoring one cached token: 2 x index_n_heads x index_head_dim (q_I . k_I
        per head; the ReLU and the heads' weighted sum are negligible)."""
        return 2 * self.index_n_heads * self.index_head_dim


@dataclass(frozen=True)
class LinearShape:
    """Linear attention with a recurrent state (Gated DeltaNet, Qwen3-Next's `linear_*` fields): per
    value head a key_head_dim x value_head_dim state, plus the short causal conv's last kernel - 1 inputs."""

    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q and k (key heads) and v (value heads)."""
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    @property
    def state_elements(self) -> int:
        """One sequence's state in one layer: Hv x dk x dv recurrent + (kernel - 1) x conv channels."""
        return (self.value_heads * self.key_head_dim * self.value_head_dim
                + (self.conv_kernel - 1) * self.conv_dim)

    @property
    def state_bytes(self) -> int:
        """state_elements x 2 B (16-bit state; an engine keeping it in fp32 doubles it)."""
        return self.state_elements * STATE_BYTES_PER_ELEMENT

    @property
    def state_flop_per_token(self) -> int:
        """FLOP one decoded token costs one layer: 7 x Hv x dk x dv (`LINEAR_STATE_FLOP_PER_ELEMENT`)."""
        return LINEAR_STATE_FLOP_PER_ELEMENT * self.value_heads * self.key_head_dim * self.value_head_dim

    def tp_problem(self, tp: int) -> str | None:
        for name, heads in (("linear_num_key_heads", self.key_heads), ("linear_num_value_heads", self.value_heads)):
            if heads % tp:
                return f"{name} {heads} is not divisible by tp {tp}"
        return None

    def shard(self, tp: int) -> LinearShape:
        """One GPU of a tp group: key and value heads split tp ways (as vLLM shards them)."""
        return LinearShape(self.key_heads // tp, self.value_heads // tp, self.key_head_dim, self.value_head_dim,
                           self.conv_kernel)


def chunk_attended(tokens, chunk: int):
    """Tokens a sequence of `tokens` (the new one included) attends in a chunked layer: its own chunk's,
    ((tokens - 1) mod C) + 1 (scalars or integer arrays)."""
    return (tokens - 1) % chunk + 1


def chunk_pairs(prompt_tokens: float, chunk: int) -> float:
    """(query, key) pairs a prompt of P tokens attends in a chunked layer from position 0: k whole chunks
    of C (k = floor(P / C)), C (C + 1) / 2 pairs each, and the rest r = P - k C, r (r + 1) / 2."""
    k = math.floor(prompt_tokens / chunk)
    r = prompt_tokens - k * chunk
    return k * chunk * (chunk + 1) / 2 + r * (r + 1) / 2


def window_pairs(prompt_tokens, window: int):
    """(query, key) pairs a causal prompt of n tokens attends (scalars or numpy arrays, the window too): n (n + 1) / 2,
    or under a sliding window of W (0: none) sum_i min(i, W) = W (W + 1) / 2 + (n - W) W past its first W tokens."""
    full = prompt_tokens * (prompt_tokens + 1) / 2
    if not np.ndim(window) and not window:
        return full
    past = window * (window + 1) / 2 + (prompt_tokens - window) * window
    if np.ndim(prompt_tokens) or np.ndim(window):
        return np.where(prompt_tokens <= window, full, past)
    return full if prompt_tokens <= window else past


def window_prefill_work(prompt_tokens, window, skips: bool):
    """(pairs, length) a window layer's prefill kernel works through for a prompt of n tokens (scalars or
    arrays): a kernel that skips the key tiles outside the window attends `window_pairs` at the rate of a
    prompt of min(n, W) tokens, the length its key loop runs; one that masks them (`skips` False) computes
    the whole causal prompt's pairs at n's rate. The datasheet window fit picks one per engine and KV dtype
    (`PrefillKV.skips_window`)."""
    if not skips:
        return window_pairs(prompt_tokens, 0), prompt_tokens
    return window_pairs(prompt_tokens, window), np.minimum(prompt_tokens, window)


def causal_prompt_tokens(pairs: float) -> float:
    """The prompt length n whose causal attention attends `pairs` (query, key) pairs, n (n + 1) / 2 = pairs:
    (sqrt(1 + 8 x pairs) - 1) / 2."""
    return (math.sqrt(1.0 + 8.0 * pairs) - 1.0) / 2.0


def window_prompt_tokens(pairs: float, window: int) -> float:
    """The prompt length whose causal attention under a sliding window of W attends `pairs` (query, key)
    pairs: `window_pairs`'s inverse - `causal_prompt_tokens` within the first W tokens, W + (pairs
    - W (W + 1) / 2) / W past them."""
    first = window * (window + 1) / 2
    if pairs <= first:
        return causal_prompt_tokens(pairs)
    return window + (pairs - first) / window


def capped_pairs(pairs: float, seqs: float, new_tokens: float, keys: int) -> float:
    """A prompt's (query, key) pairs in a layer whose token attends at most `keys` keys (a window W, a
    chunk C): whole prompts' `pairs`, or fewer where the step's `new_tokens` (chunks behind a computed
    prefix, over `seqs` prompts) attend at most `keys` each; 0 new tokens or prompts: `pairs`."""
    return min(pairs, new_tokens * keys / seqs) if new_tokens > 0 and seqs > 0 else pairs


def kind_counts(kinds: tuple[str, ...]) -> dict[str, int]:
    """{kind: layers of that kind}, in `KINDS` order, kinds with no layer left out."""
    return {k: n for k in KINDS if (n := kinds.count(k))}
