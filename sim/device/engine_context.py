"""The longest sequence a serving engine serves (vLLM's max_model_len, SGLang's context_len), and
vLLM's refusal to start when its KV budget cannot hold one such request, as pure functions.

vLLM (vllm/v1/core/kv_cache_utils.py `check_enough_kv_cache_memory`, read at vllm-project/vllm main):
after the profiling run it checks that the KV memory left holds one request of max_model_len tokens -
each layer's `max_memory_usage_bytes`: a full-attention or MLA layer every token, a sliding-window layer
min(W - 1 + max_num_batched_tokens, max_model_len) tokens, a chunked-local-attention layer min(C +
max_num_batched_tokens, max_model_len) (`ChunkedLocalAttentionSpec`), a linear-attention layer its one state - and
otherwise raises "To serve at least one request with the models's max seq len (...)". With
--max-model-len -1 it instead fits max_model_len to the largest that holds (`_auto_fit_max_model_len`,
a binary search as `vllm_fitting_context` here). Pages round each layer group up to a block: left out
(one block of 16 tokens, under 0.1% of any context this checks).
SGLang starts whatever its pool holds and refuses the requests that do not fit; TensorRT-LLM's
PyTorch flow lowers max_seq_len to what its KV cache holds. Neither has a start rule here.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.model.layers import CHUNKED, WINDOW
from sim.model.spec import ModelSpec

VLLM_CHECK = "vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory"


def vllm_request_kv_bytes(model: ModelSpec, kv_dtype: str, tokens: int, max_num_batched_tokens: int) -> float:
    """The KV bytes one GPU holds for one request of `tokens` tokens as vLLM's start check counts them
    (`model` one GPU's shard): the per-token layers (full, MLA; `ModelSpec.kv_bytes_per_token`) and the
    sparse indexer's keys x tokens, window layers x min(tokens, W - 1 + max_num_batched_tokens) tokens,
    chunked layers x min(tokens, C + max_num_batched_tokens), linear layers' state once."""
    chunked = model.kind_kv_bytes_per_token(CHUNKED, kv_dtype)
    per_token = model.kv_bytes_per_token(kv_dtype) - chunked + model.indexer_bytes_per_token()
    out = per_token * tokens + model.state_bytes_per_sequence()
    if chunked:
        out += chunked * min(tokens, model.attention_chunk + max_num_batched_tokens)
    if WINDOW in model.kind_counts:
        held = min(tokens, model.sliding_window - 1 + max_num_batched_tokens)
        out += model.kind_kv_bytes_per_token(WINDOW, kv_dtype) * held
    return float(out)


def vllm_fitting_context(need_bytes: Callable[[int], float], budget_bytes: float, context_tokens: int) -> int:
    """The longest max_model_len up to `context_tokens` whose one request fits `budget_bytes` (vLLM's
    binary search, `need_bytes` rising in tokens); 0 where not even one token fits."""
    if need_bytes(1) > budget_bytes:
        return 0
    lo, hi = 1, context_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need_bytes(mid) <= budget_bytes else (lo, mid - 1)
    return lo
