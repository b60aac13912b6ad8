"""HBM and host memory accounting (DESIGN.md "Link and memory model").

HBM  = weights + T0 KV of all sequences + staging buffers + activations + runtime reserve.
Host = T1 (full precision) + T2 (compressed) KV, pinned or pageable.
"""

from __future__ import annotations

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
