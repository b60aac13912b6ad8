"""trtllm-bench's batch limits: the max batch size and max token count its `throughput` command runs with
when the command gives none, as pure functions of the checkpoint, the GPUs and the dataset.

Read from NVIDIA/TensorRT-LLM (stored copies of the public repository):
- tensorrt_llm/bench/build/tuning.py `calc_engine_setting` and `finetune_setting`, called through
  bench/build/build.py `get_benchmark_engine_settings` by the PyTorch flow's PytMaxThroughputScenario
  (tensorrt_llm/bench/tuning) with the dataset's mean ISL and OSL; its limits become the LLM's
  max_batch_size and max_num_tokens (and the CUDA graphs' max batch). Chunked prefill stays off unless
  the options enable it; the capacity scheduler is GUARANTEED_NO_EVICT.
- bench/build/dataclasses.py `ModelConfig`: head_size is config.json's head_dim, or hidden_size /
  num_attention_heads where it states none; num_key_value_heads as the config states it.
- bench/build/utils.py `get_device_memory`: NVML's total memory of GPU 0, in GiB.
- bench/benchmark/utils/general.py `get_settings`: with chunked prefill off, whatever the heuristic
  (or BuildConfig) gave, max_num_tokens = max(that, the dataset's max ISL + max_batch_size), so the
  longest prompt fits one step beside a full batch of decodes.

The heuristic estimates how many requests of ISL + OSL tokens fit the KV cache of the whole group and
rounds that up ("slightly optimistic"); nothing in it knows about MLA's latent, attention data
parallelism or the KV dtype the run's own kv_cache_config sets later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.model.units import GiB

KV_CACHE_FRACTION = 0.95  # get_benchmark_engine_settings' kv_cache_gpu_mem_fraction, whatever the run later uses
MAX_REQUESTS_CAP = 4096  # "Cap total batch size to avoid decoder buffer size becoming too large"
MAX_TOKENS_CAP = 32768  # "Cap num tokens to avoid TRT activation buffer becoming too large"
MIN_BATCH = 64  # "Set min BS to be 64"
MIN_TOKENS = 2048  # "Set min to 2048 to ensure Ctx/Gen overlap efficiency"
BATCH_STEPS = ((256, 32), (1024, 128), (math.inf, 256))  # (below, round up to a multiple of)
TOKEN_STEPS = ((4096, 256), (8192, 512), (math.inf, 1024))
# build.py TUNED_QUANTS and tuning.py BYTES_PER_ELEM, by kvtier's weight dtype: bf16 / fp16 NO_QUANT,
# fp8 FP8 or FP8_BLOCK_SCALES, nvfp4 NVFP4 (0.5 a parameter); int8 / int4 weight-only are not tuned
# (BuildConfig's defaults instead)
TUNED_WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 0.5}
BUILD_CONFIG_DEFAULTS = (2048, 8192)  # BuildConfig max_batch_size, max_num_tokens
KV_ELEMENT_BYTES = {"fp8": 1.0}  # BYTES_PER_ELEM.get(kv_cache_quant_algo, 2): FP8 one byte, anything else two


@dataclass(frozen=True)
class BenchCheckpoint:
    """What the heuristic reads of a checkpoint: config.json as bench's ModelConfig parses it, the
    safetensors parameter count, the quantisation algorithms of its quant config."""

    num_kv_heads: int  # config.json num_key_value_heads
    head_size: int  # config.json head_dim, else hidden_size // num_attention_heads
    attention_layers: int  # num_hidden_layers (attention layers of a hybrid)
    params: float  # the safetensors parameter count (elements of every tensor, whatever its dtype)
    weight_dtype: str  # kvtier's name for the quant algo: bf16, fp16, fp8, int8, int4, nvfp4
    kv_dtype: str  # the checkpoint's KV-cache quantisation (fp8), else bf16 / fp16


@dataclass(frozen=True)
class BenchLimits:
    max_batch_size: int
    max_num_tokens: int
    kv_cache_max_requests: float  # the heuristic's estimate before rounding (nan: not tuned)
    raised_from_tokens: int | None = None  # the heuristic's max_num_tokens where get_settings raised it

    def describe(self) -> str:
        raised = (f" (raised from {self.raised_from_tokens}: max ISL + max_batch_size, chunked prefill off)"
                  if self.raised_from_tokens is not None else "")
        if math.isnan(self.kv_cache_max_requests):
            return (f"trtllm-bench: weights it does not tune, BuildConfig's defaults max_batch_size "
                    f"{self.max_batch_size}, max_num_tokens {self.max_num_tokens}{raised}")
        return (f"trtllm-bench's heuristic (tuning.py calc_engine_setting): {self.kv_cache_max_requests:.0f} "
                f"requests estimated -> max_batch_size {self.max_batch_size}, max_num_tokens "
                f"{self.max_num_tokens}{raised}")


def kv_cache_max_requests(ckpt: BenchCheckpoint, tp: int, pp: int, gpu_memory_bytes: float, isl: float,
                          osl: float) -> float:
    """calc_engine_setting's estimate of the requests the group's KV cache holds:

        GiB a token = 2 x layers x max(tp, KV heads) x head size x KV element bytes / 1024^3
        engine GiB  = parameters x weight element bytes / 1024^3
        requests    = (GPU GiB x tp x pp - engine GiB) x 0.95 / (GiB a token x (ISL + OSL))
    """
    weight_bytes = TUNED_WEIGHT_BYTES[ckpt.weight_dtype]
    kv_bytes = KV_ELEMENT_BYTES.get(ckpt.kv_dtype, 2.0)
    gib_per_token = 2 * ckpt.attention_layers * max(tp, ckpt.num_kv_heads) * ckpt.head_size * kv_bytes / GiB
    engine_gib = ckpt.params * weight_bytes / GiB
    available_gib = gpu_memory_bytes / GiB * tp * pp - engine_gib
    return available_gib * KV_CACHE_FRACTION / (gib_per_token * (isl + osl))


def finetune_setting(requests: float, isl: float, osl: float, pp: int) -> tuple[int, int]:
    """finetune_setting: (max batch size, max num tokens) rounded up from the estimate.
    batch = min(requests, 4096) / pp, rounded up to a multiple of 32 below 256 (at least 64), of 128
    below 1,024, of 256 beyond; tokens = min(batch x (1 + ISL / OSL), 32,768), rounded up to a multiple
    of 256 below 4,096 (at least 2,048), of 512 below 8,192, of 1,024 beyond."""
    raw_bs = min(requests, MAX_REQUESTS_CAP) / pp
    raw_token = min(raw_bs * (1 + isl / osl), MAX_TOKENS_CAP)
    return _round_up(raw_bs, BATCH_STEPS, MIN_BATCH), _round_up(raw_token, TOKEN_STEPS, MIN_TOKENS)


def _round_up(value: float, steps: tuple[tuple[float, int], ...], minimum: int) -> int:
    """`value` rounded up to a multiple of the step of the first (below, step) it lies below, the lowest
    range at least `minimum` (finetune_setting's ladders)."""
    (first, _), *_ = steps
    step = next(s for below, s in steps if value < below)
    rounded = step * math.ceil(value / step)
    return max(minimum, rounded) if value < first else rounded


def unchunked_max_num_tokens(max_num_tokens: int, max_batch_size: int, max_isl: int) -> int:
    """get_settings with chunked prefill off: max(max_num_tokens, max ISL + max_batch_size)."""
    return max(max_num_tokens, max_isl + max_batch_size)


def trtllm_bench_limits(ckpt: BenchCheckpoint, tp: int, pp: int, gpu_memory_bytes: float, isl: float,
                        osl: float, chunked_prefill: bool = False, max_isl: int | None = None) -> BenchLimits:
    """get_settings' limits: get_benchmark_engine_settings' - the heuristic's for a tuned weight dtype
    (over the dataset's mean `isl` and `osl`), BuildConfig's defaults for another - then, with chunked
    prefill off, max_num_tokens raised to hold the longest prompt (`max_isl`, default `isl`) beside a
    full batch (`unchunked_max_num_tokens`). A checkpoint the group cannot hold raises ValueError, as
    the heuristic does."""
    if ckpt.weight_dtype not in TUNED_WEIGHT_BYTES:
        batch, tokens, requests = *BUILD_CONFIG_DEFAULTS, math.nan
    else:
        requests = kv_cache_max_requests(ckpt, tp, pp, gpu_memory_bytes, isl, osl)
        if requests < 1:
            raise ValueError(f"trtllm-bench's heuristic finds room for {requests:.2f} requests of {isl + osl:g} "
                             "tokens: the checkpoint leaves too little memory on these GPUs")
        batch, tokens = finetune_setting(requests, isl, osl, pp)
    if chunked_prefill:
        return BenchLimits(batch, tokens, requests)
    raised = unchunked_max_num_tokens(tokens, batch, math.ceil(isl if max_isl is None else max_isl))
    return BenchLimits(batch, raised, requests, tokens if raised > tokens else None)
