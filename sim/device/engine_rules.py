"""A serving engine's rules for memory and launching (scenario `engine:`), each read from the engine's
code, as pure functions: which KV budget the engine leaves (`engine_memory_rule`, over
`device.memory`'s formulas) and which steps replay a CUDA graph and which the host launches kernel by
kernel (`LaunchRule`, `host_launch_s`; `host_times` is what physics asks for a step's host time).

Read (stored copies of the public repositories):
- vLLM (vllm-project/vllm main): vllm/config/vllm.py `VllmConfig._set_cudagraph_sizes` (capture
  sizes [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16) up to max_cudagraph_capture_size =
  min(max_num_seqs x 2, 512; 1024 on compute capability 10.x), no more than max_num_batched_tokens; a
  batch runs padded to the next of them, `bs_to_padded_graph_size`) and the default optimization level O2's cudagraph_mode
  FULL_AND_PIECEWISE; vllm/v1/cudagraph_dispatcher.py `CudagraphDispatcher` (FULL graphs for uniform
  decode batches of up to max_num_seqs tokens, PIECEWISE - attention left eager - for other batches
  up to the largest capture size, none beyond).
- SGLang (sgl-project/sglang main @ 001067ff): python/sglang/srt/server_args.py
  `_handle_gpu_memory_settings` (cuda_graph_config[decode].max_bs by GPU memory and tp) and
  python/sglang/srt/model_executor/cuda_graph_config.py (decode backend "full"; prefill "breakable",
  segmented around attention, by default on CUDA); a decode batch above max_bs runs eager; below it,
  padded to the next captured size (`_generate_cuda_graph_batch_sizes`: 1, 2, 4, 8, 12, 16-256 by 8,
  272-496 by 16, 512 up by 32; disable_cuda_graph_padding off by default), as vLLM's.
- TensorRT-LLM (NVIDIA/TensorRT-LLM main, PyTorch backend): tensorrt_llm/llmapi/llm_args.py
  `CudaGraphConfig` (on by default; max_batch_size 0 means 128; without padding the captured sizes are
  1..31, 32, 64, 128, then powers of two up to max_batch_size and max_batch_size itself, with padding
  1, 2, 4, 8, 16, ..., 128 in steps of 8 before the powers of two: `_generate_cuda_graph_batch_sizes`) -
  a decode batch of another size runs eager. Given `batch_sizes` (engine.cuda_graph_batch_sizes),
  _torch/pyexecutor/model_engine.py `_filter_cuda_graph_batch_sizes` keeps those up to min(max_batch_size,
  max_num_tokens) and, padding on, appends that cap. With `enable_padding` (engine.cuda_graph_padding)
  cuda_graph_runner.py pads a generation-only batch with dummy requests up to the next captured size,
  so its GEMMs run at that size (`decode_rows`); under attention data parallelism every rank pads to the
  size of the fullest rank; a step with context requests never replays a graph (scheduler.py
  `can_run_cuda_graph`);
  tensorrt_llm/_torch/pyexecutor/_util.py `KvCacheCreator` for the KV budget.
- Which all-reduce runs (`engine_allreduce_impl`): vLLM
  vllm/distributed/device_communicators/custom_all_reduce.py `CustomAllreduce.__init__` (custom
  all-reduce disabled "because it's not supported on more than two PCIe-only GPUs": world size > 2
  without NVLink between every pair, then NCCL through pynccl); SGLang's custom_all_reduce.py is
  adapted from vLLM's, same rule; TensorRT-LLM cpp/tensorrt_llm/plugins/ncclPlugin/allreducePlugin.cpp
  `AllreducePlugin::selectImplementation` (the TensorRT-engine flow; the PyTorch flow's AllReduce op
  has the same test): strategy AUTO returns NCCL when the group lacks NVLink (or P2P), whatever its size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.inputs.scenario import SGLANG_RUNNING_CEILING
from sim.model.units import MiB

from .memory import engine_memory, sglang_engine_memory, sglang_mem_fraction_static, trtllm_engine_memory

DECODE = "decode"  # a step of decoding sequences only
MIXED = "mixed"  # decodes with prefill chunks (continuous batching)
PREFILL = "prefill"  # prefill chunks only
STEP_KINDS = (DECODE, MIXED, PREFILL)

VLLM_MAX_CAPTURE = 512  # _set_cudagraph_sizes: default_max_graph_size
VLLM_SM100_MAX_CAPTURE = 1024  # ... on compute capability 10.x (is_device_capability_family(100))
SM100_GPUS = frozenset({"b200", "gb200", "b300", "gb300"})  # the catalog's GPUs of compute capability 10.x (B300: 10.3)

VLLM_MEMORY = "vllm/v1/worker/gpu_worker.py determine_available_memory"
SGLANG_MEMORY = "python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py profile_max_num_token"
SGLANG_DEFAULTS = "python/sglang/srt/server_args.py _handle_gpu_memory_settings"
VLLM_GRAPHS = "vllm/config/vllm.py _set_cudagraph_sizes, vllm/v1/cudagraph_dispatcher.py"
SGLANG_GRAPHS = ("python/sglang/srt/server_args.py _generate_cuda_graph_batch_sizes, "
                 "model_executor/cuda_graph_runner.py get_batch_sizes_to_capture")
TRTLLM_MEMORY = "tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator._cal_max_memory"
TRTLLM_GRAPHS = "tensorrt_llm/llmapi/llm_args.py CudaGraphConfig._generate_cuda_graph_batch_sizes"
TRTLLM_GRAPH_MAX_BATCH = 128  # CudaGraphConfig: max_batch_size 0 (unset) means 128
TRTLLM_FILTER = "_torch/pyexecutor/model_engine.py _filter_cuda_graph_batch_sizes"


CUSTOM_ALLREDUCE = "custom"  # the engine's own one-shot / two-shot kernel (AIConfigurator's custom_allreduce_perf)
NCCL_ALLREDUCE = "nccl"  # NCCL's ring / tree all_reduce (nccl_perf)
ENGINES = ("vllm", "sglang", "tensorrt-llm")
VLLM_PCIE_CUSTOM_MAX_GPUS = 2  # custom_all_reduce.py: "not supported on more than two PCIe-only GPUs"


def engine_allreduce_impl(engine: str, gpus: int, nvlink: bool) -> str:
    """Which all-reduce `engine` runs over a group of `gpus` GPUs (see the module docstring):
      NVLink between them: the engine's custom all-reduce (CUSTOM_ALLREDUCE);
      PCIe only: vLLM and SGLang their custom kernel up to VLLM_PCIE_CUSTOM_MAX_GPUS GPUs, NCCL beyond;
                 TensorRT-LLM (AUTO strategy) NCCL at any size."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if nvlink:
        return CUSTOM_ALLREDUCE
    if engine == "tensorrt-llm" or gpus > VLLM_PCIE_CUSTOM_MAX_GPUS:
        return NCCL_ALLREDUCE
    return CUSTOM_ALLREDUCE


