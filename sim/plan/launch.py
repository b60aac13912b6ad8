"""The launch command for one chosen plan configuration, on the real engines: `vllm serve ...` and
`python -m sglang.launch_server ...`, and `trtllm-serve ...` where the plan ran under `engine:
tensorrt-llm`, one line each, with a trailing shell comment for what the plan asks that the engine
cannot do (token eviction, host-side attention, the HBM share of a tiered policy).

Pure: the command builders import only the standard library (no torch, nothing of sim); `hf_model_id`
reads the model catalog with pyyaml, imported inside it.

Inputs are one replica's: `tp` GPUs per replica, `dp` replicas; `max_num_seqs`,
`max_num_batched_tokens` and `host_offload_bytes` (the host KV pool, all of the replica's TP ranks
together) are per replica, as the plan simulates them (sim/plan/search.py: each replica at rate / dp).

Flags verified against (public source, read when this module was written):
- vLLM: vllm-project/vllm vllm/engine/arg_utils.py (--tensor-parallel-size, --data-parallel-size,
  --max-num-seqs, --max-num-batched-tokens, --gpu-memory-utilization, --quantization, --kv-cache-dtype,
  --kv-offloading-size, --kv-offloading-backend; bool fields become argparse.BooleanOptionalAction,
  hence --enable-chunked-prefill / --no-enable-chunked-prefill), vllm/config/cache.py (CacheDType has
  "fp8" = fp8_e4m3; kv_offloading_size is "in GiB ... the total buffer size summed across all TP
  ranks"; KVOffloadingBackend = "native" | "lmcache") and vllm/config/kv_offloading.py (the size is
  split over tensor x pipeline ranks of one engine, so each data-parallel engine gets all of it).
  Older vLLM releases (the 0.10-era arg_utils.py) have no --kv-offloading-* flags.
- SGLang: sgl-project/sglang python/sglang/srt/server_args.py (--tp-size, --dp-size,
  --max-running-requests, --chunked-prefill-size with -1 = chunked prefill off, --max-prefill-tokens,
  --mem-fraction-static, --quantization fp8, --kv-cache-dtype whose fp8 choice is "fp8_e4m3" (no bare
  "fp8"), --enable-hierarchical-cache, --hicache-ratio, --hicache-size: an int, "in gigabytes"),
  docs/advanced_features/hicache_design.md (--hicache-size is allocated "for each rank"; a version of
  it says 1GB = 1e9 bytes) and python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py
  (_resolve_max_num_reqs: --max-running-requests // dp_size, where ModelRunner's dp_size is
  server_args.dp_size only with --enable-dp-attention, else 1).
- TensorRT-LLM: NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py (`trtllm-serve MODEL`, click options
  --backend pytorch, --tp_size (alias of --tensor_parallel_size), --pp_size, --ep_size (alias of
  --moe_expert_parallel_size), --max_batch_size, --max_num_tokens, --kv_cache_free_gpu_memory_fraction
  (alias of --free_gpu_memory_fraction), --extra_llm_api_options FILE.yaml (alias --config): a YAML of
  LLM API arguments that overrides what the flags set; no data-parallel flag), tensorrt_llm/llmapi/
  llm_args.py (enable_chunked_prefill, enable_attention_dp, KvCacheConfig's dtype ("auto" or "fp8"),
  free_gpu_memory_fraction and host_cache_size: "size of the host cache in bytes", per rank as each
  rank has its own KV cache manager) and tensorrt_llm/llmapi/llm_utils.py
  (update_llm_args_with_extra_dict: `llm_args | yaml`, so a YAML kv_cache_config replaces the one the
  --kv_cache_free_gpu_memory_fraction flag built - hence the fraction is repeated inside it).
  Newer trtllm-serve also has an --enable_chunked_prefill flag (prototype); the YAML key works in
  releases with and without it.
"""

from __future__ import annotations

import math
import re
import shlex
from functools import cache

