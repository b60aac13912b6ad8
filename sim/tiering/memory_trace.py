"""A run's memory over its steps from tier counts: the one HBM and host sum that decides whether a
run fits (`decode.capacity`) and how far pressure pushes tokens out of T0 (`pressure`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.device.memory import activation_bytes, staging_bytes
from sim.device.sparse_fetch import staging_bytes as sparse_staging_bytes

from .tiers import T1, T2


@dataclass(frozen=True)
class MemoryTrace:
    """Per-step HBM and host bytes (arrays over steps) and their components at the HBM peak."""

    hbm_bytes: np.ndarray
    host_bytes: np.ndarray
    kv_t0_bytes: np.ndarray
    staging_bytes: np.ndarray
    transit_bytes: np.ndarray  # a re-tier's demoted K/V gathered on the device, held until it lands
    bounded_bytes: np.ndarray | float = 0.0  # window and linear layers' per-sequence bytes (kept in HBM)

    @property
    def hbm_peak_bytes(self) -> float:
        return float(self.hbm_bytes.max()) if len(self.hbm_bytes) else 0.0

    @property
    def host_peak_bytes(self) -> float:
        return float(self.host_bytes.max()) if len(self.host_bytes) else 0.0


def memory_trace(ctx, t0: np.ndarray, t1: np.ndarray, t2: np.ndarray, active: np.ndarray,
                 after: np.ndarray | None = None, demoted: np.ndarray | None = None, kept=1.0) -> MemoryTrace:
    """HBM(step) = weights + T0 KV + staging for this step's T1/T2 + activations + reserve, + at a
    re-tier its demoted tokens (`demoted`, (steps, 2): to T1, to T2), gathered on the device while
    their T0 slots are still held, until the offload lands;
    host(step) = T1 x full KV bytes + T2 x compressed bytes, the larger of during the forward and
    after the step's re-tier (`after`, (steps, 4) counts: its demotions land on the host and stay).
    Inputs: tokens summed over the batch; `ctx` is the run's `decode.context.RunContext`.
    Layer kinds: the KV above is the tiered layers' (full, MLA), a staging buffer holds one tiered
    layer, and the window and linear layers add their bounded bytes (`RunContext.bounded_bytes` of
    the tokens each sequence holds, T3 counted: a window covers the latest tokens whatever the policy
    evicted) - they never leave HBM. Under vLLM (and without an engine) a chunked layer's T0 KV is its
    current chunk's alone (`RunContext.chunk_freed_bytes`: the serving run's rule, exact for a closed
    batch's equal lengths; the host tiers by `kept`, below, whatever the engine). Where the engine keeps the window
    layers in a pool of their own (`RunContext.window_pools`: TensorRT-LLM, SGLang; SGLang's also holds
    Llama 4's chunked layers, their last C tokens), the full pool's T0 KV with its staging and the window
    bytes each count over their pool's share and HBM holds the larger, as a serving run's
    `KvMemory.hbm_kv_bytes`. `kept` (per step, or one figure): the share of a host-tier token's bytes the host
    holds and a demotion gathers (`RunContext.chunk_kept`: chunked layers' copies only within the current
    chunk; 1.0 without chunked layers)."""
    p = ctx.scenario.policy
    kvl = ctx.staged_bytes_per_token_layer
    staged_layer = t1 * kvl + t2 * kvl  # T2 dequantised into staging
    stage = staging_bytes(p.prefetch, p.staging_buffers, ctx.tiered_layers, 1.0) * staged_layer
    if not ctx.policy.tiering or p.access == "host_attention":  # nothing staged on the GPU
        stage = np.zeros_like(staged_layer, dtype=float)
    elif p.access == "sparse_fetch":  # only the indexer's host picks are staged
        stage = np.asarray(sparse_staging_bytes(ctx.model, ctx.sparse_fetch, p.staging_buffers, active, t0, t1, t2, kvl),
                           dtype=float) * np.ones_like(staged_layer, dtype=float)
    kv_t0 = t0 * ctx.kv_bytes_per_token
    pools, kinds = ctx.window_pools, ctx.model.layer_kinds
    if kinds:  # tokens each sequence holds, T3 counted where `after` has it: what windows and chunks cover
        held = t0 + t1 + t2 if after is None else np.maximum(t0 + t1 + t2, after.sum(axis=1))
        kv_t0 = kv_t0 - ctx.chunk_freed_bytes(t0, held, active)  # vLLM's chunked layers
    act = np.asarray(active, dtype=float) * activation_bytes(ctx.model, 1)  # linear in batch
    if ctx.hw.held_activation_bytes > 0:  # an engine holds its profiling pass's activations (scenario engine:)
        act = np.maximum(act, ctx.hw.held_activation_bytes)
    transit = np.zeros_like(kv_t0, dtype=float)
    if demoted is not None:
        to_t1, to_t2 = demoted.T
        transit = (to_t1 * ctx.kv_bytes_per_token + to_t2 * ctx.t2_bytes_per_token) * kept
    hbm = ctx.weights_bytes + kv_t0 + stage + act + transit + ctx.hw.runtime_reserve_bytes
    bounded = 0.0
    if pools is not None:  # the engine's own window pool: its share of the budget binds as the fuller pool does
        bounded = pools.batch_bytes(held, active)
        full, window = pools.shares
        pooled = np.maximum((pools.full_bytes(kv_t0, t0) + stage) / full, bounded / window)
        hbm = ctx.weights_bytes + pooled + act + transit + ctx.hw.runtime_reserve_bytes
    elif ctx.model.has_bounded_layers:
        bounded = ctx.bounded_bytes(held, active)
        hbm = hbm + bounded
    host = (t1 * ctx.kv_bytes_per_token + t2 * ctx.t2_bytes_per_token) * kept
    if after is not None:
        host = np.maximum(host, (after[:, T1] * ctx.kv_bytes_per_token + after[:, T2] * ctx.t2_bytes_per_token) * kept)
    return MemoryTrace(hbm_bytes=hbm, host_bytes=host, kv_t0_bytes=kv_t0, staging_bytes=stage, transit_bytes=transit,
                       bounded_bytes=bounded)