DENSE_DP_ENGINES = frozenset({"vllm", "tensorrt-llm"})


def trtllm_chunked_decode_on_mmha(engine: str | None, gpu_name: str, attention_chunk: int,
                                  max_seq_len: int | None) -> bool:
    """Whether TensorRT-LLM decodes chunked-attention layers on its MMHA kernel, one thread block per query
    head, each streaming its KV head's cache (decoderMaskedMultiheadAttention: grid of heads x sequences):
    where it hands the chunk to its generation kernels - max_seq_len reaching the chunk; below it a chunk
    holds every sequence whole - on a GPU whose decode kernel is XQA, which refuses a chunk
    (decoderXQAImplJIT/kernelUtils.cpp `supportConfigCommon`: "chunked attention is not supported yet";
    attentionOp.cpp falls back to MMHA). Compute capability 10.x decodes on trtllm-gen's kernels instead,
    which take the chunk (xqaDispatcher.cpp, `mChunkedAttentionSize`)."""
    return (engine == "tensorrt-llm" and attention_chunk > 0 and gpu_name not in SM100_GPUS
            and max_seq_len is not None and max_seq_len >= attention_chunk)


def engine_dense_dp(engine: str | None) -> bool:
    """Whether `engine` runs the dense MLPs, shared experts, embedding and LM head data-parallel under
    attention data parallelism (`ModelSpec.shard`'s dense_dp): TensorRT-LLM (_torch/models/
    modeling_deepseekv3.py `_compute_mlp_tp_size` / `_compute_shared_expert_tp_size`: "If using attention
    DP, the MLP also uses DP instead of TP"; the embedding unsplit, the LM head too unless
    enable_lm_head_tp_in_adp) and vLLM (each data-parallel rank a replica of all but the experts); not
    SGLang (moe_dense_tp_size unset: the dense MLPs over the whole group) nor a run without an engine."""
    return engine in DENSE_DP_ENGINES


