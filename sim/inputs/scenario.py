"""Scenario schema (pydantic, frozen, extra keys forbidden) and loading with `--set` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_serializer, model_validator

from sim.model.layers import SPARSE
from sim.model.units import GiB, MiB

from . import catalog, kernel_tables
from .context_checks import check_context
from .errors import ConfigError
from .kernel_tables import TRTLLM_MOE_BACKENDS
from .lengths import LengthDist, draw_lengths
from .limits import (
    MAX_BATCH,
    MAX_BYTES,
    MAX_BYTES_PER_S,
    MAX_LAYER_STEPS,
    MAX_NAME_CHARS,
    MAX_OVERHEAD_S,
    MAX_RATIO,
    MAX_SEED,
    MAX_TEXT_CHARS,
    MAX_TOKEN_SLOTS,
    MAX_TOKENS,
    MIN_BYTES_PER_S,
    MIN_EFFICIENCY,
    NODE_GPUS,
)
from .moe_routing import MoeRouting
from .quiet_defaults import QuietDefaults
from .reader import check_tree, parse_yaml
from .reader import read_yaml as _read_yaml
from .requests import draw_prompts
from .serving_checks import check_serving
from .serving_config import ARRIVAL_KINDS, Arrivals, SchedulerCfg, SloCfg
from .strict import Strict

GROUP_SIZE_MAX = 2**16
COPY_ENGINES_MAX = 64
GPUS_PER_SWITCH_MAX = 64
STAGING_BUFFERS_MAX = 64


def _ratio(default: float):
    return Field(default, ge=0.0, le=1.0)

WeightDType = Literal["bf16", "fp16", "fp8", "int8", "int4", "nvfp4", "mxfp4"]  # nvfp4 / mxfp4 fix their groups
KvDType = Literal["bf16", "fp16", "fp8", "int8"]


class ModelCfg(Strict, QuietDefaults):
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)
    hf_config: str | None = Field(None, min_length=1, max_length=MAX_TEXT_CHARS)
    weight_dtype: WeightDType = "bf16"
    kv_dtype: KvDType = "bf16"
    weight_group_size: int = Field(128, ge=1, le=GROUP_SIZE_MAX)
    # a mixture of experts' expert popularity, Zipf(routing_skew) over the experts (sim/model/experts.py); 0: uniform
    routing_skew: float = Field(0.0, ge=0.0, le=4.0)
    # the fused-experts tables' routing, measured and datasheet (sim/inputs/moe_routing.py); None: AIConfigurator's
    # own for the model's family (power_law_1.2 or power_law_1.01); balanced: every expert evenly loaded (an EPLB run)
    moe_routing: MoeRouting | None = None
    # a mixture of experts' routed experts in their own format, the rest in weight_dtype (gpt-oss: mxfp4 experts,
    # bf16 attention, router and embeddings); None: weight_dtype throughout
    expert_weight_dtype: WeightDType | None = None
    # the attention projections in their own format, and the output projection in its own where it differs again
    # (ModelOpt's NVFP4 DeepSeek-R1 keeps self_attn in bf16; its -v2 quantises wo: attention bf16, output nvfp4);
    # None: weight_dtype (the output projection: the attention's)
    attention_weight_dtype: WeightDType | None = None
    attention_output_weight_dtype: WeightDType | None = None

    QUIET_DEFAULTS = {"routing_skew": 0.0, "moe_routing": None, "expert_weight_dtype": None,
                      "attention_weight_dtype": None,
                      "attention_output_weight_dtype": None}

    @model_validator(mode="after")
    def _one_source(self):
        if (self.name is None) == (self.hf_config is None):
            raise ValueError("give exactly one of 'name' (catalog) or 'hf_config' (path to config.json)")
        return self


class EfficiencyCfg(Strict):
    """Overrides of the default achieved fractions (see sim/catalog/efficiency.yaml)."""

    weight_hbm_efficiency: float | None = Field(None, ge=MIN_EFFICIENCY, le=1.0)
    attention_hbm_efficiency: float | None = Field(None, ge=MIN_EFFICIENCY, le=1.0)
    gemm_flop_efficiency: float | None = Field(None, ge=MIN_EFFICIENCY, le=1.0)
    attention_flop_efficiency: float | None = Field(None, ge=MIN_EFFICIENCY, le=1.0)
    attention_latency_s: float | None = Field(None, ge=0.0, le=MAX_OVERHEAD_S)  # floor of one decode-attention call
    gemm_floor_s: float | None = Field(None, ge=0.0, le=MAX_OVERHEAD_S)  # floor of one GEMM call
    dequant_ops_per_weight: float | None = Field(None, ge=0.0, le=1000.0)  # CUDA-core operations per weight, weight-only kernels
    layer_overhead_s: float | None = Field(None, ge=0.0, le=MAX_OVERHEAD_S)
    host_layer_s: float | None = Field(None, ge=0.0, le=MAX_OVERHEAD_S)  # host time to enqueue a layer (eager); max with device time
    host_step_s: float | None = Field(None, ge=0.0, le=MAX_OVERHEAD_S)  # host time per step outside the layers; max with LM head + step overhead
    step_overhead_s: float | None = Field(None, ge=0.0, le=MAX_OVERHEAD_S)
    host_pack_bytes_per_s: float | None = Field(None, ge=MIN_BYTES_PER_S)  # host packing before the prototype's copies (1e30: free)
    runtime_reserve_bytes: float | None = Field(None, ge=0.0, le=MAX_BYTES)


class PcieSwitchCfg(Strict):
    """GPUs behind one PCIe switch share its uplink to the host (`hardware.switch_share_bytes_per_s`);
    a field left out takes the catalog default (interconnects.yaml `pcie_switch`, assumed figures)."""

    gpus_per_switch: int | None = Field(None, ge=1, le=GPUS_PER_SWITCH_MAX)
    uplink_bytes_per_s: float | None = Field(None, ge=MIN_BYTES_PER_S, le=MAX_BYTES_PER_S)  # per direction


class HardwareCfg(Strict, QuietDefaults):
    gpu: str = Field("h200-sxm", max_length=MAX_NAME_CHARS)
    link: str | None = Field(None, max_length=MAX_NAME_CHARS)  # default: the GPU's catalog link
    host: str | None = None  # host CPU (sim/catalog/hosts.yaml); default: the GPU entry's
    host_memory_bytes: float | None = Field(None, gt=0, le=MAX_BYTES)
    profile: str | None = Field(None, min_length=1, max_length=MAX_TEXT_CHARS)  # measured profile YAML from `hwprobe calibrate`
    copy_engines: int | None = Field(None, ge=1, le=COPY_ENGINES_MAX)
    efficiency: EfficiencyCfg = EfficiencyCfg()
    pcie_switch: PcieSwitchCfg | None = None  # None: every GPU has its host link to itself
    # operator costs: auto (the default) - AIConfigurator's measured kernel tables (.[measured]) where they
    # cover the GPU and no profile is given, kvtier's datasheet model elsewhere; measured (an error where
    # no table covers the GPU); datasheet (the model, fitted constants where the tables cover the GPU)
    kernels: Literal["datasheet", "measured", "auto"] = "auto"

    QUIET_DEFAULTS = {"pcie_switch": None, "kernels": "auto"}


class WorkloadCfg(Strict, QuietDefaults):
    batch_size: int = Field(1, ge=1, le=MAX_BATCH)
    # a distribution only for served requests (workload.arrivals), drawn per request (sim/inputs/requests.py)
    prompt_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS)] | LengthDist = 256
    reasoning_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | LengthDist = 2048
    seed: int = Field(0, ge=0, le=MAX_SEED)
    arrivals: Arrivals | None = None  # serving (sim/serving): requests arrive; absent: the closed batch above

    QUIET_DEFAULTS = {"arrivals": None}


class ImportanceCfg(Strict):
    """Seeded long-tailed per-token importance (the simulator has no real attention)."""

    # importance = Gamma(gamma_shape) ** gamma_power. Defaults fitted by grid search to the paper's
    # measured shape: top 20% of tokens hold ~56.5% of attention mass, bottom 50% ~8% (under ~10%).
    gamma_shape: float = Field(0.1, gt=0.0, le=100.0)
    gamma_power: float = Field(0.25, gt=0.0, le=10.0)
    drift: float = Field(0.0, ge=0.0, le=1.0)  # share of a token's importance redrawn at each re-tier


class PolicyCfg(Strict, QuietDefaults):
    kind: Literal["full_hbm", "evict_only", "tiered"] = "tiered"
    semantics: Literal["global", "paper_prototype"] = "global"
    # share of each sequence's unprotected tokens kept in T0; `auto`: as much as HBM holds, chosen at
    # each re-tier by memory pressure, evict/compressed ratios then shares of what leaves T0 (sim/tiering/pressure.py)
    hbm_ratio: float | Literal["auto"] = 0.5
    evict_ratio: float = _ratio(0.1)
    compressed_ratio: float = _ratio(0.0)
    compressed_dtype: Literal["int8", "fp8", "int4"] = "int8"
    compressed_group_size: int = Field(64, ge=1, le=GROUP_SIZE_MAX)
    retier_interval: int = Field(64, ge=1, le=MAX_TOKENS)
    sink_tokens: int = Field(4, ge=0, le=MAX_TOKENS)
    recent_window: int = Field(128, ge=0, le=MAX_TOKENS)
    protect_prompt: bool = True
    scoring: Literal["cumulative", "recent"] = "cumulative"
    prefetch: Literal["layerwise_async", "sync_per_step", "per_interval"] = "layerwise_async"
    # how attention reaches T1/T2: prefetch them to the GPU (`prefetch` mode above), attend them on the
    # host where they live (`host_attention`), or per layer a chosen fraction each way (`split`); a
    # sparse-attention model may fetch only the host rows its indexer picks (`sparse_fetch`, on demand)
    access: Literal["prefetch", "host_attention", "split", "sparse_fetch"] = "prefetch"
    staging_buffers: int = Field(2, ge=1, le=STAGING_BUFFERS_MAX)
    pinned: bool = True
    importance: ImportanceCfg = ImportanceCfg()
    # sparse_fetch (sim/device/sparse_fetch.py): share of a step's host-resident picks already on the GPU
    # from the previous step, and how they cross: a copy per row, whole host blocks of fetch_block_tokens,
    # or gathered into one copy per layer
    sparse_reuse: float = Field(0.0, ge=0.0, lt=1.0)
    fetch_copy: Literal["rows", "blocks", "gather"] = "rows"
    fetch_block_tokens: int = Field(64, ge=1, le=MAX_TOKENS)

    QUIET_DEFAULTS = {"sparse_reuse": 0.0, "fetch_copy": "rows", "fetch_block_tokens": 64}

    @property
    def host_access(self) -> bool:
        """T1/T2 attended on the host (host_attention, split): the run needs the host CPU's model."""
        return self.access in ("host_attention", "split")

    @model_validator(mode="after")
    def _access(self):
        if self.access != "prefetch" and self.prefetch != "layerwise_async":
            raise ValueError(f"access {self.access!r} runs with prefetch 'layerwise_async' (its prefetched part is "
                             f"pipelined per layer), got {self.prefetch!r}")
        return self

    @field_validator("hbm_ratio", mode="before")
    @classmethod
    def _hbm_ratio(cls, value):
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise ValueError(f"expected a number from 0 to 1 or 'auto', got {value!r}")
        return float(value)

    @model_validator(mode="after")
    def _ratios(self):
        if self.hbm_ratio == "auto":
            if self.semantics != "global":
                raise ValueError("hbm_ratio 'auto' runs with semantics 'global' (the prototype's host tokens "
                                 "never return, so pressure could not fall back)")
            if self.evict_ratio + self.compressed_ratio > 1.0 + 1e-9:
                raise ValueError(f"with hbm_ratio 'auto', evict_ratio + compressed_ratio are shares of the tokens "
                                 f"leaving T0: {self.evict_ratio + self.compressed_ratio:g}, expected at most 1")
            return self
        total = self.hbm_ratio + self.evict_ratio + self.compressed_ratio
        if total > 1.0 + 1e-9:
            raise ValueError(
                f"hbm_ratio + evict_ratio + compressed_ratio = {total:g}, expected at most 1"
            )
        return self