GIB_BYTES = 1 << 30  # vLLM's --kv-offloading-size unit
GB_BYTES = 10**9  # SGLang's --hicache-size unit

ACCESS = ("prefetch", "host_attention", "split", "sparse_fetch")  # a tiered policy's /ACCESS suffix, as sim/plan/search.py
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "nvfp4", "mxfp4")
KV_DTYPES = ("bf16", "fp16", "fp8", "fp8_e4m3", "int8")
FP8_KV_DTYPES = ("fp8", "fp8_e4m3")

_ACCESS_MEANS = {
    "host_attention": "attention over the host-resident KV computed on the host CPU",
    "split": "per layer part of the host-resident KV attended on the host CPU, the rest prefetched",
    "sparse_fetch": "only the host-resident rows the indexer picks fetched, per layer, on demand",
}


def _parse_policy(policy: str) -> tuple[str, str | None]:
    """(kind, access) of a plan policy string: full_hbm, evict_only, tiered:RATIO or tiered:auto,
    a tiered one optionally as tiered:X/ACCESS. Raises ValueError on anything else."""
    name, slash, access = policy.partition("/")
    if name in ("full_hbm", "evict_only") and not slash:
        return name, None
    if name.startswith("tiered:") and (not slash or access in ACCESS):
        ratio = name.removeprefix("tiered:")
        if ratio == "auto" or _is_fraction(ratio):
            return "tiered", (None if access in ("", "prefetch") else access)
    raise ValueError(f"expected full_hbm, evict_only, tiered:RATIO or tiered:auto (optionally /ACCESS with ACCESS "
                     f"one of {', '.join(ACCESS)}), got {policy!r}")


def _is_fraction(text: str) -> bool:
    try:
        return 0.0 < float(text) <= 1.0
    except ValueError:
        return False


def _check(tp: int, dp: int, max_num_seqs: int, max_num_batched_tokens: int, gpu_memory_utilization: float,
           weight_dtype: str, kv_dtype: str, fraction_name: str = "gpu_memory_utilization") -> None:
    """ValueError on a layout or dtype no engine command can be written for (`fraction_name`: the
    engine's name for the memory fraction, as the message says it)."""
    for name, value in (("tp", tp), ("dp", dp), ("max_num_seqs", max_num_seqs),
                        ("max_num_batched_tokens", max_num_batched_tokens)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"{fraction_name} must be in (0, 1], got {gpu_memory_utilization!r}")
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {weight_dtype!r}")
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")


