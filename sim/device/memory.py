"""HBM and host memory accounting (DESIGN.md "Link and memory model").

HBM  = weights + T0 KV of all sequences + staging buffers + activations + runtime reserve.
Host = T1 (full precision) + T2 (compressed) KV, pinned or pageable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.model.spec import ModelSpec

ACTIVATION_BYTES = 2  # bf16 activations
LOGIT_BYTES = 4  # fp32 logits for sampling
ACTIVATION_BUFFERS = 2  # a residual stream and a scratch copy of the widest activation


def activation_bytes(model: ModelSpec, batch: int, itemsize: int = ACTIVATION_BYTES,
                     buffers: int = ACTIVATION_BUFFERS) -> float:
    """Decode activations alive at once: B * (buffers * widest per-token activation) * itemsize
    + B * V * 4 B logits. The widest activation is the gate/up output (2 * I) or the q/k/v output.
    The simulator uses the defaults (2 buffers, bf16); hwprobe's layer planner passes its run dtype
    and a margin of extra buffers (hwprobe/decode.py `estimate_device_bytes`)."""
    inter = model.intermediate_size or model.moe_intermediate_size * max(model.experts_per_token, 1)
    widest = max(2 * inter, model.q_dim + 2 * model.kv_dim, model.hidden_size)
    return batch * (buffers * widest * itemsize + model.vocab_size * LOGIT_BYTES)


def staging_bytes(prefetch: str, staging_buffers: int, num_layers: int, staged_layer_bytes: float) -> float:
    """GPU staging for T1/T2 of one step, `staged_layer_bytes` = one layer's staged KV for the batch.

    layerwise_async: `staging_buffers` layer-sized buffers; sync_per_step: every layer at once
    (the prototype copies all layers before the forward pass); per_interval: T1/T2 kept resident,
    so also every layer (this is why it saves no HBM).
    """
    if prefetch == "layerwise_async":
        return staging_buffers * staged_layer_bytes
    return num_layers * staged_layer_bytes


def profile_run_activation_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """Activations of the largest step the scheduler can form, as vLLM sizes its KV cache after a
    profiling forward pass of `max_num_batched_tokens` tokens: `activation_bytes` of those rows less
    the logits of the rows that never sample (at most `max_num_seqs` do)."""
    rows = max_num_batched_tokens
    return activation_bytes(model, rows) - max(0, rows - max_num_seqs) * model.vocab_size * LOGIT_BYTES


def engine_memory(memory_bytes: float, gpu_memory_utilization: float, non_torch_bytes: float,
                  profile_activation_bytes: float) -> tuple[float, float, float]:
    """(usable HBM, runtime reserve, activations held) under vLLM's rule (`EngineCfg`): the engine
    uses memory x gpu_memory_utilization; of it, the memory outside torch is reserved and the
    profiling pass's activations are held whatever the step (a step needing more holds more)."""
    return memory_bytes * gpu_memory_utilization, non_torch_bytes, profile_activation_bytes


# ---- SGLang's static pool (sgl-project/sglang main @ 001067ff) ------------------------------------

SGLANG_PREFILL_GRAPH_MB = 8  # server_args.py reserve_for_graph_mb: non-torch MiB per captured prefill size
SGLANG_MLA_PREFILL_GRAPH_MB = 1.5 * 1024  # ... and for an MLA model's prefill graphs, whatever the sizes