# The one definition of every policy default: sim/tiering/tiers.py's TierPolicy and hwprobe's CacheOptions
# take theirs from it, so a scenario, the simulator and the real cache cannot disagree.
DEFAULT_POLICY = PolicyCfg()


class SimCfg(Strict):
    # layer: SimPy events per layer (the reference); step: closed-form pipeline per step in SimPy;
    # fast: numpy over all steps, re-tier churn from `fast_rows` sequences (sim/decode/fast.py)
    detail: Literal["layer", "step", "fast"] = "layer"
    fast_rows: int = Field(4, ge=1, le=MAX_BATCH)  # fast level: sequences whose token-level churn stands for the batch
    step_stride: int = Field(1, ge=1, le=MAX_TOKENS)  # simulate every k-th decode step, weight it by k
    record_every: int = Field(1, ge=1, le=MAX_TOKENS)  # per-step CSV keeps every n-th simulated step
    max_batch_limit: int = Field(4096, ge=1, le=MAX_BATCH)  # upper end of the max-batch search


class ParallelCfg(Strict, QuietDefaults):
    """Tensor parallelism: weights, query heads and KV heads sharded over `tp` GPUs (KV heads
    replicated where the model has fewer than `tp`, as vLLM does), two all-reduces per layer.
    Pipeline parallelism (`pp`, vLLM --pipeline-parallel-size): the layers split into pp stages of tp
    GPUs each, up to pp batches in flight (`sim.serving.pipeline`); serving runs only.
    A mixture-of-experts model may split its experts whole over the group instead (`ep: tp`, vLLM
    --enable-expert-parallel, SGLang --ep-size) and run attention data-parallel (`attention_dp`: D
    ranks each holding its own sequences' KV, attention tensor-parallel over tp / D GPUs; SGLang
    --enable-dp-attention --dp D, vLLM --data-parallel-size D with expert parallelism), the tokens
    exchanged with their experts' GPUs and back (`moe_comm`, `sim.device.physics.moe_exchange_s`)."""

    tp: int = Field(1, ge=1, le=64)
    ep: int = Field(1, ge=1, le=64)  # 1: experts split by tensor parallelism; tp: E / tp whole experts per GPU
    attention_dp: int = Field(1, ge=1, le=64)  # attention data-parallel ranks within the tp group
    pp: int = Field(1, ge=1, le=8)  # pipeline stages, each a tp group holding ceil(L / pp) layers (serving runs)
    # attention DP's token exchange with the experts: the engine's default (all-gather + reduce-scatter
    # in vLLM, SGLang and TensorRT-LLM) or an all-to-all (DeepEP-style, each engine's opt-in)
    moe_comm: Literal["engine", "alltoall"] = "engine"

    QUIET_DEFAULTS = {"ep": 1, "attention_dp": 1, "pp": 1, "moe_comm": "engine"}

    @property
    def layout(self) -> tuple[int, int, int]:
        """(tp, ep, attention_dp): what `ModelSpec.shard` takes."""
        return self.tp, self.ep, self.attention_dp