def _ceil_div(amount_bytes: float, unit_bytes: int) -> int:
    """ceil(amount / unit) in integers, so exact multiples do not round up on float error."""
    return -(-math.ceil(amount_bytes) // unit_bytes)


def _dtype_args(engine: str, weight_dtype: str, kv_dtype: str, notes: list[str]) -> list[str]:
    """--dtype / --quantization / --kv-cache-dtype for `engine` ("vllm" or "sglang"); what has no flag
    goes to `notes`. bf16 weights and 16-bit KV are the engines' "auto" (the model's dtype, same bytes): no flag."""
    args = []
    if weight_dtype == "fp16":
        args += ["--dtype", "float16"]
    elif weight_dtype == "fp8":  # online fp8 quantization of a 16-bit checkpoint in both engines
        args += ["--quantization", "fp8"]
    elif weight_dtype in ("int8", "int4"):
        notes.append(f"weight_dtype {weight_dtype}: serve a checkpoint already quantized (e.g. AWQ/GPTQ, gpt-oss's "
                     f"MXFP4); the engine reads the method from the checkpoint's config, no flag added")
    elif weight_dtype in ("nvfp4", "mxfp4"):  # neither engine quantises to them online
        example = ("NVIDIA's ModelOpt '-FP4' or a compressed-tensors nvfp4 one" if weight_dtype == "nvfp4"
                   else "gpt-oss's")
        notes.append(f"weight_dtype {weight_dtype}: serve an {weight_dtype.upper()} checkpoint (e.g. {example}); the "
                     f"engine reads the method from the checkpoint's config, no flag added")
    if kv_dtype in FP8_KV_DTYPES:
        args += ["--kv-cache-dtype", "fp8" if engine == "vllm" else "fp8_e4m3"]
    elif kv_dtype == "int8":
        notes.append("kv_dtype int8 (grouped, with scales): no matching --kv-cache-dtype verified; the engine keeps "
                     "the KV cache in the model dtype")
    return args


def _policy_notes(engine: str, policy: str, host_offload_bytes: float | None) -> list[str]:
    """What the engine (its display name) cannot do of `policy`, one phrase each."""
    kind, access = _parse_policy(policy)
    notes = []
    if kind == "evict_only":
        notes.append(f"evict_only: {engine} does not evict tokens (eviction is lossy and not supported by the "
                     f"engine); this command keeps the whole KV cache in HBM")
    if kind == "tiered":
        notes.append(f"{policy.partition('/')[0]}: {engine} keeps each running request's whole KV cache in HBM and "
                     f"uses the host pool for blocks dropped from HBM (a prefix-cache tier); the HBM share of a "
                     f"live request has no {engine} flag")
        if not host_offload_bytes or host_offload_bytes <= 0:
            notes.append("no host KV bytes given (None or 0): host offload flags left out")
    if access is not None:
        notes.append(f"{access} access ({_ACCESS_MEANS[access]}) has no {engine} equivalent; no flag added")
    return notes


def _line(args: list[str], notes: list[str]) -> str:
    """The command on one line, then the notes as one trailing shell comment."""
    command = " ".join(args)
    return f"{command}  # {'; '.join(notes)}" if notes else command


def vllm_serve_command(model_id: str, tp: int, dp: int, max_num_seqs: int, max_num_batched_tokens: int,
                       gpu_memory_utilization: float, chunked_prefill: bool, policy: str,
                       host_offload_bytes: float | None, weight_dtype: str, kv_dtype: str) -> str:
    """`vllm serve MODEL ...` for one plan configuration (vLLM main's flags; see the module docstring).

    Maps tp -> --tensor-parallel-size, dp -> --data-parallel-size, max_num_seqs -> --max-num-seqs and
    max_num_batched_tokens -> --max-num-batched-tokens (each per engine, i.e. per replica: every DP rank
    runs its own scheduler), gpu_memory_utilization -> --gpu-memory-utilization, chunked_prefill ->
    --enable-chunked-prefill / --no-enable-chunked-prefill. Every one is stated: vLLM's defaults for
    them have changed between releases (e.g. 0.90 -> 0.92 utilization) or depend on the GPU.
    A tiered policy adds vLLM's CPU KV offloading (the native OffloadingConnector) sized to
    host_offload_bytes in GiB rounded up: --kv-offloading-size is one engine's buffer over all its TP
    ranks, the same scope as host_offload_bytes. evict_only, the HBM share of a tiered policy and
    host_attention / split access have no vLLM equivalent: said in a trailing comment, no flag invented.
    """
    kind, _ = _parse_policy(policy)
    _check(tp, dp, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, weight_dtype, kv_dtype)
    args = ["vllm", "serve", shlex.quote(model_id),
            "--tensor-parallel-size", str(int(tp)), "--data-parallel-size", str(int(dp)),
            "--max-num-seqs", str(int(max_num_seqs)), "--max-num-batched-tokens", str(int(max_num_batched_tokens)),
            "--gpu-memory-utilization", f"{gpu_memory_utilization:g}",
            "--enable-chunked-prefill" if chunked_prefill else "--no-enable-chunked-prefill"]
    notes: list[str] = []
    args += _dtype_args("vllm", weight_dtype, kv_dtype, notes)
    if kind == "tiered" and host_offload_bytes and host_offload_bytes > 0:
        args += ["--kv-offloading-backend", "native",
                 "--kv-offloading-size", str(_ceil_div(host_offload_bytes, GIB_BYTES))]
    return _line(args, notes + _policy_notes("vLLM", policy, host_offload_bytes))


def sglang_launch_command(model_id: str, tp: int, dp: int, max_num_seqs: int, max_num_batched_tokens: int,
                          gpu_memory_utilization: float, chunked_prefill: bool, policy: str,
                          host_offload_bytes: float | None, weight_dtype: str, kv_dtype: str, *,
                          mem_fraction_static: float | None = None, mixed_chunk: bool = False) -> str:
    """`python -m sglang.launch_server --model-path MODEL ...` for one plan configuration (SGLang main's
    python/sglang/srt/server_args.py; see the module docstring).

    Maps tp -> --tp-size, dp -> --dp-size, max_num_seqs -> --max-running-requests (per replica: current
    SGLang divides it by dp_size only with --enable-dp-attention, which this command does not set),
    max_num_batched_tokens -> --chunked-prefill-size when chunked prefill is on, else
    --chunked-prefill-size -1 (off) with --max-prefill-tokens; gpu_memory_utilization ->
    --mem-fraction-static (SGLang's fraction covers weights and the KV pool only, vLLM's everything), or
    `mem_fraction_static` where given: the SGLang fraction the plan ran with (scenario engine: sglang,
    its mem_fraction_static or the default of sim/device/memory.py sglang_mem_fraction_static).
    `mixed_chunk` (the plan's steps mixed prefill chunks with the decodes, kvtier's and vLLM's way, with
    chunked prefill on) adds --enable-mixed-chunk: SGLang otherwise runs a prefill batch alone.
    A tiered policy adds SGLang's hierarchical cache (HiCache) with --hicache-size: decimal GB per TP
    rank, an int, so host_offload_bytes / tp rounded up. SGLang's HiCache docs require the host pool to
    be larger than the device KV pool (--hicache-ratio at least 1 or 2, by version); this function does
    not know the device pool and cannot check that. What SGLang cannot do of the policy goes to a
    trailing comment, as for vLLM.
    """
    kind, _ = _parse_policy(policy)
    _check(tp, dp, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, weight_dtype, kv_dtype)
    args = ["python", "-m", "sglang.launch_server", "--model-path", shlex.quote(model_id),
            "--tp-size", str(int(tp)), "--dp-size", str(int(dp)), "--max-running-requests", str(int(max_num_seqs))]
    if chunked_prefill:
        args += ["--chunked-prefill-size", str(int(max_num_batched_tokens))] + ["--enable-mixed-chunk"] * mixed_chunk
    else:
        args += ["--chunked-prefill-size", "-1", "--max-prefill-tokens", str(int(max_num_batched_tokens))]
    if mem_fraction_static is not None and not 0.0 < mem_fraction_static < 1.0:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static!r}")
    fraction = gpu_memory_utilization if mem_fraction_static is None else mem_fraction_static
    args += ["--mem-fraction-static", f"{fraction:g}"]
    notes: list[str] = []
    args += _dtype_args("sglang", weight_dtype, kv_dtype, notes)
    if kind == "tiered" and host_offload_bytes and host_offload_bytes > 0:
        per_rank_gb = _ceil_div(_ceil_div(host_offload_bytes, int(tp)), GB_BYTES)
        args += ["--enable-hierarchical-cache", "--hicache-size", str(per_rank_gb)]
    return _line(args, notes + _policy_notes("SGLang", policy, host_offload_bytes))