def engine_whole_embedding(engine: str | None) -> bool:
    """Whether `engine` holds the whole embedding on every GPU under attention data parallelism while
    its LM head stays split over the group (`ModelSpec.shard`'s whole_embedding): SGLang, whose models
    build it as VocabParallelEmbedding(..., enable_tp=not is_dp_attention_enabled()) and the LM head
    vocab-parallel over the whole group unless enable_dp_lm_head. TensorRT-LLM and vLLM hold it whole
    per rank already (`engine_dense_dp`); a run without an engine splits it."""
    return engine == "sglang"


@dataclass(frozen=True)
class LaunchRule:
    """How an engine launches a step's kernels: decode batches of up to `graph_max_batch` replay a
    captured CUDA graph (one launch for the step); every other step is launched by the host kernel by
    kernel, `eager_layer_s` a layer and `eager_step_s` for the rest of the step."""

    cuda_graphs: bool
    graph_max_batch: int  # 0: nothing captured
    eager_layer_s: float
    eager_step_s: float
    graph_sizes: frozenset[int] | None = None  # only these decode batches replay (TensorRT-LLM); None: 1..graph_max_batch
    padding: bool = False  # a decode batch below the largest graph is padded up to the next size (TensorRT-LLM's)
    ranks: int = 1  # attention data-parallel ranks: the graph sizes are each rank's batch
    host_s_per_sequence: float = 0.0  # the engine's host loop a step, per request in it (`host_loop_s`)


def decode_rows(rule: LaunchRule | None, batch: int) -> int:
    """The rows a decode step of `batch` sequences computes its GEMMs over: with TensorRT-LLM's padding
    (`LaunchRule.padding`), the fullest rank's ceil(batch / ranks) rounded up to the next captured size,
    on every rank; else `batch` (no padding, or a batch above the largest graph: eager)."""
    if rule is None or not (rule.padding and rule.cuda_graphs and rule.graph_sizes) or batch < 1:
        return batch
    per_rank = math.ceil(batch / rule.ranks)
    padded = min((s for s in rule.graph_sizes if s >= per_rank), default=None)
    return batch if padded is None else padded * rule.ranks


def host_launch_s(rule: LaunchRule, batch: int, step_kind: str) -> tuple[float, float]:
    """(host time per layer, host time for the rest of the step) of a step of `batch` sequences:
      decode, cuda_graphs and batch <= graph_max_batch: (0, 0) - a graph replay, launched once
      otherwise: (eager_layer_s, eager_step_s) - the host enqueues every kernel
    Mixed and prefill steps count as eager: vLLM runs them as piecewise graphs and SGLang's prefill as
    a breakable graph, both with attention launched eagerly in every layer, so their host time lies
    between the two; eager is the bound kept (such steps carry prefill rows, whose device work is far
    above a layer's launches)."""
    if step_kind not in STEP_KINDS:
        raise ValueError(f"step_kind must be one of {', '.join(STEP_KINDS)}, got {step_kind!r}")
    per_rank = math.ceil(batch / rule.ranks)
    if rule.cuda_graphs and step_kind == DECODE and 1 <= per_rank <= rule.graph_max_batch and (
            rule.graph_sizes is None or rule.padding or per_rank in rule.graph_sizes):
        return 0.0, 0.0
    return rule.eager_layer_s, rule.eager_step_s