DP_ATTENTION_CONSERVATIVENESS = 0.3  # server_args.py _handle_data_parallelism: schedule_conservativeness x 0.3
SGLANG_RUNNING_CEILING = 4096  # model_runner_kv_cache_mixin.py _resolve_max_num_reqs: a rank's running requests at most
VLLM_LARGE_GPU_GIB = 70  # get_batch_defaults: device memory from which the larger serve defaults apply
VLLM_SERVE_DEFAULTS = {True: (8192, 1024), False: (2048, 256)}  # (max_num_batched_tokens, max_num_seqs) by "large"
MEMORY_KNOB_OWNER = {"gpu_memory_utilization": "vllm", "mem_fraction_static": "sglang",
                     "free_gpu_memory_fraction": "tensorrt-llm"}  # each engine's KV memory fraction


class EngineCfg(Strict, QuietDefaults):
    """The serving engine whose rules set the KV budget, the scheduler's defaults and how steps are
    launched (CUDA graphs or eager); each rule read from the engine's code (docs/scenarios.md).

    vLLM (vllm/v1/worker/gpu_worker.py, `Worker.determine_available_memory`): KV cache = total memory
    x gpu_memory_utilization - (the torch peak of a profiling forward pass of max_num_batched_tokens
    tokens, weights included, + the memory allocated outside torch: CUDA context, NCCL buffers).
    SGLang (python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py, `profile_max_num_token`):
    KV pool = free memory after the weights - free memory before them x (1 - mem_fraction_static), i.e.
    (total - what the CUDA context and NCCL hold) x mem_fraction_static - weights; unset, the fraction
    is server_args.py `_handle_gpu_memory_settings`'s (`device.memory.sglang_mem_fraction_static`).
    TensorRT-LLM (tensorrt_llm/_torch/pyexecutor/_util.py, `KvCacheCreator._cal_max_memory`): KV cache =
    (total memory - the peak of a profiling run: weights + its activations + what lies outside torch)
    x free_gpu_memory_fraction (KvCacheConfig: 0.9).
    The measured kernel tables are the engine's own (`kernel_framework`: AIConfigurator measured vLLM
    0.24, SGLang 0.5.14 and TensorRT-LLM 1.3's PyTorch flow), or another engine's (`kernel_tables`) for
    a release whose kernels those tables do not time (TensorRT-LLM's older TensorRT-engine flow)."""

    QUIET_DEFAULTS = {"gpu_memory_utilization": None, "mem_fraction_static": None, "cuda_graphs": True,
                      "cuda_graph_max_batch": None, "free_gpu_memory_fraction": None, "kernel_tables": "own",
                      "cuda_graph_batch_sizes": None, "cuda_graph_padding": False, "max_model_len": None,
                      "swa_full_tokens_ratio": None, "moe_backend": None,
                      "host_s_per_sequence": None}  # dumps as before these existed

    name: Literal["vllm", "sglang", "tensorrt-llm"]
    version: str = Field(max_length=MAX_NAME_CHARS)  # informational: the engine the rules are read from
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)  # vLLM's; 0.9 by default (CacheConfig)
    mem_fraction_static: float | None = Field(None, gt=0.0, lt=1.0)  # SGLang's; None: its default rule
    free_gpu_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)  # TensorRT-LLM's; 0.9 by default
    kernel_tables: Literal["own", "vllm", "sglang", "trtllm"] = "own"  # whose measured kernel tables apply
    non_torch_bytes: float = Field(1.0e9, ge=0.0, le=MAX_BYTES)  # assumed: CUDA context + NCCL + cuBLAS workspace
    cuda_graphs: bool = True  # both engines capture decode steps as CUDA graphs by default; false: eager
    # largest decode batch a graph is captured for: vLLM's max_cudagraph_capture_size, SGLang's
    # cuda_graph_max_bs; None: the engine's default (`device.engine_rules`)
    cuda_graph_max_batch: int | None = Field(None, ge=1, le=MAX_BATCH)
    # TensorRT-LLM's cuda_graph_config: batch_sizes (each rank's; None: its generated list) and enable_padding
    # (a decode batch padded with dummy requests up to the next captured size: its GEMMs run at that size)
    cuda_graph_batch_sizes: list[Annotated[int, Field(ge=1, le=MAX_BATCH)]] | None = Field(None, min_length=1, max_length=256)
    cuda_graph_padding: bool = False
    # the longest sequence the engine serves: vLLM's --max-model-len, SGLang's --context-length,
    # TensorRT-LLM's max_seq_len; None: the model's context (`ModelSpec.context_tokens`); "auto": vLLM's
    # --max-model-len -1, the longest its KV budget holds one request of (`engine_context`)
    max_model_len: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | Literal["auto"] | None = None
    # SGLang's --swa-full-tokens-ratio: its window pool's tokens per full-attention pool token (a model with
    # window layers); None: its default 0.8 (`device.memory.sglang_swa_pool_shares`)
    swa_full_tokens_ratio: float | None = Field(None, gt=0.0, le=MAX_RATIO)
    # TensorRT-LLM's moe_config.backend, where the run's options set it; None: the engine's own choice. It
    # does not change the cost: the sources say whether the measured MoE table timed that backend's kernel
    moe_backend: Literal[TRTLLM_MOE_BACKENDS] | None = None
    # the engine's host loop a step (scheduling, input preparation, the sampler), per request in the step; it
    # overlaps the GPU's previous step, so a step lasts max(GPU, loop). None: the engine's measured figure
    # (`device.engine_rules.engine_host_s_per_sequence`: TensorRT-LLM's PyTorch executor 11.3 us, others 0)
    host_s_per_sequence: float | None = Field(None, ge=0.0, le=MAX_OVERHEAD_S)

    @model_validator(mode="before")
    @classmethod
    def _engine_defaults(cls, data):
        """Each engine's version read, and vLLM's default gpu_memory_utilization (CacheConfig: 0.9)."""
        # sgl-project/sglang server_args.py commit read; NVIDIA/TensorRT-LLM main as stored in 2026-12
        versions = {"vllm": "0.24.0", "sglang": "main@001067ff", "tensorrt-llm": "main@2026-12"}
        if isinstance(data, dict) and data.get("name") in versions:
            data = {"version": versions[data["name"]], **data}
            if data["name"] == "vllm":
                data = {"gpu_memory_utilization": 0.9, **data}
            if data["name"] == "tensorrt-llm":  # KvCacheConfig.free_gpu_memory_fraction
                data = {"free_gpu_memory_fraction": 0.9, **data}
        return data

    @model_validator(mode="after")
    def _engine_own_keys(self):
        """cuda_graph_batch_sizes and cuda_graph_padding are TensorRT-LLM's cuda_graph_config keys and
        moe_backend its moe_config.backend, swa_full_tokens_ratio SGLang's server argument."""
        if self.name != "sglang" and self.swa_full_tokens_ratio is not None:
            raise ValueError("swa_full_tokens_ratio is SGLang's (--swa-full-tokens-ratio); "
                             f"engine {self.name} has no such setting")
        if self.name != "tensorrt-llm" and self.moe_backend is not None:
            raise ValueError(f"moe_backend is TensorRT-LLM's (moe_config.backend); engine {self.name} has no such "
                             "setting")
        if self.name != "tensorrt-llm" and (self.cuda_graph_batch_sizes is not None or self.cuda_graph_padding):
            raise ValueError("cuda_graph_batch_sizes and cuda_graph_padding are TensorRT-LLM's (cuda_graph_config); "
                             f"{self.name} takes cuda_graph_max_batch")
        return self

    @model_validator(mode="after")
    def _auto_is_vllms(self):
        """max_model_len auto is vLLM's --max-model-len -1; the others take a number."""
        if self.max_model_len == "auto" and self.name != "vllm":
            raise ValueError(f"max_model_len auto is vLLM's (--max-model-len -1); {self.name} takes a number of tokens")
        return self

    @field_validator("gpu_memory_utilization", "mem_fraction_static", "free_gpu_memory_fraction")
    @classmethod
    def _own_engine(cls, value, info):
        """Each engine's memory knob is its own: vLLM's gpu_memory_utilization, SGLang's
        mem_fraction_static, TensorRT-LLM's free_gpu_memory_fraction."""
        name = info.data.get("name")
        if value is not None and name is not None and name != MEMORY_KNOB_OWNER[info.field_name]:
            other = next(k for k, v in MEMORY_KNOB_OWNER.items() if v == name)
            raise ValueError(f"{info.field_name} is {MEMORY_KNOB_OWNER[info.field_name]}'s; {name}'s fraction is {other}")
        if value is None and name == MEMORY_KNOB_OWNER[info.field_name] and name != "sglang":
            raise ValueError("give a fraction in (0, 1]")
        return value

    @property
    def kernel_framework(self) -> str:
        """Whose measured kernel tables apply (`inputs.kernel_tables.FRAMEWORKS`): the engine's own unless
        `kernel_tables` names another's."""
        if self.kernel_tables != "own":
            return self.kernel_tables
        return {"vllm": "vllm", "sglang": "sglang", "tensorrt-llm": "trtllm"}[self.name]

    def sglang_gpu_defaults(self, gpu_memory_bytes: float, tp: int) -> tuple[int, int]:
        """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks by the GPU's memory (nvidia-smi
        memory.total in MiB) and tp (server_args.py `_handle_gpu_memory_settings`): < 20 GiB 2048, 8;
        < 35 GiB 2048, 24 (tp >= 4: 80); < 60 GiB 4096, 32 (160); < 160 GiB 8192, 256 (512); else 16384, 512."""
        tiers = ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (90, 8192, 256, 512),
                 (160, 8192, 256, 512), (float("inf"), 16384, 512, 512))  # (below GiB, cps, max_bs tp < 4, tp >= 4)
        gpu_mem_mib = gpu_memory_bytes / MiB
        _, chunk, small_tp, large_tp = next(t for t in tiers if gpu_mem_mib < t[0] * 1024)
        return chunk, small_tp if tp < 4 else large_tp

    def declared_context(self, model_context: int | None) -> int | None:
        """The longest sequence this engine is declared to serve: max_model_len where a number, else the
        model's context (`ModelSpec.context_tokens`; "auto" shrinks it at run time, `decode.context`)."""
        return self.max_model_len if isinstance(self.max_model_len, int) else model_context

    def context_origin(self, model_name: str) -> str:
        """Where `declared_context` comes from, for people."""
        return "engine.max_model_len" if isinstance(self.max_model_len, int) else f"{model_name}'s context"

    def scheduler_for(self, scheduler: SchedulerCfg, gpu_memory_bytes: float, tp: int, gpu_name: str = "",
                      attention_dp: int = 1, context_tokens: int | None = None) -> SchedulerCfg:
        """The scheduler this engine runs: the scenario's keys where it set them, else the engine's
        defaults. vLLM: `_vllm_scheduler`. SGLang (server_args.py):
        max_num_batched_tokens = chunked_prefill_size by GPU memory (`sglang_gpu_defaults`) with
        chunked prefill, max_prefill_tokens (16384) without; max_num_seqs = SGLANG_RUNNING_CEILING (4096) a
        rank, the cap of its max_running_requests rule, which the serving run applies once the KV pool is
        known (`device.engine_rules.sglang_max_running_requests`: min(pool / context_len x 512 clamped to
        2048..4096, pool // 2), and a set max_num_seqs no higher); mixed_prefill off (enable_mixed_chunk
        False: scheduler.py `get_next_batch_to_run` runs a new prefill batch alone, before the decodes);
        admission reserve_ratio (schedule_policy.py `PrefillAdder`: `sim/serving/new_token_ratio.py`), its
        schedule_conservativeness 1.0, x 0.3 under DP attention (`attention_dp` > 1: server_args.py
        `_handle_data_parallelism`)."""
        if self.name == "tensorrt-llm":
            return self._trtllm_scheduler(scheduler)
        if self.name == "vllm":
            return self._vllm_scheduler(scheduler, gpu_memory_bytes, gpu_name, self.declared_context(context_tokens))
        unset = ({"max_num_batched_tokens", "max_num_seqs", "mixed_prefill", "admission", "schedule_conservativeness"}
                 - scheduler.model_fields_set)
        chunk = self.sglang_gpu_defaults(gpu_memory_bytes, tp)[0] if scheduler.chunked_prefill else 16384
        update = {"max_num_batched_tokens": chunk, "max_num_seqs": SGLANG_RUNNING_CEILING * attention_dp,
                  "mixed_prefill": False, "admission": "reserve_ratio",
                  "schedule_conservativeness": DP_ATTENTION_CONSERVATIVENESS if attention_dp > 1 else 1.0}
        return scheduler.model_copy(update={k: v for k, v in update.items() if k in unset})

    @staticmethod
    def _vllm_scheduler(scheduler: SchedulerCfg, gpu_memory_bytes: float, gpu_name: str,
                        context_tokens: int | None) -> SchedulerCfg:
        """vLLM's defaults for `vllm serve` (vllm/engine/arg_utils.py `get_batch_defaults`,
        OPENAI_API_SERVER, and `_set_default_max_num_seqs_and_batched_tokens_args`): on a GPU of at
        least 70 GiB that is not an A100 ("GPUs like H100 and MI300x"; A100s regressed with the larger
        budget, its PR #17885) max_num_batched_tokens 8192 and max_num_seqs 1024, else 2048 and 256;
        max_num_seqs no more than max_num_batched_tokens. Without chunked prefill vLLM takes
        max(max_model_len, that) tokens, a whole longest prompt a step (`context_tokens`: the declared
        max_model_len; None, a model without a context: kvtier's budget stays)."""
        large = gpu_memory_bytes >= VLLM_LARGE_GPU_GIB * GiB and "a100" not in gpu_name.lower()
        tokens, seqs = VLLM_SERVE_DEFAULTS[large]
        unset = {"max_num_batched_tokens", "max_num_seqs"} - scheduler.model_fields_set
        if "max_num_batched_tokens" in unset and (scheduler.chunked_prefill or context_tokens is not None):
            tokens = tokens if scheduler.chunked_prefill else max(context_tokens, tokens)
            scheduler = scheduler.model_copy(update={"max_num_batched_tokens": tokens})
        if "max_num_seqs" in unset:
            scheduler = scheduler.model_copy(update={"max_num_seqs": min(seqs, scheduler.max_num_batched_tokens)})
        return scheduler

    def _trtllm_scheduler(self, scheduler: SchedulerCfg) -> SchedulerCfg:
        """TensorRT-LLM's defaults (tensorrt_llm/llmapi/llm_args.py): max_batch_size 2048 as max_num_seqs,
        max_num_tokens 8192 as max_num_batched_tokens, enable_chunked_prefill False, and the capacity
        policy GUARANTEED_NO_EVICT (admission no_evict); each where the scenario set none."""
        defaults = {"max_num_seqs": 2048, "max_num_batched_tokens": 8192, "chunked_prefill": False, "admission": "no_evict"}
        unset = set(defaults) - scheduler.model_fields_set
        return scheduler.model_copy(update={k: v for k, v in defaults.items() if k in unset})