EXTRA_OPTIONS_FILE = "extra_llm_api_options.yaml"  # trtllm-serve --extra_llm_api_options; its content in the comment


def trtllm_serve_command(model_id: str, tp: int, dp: int, max_num_seqs: int, max_num_batched_tokens: int,
                         free_gpu_memory_fraction: float, chunked_prefill: bool, policy: str,
                         host_offload_bytes: float | None, weight_dtype: str, kv_dtype: str, *,
                         ep_size: int | None = None, attention_dp: bool = False) -> str:
    """`trtllm-serve MODEL --backend pytorch ...` for one plan configuration (TensorRT-LLM's
    tensorrt_llm/commands/serve.py; see the module docstring).

    Maps tp -> --tp_size (with --pp_size 1), max_num_seqs -> --max_batch_size, max_num_batched_tokens
    -> --max_num_tokens, free_gpu_memory_fraction (the fraction the plan ran with: scenario engine
    tensorrt-llm, 0.9 by default) -> --kv_cache_free_gpu_memory_fraction. trtllm-serve has no
    data-parallel flag: dp > 1 replicas are one server per tp-GPU group behind the load balancer, said
    in the comment. `ep_size` adds --ep_size (expert parallel MoE layers); without it the flag is left
    out. `attention_dp`: attention data-parallel over the tp ranks (enable_attention_dp in the YAML);
    TensorRT-LLM's --max_batch_size is then per rank, so it is max_num_seqs / tp rounded up (the
    group's cap over its ranks); --max_num_tokens stays as given.
    What has no flag goes into the extra LLM API options YAML - chunked prefill (off by default, so
    only when on), fp8 KV (kv_cache_config dtype fp8), a tiered policy's host KV cache for offloaded
    reusable blocks (kv_cache_config host_cache_size: bytes per rank, host_offload_bytes / tp rounded
    up) - and --extra_llm_api_options extra_llm_api_options.yaml is added only when the YAML has
    something, its content written in the trailing comment (the command stays one line). A YAML
    kv_cache_config replaces the flag's, so it repeats free_gpu_memory_fraction. Weights: the PyTorch
    backend serves pre-quantized checkpoints and has no online quantisation flag, so fp8 / int8 / int4
    weights are a note; what TensorRT-LLM cannot do of the policy is a note, as for vLLM.
    """
    kind, _ = _parse_policy(policy)
    _check(tp, dp, max_num_seqs, max_num_batched_tokens, free_gpu_memory_fraction, weight_dtype, kv_dtype,
           "free_gpu_memory_fraction")
    batch = _ceil_div(max_num_seqs, int(tp)) if attention_dp else int(max_num_seqs)
    args = ["trtllm-serve", shlex.quote(model_id), "--backend", "pytorch", "--tp_size", str(int(tp)), "--pp_size", "1"]
    if ep_size is not None:
        args += ["--ep_size", str(int(ep_size))]
    args += ["--max_batch_size", str(batch), "--max_num_tokens", str(int(max_num_batched_tokens)),
             "--kv_cache_free_gpu_memory_fraction", f"{free_gpu_memory_fraction:g}"]
    notes: list[str] = []
    kv_cache: dict = {}
    if kv_dtype in FP8_KV_DTYPES:
        kv_cache["dtype"] = "fp8"
    if kind == "tiered" and host_offload_bytes and host_offload_bytes > 0:
        kv_cache["host_cache_size"] = _ceil_div(host_offload_bytes, int(tp))
    extra = {**({"enable_chunked_prefill": True} if chunked_prefill else {}),
             **({"enable_attention_dp": True} if attention_dp else {}),
             **({"kv_cache_config": {"free_gpu_memory_fraction": free_gpu_memory_fraction, **kv_cache}}
                if kv_cache else {})}
    if extra:
        args += ["--extra_llm_api_options", EXTRA_OPTIONS_FILE]
        notes.append(f"{EXTRA_OPTIONS_FILE}: {_flow_yaml(extra)}")
    notes += _trtllm_dtype_notes(weight_dtype, kv_dtype) + _policy_notes("TensorRT-LLM", policy, host_offload_bytes)
    return _line(args, notes + ([_replica_note(tp, dp)] if dp > 1 else []))