# TensorRT-LLM's PyTorch executor does a step's host work - scheduling, input preparation, its sampler's
# update of every request - in one Python loop on each attention rank (py_executor.py `_executor_loop_overlap`):
# with the overlap scheduler, on by default, it prepares and launches step i + 1, then waits for step i's
# tokens and hands them out, so a step lasts the longer of the GPU's work and that loop, which grows with the
# requests in the step. Measured (PR #11983, 2026-03): its TorchSampler - what greedy decoding gets (_util.py
# `instantiate_sampler`: TRTLLMSampler only when asked for, or for beam search) - takes 11.3 ms of host time a
# step at batch 1,000 (13.8 ms before that PR; Llama-3.2-1B, logprobs=0, an L40S machine's host). The
# scheduler's and the input preparation's shares are not in it: a floor of the loop, not its whole.
TRTLLM_SAMPLER_S_PER_SEQUENCE = 11.3e-6
TRTLLM_HOST_LOOP = ("TensorRT-LLM's PyTorch executor, overlap scheduler: a step lasts max(GPU, host loop); the loop "
                    "at its TorchSampler's 11.3 us a request a step (PR #11983: 11.3 ms at batch 1,000, an L40S "
                    "machine's host; the scheduler's and input preparation's shares not counted)")


def engine_host_s_per_sequence(engine) -> tuple[float, str]:
    """The engine's host loop per request a step (`inputs.scenario.EngineCfg.host_s_per_sequence`, else the
    engine's measured figure) and where it comes from: TensorRT-LLM's PyTorch executor
    `TRTLLM_SAMPLER_S_PER_SEQUENCE`; vLLM's and SGLang's loops are not measured here: 0."""
    if engine.host_s_per_sequence is not None:
        return engine.host_s_per_sequence, (f"engine.host_s_per_sequence {engine.host_s_per_sequence * 1e6:g} us: "
                                            "a step lasts max(GPU, host loop)")
    if engine.name == "tensorrt-llm":
        return TRTLLM_SAMPLER_S_PER_SEQUENCE, TRTLLM_HOST_LOOP
    return 0.0, f"{engine.name}: its host loop is not measured: 0 (a step lasts the GPU's work)"


def host_loop_s(rule: LaunchRule | None, sequences: int, ranks: int = 1) -> float:
    """The engine's host loop over a step of `sequences` requests (decodes and prefills) on the busiest of
    `ranks` attention ranks, each running its own: host_s_per_sequence x ceil(sequences / ranks); 0 without
    a rule. The step lasts max(the device's work, this) (the loop overlaps the previous step's GPU work).
    Example: TensorRT-LLM (11.3 us), 1,500 decodes on one rank: 17 ms."""
    if rule is None or not rule.host_s_per_sequence or sequences < 1:
        return 0.0
    return rule.host_s_per_sequence * math.ceil(sequences / max(ranks, 1))


def host_loop_steps_s(rule: LaunchRule | None, sequences: np.ndarray, ranks: int = 1) -> np.ndarray:
    """`host_loop_s` over an array of steps' request counts (a closed batch's decode steps)."""
    sequences = np.asarray(sequences, dtype=float)
    if rule is None or not rule.host_s_per_sequence:
        return np.zeros(len(sequences))
    return np.where(sequences >= 1, rule.host_s_per_sequence * np.ceil(sequences / max(ranks, 1)), 0.0)