def sglang_prefill_graph_sizes(max_tokens: int) -> list[int]:
    """The prefill CUDA-graph sizes SGLang captures up to `max_tokens` (server_args.py
    `_generate_prefill_cuda_graph_batch_sizes`): 4..32 by 4, 48..256 by 16, 288..512 by 32, 576..1024 by
    64, 1280..4096 by 256, then by 512."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [s for s in sizes if s <= max_tokens]


def sglang_mem_fraction_static(gpu_memory_mib: float, tp: int, prefill_tokens: int, chunked: bool,
                               cuda_graph_max_bs: int, cuda_graphs: bool, mla: bool) -> float:
    """SGLang's default mem_fraction_static (server_args.py `_handle_gpu_memory_settings`, one node,
    no pipeline, DP attention, speculative decoding or disaggregation), in MiB as the code counts:
      reserved = 512 + max(prefill_tokens, 2048) x 1.5 + tp / 8 x 1024 + graphs
      graphs   = cuda_graph_max_bs x 2 (decode) + 8 x the prefill sizes captured up to chunked_prefill_size
                 (1.5 GiB for an MLA model; `reserve_for_graph_mb`; none without CUDA graphs)
      reserved = max(reserved, 10 GiB) on a GPU of more than 60 GiB
      mem_fraction_static = round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)
    `prefill_tokens` is chunked_prefill_size with chunked prefill, else max_prefill_tokens; without
    chunked prefill no prefill sizes are captured (chunked_prefill_size -1)."""
    reserved = 512 + max(prefill_tokens, 2048) * 1.5 + tp / 8 * 1024
    if cuda_graphs:
        prefill = SGLANG_MLA_PREFILL_GRAPH_MB if mla else SGLANG_PREFILL_GRAPH_MB * len(
            sglang_prefill_graph_sizes(prefill_tokens if chunked else 0))
        reserved += cuda_graph_max_bs * 2 + prefill
    if gpu_memory_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)


def sglang_engine_memory(memory_bytes: float, mem_fraction_static: float, non_torch_bytes: float,
                         profile_activation_bytes: float) -> tuple[float, float, float]:
    """(usable HBM, runtime reserve, activations held) under SGLang's rule (`EngineCfg`): its static
    pool (weights + KV) is the free memory before the weights x mem_fraction_static, that free memory
    being the device's less what the CUDA context and NCCL hold (`non_torch_bytes`); activations and
    CUDA graphs live in the rest. kvtier counts activations in HBM beside the KV, so they are added
    to the usable HBM and held whatever the step, which leaves the KV exactly
      KV budget = (memory - non_torch_bytes) x mem_fraction_static - weights."""
    static = (memory_bytes - non_torch_bytes) * mem_fraction_static
    return non_torch_bytes + static + profile_activation_bytes, non_torch_bytes, profile_activation_bytes


# ---- TensorRT-LLM's KV fraction (NVIDIA/TensorRT-LLM main, PyTorch backend) ------------------------

def trtllm_engine_memory(memory_bytes: float, free_gpu_memory_fraction: float, non_torch_bytes: float,
                         profile_activation_bytes: float, weights_bytes: float) -> tuple[float, float, float]:
    """(usable HBM, runtime reserve, activations held) under TensorRT-LLM's rule (`EngineCfg`): after a
    profiling run, KV = (total - its peak) x free_gpu_memory_fraction, the peak being the weights, the
    run's activations and what lies outside torch (KvCacheCreator._cal_max_memory). kvtier's KV budget
    is usable - weights - activations - reserve, so usable = that peak + the KV:
      KV budget = free_gpu_memory_fraction x (memory - non_torch_bytes - weights - activations)."""
    peak = non_torch_bytes + weights_bytes + profile_activation_bytes
    return peak + free_gpu_memory_fraction * max(memory_bytes - peak, 0.0), non_torch_bytes, profile_activation_bytes


# ---- TensorRT-LLM's KV pools under variable sliding-window attention (VSWA) -------------------------
# Read (stored copies of NVIDIA/TensorRT-LLM, the linear-SWA KV cache manager, PR #6768 on):
# - cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp `BaseKVCacheManager::calculateMaxNumBlocks`: one pool
#   per window size (full attention's is max_seq_len), each given an equal share of the KV memory ("we are
#   first allocating identical number of blocks for all layers to achieve identical performance";
#   TRTLLM_WINDOW_SIZE_SHARES unset), and `KVCacheManager::getRemainingBlocksToCompletion`, what
#   GUARANTEED_NO_EVICT reserves in a window's pool: min(prompt + max new tokens, W + temporary window)
#   tokens, and one block more where the sequence outgrows W (the block the window slides into);
# - tensorrt_llm/_torch/pyexecutor/resource_manager.py `calculate_max_num_blocks_from_cpp` (the PyTorch
#   flow's VSWA path) and `_set_temp_attention_window_inputs`: paged context FMHA, max_input_len =
#   max_seq_len - 1, max_num_tokens; the window manager's `calculateTemporaryAttentionWindow` makes that
#   min(max_num_tokens, max_input_len - W) (0 where the input fits the window).
TRTLLM_TOKENS_PER_BLOCK = 32  # KvCacheConfig's tokens_per_block default


def trtllm_temporary_window(window: int, max_seq_len: int, max_num_tokens: int) -> int:
    """The temporary attention window a sliding-window pool keeps beside W for a context chunk:
    min(max_num_tokens, max_seq_len - 1 - W), 0 where max_seq_len - 1 <= W."""
    max_input_len = max_seq_len - 1
    return max(0, min(max_num_tokens, max_input_len - window)) if max_input_len > window else 0


def trtllm_window_tokens(tokens, window: int, max_seq_len: int, max_num_tokens: int):
    """Tokens a request of `tokens` tokens (scalar or array) reserves in a window layer's pool:
    min(tokens, W + temporary window) + one block where tokens > W."""
    reach = window + trtllm_temporary_window(window, max_seq_len, max_num_tokens)
    return _pool_tokens(tokens, 1, window, reach, TRTLLM_TOKENS_PER_BLOCK)


def _pool_tokens(tokens, sequences, window: int, reach: float, block_tokens: int):
    """Tokens `sequences` requests holding `tokens` in all keep in a window pool (scalars or arrays):
    min(tokens, B x reach) + B x `block_tokens` where tokens > B x W - exact when each holds as many."""
    t, b = np.asarray(tokens, dtype=float), np.asarray(sequences, dtype=float)
    out = np.minimum(t, b * reach) + np.where(t > b * window, b * block_tokens, 0)
    return out if np.ndim(out) else float(out)


# ---- SGLang's hybrid sliding-window pools -------------------------------------------------------------
# Read (sgl-project/sglang): model_config.py `is_hybrid_swa_model` (GptOssForCausalLM, Llama4, MiMo-V2,
# Step-3.5, Gemma 4 keep a separate window pool unless --disable-hybrid-swa-memory), server_args.py
# swa_full_tokens_ratio (0.8 by default), and model_runner_kv_cache_mixin.py `_resolve_hybrid_swa_tokens`:
# the KV memory M, profiled as if every layer held every token, is split so that full_tokens x F x n_full +
# swa_tokens x S x n_swa = M with swa_tokens = r x full_tokens; full_tokens is the pool size the scheduler
# counts (max_total_num_tokens). SWAKVPool frees a request's window tokens as the window slides.
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8  # server_args.py swa_full_tokens_ratio


def sglang_swa_pool_shares(full_bytes_per_token: float, window_bytes_per_token: float,
                           ratio: float = SGLANG_SWA_FULL_TOKENS_RATIO) -> tuple[float, float]:
    """(full pool's share, window pool's share) of SGLang's KV memory, the bytes per token over each kind's
    layers (F x n_full, S x n_swa): F n_full / D and r S n_swa / D, D = F n_full + r S n_swa."""
    d = full_bytes_per_token + ratio * window_bytes_per_token
    return full_bytes_per_token / d, ratio * window_bytes_per_token / d


# ---- an engine's window pools, as a rule both the serving run and the closed batch apply ----------------
@dataclass(frozen=True)
class WindowPools:
    """An engine's separate KV pool for a model's window layers: the budget's (full pool, window pool)
    shares, and what a request holds in the window pool - `per_token` (the window layers' bytes a token)
    x min(tokens, reach), plus `block_tokens` once it outgrows W. The budget binds as the fuller pool does."""

    shares: tuple[float, float]
    per_token: float
    window: int
    reach: float  # the most tokens a request holds in the window pool: W, or W + TensorRT-LLM's temporary window
    block_tokens: int = 0  # TensorRT-LLM's block more past W (`trtllm_window_tokens`)
    # the window-pool layers' bytes a token where they are tiered kinds, so counted in the run's KV bytes a
    # token (Llama 4's chunked layers under SGLang, `sglang_chunk_pools`): the full pool holds the rest
    tiered_per_token: float = 0.0

    def batch_bytes(self, tokens, sequences=1):
        """The window-pool bytes of `sequences` requests holding `tokens` in all (scalars or arrays over
        steps; one request by default): per_token x `_pool_tokens`."""
        return self.per_token * _pool_tokens(tokens, sequences, self.window, self.reach, self.block_tokens)

    def full_bytes(self, kv_bytes, t0):
        """The full pool's bytes of `t0` T0 tokens whose tiered layers hold `kv_bytes` (scalars or arrays):
        kv_bytes less the window-pool layers' share of them (`tiered_per_token` x t0)."""
        return kv_bytes - self.tiered_per_token * np.asarray(t0, dtype=float)


def window_pools_rule(engine: str | None, full_bytes_per_token: float, window_bytes_per_token: float, window: int,
                      max_seq_len: int | None, max_num_tokens: int,
                      swa_ratio: float | None = None) -> WindowPools | None:
    """The window pools `engine` keeps for a model with full and window layers: TensorRT-LLM's equal shares
    with its no-evict window reserve (`trtllm_window_tokens`; max_seq_len None: no temporary window), SGLang's
    swa_full_tokens_ratio split with W tokens a request (`sglang_swa_pool_shares`); None for vLLM and no
    engine, whose hybrid allocator keeps one pool (a request's W tokens of window KV beside its full KV)."""
    if engine == "sglang":
        shares = sglang_swa_pool_shares(full_bytes_per_token, window_bytes_per_token,
                                        swa_ratio or SGLANG_SWA_FULL_TOKENS_RATIO)
        return WindowPools(shares, window_bytes_per_token, window, float(window))
    if engine == "tensorrt-llm":
        temporary = trtllm_temporary_window(window, max_seq_len, max_num_tokens) if max_seq_len else 0
        halves = (0.5, 0.5)  # two window sizes, full attention's and the window's: an equal share each
        return WindowPools(halves, window_bytes_per_token, window, float(window + temporary), TRTLLM_TOKENS_PER_BLOCK)
    return None


# SGLang keeps Llama 4's chunked layers in its window pool (model_config.py `is_hybrid_swa_model` lists
# Llama4ForConditionalGeneration, and `get_hybrid_layer_ids` puts its layers with (i + 1) % 4 != 0 - the 36
# RoPE layers, chunked - in the SWA pool, the NoPE ones in the full pool). Their window is the chunk:
# Llama 4's config has no sliding_window key (aiconfigurator-core's stored copy of Maverick's config.json: only
# attention_chunk_size 8192), so model_runner.py sets sliding_window_size = attention_chunk_size ("Setting
# sliding_window_size to be attention_chunk_size"), and the SWA caches free what falls behind it. The last C
# tokens cover a chunk, whose tokens reach back at most C - 1.
def sglang_chunk_pools(kv_bytes_per_token: float, chunk_bytes_per_token: float, chunk: int,
                       swa_ratio: float | None = None) -> WindowPools:
    """SGLang's pools for a model whose chunked layers it keeps in its window pool: the full-attention
    layers' bytes a token (kv_bytes_per_token less the chunked layers') against the chunked layers' in
    swa_full_tokens_ratio's split, a request holding min(tokens, C) tokens in the window pool."""
    full = kv_bytes_per_token - chunk_bytes_per_token
    shares = sglang_swa_pool_shares(full, chunk_bytes_per_token, swa_ratio or SGLANG_SWA_FULL_TOKENS_RATIO)
    return WindowPools(shares, chunk_bytes_per_token, chunk, float(chunk), tiered_per_token=chunk_bytes_per_token)