class Scenario(Strict):
    name: str = Field("scenario", min_length=1, max_length=MAX_NAME_CHARS)
    description: str = Field("", max_length=MAX_TEXT_CHARS)
    model: ModelCfg
    hardware: HardwareCfg = HardwareCfg()
    workload: WorkloadCfg = WorkloadCfg()
    policy: PolicyCfg = PolicyCfg()
    parallel: ParallelCfg = ParallelCfg()
    sim: SimCfg = SimCfg()
    scheduler: SchedulerCfg = SchedulerCfg()  # continuous batching, for workload.arrivals
    slo: SloCfg | None = None  # goodput targets, for workload.arrivals
    engine: EngineCfg | None = None  # an engine's memory rule for the KV budget; None: kvtier's flat reserve

    @model_serializer(mode="wrap")
    def _closed_batch_unchanged(self, handler):
        """A closed batch dumps (resolved scenario, sweep hashes) as it did before serving existed."""
        data = handler(self)
        if self.engine is None:  # unset: resolved scenarios and sweep hashes as before the section existed
            data.pop("engine", None)
        if self.workload.arrivals is None:
            data.pop("scheduler", None)
            data.pop("slo", None)
        return data


# ---- loading ------------------------------------------------------------------------------

_UNION_TAGS = ("int", "constrained-int", "LengthDist", *ARRIVAL_KINDS)  # pydantic's names of a union's branches in `loc`