def host_times(hw, batch: int, step_kind: str) -> tuple[float, float]:
    """(host time per layer, for the rest of the step) of `hw` (a `device.hardware.Hardware`) for a step
    of `batch` rows: its engine's `host_launch_s` where a scenario engine set `hw.launch`, else
    (hw.host_layer_s, hw.host_step_s) as they are - the same floats, so a run without `engine:` is
    unchanged. What physics calls where it builds a layer's or a step's host time."""
    if hw.launch is None:
        return hw.host_layer_s, hw.host_step_s
    return host_launch_s(hw.launch, batch, step_kind)


def vllm_graph_max_batch(max_num_seqs: int, max_num_batched_tokens: int, sm100: bool,
                         max_capture: int | None = None) -> int:
    """The largest decode batch vLLM replays as a FULL graph: max_cudagraph_capture_size (`max_capture`,
    default min(max_num_seqs x 2, 512; 1024 on SM100)), no more than max_num_batched_tokens, and no more
    than max_num_seqs (the FULL decode keys)."""
    cap = max_capture or min(max_num_seqs * 2, VLLM_SM100_MAX_CAPTURE if sm100 else VLLM_MAX_CAPTURE)
    return min(cap, max_num_batched_tokens, max_num_seqs)


def launch_rule(engine, scheduler, gpu_name: str, gpu_memory_bytes: float, tp: int, eager_layer_s: float,
                eager_step_s: float, ranks: int = 1) -> tuple[LaunchRule, str]:
    """The engine's rule (`inputs.scenario.EngineCfg`) for the run's effective `scheduler` (the group's
    limits; `ranks` attention data-parallel ranks, whose batches the graphs are), and where its graph
    size comes from."""
    if not engine.cuda_graphs:
        return LaunchRule(False, 0, eager_layer_s, eager_step_s), "engine.cuda_graphs false: every step eager"
    if engine.name == "tensorrt-llm":
        sizes, why = trtllm_graphs(engine, scheduler, ranks)
        return LaunchRule(True, max(sizes), eager_layer_s, eager_step_s, frozenset(sizes), engine.cuda_graph_padding,
                          ranks), why
    if engine.name == "vllm":
        largest = vllm_graph_max_batch(scheduler.max_num_seqs, scheduler.max_num_batched_tokens,
                                       gpu_name in SM100_GPUS, engine.cuda_graph_max_batch)
        sizes = vllm_capture_sizes(largest)
        why = (f"{'engine.cuda_graph_max_batch' if engine.cuda_graph_max_batch else 'default'}: a batch padded up to "
               f"the next captured size ({VLLM_GRAPHS})")
        return LaunchRule(True, max(sizes), eager_layer_s, eager_step_s, frozenset(sizes), True), why
    max_bs = engine.cuda_graph_max_batch or engine.sglang_gpu_defaults(gpu_memory_bytes, tp)[1]
    sizes = sglang_capture_sizes(max_bs, max(scheduler.max_num_seqs // ranks, 1))  # each rank's request pool
    why = (f"cuda_graph_max_bs {max_bs}, {'engine.cuda_graph_max_batch' if engine.cuda_graph_max_batch else SGLANG_DEFAULTS}"
           f": a batch padded up to the next captured size ({SGLANG_GRAPHS})")
    return LaunchRule(True, max(sizes), eager_layer_s, eager_step_s, frozenset(sizes), True, ranks), why


def vllm_capture_sizes(largest: int) -> list[int]:
    """vLLM's captured batch sizes up to `largest`: 1, 2, 4, then 8 to 248 in steps of 8, then 256 up in
    steps of 16 (`_set_cudagraph_sizes`)."""
    sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)] if s <= largest]
    return sizes or [1]


def sglang_capture_sizes(max_bs: int, pool_size: int) -> list[int]:
    """SGLang's captured decode batch sizes (each attention rank's): 1, 2, 4, 8, 12, then 16 to 256 in steps
    of 8, 272 to 496 in steps of 16, 512 up in steps of 32, up to cuda_graph_max_bs (server_args.py
    `_generate_cuda_graph_batch_sizes`, padding on by default); none above the request pool (max running
    requests), whose size is captured where the ladder passes it (cuda_graph_runner.py
    `get_batch_sizes_to_capture`)."""
    ladder = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [s for s in ladder if s <= max_bs]
    if sizes and sizes[-1] > pool_size:
        sizes = [s for s in sizes if s < pool_size] + [pool_size]
    return sizes or [1]