# Pre-quantized checkpoints of each weight format, as examples for the note (TensorRT-LLM reads
# hf_quant_config.json / the config's quantization_config of a ModelOpt, AWQ or GPTQ checkpoint).
_TRTLLM_CHECKPOINTS = {"fp8": "ModelOpt FP8", "int8": "int8 weight-only, W8A16", "int4": "AWQ/GPTQ int4",
                       "nvfp4": "ModelOpt NVFP4", "mxfp4": "gpt-oss's MXFP4"}


def _trtllm_dtype_notes(weight_dtype: str, kv_dtype: str) -> list[str]:
    """What TensorRT-LLM's command cannot say of the dtypes: bf16 weights and 16-bit or fp8 KV need no note."""
    notes = []
    if weight_dtype == "fp16":
        notes.append("weight_dtype fp16: no flag; TensorRT-LLM uses the checkpoint's dtype (serve a float16 one)")
    elif weight_dtype in _TRTLLM_CHECKPOINTS:
        notes.append(f"weight_dtype {weight_dtype}: TensorRT-LLM's PyTorch backend has no online quantization; serve "
                     f"a checkpoint already quantized in {weight_dtype} (e.g. {_TRTLLM_CHECKPOINTS[weight_dtype]}); "
                     f"the engine reads the method from the checkpoint's config, no flag added")
    if kv_dtype == "int8":
        notes.append("kv_dtype int8 (grouped, with scales): no matching kv_cache_config dtype verified; the engine "
                     "keeps the KV cache in the model dtype")
    return notes