def _field_path(loc: tuple) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p in _UNION_TAGS))]
    return ".".join(parts) or "(top level)"


def validation_error_line(err: ValidationError, source: str) -> ConfigError:
    errors = err.errors()
    # For `int | LengthDist` fields, report the error of the branch the input's kind selects: the
    # mapping branch for a mapping, the integer branch for anything else.
    specific = [e for e in errors if e["type"] != "model_type"
                and not (e["loc"] and e["loc"][-1] in ("int", "constrained-int") and isinstance(e["input"], dict))]
    first = (specific or errors)[0]
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    if first["type"] == "union_tag_not_found":  # a tagged union (workload.arrivals) without its tag
        msg = f"missing key {first['ctx']['discriminator']}"
    return ConfigError(msg, source=source, field=_field_path(first["loc"]))


def apply_overrides(data: dict, overrides: list[str], source: str) -> dict:
    """`a.b.c=value` (value parsed as YAML) set into a nested dict copy."""
    import copy

    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key.path=value, got {item!r}", source=source)
        try:
            value = parse_yaml(raw, "--set", check=False) if raw != "" else ""  # checked with the whole tree
        except ConfigError:  # not YAML: the text itself (refused by the schema unless a string is expected)
            value = raw
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"cannot set {key!r}: {p!r} is not a mapping", source=source)
            node = child
        node[parts[-1]] = value
    return out