def trtllm_graphs(engine, scheduler, ranks: int) -> tuple[list[int], str]:
    """TensorRT-LLM's captured batch sizes (each rank's) and where they come from: engine.cuda_graph_batch_sizes
    up to min(max_batch_size, max_num_tokens) a rank, that cap appended with padding
    (`_filter_cuda_graph_batch_sizes`); else `trtllm_graph_batch_sizes` of engine.cuda_graph_max_batch or 128."""
    pad = "padded up to the next size" if engine.cuda_graph_padding else "others eager"
    if engine.cuda_graph_batch_sizes:
        cap = min(scheduler.max_num_seqs, scheduler.max_num_batched_tokens) // ranks
        sizes = sorted(s for s in set(engine.cuda_graph_batch_sizes) if s <= cap)
        if engine.cuda_graph_padding and cap not in sizes:
            sizes.append(cap)
        return sizes or [cap], (f"engine.cuda_graph_batch_sizes up to min(max_batch_size, max_num_tokens) {cap} a rank"
                                f"{', it appended' if engine.cuda_graph_padding else ''}: {pad} ({TRTLLM_GRAPHS}, "
                                f"{TRTLLM_FILTER})")
    sizes = trtllm_graph_batch_sizes(engine.cuda_graph_max_batch or TRTLLM_GRAPH_MAX_BATCH, engine.cuda_graph_padding)
    first = "1, 2, 4, 8-128 in steps of 8" if engine.cuda_graph_padding else "1-31, 32, 64, 128"
    return sizes, (f"{'engine.cuda_graph_max_batch' if engine.cuda_graph_max_batch else 'default'}: batches "
                   f"{first}, powers of two, the largest; {pad} ({TRTLLM_GRAPHS})")


def trtllm_graph_batch_sizes(max_batch_size: int, padding: bool = False) -> list[int]:
    """The decode batch sizes TensorRT-LLM captures: 1..31, 32, 64, 128 (with padding: 1, 2, 4, then 8
    to 128 in steps of 8), then powers of two up to (not including) max_batch_size, all at most
    max_batch_size, and max_batch_size itself."""
    sizes = [1, 2, 4] + [8 * i for i in range(1, 17)] if padding else list(range(1, 32)) + [32, 64, 128]
    sizes += [2 ** i for i in range(8, math.ceil(math.log2(max_batch_size)))] if max_batch_size > 1 else []
    sizes = sorted(x for x in sizes if x <= max_batch_size)
    return sizes if sizes[-1] == max_batch_size else sizes + [max_batch_size]


SGLANG_RUNNING = "python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py _resolve_max_num_reqs"
SGLANG_RUNNING_FLOOR = 2048  # its estimate's clamp: 2048 .. SGLANG_RUNNING_CEILING
SGLANG_REQUESTS_PER_CONTEXT = 512  # ... of pool tokens / context_len x 512
SGLANG_DEFAULT_CONTEXT = 2048  # model_config.py get_context_length: a config without any context key


