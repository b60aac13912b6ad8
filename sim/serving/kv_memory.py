"""The memory admission checks against, per GPU (with tensor parallelism the context is one GPU's
shard, so KV bytes per token are one GPU's): DESIGN.md "Link and memory model" for a serving run.

HBM = weights + activations + runtime reserve (fixed) + T0 KV of the running sequences + staging
for the step's T1/T2 + each running request's bounded bytes (layer kinds: its window layers' KV of
its last min(tokens, W) tokens, as vLLM's SlidingWindowManager frees the blocks that left the window
(vllm/v1/core/single_type_kv_cache_manager.py remove_skipped_blocks), and its linear layers' fixed
state; `RunContext.bounded_bytes` of one sequence, the closed batch's rule); host = T1 x full KV
bytes + T2 x compressed bytes, against host capacity. TensorRT-LLM and SGLang keep a model's window
layers (a model without linear or sparse ones) in a pool of their own beside full attention's, each a
share of the budget (`window_pools`): TensorRT-LLM equal shares, a window's W + temporary window tokens
reserved (`device.memory.trtllm_window_tokens`); SGLang its swa_full_tokens_ratio split
(`device.memory.sglang_swa_pool_shares`), its window pool holding Llama 4's chunked layers too, their last
C tokens (`device.memory.sglang_chunk_pools`). A request then counts as its bytes in the fuller pool over
that pool's share (`KvMemory.pool_shares`). Under vLLM (and without an engine) a chunked-local-attention
layer holds its current chunk's tokens only (`model.layers.chunk_attended`, `KvMemory.chunk_rule`).
The activations are held for the largest step the scheduler can form, as vLLM sizes its KV cache
after a profiling forward pass of `max_num_batched_tokens` tokens (logits only for the rows that
sample: at most `max_num_seqs`). Under SGLang the pool also caps the requests that run at once
(`engine_scheduler`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from sim.decode.context import RunContext, engine_window_pools
from sim.device.engine_rules import sglang_max_running_requests
from sim.device.memory import profile_run_activation_bytes, staging_bytes
from sim.inputs.serving_config import SchedulerCfg
from sim.model.layers import chunk_attended


@dataclass(frozen=True)
class KvMemory:
    hbm_capacity_bytes: float
    weights_bytes: float
    activation_bytes: float
    runtime_reserve_bytes: float
    host_capacity_bytes: float
    kv_bytes_per_token: float
    t2_bytes_per_token: float
    staging_bytes_per_token: float  # HBM staging per T1/T2 token a step attends on the GPU (0: nothing staged)
    bounded_bytes_per_request: float = 0.0  # window and linear layers' HBM a running request holds at most
    request_bounded: Callable | None = None  # tokens a request holds -> its window/state bytes (None: no such layers)
    # (full attention's, the window's) shares of the budget where the engine keeps the window layers' KV in
    # a pool of its own (`window_pools`); None: one pool
    pool_shares: tuple[float, float] | None = None
    # the window pool's layers' bytes a token where `kv_bytes_per_token` counts them too (Llama 4's chunked
    # layers under SGLang): the full pool holds the rest
    pool_tiered_bytes_per_token: float = 0.0
    # (chunked layers' KV bytes a token, chunk C) where the engine frees a chunked layer's blocks before its
    # current chunk (vLLM's ChunkedLocalAttentionManager); None: those layers hold every token
    chunk_rule: tuple[float, int] | None = None
    # (tokens, prompt tokens) -> the share of a host-tier token's bytes the host holds (`RunContext.chunk_kept`:
    # chunked layers' copies only within the current chunk); None: every tiered layer's
    chunk_kept: Callable | None = None

    @property
    def fixed_bytes(self) -> float:
        return self.weights_bytes + self.activation_bytes + self.runtime_reserve_bytes

    @property
    def kv_budget_bytes(self) -> float:
        """HBM left for T0 KV and staging: capacity - weights - activations - reserve."""
        return self.hbm_capacity_bytes - self.fixed_bytes

    def bounded_bytes(self, tokens=None):
        """A request's window and linear layers' HBM when it holds `tokens` tokens (T0..T3: a window
        covers the latest tokens whatever was evicted): min(tokens, W) tokens of window KV + its state;
        `tokens` None: the most a request holds (W tokens). 0 for a model without such layers."""
        if tokens is None or self.request_bounded is None:
            return self.bounded_bytes_per_request
        return self.request_bounded(tokens)

    @property
    def pool_bytes_per_token(self) -> float:
        """The budget one token of the tiered layers takes: its KV bytes, or where the engine splits the
        budget its full pool's bytes over that pool's share (SGLang's token pool and reservations count these)."""
        if not self.pool_shares:
            return self.kv_bytes_per_token
        return (self.kv_bytes_per_token - self.pool_tiered_bytes_per_token) / self.pool_shares[0]

    def hbm_kv_bytes(self, t0, staged, tokens=None):
        """T0 tokens x KV bytes + staged T1/T2 tokens x staging bytes per token + the request's bounded
        bytes (`bounded_bytes(tokens)`; 0 for a dense model), per request; with `chunk_rule` the chunked
        layers' T0 bytes past their current chunk left out. With `pool_shares` each part
        is over its pool's share and the request counts as the larger: the budget binds as the fuller
        pool does, exactly where every request's fuller pool is the same."""
        full = t0 * self.kv_bytes_per_token + staged * self.staging_bytes_per_token
        if self.chunk_rule:  # the chunked layers keep the T0 tokens of their current chunk alone
            chunk_bytes, chunk = self.chunk_rule
            current = chunk_attended(t0 if tokens is None else tokens, chunk)  # (t0 = 0: nothing left out)
            full = full - chunk_bytes * (t0 - np.minimum(t0, current))
        if self.pool_shares:
            full_share, window_share = self.pool_shares
            full = full - self.pool_tiered_bytes_per_token * t0  # the window pool's own layers (Llama 4's chunked)
            return np.maximum(full / full_share, self.bounded_bytes(tokens) / window_share)
        return full + self.bounded_bytes(tokens)

    def host_bytes(self, t1, t2, tokens=None, prompt=None):
        """T1 x full KV bytes + T2 x compressed bytes, per request; for requests of `tokens` tokens (their
        counts' sum, T3 included) and prompt `prompt`, the chunked layers' copies only within the current
        chunk (`chunk_kept`)."""
        out = t1 * self.kv_bytes_per_token + t2 * self.t2_bytes_per_token
        if self.chunk_kept is None or tokens is None:
            return out
        return out * self.chunk_kept(tokens, prompt)

    def fits(self, hbm_kv_bytes: float, host_bytes: float) -> bool:
        return hbm_kv_bytes <= self.kv_budget_bytes and host_bytes <= self.host_capacity_bytes


def kv_memory(ctx: RunContext, max_num_batched_tokens: int, max_num_seqs: int) -> KvMemory:
    """activations = activation_bytes(max_num_batched_tokens rows) less the logits of the rows that
    never sample; staging per token as `tiering.memory_trace` stages (none for full_hbm, evict_only
    and host_attention; T2 staged dequantised, so at full KV bytes)."""
    p = ctx.scenario.policy
    act = max(profile_run_activation_bytes(ctx.model, max_num_batched_tokens, max_num_seqs), ctx.hw.held_activation_bytes)
    stage = 0.0
    if ctx.policy.tiering and p.access != "host_attention":  # one tiered layer's KV per staged token
        stage = staging_bytes(p.prefetch, p.staging_buffers, ctx.tiered_layers, 1.0) * ctx.staged_bytes_per_token_layer
    window = ctx.model.sliding_window or 0
    bounded = ctx.bounded_bytes(window, 1)  # the most one request holds: W tokens of window KV + its state
    per_request = partial(ctx.bounded_bytes, sequences=1) if ctx.model.has_bounded_layers else None
    memory = KvMemory(hbm_capacity_bytes=ctx.hw.memory_bytes, weights_bytes=ctx.weights_bytes, activation_bytes=act,
                      runtime_reserve_bytes=ctx.hw.runtime_reserve_bytes, host_capacity_bytes=ctx.hw.host_memory_bytes,
                      kv_bytes_per_token=ctx.kv_bytes_per_token, t2_bytes_per_token=ctx.t2_bytes_per_token,
                      staging_bytes_per_token=stage, bounded_bytes_per_request=bounded, request_bounded=per_request,
                      chunk_kept=ctx.chunk_kept if ctx.model.chunked_tier_share else None)
    return chunked_local(ctx, window_pools(ctx, memory, max_num_batched_tokens))


def chunked_local(ctx: RunContext, memory: KvMemory) -> KvMemory:
    """`memory` with vLLM's chunked local attention where the run's engine is vLLM or none (kvtier's
    default rules, vLLM's) and its model has chunked layers: they hold their current chunk's tokens
    (`model.layers.chunk_attended`), the blocks before it freed (vllm/v1/core/single_type_kv_cache_manager.py
    `ChunkedLocalAttentionManager`, under the hybrid KV cache manager, on for chunked attention by default:
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE 1 since PR #29627; #46553's proposal to turn it off
    again was closed unmerged). TensorRT-LLM keeps every token (its KV
    cache sizes every layer for max_seq_len); SGLang keeps them in its window pool (`window_pools`).
    Else `memory`."""
    return replace(memory, chunk_rule=ctx.chunk_rule) if ctx.chunk_rule else memory


def window_pools(ctx: RunContext, memory: KvMemory, max_num_tokens: int) -> KvMemory:
    """`memory` under its engine's window pools (`device.memory.window_pools_rule`), for a model with window
    and full-attention layers and no linear or sparse ones (else `memory`):
      TensorRT-LLM: one pool per window size, equal shares; a request reserves its whole length in the
        full pool and min(length, W + temporary window) + a block in the window's (`max_num_tokens` the
        group's: an attention-data-parallel rank's is its share);
      SGLang: swa_full_tokens_ratio's split; a request holds min(length, W) tokens in the window's pool,
        as vLLM's (`RunContext.bounded_bytes`); a model with chunked layers and no window ones (Llama 4)
        keeps them there, min(length, C) tokens, the full pool the rest (`device.memory.sglang_chunk_pools`)."""
    rule = engine_window_pools(ctx, max_num_tokens)
    if rule is None:
        return memory
    longest = ctx.max_model_len or ctx.model.context_tokens or rule.reach  # the most a request holds
    return replace(memory, pool_shares=rule.shares, request_bounded=rule.batch_bytes,
                   bounded_bytes_per_request=rule.batch_bytes(longest),
                   pool_tiered_bytes_per_token=rule.tiered_per_token)


def engine_scheduler(ctx: RunContext, memory: KvMemory) -> SchedulerCfg:
    """The scheduler a run applies: the scenario's, its max_num_seqs under SGLang cut to the
    max_running_requests its KV pool allows (`device.engine_rules.sglang_max_running_requests`, of the
    KV budget in tokens and the context it serves)."""
    sc, e = ctx.scenario.scheduler, ctx.scenario.engine
    if e is None or e.name != "sglang" or memory.kv_bytes_per_token <= 0 or memory.kv_budget_bytes <= 0:
        return sc
    context = ctx.max_model_len or ctx.model.context_tokens
    cap = sglang_max_running_requests(sc.max_num_seqs, memory.kv_budget_bytes / memory.pool_bytes_per_token, context,
                                      ctx.model.attention_dp)
    return sc if cap == sc.max_num_seqs else sc.model_copy(update={"max_num_seqs": cap})