def scenario_from_dict(data: Any, source: str, overrides: list[str] | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", source=source)
    data = apply_overrides(data, overrides or [], source)
    check_tree(data, source)
    try:
        scenario = Scenario.model_validate(data, strict=True)
    except ValidationError as err:
        raise validation_error_line(err, source) from None
    check_catalog_names(scenario, source)
    if scenario.engine is not None and scenario.workload.arrivals is not None:
        # a serving run under an engine takes that engine's scheduler defaults where the scenario set none
        gpu_bytes = catalog.gpu(scenario.hardware.gpu).memory_bytes
        scheduler = scenario.engine.scheduler_for(scenario.scheduler, gpu_bytes, scenario.parallel.tp,
                                                  scenario.hardware.gpu, scenario.parallel.attention_dp,
                                                  catalog.resolve_model(scenario.model).context_tokens)
        scenario = scenario.model_copy(update={"scheduler": scheduler})
    check_simulable(scenario, source)
    check_serving(scenario, source)
    check_context(scenario, source)
    return scenario


def check_simulable(scenario: Scenario, source: str) -> None:
    """Sizes no run could hold are refused at load, naming the limit: the longest drawn reasoning
    length, the per-token state of the batch and (detail 'layer') the SimPy events per layer."""
    w = scenario.workload
    prompt = w.prompt_tokens
    if isinstance(prompt, LengthDist):
        if w.arrivals is None:
            raise ConfigError("a prompt-length distribution applies to a serving run (workload.arrivals); a closed "
                              "batch has one prompt length: give an integer", source=source, field="workload.prompt_tokens")
        prompt = int(draw_prompts(w, w.batch_size).max())
    longest = int(draw_lengths(w, w.batch_size).max())
    if longest > MAX_TOKENS:
        raise ConfigError(f"draws a reasoning length of {longest:,} tokens, more than {MAX_TOKENS:,}; give a max",
                          source=source, field="workload.reasoning_tokens")
    slots = w.batch_size * (prompt + longest)
    if slots > MAX_TOKEN_SLOTS:
        raise ConfigError(f"batch_size x (prompt_tokens + longest reasoning) = {slots:,} tokens, more than the "
                          f"{MAX_TOKEN_SLOTS:,} a run can hold", source=source, field="workload.batch_size")
    if scenario.sim.detail == "layer":
        layers = catalog.resolve_model(scenario.model).num_layers
        events = -(-longest // scenario.sim.step_stride) * layers
        if events > MAX_LAYER_STEPS:
            raise ConfigError(f"{events:,} simulated layer-steps (steps / step_stride x {layers} layers), more than "
                              f"{MAX_LAYER_STEPS:,}; use sim.detail: step or a larger sim.step_stride",
                              source=source, field="sim.detail")


def check_catalog_names(scenario: Scenario, source: str) -> None:
    """Unknown model, GPU or link names fail at load, naming the file and the field."""
    checks = [("model.name", scenario.model.name, catalog.model), ("hardware.gpu", scenario.hardware.gpu, catalog.gpu),
              ("hardware.link", scenario.hardware.link, catalog.link), ("hardware.host", scenario.hardware.host, catalog.host)]
    if scenario.model.hf_config is not None:
        try:
            catalog.model_from_hf_config(scenario.model.hf_config)
        except ConfigError as err:
            where = ": ".join(p for p in (err.source, err.field) if p)
            raise ConfigError(f"{where}: {err.message}", source=source, field="model.hf_config") from None
    for field, value, lookup in checks:
        if value is None:
            continue
        try:
            lookup(value)
        except ConfigError as err:
            raise ConfigError(err.message, source=source, field=field) from None
    if scenario.hardware.kernels == "measured":
        check_measured_kernels(scenario.hardware.gpu, source)
    if scenario.parallel.tp > NODE_GPUS:
        raise ConfigError(f"tp {scenario.parallel.tp} spans more than one {NODE_GPUS}-GPU node: tensor, expert and "
                          f"attention parallelism across nodes (InfiniBand collectives) are not modelled; use replicas "
                          f"or disaggregated pools (kvsim plan)", source=source, field="parallel.tp")
    _check_against_model(scenario, source)


def _check_against_model(scenario: Scenario, source: str) -> None:
    """What the model must be for the scenario's layout, routing skew and access (resolved once)."""
    spec = catalog.resolve_model(scenario.model)
    if scenario.parallel.layout != (1, 1, 1):
        problem = spec.parallel_problem(*scenario.parallel.layout)
        if problem:
            raise ConfigError(problem[1], source=source, field=problem[0])
    if scenario.parallel.pp > 1:
        _check_pipeline(scenario, source, spec)
    if scenario.model.expert_weight_dtype and not spec.is_moe:
        raise ConfigError(f"expert_weight_dtype applies to a mixture-of-experts model; {spec.name} is dense",
                          source=source, field="model.expert_weight_dtype")
    if scenario.model.routing_skew and not spec.is_moe:
        raise ConfigError(f"routing_skew applies to a mixture-of-experts model; {spec.name} is dense", source=source,
                          field="model.routing_skew")
    if scenario.model.moe_routing and not spec.is_moe:
        raise ConfigError(f"moe_routing applies to a mixture-of-experts model; {spec.name} is dense", source=source,
                          field="model.moe_routing")
    if scenario.model.moe_routing and scenario.model.routing_skew:
        raise ConfigError("give routing_skew (the datasheet model's expert popularity) or moe_routing (the measured "
                          "tables' routing), not both: a skewed run takes the datasheet model", source=source,
                          field="model.moe_routing")
    if scenario.policy.access == "sparse_fetch" and SPARSE not in spec.kind_counts:
        raise ConfigError(f"sparse_fetch needs a sparse-attention model (config.json index_topk, e.g. deepseek-v3.2); "
                          f"{spec.name} attends every token", source=source, field="policy.access")


def _check_pipeline(scenario: Scenario, source: str, spec) -> None:
    """Pipeline parallelism as `sim.serving.pipeline` models it: a serving run, one node, stages of
    alike layers, and no K/V on the host (each stage's own link traffic is not modelled)."""
    pp, tp, p = scenario.parallel.pp, scenario.parallel.tp, scenario.policy
    if scenario.workload.arrivals is None:
        raise ConfigError("pipeline parallelism is modelled for serving runs (give workload.arrivals): a closed batch "
                          "would go through the stages one at a time", source=source, field="parallel.pp")
    if tp * pp > NODE_GPUS:
        raise ConfigError(f"tp {tp} x pp {pp} spans more than one {NODE_GPUS}-GPU node: stages across nodes "
                          f"(sends over InfiniBand) are not modelled", source=source, field="parallel.pp")
    problem = spec.pipeline_problem(pp)
    if problem:
        raise ConfigError(problem, source=source, field="parallel.pp")
    host = p.kind == "tiered" and (p.hbm_ratio == "auto" or p.hbm_ratio < 1.0 - p.evict_ratio)
    if host or scenario.scheduler.preemption == "swap":
        what = "a tiered policy's host tiers" if host else "swap preemption"
        raise ConfigError(f"pipeline parallelism with {what}: each stage's own host-link traffic is not modelled; "
                          f"use full_hbm or evict_only (and recompute preemption)", source=source, field="parallel.pp")


def check_measured_kernels(gpu: str, source: str) -> None:
    """Measured kernels need tables of this GPU and the package that ships them."""
    if kernel_tables.system_for(catalog.gpu(gpu).name) is None or not kernel_tables.tables_available():
        try:
            kernel_tables.load_tables(catalog.gpu(gpu).name)
        except ConfigError as err:
            raise ConfigError(err.message, source=source, field="hardware.kernels") from None


def read_yaml(path: str | Path) -> Any:
    """A YAML document, size-capped and checked (see sim/inputs/reader.py); any failure a ConfigError."""
    return _read_yaml(path)


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Load and validate; a relative `model.hf_config` or trace `workload.arrivals.path` is taken
    relative to the scenario file."""
    data = read_yaml(path)
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        hf = data["model"].get("hf_config")
        if isinstance(hf, str) and not Path(hf).is_absolute() and (Path(path).parent / hf).exists():
            data = {**data, "model": {**data["model"], "hf_config": str(Path(path).parent / hf)}}
    arrivals = data.get("workload", {}).get("arrivals") if isinstance(data, dict) and isinstance(data.get("workload"), dict) else None
    if isinstance(arrivals, dict) and isinstance(arrivals.get("path"), str):
        trace = arrivals["path"]
        if not Path(trace).is_absolute() and (Path(path).parent / trace).exists():
            data = {**data, "workload": {**data["workload"], "arrivals": {**arrivals, "path": str(Path(path).parent / trace)}}}
    return scenario_from_dict(data, str(path), overrides)


def scenario_to_yaml(scenario: Scenario) -> str:
    return yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False)