def sglang_max_running_requests(requested: int, pool_tokens: float, context_tokens: int | None, ranks: int = 1) -> int:
    """The requests SGLang runs at once over `ranks` attention data-parallel ranks (`SGLANG_RUNNING`),
    each rank holding pool_tokens / ranks of KV:
      estimated = clamp(int(rank's pool / context_len x 512), 2048, 4096)
      a rank's cap = min(requested // ranks, estimated, rank's pool // 2)
    `requested` is --max-running-requests (the group's); unset, kvtier passes the ceiling 4096 x ranks,
    which leaves min(estimated, pool // 2), SGLang's rule without it. `context_tokens`: --context-length,
    else the model's (None: SGLang's fallback 2048)."""
    ranks = max(ranks, 1)
    rank_pool = int(pool_tokens / ranks)
    context = context_tokens or SGLANG_DEFAULT_CONTEXT
    estimated = min(max(int(rank_pool / context * SGLANG_REQUESTS_PER_CONTEXT), SGLANG_RUNNING_FLOOR),
                    SGLANG_RUNNING_CEILING)
    per_rank = max(min(requested // ranks, estimated, rank_pool // 2), 1)
    return min(per_rank * ranks, requested)  # never above what was asked (fewer than one a rank: as asked)


@dataclass(frozen=True)
class EngineMemory:
    """An engine's memory rule applied: what `Hardware` carries (usable HBM, reserve, activations held)
    and the sentence saying how."""

    usable_bytes: float
    reserve_bytes: float
    held_activation_bytes: float
    rule: str  # the engine's file and function
    usable: str  # how usable_bytes came about


def sglang_fraction(engine, scheduler, memory_bytes: float, tp: int, mla: bool) -> tuple[float, str]:
    """SGLang's mem_fraction_static for this run and where it comes from: engine.mem_fraction_static
    as set, else `sglang_mem_fraction_static` for this GPU's memory (in MiB), tp and the effective
    `scheduler` (`EngineCfg.scheduler_for`) - what `kvsim plan` writes as --mem-fraction-static."""
    if engine.mem_fraction_static is not None:
        return engine.mem_fraction_static, "engine.mem_fraction_static"
    max_bs = engine.cuda_graph_max_batch or engine.sglang_gpu_defaults(memory_bytes, tp)[1]
    fraction = sglang_mem_fraction_static(memory_bytes / MiB, tp, scheduler.max_num_batched_tokens,
                                          scheduler.chunked_prefill, max_bs, engine.cuda_graphs, mla)
    return fraction, (f"default for {memory_bytes / MiB:,.0f} MiB, tp {tp}, {scheduler.max_num_batched_tokens} prefill "
                      f"tokens, cuda_graph_max_bs {max_bs}{', MLA' if mla else ''} ({SGLANG_DEFAULTS})")


def engine_memory_rule(engine, scheduler, memory_bytes: float, tp: int, mla: bool,
                       activation_bytes: float, weights_bytes: float = 0.0) -> EngineMemory:
    """vLLM: `device.memory.engine_memory`; SGLang: `sglang_engine_memory` at `sglang_fraction`;
    TensorRT-LLM: `trtllm_engine_memory` (one GPU's `weights_bytes`)."""
    head = f"engine {engine.name} {engine.version}"
    if engine.name == "tensorrt-llm":
        f = engine.free_gpu_memory_fraction
        usable, reserve, held = trtllm_engine_memory(memory_bytes, f, engine.non_torch_bytes, activation_bytes,
                                                     weights_bytes)
        return EngineMemory(usable, reserve, held, f"{head} ({TRTLLM_MEMORY})",
                            f"weights + activations + memory outside torch + free_gpu_memory_fraction {f:g} x what "
                            f"they leave of")
    if engine.name == "vllm":
        usable, reserve, held = engine_memory(memory_bytes, engine.gpu_memory_utilization, engine.non_torch_bytes,
                                              activation_bytes)
        return EngineMemory(usable, reserve, held, f"{head} ({VLLM_MEMORY})",
                            f"gpu_memory_utilization {engine.gpu_memory_utilization:g} x")
    fraction, how = sglang_fraction(engine, scheduler, memory_bytes, tp, mla)
    usable, reserve, held = sglang_engine_memory(memory_bytes, fraction, engine.non_torch_bytes, activation_bytes)
    return EngineMemory(usable, reserve, held, f"{head} ({SGLANG_MEMORY})",
                        f"static pool (memory - engine.non_torch_bytes) x mem_fraction_static {fraction:g} [{how}] "
                        f"+ the activations held outside it, of")