def _flow_yaml(mapping: dict) -> str:
    """`mapping` as one line of YAML flow style: {key: value, key: {key: value}}; bools as true / false."""
    def text(value) -> str:
        if isinstance(value, dict):
            return _flow_yaml(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        return f"{value:g}" if isinstance(value, float) else str(value)
    return "{" + ", ".join(f"{key}: {text(value)}" for key, value in mapping.items()) + "}"


def launch_commands(model_id: str, tp: int, dp: int, max_num_seqs: int, max_num_batched_tokens: int,
                    gpu_memory_utilization: float, chunked_prefill: bool, policy: str,
                    host_offload_bytes: float | None, weight_dtype: str, kv_dtype: str,
                    experts: str | None = None, moe: bool = False,
                    mem_fraction_static: float | None = None,
                    trtllm_fraction: float | None = None, mixed_chunk: bool = False) -> dict[str, str]:
    """{"vllm": vllm_serve_command(...), "sglang": sglang_launch_command(...)} for the same inputs;
    a mixture of experts' layout `experts` as `expert_commands` says. A mixture of experts (`moe`,
    or any `experts` layout) never takes --data-parallel-size for its replicas: vLLM runs the
    data-parallel ranks of an MoE model in lockstep as one expert group of dp x tp GPUs
    (docs/serving/data_parallel_deployment.md), not the independent replicas the plan simulates -
    so one server per replica, said in a comment. `mem_fraction_static`: SGLang's fraction where the plan
    ran under `engine: sglang` (else SGLang's flag takes gpu_memory_utilization); `mixed_chunk`: SGLang's
    --enable-mixed-chunk (`sglang_launch_command`). `trtllm_fraction`:
    TensorRT-LLM's free_gpu_memory_fraction where the plan ran under `engine: tensorrt-llm`, which adds
    a "trtllm" entry (trtllm_serve_command); None (the default): no "trtllm" entry."""
    rest = (max_num_batched_tokens, gpu_memory_utilization, chunked_prefill, policy, host_offload_bytes, weight_dtype,
            kv_dtype)
    fraction = {"mem_fraction_static": mem_fraction_static, "mixed_chunk": mixed_chunk}  # SGLang's keywords
    if experts:
        return _replicas(expert_commands(model_id, tp, max_num_seqs, experts, rest, fraction, trtllm_fraction), tp, dp)
    replica_dp = 1 if moe else dp
    args = (model_id, tp, replica_dp, max_num_seqs, *rest)
    out = {"vllm": vllm_serve_command(*args), "sglang": sglang_launch_command(*args, **fraction)}
    if trtllm_fraction is not None:
        out["trtllm"] = trtllm_serve_command(*_trtllm_args(args, trtllm_fraction))
    return _replicas(out, tp, dp) if moe else out


def _trtllm_args(args: tuple, trtllm_fraction: float) -> tuple:
    """vllm_serve_command's positional inputs with TensorRT-LLM's fraction for gpu_memory_utilization."""
    return (*args[:5], trtllm_fraction, *args[6:])


def _replica_note(tp: int, dp: int) -> str:
    return f"one server per {int(tp)}-GPU group: run {int(dp)} behind the load balancer"


def _replicas(commands: dict[str, str], tp: int, dp: int) -> dict[str, str]:
    """`commands` for one of `dp` replicas, each a server of its own behind the load balancer."""
    if dp <= 1:
        return commands
    return {engine: with_note(line, _replica_note(tp, dp)) for engine, line in commands.items()}


def expert_commands(model_id: str, tp: int, max_num_seqs: int, experts: str, rest: tuple,
                    fraction: dict | None = None, trtllm_fraction: float | None = None) -> dict[str, str]:
    """One `tp`-GPU group's commands of a mixture of experts' layout (`rest`: launch_commands' inputs
    from max_num_batched_tokens on).
    "ep": the tensor-parallel commands with vLLM's --enable-expert-parallel (vllm/config/parallel.py
    `enable_expert_parallel`: "use expert parallelism instead of tensor parallelism for MoE layers")
    or SGLang's --ep-size tp (server_args.py, alias --expert-parallel-size).
    "ep+dpa" (attention data-parallel over the group): vLLM runs the group as tp data-parallel ranks
    of one GPU each with --enable-expert-parallel, each rank an engine with its own scheduler and
    offload buffer, so --max-num-seqs, --max-num-batched-tokens and --kv-offloading-size are the
    group's / tp (rounded up); SGLang as --tp-size tp --dp-size tp --enable-dp-attention --ep-size tp,
    whose --max-running-requests is divided over the dp ranks (the group's cap as is).
    `trtllm_fraction` (not None) adds TensorRT-LLM's: --ep_size tp for both, and for "ep+dpa"
    enable_attention_dp in its YAML with --max_batch_size per rank (trtllm_serve_command attention_dp)."""
    out = {}
    if experts == "ep":
        out["vllm"] = with_flags(vllm_serve_command(model_id, tp, 1, max_num_seqs, *rest), "--enable-expert-parallel")
        out["sglang"] = with_flags(sglang_launch_command(model_id, tp, 1, max_num_seqs, *rest, **(fraction or {})),
                                   f"--ep-size {int(tp)}")
    else:
        tokens, util, chunked, policy, host, weight_dtype, kv_dtype = rest
        per_rank = (_ceil_div(tokens, tp), util, chunked, policy, host / tp if host else host, weight_dtype, kv_dtype)
        out["vllm"] = with_flags(vllm_serve_command(model_id, 1, tp, _ceil_div(max_num_seqs, tp), *per_rank),
                                 "--enable-expert-parallel")
        out["sglang"] = with_flags(sglang_launch_command(model_id, tp, tp, max_num_seqs, *rest, **(fraction or {})),
                                   f"--enable-dp-attention --ep-size {int(tp)}")
    if trtllm_fraction is not None:
        out["trtllm"] = trtllm_serve_command(*_trtllm_args((model_id, tp, 1, max_num_seqs, *rest), trtllm_fraction),
                                             ep_size=tp, attention_dp=experts != "ep")
    return out


def with_flags(line: str, flags: str) -> str:
    """`line` with `flags` appended to the command, before its trailing comment."""
    command, sep, comment = line.partition("  # ")
    return f"{command} {flags}" + (f"  # {comment}" if sep else "")


# each engine's pipeline-parallel flag: vLLM arg_utils.py --pipeline-parallel-size, SGLang server_args.py
# --pp-size, trtllm-serve --pp_size (already on its line as 1)
PIPELINE_FLAGS = {"vllm": "--pipeline-parallel-size {pp}", "sglang": "--pp-size {pp}"}


_TRTLLM_BATCH = re.compile(r"--max_batch_size (\d+)")


def with_pipeline(engine: str, line: str, pp: int) -> str:
    """`line` of `engine` ("vllm", "sglang", "trtllm") with `pp` pipeline stages. The plan's max_num_seqs
    holds for all the batches in flight together (`sim.serving.pipeline`, as vLLM's); TensorRT-LLM's
    --max_batch_size bounds each of its pp micro-batches and its capacity scheduler holds max_batch_size x
    pp requests (pyexecutor _util.py `max_num_sequences = max_batch_size * mapping.pp_size`), so its
    --max_batch_size is divided by pp, rounded up."""
    if pp <= 1:
        return line
    if engine == "trtllm":
        line = _TRTLLM_BATCH.sub(lambda m: f"--max_batch_size {_ceil_div(int(m.group(1)), int(pp))}", line, count=1)
        return line.replace("--pp_size 1", f"--pp_size {int(pp)}", 1)
    return with_flags(line, PIPELINE_FLAGS[engine].format(pp=int(pp)))


def with_note(line: str, note: str) -> str:
    """`line` with `note` added to its trailing comment."""
    command, sep, comment = line.partition("  # ")
    return f"{command}  # " + (f"{comment}; {note}" if sep else note)


# ---- The Hugging Face repository a catalog model is served from --------------------------------------

# `org/name` after huggingface.co/ in a catalog entry's `source` (sim/catalog/models.yaml has no field
# of its own for the repository; `source` names the config.json the shapes come from).
_HF_REPO = re.compile(r"huggingface\.co/([A-Za-z0-9][\w.-]*/[\w.-]*[\w-])")

# Aliases that name a different checkpoint than the one their entry's `source` cites: the catalog
# files them under a model of the same shapes (e.g. DeepSeek-R1-Distill-Llama-70B under
# llama-3.1-70b, whose source is meta-llama/Llama-3.1-70B), but a user serving the alias wants this repo.
_SERVED_REPOS = {
    "deepseek-r1-distill-llama-70b": "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
    "deepseek-r1-distill-llama-8b": "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen2.5-14b": "Qwen/Qwen2.5-14B",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B",
    "qwq-32b": "Qwen/QwQ-32B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
}


def _key(name: str) -> str:
    """A name as the catalog compares names (sim/inputs/catalog.py: case, `_` and `-` alike)."""
    return name.strip().lower().replace("_", "-")


@cache
def _catalog_sources() -> tuple[tuple[str, frozenset[str], str], ...]:
    """(the key of an entry's name, the keys of its aliases, its `source`) for each entry of
    sim/catalog/models.yaml, read as sim/inputs/catalog.py reads it (the package resource, yaml.safe_load)."""
    from importlib import resources

    import yaml

    text = resources.files("sim").joinpath("catalog", "models.yaml").read_text()
    return tuple((_key(e["name"]), frozenset(map(_key, e.get("aliases", []))), e["source"])
                 for e in yaml.safe_load(text)["models"])


def hf_model_id(model_name: str) -> str | None:
    """The Hugging Face repo id (`org/name`) to serve the catalog model `model_name` from - its name, one
    of its aliases or the repo id itself - or None where the catalog does not say: an unknown name, a
    source without huggingface.co/ORG/NAME, or an alias naming another checkpoint missing from _SERVED_REPOS."""
    key = _key(model_name)
    if key in _SERVED_REPOS:
        return _SERVED_REPOS[key]
    for name, aliases, source in _catalog_sources():
        match = _HF_REPO.search(source)
        repo = match.group(1) if match else None
        own = {name} if repo is None else {name, _key(repo), _key(repo.rpartition("/")[2])}
        if key in own:
            return repo
        if key in aliases:
            return None  # same shapes, another checkpoint: the source's repo would be the wrong one to serve
    return None
