"""The memory admission checks against, per GPU (with tensor parallelism the context is one GPU's
shard, so KV bytes per token are one GPU's): DESIGN.md "Link and memory model" for a serving run.

HBM = weights + activations + runtime reserve (fixed) + T0 KV of the running sequences + staging
for the step's T1/T2 + each running request's bounded window/state bytes (layer kinds, at most); host = T1 x full KV bytes + T2 x compressed bytes, against host capacity.
The activations are held for the largest step the scheduler can form, as vLLM sizes its KV cache
after a profiling forward pass of `max_num_batched_tokens` tokens (logits only for the rows that
sample: at most `max_num_seqs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.decode.context import RunContext
from sim.device.memory import profile_run_activation_bytes, staging_bytes


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

    @property
    def fixed_bytes(self) -> float:
        return self.weights_bytes + self.activation_bytes + self.runtime_reserve_bytes

    @property
    def kv_budget_bytes(self) -> float:
        """HBM left for T0 KV and staging: capacity - weights - activations - reserve."""
        return self.hbm_capacity_bytes - self.fixed_bytes

    def hbm_kv_bytes(self, t0, staged):
        """T0 tokens x KV bytes + staged T1/T2 tokens x staging bytes per token + the request's bounded
        bytes (window KV up to W tokens, linear state; 0 for a dense model), per request."""
        return t0 * self.kv_bytes_per_token + staged * self.staging_bytes_per_token + self.bounded_bytes_per_request

    def host_bytes(self, t1, t2):
        return t1 * self.kv_bytes_per_token + t2 * self.t2_bytes_per_token

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
    return KvMemory(hbm_capacity_bytes=ctx.hw.memory_bytes, weights_bytes=ctx.weights_bytes, activation_bytes=act,
                    runtime_reserve_bytes=ctx.hw.runtime_reserve_bytes, host_capacity_bytes=ctx.hw.host_memory_bytes,
                    kv_bytes_per_token=ctx.kv_bytes_per_token, t2_bytes_per_token=ctx.t2_bytes_per_token,
                    staging_bytes_per_token=stage, bounded_bytes_per_request=bounded)
