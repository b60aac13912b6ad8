"""Measured kernel tables from NVIDIA AIConfigurator's database (PyPI `aiconfigurator-core`,
Apache-2.0, the `.[measured]` extra): the one adapter that reads its per-system parquet files into
kvtier's units. Another source (a newer release, `hwprobe calibrate` output in the same schema) is
one more adapter producing `KernelTables`.

What each table means, as the package's own loader reads it (its Rust engine; the column meanings
were checked against the 0.12.0 engine to ~1e-16):
- `gemm/<fw>/<ver>/gemm_perf.parquet`: one call of `x[m, k] @ W[n, k]^T` - m tokens, n output
  features per GPU, k the reduction dimension; `latency` in ms; one row per (gemm_dtype, m, n, k),
  the kernel vLLM dispatched for it (first row wins on a duplicate, as in the loader).
- `attention/<fw>/<ver>/generation_attention_perf.parquet`: one layer's decode-attention call for
  `batch_size` sequences with query length 1, each attending `step` cached tokens (the collector
  passes seq_len = step; isl is always 1); heads per GPU (after TP); `num_key_value_heads` equal
  to `num_heads` means MHA; `window_size` 0 is full attention; ms.
- `comm/<fw>/<ver>/custom_allreduce_perf.parquet` (the engine's custom all-reduce, CUDA-graph
  rows only) and `comm/nccl/<misc.nccl_version>/nccl_perf.parquet` (op all_reduce, dtype half):
  `message_size` in ELEMENTS of 2 bytes, `num_gpus`, ms per call. The same NCCL file's all_gather and
  reduce_scatter rows (dtype half) are read too (`KernelTables.gather`): nccl-tests' convention, the
  size is the whole buffer - the gathered output of an all-gather, the input every GPU reduces of a
  reduce-scatter (its 67M-element all_gather on 8 H200s takes 0.38 ms: 309 GB/s busbw over the whole
  buffer; per GPU it would be 2.8 TB/s).
- `comm/<fw>/<ver>/moe_a2a_perf.parquet` (TensorRT-LLM's and vLLM's; SGLang takes vLLM's): DeepEP's
  expert-parallel all-to-all, one `phase` (dispatch or combine) of one MoE layer, `num_tokens` tokens
  on each EP rank (DeepEP's own benchmarks count per rank), `hidden_size`, `topk`, `num_experts` over
  `ep_size` ranks of one node; `comm_backend` the high-throughput (normal) or low-latency kernels,
  `comm_dtype` what crosses (TensorRT-LLM: HT sends an fp8 model's activations in bf16, LL in fp8;
  vLLM's 'default'); `latency` in MICROseconds (the collector's transmit_us; 44-11,594 for 16-65,536
  tokens on H200), read into seconds (`KernelTables.a2a`).

Three more families are read on first use only (`with_moe_mla`; a run of a dense model never pays
for them), with the meanings of the package's loaders (aic-core perf_database/mla.rs
`load_op_gen_parquet`, = Python operations/mla.py `load_generation_mla_data`; perf_database/moe.rs
`load_moe_parquet`, = operations/moe.py `load_moe_data`) and its collectors:
- `mla/trtllm/<ver>/generation_mla_perf.parquet`: one layer's absorbed MLA decode kernel for
  DeepSeek-V3 shapes (kv_lora_rank 512 + rope 64 latent, one latent "KV head", q of 512 + 64 per
  head, output in the 512-wide latent space; the W_UK / W_UV BMMs and all projections outside it):
  `batch_size` sequences, `num_heads` query heads per GPU (after TP; the `tp_size` column is not a
  key), `step` cached tokens each (isl is always 1; the loader keys the row at isl + step tokens, the
  cached ones and the new one: collector/trtllm/collect_mla.py "[target token s] is equivalent to
  [in: s-1, step=1]"), `kv_cache_dtype` bfloat16 or fp8 (`mla_dtype` is degenerate and not a key),
  `latency` ms per call (CUDA-graph replay). vLLM measures MLA only as a whole module (projections
  + attention, mla_generation_module_perf), so the kernel table is TensorRT-LLM's (its
  kernel_source 'default' rows, which the package lends other backends as a shared fallback:
  perf_data_reuse_manifest.yaml); duplicate keys: the first row wins, as in the loader.
- `mla/trtllm/<ver>/context_mla_perf.parquet`: one layer's MLA prefill attention kernel as TensorRT-LLM
  runs it, not absorbed (collector/trtllm/collect_mla.py, the context phase: q and k of 128 + 64 and v
  of 128 per head after kv_b, causal FMHA over whole prompts; the projections outside it): `batch_size`
  prompts of `isl` tokens, `num_heads` query heads per GPU (the `tp_size` column is not a key),
  `kv_cache_dtype` bfloat16 or fp8 (the KV written; `mla_dtype`, the FMHA's, is bfloat16 throughout),
  `latency` ms per call; the same framework and version as the decode table, first row wins on a key.
- `moe/vllm/<ver>/moe_perf.parquet`: one call of vLLM's fused experts on one GPU
  (collector/vllm/collect_moe.py: `fused_experts` / FusedMoE, routing given, no router GEMM, no
  all-reduce or all-to-all): `num_tokens` tokens entering the layer (hidden states before routing,
  all of them routed over all `num_experts`), `hidden_size`, `inter_size` one expert's full
  intermediate width (w13 is [E/ep, 2 inter/tp, hidden], w2 [E/ep, hidden, inter/tp]), `topk`,
  `moe_tp_size` splitting every expert's inter, `moe_ep_size` splitting the experts whole (E/ep
  local; tokens routed elsewhere are skipped; vLLM rows never have both > 1), `moe_dtype` the
  weight format (bfloat16; fp8 W8A8 per-tensor; fp8_block 128x128 block-scaled W8A8; int4_wo W4A16
  Marlin group 128; w4a16_mxfp4 gpt-oss MXFP4), `distribution` the routing ('balanced': token i's
  picks (i + j ceil(E/k)) mod E, experts evenly loaded; 'power_law_<alpha>': per-expert counts drawn
  from a power law, the busiest EP rank measured), `latency` ms per call. First row wins on a key.
- `mla_bmm/<fw>/<ver>/mla_bmm_perf.parquet` (the engine's own; none: no table): absorbed MLA decode's
  two batched matmuls around the attention kernel, DeepSeek-V3's shapes - `mla_gen_pre` (each head's
  128-wide q_nope times W_UK into the 512-wide latent) and `mla_gen_post` (the latent output times W_UV
  back to 128) - for `num_tokens` tokens and `num_heads` heads on one GPU, `bmm_dtype` bfloat16 or fp8
  (TensorRT-LLM's fp8 block-scaled BMM on Hopper, its dequantised bf16 one on Blackwell; SGLang's
  sgl-kernel bmm_fp8; vLLM times only torch's bf16 bmm), `latency` ms per call.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from sim.model.dtypes import WEIGHT_DTYPES

from . import catalog
from .errors import ConfigError

PACKAGE = "aiconfigurator-core"
FRAMEWORK = "vllm"  # the default tables: a run without an `engine:` section is costed as vLLM runs
FRAMEWORKS = ("vllm", "sglang", "trtllm")  # the package's framework directories kvtier reads
MS_TO_S = 1e-3
ELEMENT_BYTES = 2  # all-reduce message sizes are counted in bf16/half elements
# kvtier catalog GPU -> AIConfigurator system (its systems/<name>.yaml and data/<name>/)
SYSTEMS = {"h100-sxm": "h100_sxm", "h200-sxm": "h200_sxm", "a100-80gb-sxm": "a100_sxm", "l40s": "l40s",
           "b200": "b200_sxm", "gb200": "gb200", "b300": "b300_sxm", "gb300": "gb300",
           "rtx-pro-6000-server": "rtx_pro_6000_server"}
# weight dtype -> measured GEMM dtype; the weight-only int8/int4 tables are TensorRT-LLM's (its
# WeightOnlyQuantMatmul plugin, per-channel scales: A100 1.0.0 only), the other frameworks time none
GEMM_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "int8": "int8_wo", "int4": "int4_wo",
               "nvfp4": "nvfp4"}  # nvfp4: W4A4 (Blackwell: vLLM's and SGLang's FlashInfer kernels, TensorRT-LLM's)
KV_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}
PROFILE_SOURCE = "hwprobe"  # KernelTables.framework of tables read from a `hwprobe calibrate` profile
# TensorRT-LLM's attention op runs fp8 context FMHA with an fp8 KV cache (thop attentionOp.cpp
# `mFP8ContextFMHA = is_fp8_out || is_fp4_out || (hasFp8KvCache && use_paged_context_fmha)`): the output is
# quantised for an FP8 / NVFP4 o_proj (modules/attention.py out_scale; trtllm.py get_quantize_output_dtype:
# fp8 with an fp8 KV cache), and paged context FMHA is on with block reuse (KvCacheConfig's default) or
# chunked prefill, and always on SM90; AIConfigurator's own estimate takes fp8 FMHA for such runs too
FP8_FMHA_FRAMEWORKS = ("trtllm",)
MLA_FRAMEWORK = "trtllm"  # the MLA decode kernel table's framework (vLLM measures only the whole module)
MLA_TABLE, MOE_TABLE = "generation_mla", "moe"  # KernelTables.table_sources keys, as `source` names them
MOE_QUANTS = ("bfloat16", "fp8", "fp8_block", "int4_wo", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8", "nvfp4")  # formats read
MLA_COLUMNS = ["kv_dtype", "heads", "batch", "kv_tokens", "latency_s"]
MLA_BMM_COLUMNS = ["op", "dtype", "heads", "tokens", "latency_s"]
MLA_BMM_TABLE = "mla_bmm"
MLA_CONTEXT_COLUMNS = ["kv_dtype", "heads", "batch", "tokens", "latency_s"]
MLA_CONTEXT_TABLE = "context_mla"
MOE_COLUMNS = ["quant", "distribution", "experts", "top_k", "hidden", "inter", "tp", "ep", "tokens", "kernel",
               "latency_s", "from_twin"]  # from_twin: the die twin's time stands in (`twin_checked_moe`)
MOE_SLICE = ["quant", "distribution", "experts", "top_k", "hidden", "inter", "tp", "ep"]  # one token curve each


@dataclass(frozen=True)
class KernelTables:
    """One system's measured kernels under one framework, in seconds and bytes."""

    system: str
    device: str  # the GPU as the tables name it ("NVIDIA H200")
    framework: str
    framework_version: str
    package_version: str
    gemm: pd.DataFrame  # dtype (kvtier weight dtype), m, n, k, latency_s
    decode_attention: pd.DataFrame  # kv_dtype, kv_heads (0: MHA), head_dim, window, heads, batch, kv_tokens, latency_s
    allreduce: dict[str, pd.DataFrame] = field(default_factory=dict)  # impl -> gpus, bytes, latency_s
    # NCCL all_gather / reduce_scatter -> gpus, bytes (the whole buffer), latency_s
    gather: dict[str, pd.DataFrame] = field(default_factory=dict)
    a2a: pd.DataFrame | None = None  # A2A_COLUMNS: DeepEP dispatch / combine per rank's tokens (None: no table)
    # prefill (context) attention: decode_attention's columns, kv_tokens the prompt length (None: no table)
    context_attention: pd.DataFrame | None = None
    nccl_version: str | None = None
    # read on first use (`with_moe_mla`); None: not read yet
    mla_decode: pd.DataFrame | None = None  # MLA_COLUMNS: kv_dtype, heads, batch, kv_tokens (new one included), latency_s
    moe: pd.DataFrame | None = None  # MOE_COLUMNS: quant, distribution, experts, top_k, hidden, inter, tp, ep, tokens, ...
    mla_bmm: pd.DataFrame | None = None  # MLA_BMM_COLUMNS: op (pre, post), dtype, heads, tokens, latency_s
    mla_context: pd.DataFrame | None = None  # MLA_CONTEXT_COLUMNS: kv_dtype, heads, batch, tokens (a prompt), latency_s
    table_sources: dict[str, str] = field(default_factory=dict)  # table -> "framework version" where not `framework`'s
    cache_served: dict[str, int] = field(default_factory=dict)  # table -> points dropped as timed from a warm L2

    def source(self, table: str) -> str:
        """Where a figure came from, for `sources` and `kvsim ops`."""
        if self.framework == PROFILE_SOURCE:
            return f"measured: hwprobe profile of {self.device} ({self.framework_version}) {table}"
        ver = self.nccl_version if table.startswith("nccl ") else f"{self.framework} {self.framework_version}"
        ver = self.table_sources.get(table.split(" ")[0], ver)  # "gemm fp8" is the gemm table's
        return f"measured: {PACKAGE} {self.package_version} {self.system} ({self.device}) {ver} {table}"


def tables_available() -> bool:
    return importlib.util.find_spec("aiconfigurator_core") is not None


def system_for(gpu: str) -> str | None:
    """The AIConfigurator system measuring this catalog GPU, or None (RTX cards, GH200, custom GPUs)."""
    return SYSTEMS.get(gpu)


def load_tables(gpu: str, framework: str = FRAMEWORK) -> KernelTables:
    """The measured tables of a catalog GPU under `framework` (FRAMEWORKS: the engine the scenario runs);
    a ConfigError naming what is missing otherwise."""
    system = system_for(gpu)
    if system is None:
        covered = ", ".join(SYSTEMS)
        raise ConfigError(f"no measured kernel tables for {gpu!r}; AIConfigurator's tables cover {covered} "
                          f"(the datasheet kernels apply)", field="hardware.kernels")
    if framework not in FRAMEWORKS:
        raise ConfigError(f"no measured tables for framework {framework!r}; expected one of {', '.join(FRAMEWORKS)}",
                          field="engine.name")
    if not tables_available():
        raise ConfigError(f"measured kernels need the {PACKAGE} package: pip install -e '.[measured]' "
                          f"(or use the datasheet kernels)", field="hardware.kernels")
    return _cold(system, framework, catalog.gpu(gpu).hbm_bytes_per_s)


# A decode step reads each GEMM's weights and each layer's KV cache once, from DRAM: the other layers
# between two reads evict them. AIConfigurator's collectors time one call over and over, so where the
# call's weights or KV fit in the GPU's L2 the table times a warm cache: L40S GEMMs (96 MB L2) over
# 8-16 MB of bf16 weights run at a median 1.46x its DRAM peak, its decode attention over 64-128 MB of
# KV at 2.0x, RTX PRO 6000's (128 MB) alike; H100's and H200's vLLM tables (50 MB) never pass the peak
# outside sliding windows (SGLang's H100 table has 23 such points; TensorRT-LLM's A100 table reads 4.3 GB
# contexts at 1.6x its peak: blocks shared between sequences, likely). A point that read its cold operand faster than the table's own cold
# calls ever stream - those of >= COLD_BYTES, past every GPU's L2, at or under the DRAM peak - is
# dropped (`cache_served`), and the grids fill its cell from the larger calls beside it
# (`kernel_grid.fill_cold_side`).
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5,  # a table dtype's bytes a weight
                "nvfp4": WEIGHT_DTYPES["nvfp4"].packed_bytes_per_element}
COLD_BYTES = 256 * 2**20


def gemm_weight_bytes(gemm: pd.DataFrame) -> np.ndarray:
    """The weights one GEMM call streams: n x k x the dtype's bytes."""
    return gemm["n"].to_numpy(float) * gemm["k"].to_numpy(float) * gemm["dtype"].map(WEIGHT_BYTES).to_numpy(float)


def attention_kv_bytes(attn: pd.DataFrame) -> np.ndarray:
    """The KV one decode-attention call reads: batch x min(cached tokens, window) x 2 x KV heads x head dim
    x the KV dtype's bytes (kv_heads 0: MHA, as many as the query heads; window 0: the whole context)."""
    tokens = attn["kv_tokens"].to_numpy(float)
    window = attn["window"].to_numpy(float)
    read = np.where(window > 0, np.minimum(tokens, window), tokens)
    kv_heads = attn["kv_heads"].where(attn["kv_heads"] > 0, attn["heads"]).to_numpy(float)
    return attn["batch"].to_numpy(float) * read * 2 * kv_heads * attn["head_dim"].to_numpy(float) * \
        attn["kv_dtype"].map(WEIGHT_BYTES).to_numpy(float)


def cache_served(cold_bytes: np.ndarray, latency_s: np.ndarray, dtype: np.ndarray,
                 hbm_bytes_per_s: float) -> np.ndarray:
    """Per point: whether it read its cold operand faster than its dtype's cold rate - the fastest
    stream of that dtype's calls of >= COLD_BYTES under the DRAM peak (the peak where none is)."""
    cold_bytes, latency_s, dtype = np.asarray(cold_bytes, float), np.asarray(latency_s, float), np.asarray(dtype)
    rate = cold_bytes / latency_s
    warm = np.zeros(len(rate), dtype=bool)
    for d in np.unique(dtype):
        mine = dtype == d
        cold = mine & (cold_bytes >= COLD_BYTES) & (rate <= hbm_bytes_per_s)
        warm |= mine & (rate > (rate[cold].max() if cold.any() else hbm_bytes_per_s))
    return warm


@lru_cache(maxsize=16)
def _cold(system: str, framework: str, hbm_bytes_per_s: float) -> KernelTables:
    """`_load`'s tables without the GEMM and decode-attention points a warm L2 served."""
    tables = _load(system, framework)
    gemm, attn = tables.gemm, tables.decode_attention
    warm_gemm = cache_served(gemm_weight_bytes(gemm), gemm["latency_s"], gemm["dtype"], hbm_bytes_per_s)
    warm_attn = cache_served(attention_kv_bytes(attn), attn["latency_s"], attn["kv_dtype"], hbm_bytes_per_s)
    dropped = {k: int(n) for k, n in (("gemm", warm_gemm.sum()), ("generation_attention", warm_attn.sum())) if n}
    return replace(tables, gemm=gemm[~warm_gemm].reset_index(drop=True),
                   decode_attention=attn[~warm_attn].reset_index(drop=True), cache_served=dropped)


@lru_cache(maxsize=16)
def _load(system: str, framework: str = FRAMEWORK) -> KernelTables:
    """Each table of `framework` at the version the package queries for this system, back-filled from
    the framework's older versions as the package does; a table the framework lacks altogether is
    vLLM's, and `table_sources` says so."""
    root = _package_root() / "systems"
    spec = yaml.safe_load((root / f"{system}.yaml").read_text())
    data = root / "data" / system
    ver = _query_version(root, system, framework)
    sources: dict[str, str] = {}

    def table(family: str, filename: str, label: str) -> Path | None:
        path, fw = _backfilled(data / family / framework, ver, filename), framework
        if path is None and framework != FRAMEWORK:
            fw, path = FRAMEWORK, _backfilled(data / family / FRAMEWORK, _query_version(root, system), filename)
        if path is not None and (fw, path.parent.name) != (framework, ver):
            sources[label] = f"{fw} {path.parent.name}"
        return path

    def required(family: str, filename: str, label: str) -> Path:
        path = table(family, filename, label)
        if path is None:
            raise ConfigError(f"no measured {label} table for {system} in {PACKAGE}", field="hardware.kernels")
        return path

    a2a = table("comm", "moe_a2a_perf.parquet", "moe_a2a")
    gemm = _read(required("gemm", "gemm_perf.parquet", "gemm"), GEMM_READ)
    attn = _read(required("attention", "generation_attention_perf.parquet", "generation_attention"), ATTENTION_READ)
    context = table("attention", "context_attention_perf.parquet", "context_attention")
    fp8_fmha = (sources.get("context_attention") or framework).split()[0] in FP8_FMHA_FRAMEWORKS
    nccl_version = str((spec.get("misc") or {}).get("nccl_version") or "")
    custom = table("comm", "custom_allreduce_perf.parquet", "custom_allreduce")
    allreduce = {"custom": _allreduce_graphs(_read(custom, ALLREDUCE_READ)) if custom is not None else None}
    nccl = data / "comm" / "nccl" / nccl_version / "nccl_perf.parquet"
    gather = {}
    if nccl_version and nccl.is_file():
        allreduce["nccl"], gather = _nccl_allreduce(nccl), _nccl_gather(nccl)
    return KernelTables(system=system, device=str(gemm["device"].iloc[0]), framework=framework, framework_version=ver,
                        package_version=version(PACKAGE), gemm=_gemm(gemm), decode_attention=_decode_attention(attn),
                        allreduce={k: v for k, v in allreduce.items() if v is not None}, gather=gather,
                        a2a=_a2a(_read(a2a)) if a2a is not None else None,
                        nccl_version=nccl_version or None,
                        context_attention=(_context_attention(_read(context, ATTENTION_READ), fp8_fmha)
                                           if context is not None else None),
                        table_sources=sources)


def tables_from_profile(profile) -> KernelTables:
    """The kernels a `hwprobe calibrate` profile timed on the user's own device, as tables of the
    same schema: its decode GEMM points (m tokens, n outputs, k reduction; bf16 and fp8) and decode
    attention points (batch sequences of context_tokens each). It times no all-reduce."""
    by_dtype = {v: k for k, v in GEMM_DTYPES.items() if k != "fp16"} | {"bf16": "bf16", "fp8": "fp8"}
    gemm = pd.DataFrame([{"dtype": by_dtype[g.dtype], "m": g.m, "n": g.n, "k": g.k, "latency_s": g.time_s}
                         for g in profile.compute.gemm_points if g.dtype in by_dtype],
                        columns=["dtype", "m", "n", "k", "latency_s"])
    attn = pd.DataFrame([{"kv_dtype": a.dtype if a.dtype in KV_DTYPES else "bf16",
                          "kv_heads": 0 if a.num_kv_heads == a.num_heads else a.num_kv_heads, "head_dim": a.head_dim,
                          "window": 0, "heads": a.num_heads, "batch": a.batch, "kv_tokens": a.context_tokens,
                          "latency_s": a.time_s} for a in profile.compute.attention_points],
                        columns=["kv_dtype", "kv_heads", "head_dim", "window", "heads", "batch", "kv_tokens", "latency_s"])
    return KernelTables(system="profile", device=f"{profile.device} {profile.device_name}", framework=PROFILE_SOURCE,
                        framework_version=profile.created_utc, package_version="", gemm=gemm.drop_duplicates(
                            ["dtype", "m", "n", "k"], keep="first"), decode_attention=attn)


def _package_root() -> Path:
    spec = importlib.util.find_spec("aiconfigurator_core")  # located, not imported (its engine is compiled)
    return Path(next(iter(spec.submodule_search_locations)))


def _query_version(root: Path, system: str, framework: str = FRAMEWORK) -> str:
    """The version the package queries for this system (systems/query_versions.yaml 'current')."""
    q = yaml.safe_load((root / "query_versions.yaml").read_text())
    slot = (q.get("overrides", {}).get(system) or {}).get(framework) or q["defaults"][framework]
    return str(slot["current"])


# the columns each reader uses (of those the file has): the tables' other string columns (framework,
# version, op_name) would become a Python object per row, most of the time of reading them
GEMM_READ = ("device", "gemm_dtype", "m", "n", "k", "latency")
ATTENTION_READ = ("kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "window_size",
                  "beam_width", "attn_dtype", "kv_cache_dtype", "step", "latency")
ALLREDUCE_READ = ("op_name", "kernel_source", "backend", "nccl_dtype", "num_gpus", "message_size", "latency")


def _read(path: Path, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The table at `path`; `columns`: only those of them it has (default every column)."""
    try:
        if columns is not None:
            import pyarrow.parquet as pq  # (pandas reads parquet with it too; imported when a table is)

            have = set(pq.read_schema(path).names)
            return pd.read_parquet(path, columns=[c for c in columns if c in have])
        return pd.read_parquet(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read measured table {path}: {err}", field="hardware.kernels") from None


def _gemm(df: pd.DataFrame) -> pd.DataFrame:
    by_dtype = {v: k for k, v in GEMM_DTYPES.items() if k != "fp16"}
    df = df[df["gemm_dtype"].isin(by_dtype)].drop_duplicates(["gemm_dtype", "m", "n", "k"], keep="first")
    out = pd.DataFrame({"dtype": df["gemm_dtype"].map(by_dtype).to_numpy(), "m": df["m"].to_numpy(),
                        "n": df["n"].to_numpy(), "k": df["k"].to_numpy(),
                        "latency_s": df["latency"].to_numpy() * MS_TO_S})
    return drop_spikes(out, ("m", "n", "k"), ("dtype",))


# A kernel's time never falls as its sizes grow but for a kernel switch, which is a step, not a peak:
# a point slower than both its neighbours by SPIKE_FACTOR along SPIKE_AXES of its axes is a hiccup of
# the measurement, and interpolating from one would carry it to every query near it. 0.12.0's B200
# fp8 GEMM table has ~990 (~300 us added to 50-100 us kernels at scattered shapes; the other GEMM
# tables 0-120); its MLA decode table 0-13 a system, up to 60x (H200: 2.2 ms at batch 32, 4 tokens,
# 16 heads, between 14-15 us); decode and prefill attention 0-130 a table, ~1.5-4x. Such points are
# dropped, until none is left (a dropped one can unmask another beside it: 941 + 43 + 4 + 1 in the
# B200 table); the grid fills the holes from the neighbours. An MoE slice is one curve over tokens, so
# a peak there is judged on that axis alone, at MOE_SPIKE_FACTOR: in every slice the non-power-of-two
# token counts run up to ~1.7-2x the powers of two beside them (a pattern of the kernel's tiles, kept),
# while its hiccups are 2-38x (H100's TensorRT-LLM table: 517 us at 4 tokens between 25 and 46 us).
SPIKE_FACTOR, SPIKE_AXES = 1.5, 2
MOE_SPIKE_FACTOR = 2.0


def drop_spikes(df: pd.DataFrame, axes: tuple[str, ...], by: tuple[str, ...], factor: float = SPIKE_FACTOR,
                min_axes: int = SPIKE_AXES) -> pd.DataFrame:
    """`df` without its isolated spikes (`isolated_spikes`), repeated until it has none."""
    df = df.reset_index(drop=True)
    while (spikes := isolated_spikes(df, axes, by, factor, min_axes)).any():
        df = df[~spikes].reset_index(drop=True)
    return df


def isolated_spikes(df: pd.DataFrame, axes: tuple[str, ...], by: tuple[str, ...], factor: float = SPIKE_FACTOR,
                    min_axes: int = SPIKE_AXES) -> np.ndarray:
    """Per row of `df` (a `latency_s` column, `axes` and `by` key columns): whether it is more than
    `factor` times both its neighbours along at least `min_axes` of `axes` (the adjacent measured
    points on that axis, every other key equal); a point at an axis's end is never a peak on it."""
    peaks = np.zeros(len(df), dtype=int)
    for axis in axes:
        line = [*by, *(a for a in axes if a != axis)]
        s = df.sort_values([*line, axis], kind="stable")
        lat = s["latency_s"].to_numpy()
        key = s[line].to_numpy()
        same_prev = np.r_[False, (key[1:] == key[:-1]).all(axis=1)]
        same_next = np.r_[same_prev[1:], False]
        prev = np.where(same_prev, np.roll(lat, 1), np.inf)
        nxt = np.where(same_next, np.roll(lat, -1), np.inf)
        peak = (lat > factor * prev) & (lat > factor * nxt)
        peaks[df.index.get_indexer(s.index[peak])] += 1
    return peaks >= min_axes


ATTENTION_SHAPE = ["num_heads", "num_key_value_heads", "head_dim", "window_size"]  # an attention table's shape


def _decode_attention(df: pd.DataFrame, tokens: str = "step", fp8_fmha: bool = False) -> pd.DataFrame:
    """Attention rows in kvtier's units, `tokens` the column of each sequence's tokens (decode: `step`
    cached tokens; context: `isl`): the bf16-attention rows, or with `fp8_fmha` the fp8 ones for an fp8
    KV cache where the table times that shape so (`_attention_dtype`)."""
    by_dtype = {v: k for k, v in KV_DTYPES.items() if k != "fp16"}
    df = df.assign(**{c: df[c] if c in df else d for c, d in (("window_size", 0), ("beam_width", 1), ("attn_dtype", "bfloat16"))})
    wanted = _attention_dtype(df, fp8_fmha)
    df = df[df["kv_cache_dtype"].isin(by_dtype) & (df["attn_dtype"] == wanted) & (df["beam_width"] == 1)]
    # one kernel lane per slice, the one with most rows first (lanes never mix, as in the engine)
    lanes = df["kernel_source"].value_counts()
    df = df.assign(_lane=df["kernel_source"].map({k: i for i, k in enumerate(lanes.index)})).sort_values("_lane", kind="stable")
    kv_heads = df["num_key_value_heads"].where(df["num_key_value_heads"] != df["num_heads"], 0)
    out = pd.DataFrame({"kv_dtype": df["kv_cache_dtype"].map(by_dtype).to_numpy(), "kv_heads": kv_heads.to_numpy(),
                        "head_dim": df["head_dim"].to_numpy(), "window": df["window_size"].to_numpy(),
                        "heads": df["num_heads"].to_numpy(), "batch": df["batch_size"].to_numpy(),
                        "kv_tokens": df[tokens].to_numpy(), "latency_s": df["latency"].to_numpy() * MS_TO_S})
    out = out.drop_duplicates(["kv_dtype", "kv_heads", "head_dim", "window", "heads", "batch", "kv_tokens"], keep="first")
    return drop_spikes(out, ("batch", "kv_tokens"), ("kv_dtype", "kv_heads", "head_dim", "window", "heads"))


def _attention_dtype(df: pd.DataFrame, fp8_fmha: bool) -> pd.Series:
    """Each row's wanted attention dtype: bfloat16, or with `fp8_fmha` fp8 for an fp8 KV cache in a shape
    (`ATTENTION_SHAPE`) the table times with fp8 attention (bf16 where it does not)."""
    if not fp8_fmha:
        return pd.Series("bfloat16", index=df.index)
    shape = pd.MultiIndex.from_frame(df[ATTENTION_SHAPE])
    fp8_kv = (df["kv_cache_dtype"] == "fp8").to_numpy()
    timed = shape[fp8_kv & (df["attn_dtype"] == "fp8").to_numpy()]
    return pd.Series(np.where(fp8_kv & shape.isin(timed), "fp8", "bfloat16"), index=df.index)


def _context_attention(df: pd.DataFrame, fp8_fmha: bool = False) -> pd.DataFrame:
    """`context_attention_perf`: one layer's causal prefill attention of `batch_size` prompts of `isl`
    tokens each, nothing cached before them (`step` is always 0), heads per GPU; ms. Its bf16-attention
    rows by KV dtype, as `_decode_attention` reads its own; with `fp8_fmha` (TensorRT-LLM's tables) an fp8
    KV cache's prefill takes the fp8 context-FMHA rows, the kernel that engine runs then (`FP8_FMHA_FRAMEWORKS`)."""
    return _decode_attention(df[df["step"] == 0], tokens="isl", fp8_fmha=fp8_fmha)


def _allreduce_graphs(df: pd.DataFrame) -> pd.DataFrame:
    """The custom all-reduce rows replayed in a CUDA graph (vLLM and SGLang also time it eager;
    TensorRT-LLM's rows are all graph replays)."""
    graph = ~df["kernel_source"].astype(str).str.contains("eager")
    if "backend" in df:
        graph &= ~df["backend"].astype(str).str.contains("eager")
    return _allreduce(df[graph])


def _backfilled(family: Path, ver: str, filename: str) -> Path | None:
    """`family/<ver>/filename`, else the newest older version's that has it (the package's backward
    fill, never forward); None where no version at or below `ver` has it."""
    older = sorted((p.name for p in family.iterdir() if p.is_dir() and _version_key(p.name) <= _version_key(ver)),
                   key=_version_key, reverse=True) if family.is_dir() else []
    return next((family / v / filename for v in older if (family / v / filename).is_file()), None)


def _version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in v.replace("rc", ".").replace("post", ".").split("."))


def _nccl_allreduce(path: Path) -> pd.DataFrame:
    df = _read(path, ALLREDUCE_READ)
    return _allreduce(df[(df["op_name"] == "all_reduce") & (df["nccl_dtype"] == "half")])


GATHER_OPS = ("all_gather", "reduce_scatter")
US_TO_S = 1e-6
A2A_COLUMNS = ["backend", "phase", "wire", "ep", "hidden", "top_k", "experts", "tokens", "latency_s"]
A2A_SLICE = A2A_COLUMNS[:7]  # one token curve each
A2A_BACKENDS = {"trtllm_deepep_ht": "ht", "trtllm_deepep_ll": "ll", "deepep_ht": "ht", "deepep_ll": "ll"}
A2A_WIRES = {"bfloat16": "bf16", "fp8": "fp8", "default": "default"}  # (nvfp4 / fp4 wires are not read)


def _a2a(df: pd.DataFrame) -> pd.DataFrame:
    """The DeepEP rows in kvtier's units (seconds; the collector's latency is in microseconds), single-node
    ones of the HT and LL kernels, the wires of `A2A_WIRES`; the first row of a duplicated key wins."""
    df = df[df["comm_backend"].isin(A2A_BACKENDS) & df["comm_dtype"].isin(A2A_WIRES) & (df["node_num"] == 1)]
    out = pd.DataFrame({"backend": df["comm_backend"].map(A2A_BACKENDS).to_numpy(), "phase": df["phase"].to_numpy(),
                        "wire": df["comm_dtype"].map(A2A_WIRES).to_numpy(), "ep": df["ep_size"].to_numpy(),
                        "hidden": df["hidden_size"].to_numpy(), "top_k": df["topk"].to_numpy(),
                        "experts": df["num_experts"].to_numpy(), "tokens": df["num_tokens"].to_numpy(),
                        "latency_s": df["latency"].to_numpy() * US_TO_S})
    return out.drop_duplicates(A2A_SLICE + ["tokens"], keep="first").reset_index(drop=True)


def _nccl_gather(path: Path) -> dict[str, pd.DataFrame]:
    """NCCL's all_gather and reduce_scatter rows (dtype half), each as `_allreduce` reads its rows."""
    df = _read(path, ALLREDUCE_READ)
    half = df[df["nccl_dtype"] == "half"]
    return {op: _allreduce(half[half["op_name"] == op]) for op in GATHER_OPS if (half["op_name"] == op).any()}


def _allreduce(df: pd.DataFrame) -> pd.DataFrame:
    df = df.drop_duplicates(["num_gpus", "message_size"], keep="first")
    return pd.DataFrame({"gpus": df["num_gpus"].to_numpy(), "bytes": df["message_size"].to_numpy() * ELEMENT_BYTES,
                         "latency_s": df["latency"].to_numpy() * MS_TO_S})


# ---- MLA decode and MoE (read on first use) --------------------------------------------------------
def with_moe_mla(tables: KernelTables) -> KernelTables:
    """`tables` with their system's MLA decode and MoE tables read (empty where the package has none,
    and for a profile's tables: `hwprobe calibrate` times neither): the MoE table of the tables'
    framework (the engine's fused experts), vLLM's where that framework times none for the system.
    Tables that carry them already (a split's parts) come back as they are."""
    if tables.mla_decode is not None and tables.moe is not None:
        return tables
    if tables.framework == PROFILE_SOURCE or tables.system not in SYSTEMS.values() or not tables_available():
        return replace(tables, mla_decode=pd.DataFrame(columns=MLA_COLUMNS), moe=pd.DataFrame(columns=MOE_COLUMNS),
                       mla_bmm=pd.DataFrame(columns=MLA_BMM_COLUMNS),
                       mla_context=pd.DataFrame(columns=MLA_CONTEXT_COLUMNS))
    mla, moe, sources = _moe_mla(tables.system, tables.framework)
    bmm = _mla_bmm_table(tables.system, tables.framework)
    context = _mla_context_table(tables.system)
    if len(context) and MLA_TABLE in sources:  # the decode table's framework and version
        sources = {**sources, MLA_CONTEXT_TABLE: sources[MLA_TABLE]}
    return replace(tables, mla_decode=mla, moe=moe, mla_bmm=bmm, mla_context=context,
                   table_sources={**tables.table_sources, **sources})


@lru_cache(maxsize=8)
def _mla_context_table(system: str) -> pd.DataFrame:
    """TensorRT-LLM's MLA prefill rows (the decode table's framework and version) in kvtier's units;
    empty where the package has none for the system."""
    root = _package_root() / "systems"
    path = _backfilled(root / "data" / system / "mla" / MLA_FRAMEWORK, _query_version(root, system, MLA_FRAMEWORK),
                       "context_mla_perf.parquet")
    if path is None:
        return pd.DataFrame(columns=MLA_CONTEXT_COLUMNS)
    by_dtype = {v: k for k, v in KV_DTYPES.items() if k != "fp16"}
    df = _read(path)
    df = df[df["kv_cache_dtype"].isin(by_dtype) & (df["mla_dtype"] == "bfloat16")]
    out = pd.DataFrame({"kv_dtype": df["kv_cache_dtype"].map(by_dtype).to_numpy(), "heads": df["num_heads"].to_numpy(),
                        "batch": df["batch_size"].to_numpy(), "tokens": df["isl"].to_numpy(),
                        "latency_s": df["latency"].to_numpy() * MS_TO_S})
    out = out.drop_duplicates(["kv_dtype", "heads", "batch", "tokens"], keep="first")
    return drop_spikes(out, ("batch", "tokens", "heads"), ("kv_dtype",))


@lru_cache(maxsize=8)
def _mla_bmm_table(system: str, framework: str) -> pd.DataFrame:
    """The engine's own MLA BMM rows in kvtier's units (op pre / post, dtype bf16 / fp8, seconds); empty
    where the engine times none for the system (another engine's BMMs are not this engine's)."""
    root = _package_root() / "systems"
    path = _backfilled(root / "data" / system / MLA_BMM_TABLE / framework, _query_version(root, system, framework),
                       "mla_bmm_perf.parquet") if framework in FRAMEWORKS else None
    if path is None:
        return pd.DataFrame(columns=MLA_BMM_COLUMNS)
    df = _read(path)
    df = df[df["bmm_dtype"].isin(["bfloat16", "fp8"])]
    out = pd.DataFrame({"op": df["op_name"].map({"mla_gen_pre": "pre", "mla_gen_post": "post"}).to_numpy(),
                        "dtype": df["bmm_dtype"].map({"bfloat16": "bf16", "fp8": "fp8"}).to_numpy(),
                        "heads": df["num_heads"].to_numpy(), "tokens": df["num_tokens"].to_numpy(),
                        "latency_s": df["latency"].to_numpy() * MS_TO_S})
    return out.dropna().drop_duplicates(["op", "dtype", "heads", "tokens"], keep="first").reset_index(drop=True)


@lru_cache(maxsize=8)
def _moe_mla(system: str, framework: str = FRAMEWORK) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    root = _package_root() / "systems"
    data = root / "data" / system
    mla_ver = _query_version(root, system, MLA_FRAMEWORK)
    mla_path = _backfilled(data / "mla" / MLA_FRAMEWORK, mla_ver, "generation_mla_perf.parquet")
    moe_path = None
    for moe_fw in dict.fromkeys((framework if framework in FRAMEWORKS else FRAMEWORK, FRAMEWORK)):  # vLLM's after
        moe_path = _moe_path(system, moe_fw)
        if moe_path is not None:
            break
    mla = _mla_decode(_read(mla_path)) if mla_path else pd.DataFrame(columns=MLA_COLUMNS)
    moe = _twin_checked(system, moe_fw, _moe_rows(moe_path)) if moe_path else pd.DataFrame(columns=MOE_COLUMNS)
    sources = {table: f"{fw} {path.parent.name}" for table, fw, path in
               ((MLA_TABLE, MLA_FRAMEWORK, mla_path), (MOE_TABLE, moe_fw, moe_path)) if path is not None}
    return mla, moe, sources


def _moe_path(system: str, framework: str) -> Path | None:
    """The fused-experts table the package holds for `system` under `framework` (its queried version,
    back-filled), or None."""
    root = _package_root() / "systems"
    return _backfilled(root / "data" / system / "moe" / framework, _query_version(root, system, framework),
                       "moe_perf.parquet")


def moe_curves(moe: pd.DataFrame) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """A fused-experts table (MOE_COLUMNS) as (quant, distribution, experts, top-k, hidden, inter, tp, ep) -> its
    (tokens, seconds) curve."""
    return {(k[0], k[1], *(int(x) for x in k[2:])): (t["tokens"].to_numpy(dtype=float), t["latency_s"].to_numpy())
            for k, t in moe.groupby(MOE_SLICE)}


def raw_moe_table(gpu: str, framework: str = FRAMEWORK) -> pd.DataFrame | None:
    """A catalog GPU's fused-experts rows under `framework` as read, before the die-twin check (MOE_COLUMNS but
    from_twin; `benchmarks/sibling_tables.py`), or None where the package holds no such table."""
    system = system_for(gpu)
    path = _moe_path(system, framework) if system and tables_available() else None
    return _moe_rows(path) if path else None


@lru_cache(maxsize=8)
def _moe_rows(path: Path) -> pd.DataFrame:
    """One fused-experts table's rows as `_moe` reads them, before any twin check (read once per process)."""
    return _moe(_read(path))


# ---- Blackwell's die twins (the fused-experts tables) ----------------------------------------------
# AIConfigurator measures four Blackwell datacenter systems built on two dies at one HBM rate: B200 and GB200
# carry one die, B300 and GB300 (Blackwell Ultra) the other. TensorRT-LLM's fused-experts tables of the four
# agree within a few percent over most slices, but in 2-7% of the bf16 and fp8 slices one system's curve sits
# >= 1.3x from the other three's median, and in 11% of B200's NVFP4 slices, every one slower (DeepSeek-R1's
# and Qwen3-235B's EP4 among them; `benchmarks/sibling_tables.py --four`) - as if the collector had timed
# another tactic there - while the published B200 and GB200 throughputs of those models are within 1-13% of
# each other. Such a point takes its die twin's time where the twin's agrees with the four's median; vLLM's
# and SGLang's tables of the four hold few (32-463 points each, against TensorRT-LLM's 4,446-9,237).
DIE_TWINS = {"b200_sxm": "gb200", "gb200": "b200_sxm", "b300_sxm": "gb300", "gb300": "b300_sxm"}
TWIN_APART = 1.3  # a point this far from its twin's and from the four's median stands apart


def _twin_checked(system: str, framework: str, moe: pd.DataFrame) -> pd.DataFrame:
    """`moe` (`system`'s fused-experts rows under `framework`) through `twin_checked_moe` where the system has a
    die twin whose table the package holds; else as it is, no point flagged."""
    twin = DIE_TWINS.get(system)
    path = _moe_path(twin, framework) if twin else None
    if path is None:
        return moe.assign(from_twin=False)
    others = [_moe_rows(p) for p in (_moe_path(s, framework) for s in DIE_TWINS if s not in (system, twin)) if p]
    return twin_checked_moe(moe, _moe_rows(path), others)


def twin_checked_moe(moe: pd.DataFrame, twin: pd.DataFrame, others: list[pd.DataFrame]) -> pd.DataFrame:
    """`moe` (one system's fused-experts rows, MOE_COLUMNS) with a `from_twin` column: each point that stands
    TWIN_APART from its die twin's (`twin`: the same slice and token count) and from the median of the twin's
    and `others`' (the other die's systems, one of them at least timing it too), while the twin's own point is
    within TWIN_APART of that median, takes the twin's time and is flagged."""
    key = MOE_SLICE + ["tokens"]
    m = moe[key + ["latency_s"]].merge(twin[key + ["latency_s"]].rename(columns={"latency_s": "twin"}), on=key,
                                       how="left")
    refs = ["twin"]
    for i, other in enumerate(others):
        refs.append(f"other{i}")
        m = m.merge(other[key + ["latency_s"]].rename(columns={"latency_s": refs[-1]}), on=key, how="left")
    median = m[refs].median(axis=1, skipna=True)
    far = np.log(TWIN_APART)
    with np.errstate(invalid="ignore", divide="ignore"):
        apart = ((m[refs].notna().sum(axis=1) >= 2) & (np.abs(np.log(m["latency_s"] / m["twin"])) >= far)
                 & (np.abs(np.log(m["latency_s"] / median)) >= far) & (np.abs(np.log(m["twin"] / median)) < far))
    apart = apart.to_numpy()
    return moe.assign(latency_s=np.where(apart, m["twin"].to_numpy(), m["latency_s"].to_numpy()), from_twin=apart)


def _mla_decode(df: pd.DataFrame) -> pd.DataFrame:
    """The generation MLA rows in kvtier's units: kv_tokens = isl + step (the cached tokens and the new
    one, as the package's loader keys them), seconds; the first row of a duplicated key wins."""
    by_dtype = {v: k for k, v in KV_DTYPES.items() if k != "fp16"}
    df = df[df["kv_cache_dtype"].isin(by_dtype)]
    out = pd.DataFrame({"kv_dtype": df["kv_cache_dtype"].map(by_dtype).to_numpy(), "heads": df["num_heads"].to_numpy(),
                        "batch": df["batch_size"].to_numpy(), "kv_tokens": (df["isl"] + df["step"]).to_numpy(),
                        "latency_s": df["latency"].to_numpy() * MS_TO_S})
    out = out.drop_duplicates(["kv_dtype", "heads", "batch", "kv_tokens"], keep="first")
    return drop_spikes(out, ("batch", "kv_tokens", "heads"), ("kv_dtype",))


# TensorRT-LLM's Blackwell NVFP4 tables time two kernels on the same keys: the CUTLASS fused MoE
# (moe_config.backend CUTLASS, the default) and trtllm-gen's min-latency kernel (backend TRTLLM). The engine
# runs the backend its options name at every batch size (`create_moe.get_moe_cls`: no switch by token count),
# and the collector times the min-latency kernel under DeepSeek-V3's group-limited router (8 groups, top 4)
# and without the finalize step that sums each token's experts (`do_finalize=False`; AIConfigurator
# collector/trtllm/collect_moe.py `run_moe_torch`): another routing and less work than the CUTLASS rows'.
# So the CUTLASS rows are kept at every token count and the min-latency lane is left out: every key it
# times, CUTLASS times too. A run that names the TRTLLM backend takes the CUTLASS rows, and its sources say
# so (`moe_mla_costs._moe_part`).
MIN_LATENCY_LANE = "moe_torch_flow_min_latency"
# TensorRT-LLM's tables also time non-gated experts (Nemotron-H's ReLU^2 MLP: up and down, 2 h I weights an
# expert) in their own lane. kvtier's experts are gated (gate, up, down: 3 h I), so those rows are another
# operator: left out, lest a fit costing them at 3 h I bend the gated experts' constants.
NONGATED_LANE = "moe_torch_flow_nongated"
LANES_LEFT_OUT = (MIN_LATENCY_LANE, NONGATED_LANE)


def _moe(df: pd.DataFrame) -> pd.DataFrame:
    """The fused-experts rows in kvtier's units (seconds), the weight formats of `MOE_QUANTS`, without the
    kernel lanes `LANES_LEFT_OUT` (TensorRT-LLM's min-latency and non-gated ones); otherwise the first row of a
    duplicated (slice, tokens) key wins."""
    df = df[df["moe_dtype"].isin(MOE_QUANTS)]
    if "kernel_source" in df:
        df = df[~df["kernel_source"].isin(LANES_LEFT_OUT)]
    kernel = df["kernel_source"] if "kernel_source" in df else pd.Series("", index=df.index)
    out = pd.DataFrame({"quant": df["moe_dtype"].to_numpy(), "distribution": df["distribution"].to_numpy(),
                        "experts": df["num_experts"].to_numpy(), "top_k": df["topk"].to_numpy(),
                        "hidden": df["hidden_size"].to_numpy(), "inter": df["inter_size"].to_numpy(),
                        "tp": df["moe_tp_size"].to_numpy(), "ep": df["moe_ep_size"].to_numpy(),
                        "tokens": df["num_tokens"].to_numpy(), "kernel": kernel.astype(str).to_numpy(),
                        "latency_s": df["latency"].to_numpy() * MS_TO_S})
    out = out.drop_duplicates(MOE_SLICE + ["tokens"], keep="first")
    return drop_spikes(out, ("tokens",), tuple(MOE_SLICE), MOE_SPIKE_FACTOR, min_axes=1)


def moe_quant_for(weight_dtype: str, group_size: int = 128, w4a8: bool = False) -> str | None:
    """The MoE table weight format a kvtier weight dtype runs as: bf16/fp16 unquantised; fp8 as the
    128x128 block-scaled W8A8 of DeepSeek's and Qwen3's FP8 checkpoints; mxfp4 (and int4 with groups of
    32, its nearest integer stand-in) as gpt-oss's MXFP4 - W4A16 before Blackwell, W4A8 with MXFP8
    activations on it (`w4a8`: the GPU runs mxfp4 at its fp8 peak, TensorRT-LLM's SM100 choice) - other
    int4 as Marlin W4A16; nvfp4 as NVFP4 W4A4 (Blackwell tables); None for int8 (no table)."""
    if weight_dtype in ("bf16", "fp16"):
        return "bfloat16"
    if weight_dtype == "fp8":
        return "fp8_block"
    if weight_dtype == "mxfp4":
        return "w4a8_mxfp4_mxfp8" if w4a8 else "w4a16_mxfp4"
    if weight_dtype == "int4":
        return "w4a16_mxfp4" if group_size == 32 else "int4_wo"
    if weight_dtype == "nvfp4":
        return "nvfp4"
    return None


# TensorRT-LLM's MoE backends (moe_config.backend), as scenario `engine.moe_backend` names them.
TRTLLM_MOE_BACKENDS = ("CUTLASS", "TRTLLM", "TRITON", "DEEPGEMM")
MXFP4_QUANTS = ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8")


def trtllm_moe_backend(kernel: str, quant: str, sm100: bool) -> str | None:
    """The TensorRT-LLM MoE backend a row of its fused-experts table timed, from the row's kernel_source,
    weight format and GPU (`sm100`: compute capability 10.x), as AIConfigurator's collector picks it
    (collector/trtllm/collect_moe_v3.py, TensorRT-LLM >= 1.3.0rc20, `run_moe_torch`): deepgemm DEEPGEMM
    (fp8_block on 10.x); min_latency TRTLLM (trtllm-gen; not loaded, `LANES_LEFT_OUT`); cutlass and nongated (not
    loaded) CUTLASS; Triton's fp8_block
    TRITON; the unlabelled moe_torch_flow is MXFP4's own - TRITON on Hopper, TRTLLM on 10.x (the engine's
    AUTO for gpt-oss there, model_config.py `resolve_moe_backend`). None: a lane it does not name."""
    if kernel == "deepgemm":
        return "DEEPGEMM"
    if kernel == "moe_torch_flow_min_latency":
        return "TRTLLM"
    if kernel in ("moe_torch_flow_cutlass", "moe_torch_flow_nongated"):
        return "CUTLASS"
    if kernel == "moe_torch_flow_triton_fp8_block":
        return "TRITON"
    if kernel == "moe_torch_flow" and quant in MXFP4_QUANTS:
        return "TRTLLM" if sm100 else "TRITON"
    return None


# ---- the held-out split ---------------------------------------------------------------------------
# Whole grid lines are held out, so the held-out points test interpolation across a gap (a held-out
# cell inside a kept line would only test the nearest-cell fill): every 4th value (from the 3rd) of
# GEMM n and k, of decode and prefill attention tokens and batch, and of all-reduce, all-gather and
# reduce-scatter message size; of DeepEP's tokens a rank (per kernel); of MLA decode kv_tokens and batch,
# of MLA prefill tokens and batch, and of MoE and MLA BMM tokens (where the tables carry them: `with_moe_mla`).
HELD_OUT_EVERY, HELD_OUT_FROM = 4, 2


def _held_lines(values: pd.Series) -> pd.Series:
    axis = np.unique(values.to_numpy())
    held = axis[HELD_OUT_FROM::HELD_OUT_EVERY]
    return values.isin(held)


def split_tables(tables: KernelTables) -> tuple[KernelTables, KernelTables]:
    """(tune, held_out): the same tables with the held-out grid lines removed, and those lines alone."""
    g, a = tables.gemm, tables.decode_attention
    g_held = _held_lines(g["n"]) | _held_lines(g["k"])
    a_held = _held_lines(a["kv_tokens"]) | _held_lines(a["batch"])
    c = tables.context_attention
    c_held = (_held_lines(c["kv_tokens"]) | _held_lines(c["batch"])) if c is not None else None
    ar_held = {impl: t.groupby("gpus")["bytes"].transform(lambda s: _held_lines(s)).astype(bool)
               for impl, t in tables.allreduce.items()}
    gather_held = {op: t.groupby("gpus")["bytes"].transform(lambda s: _held_lines(s)).astype(bool)
                   for op, t in tables.gather.items()}
    x = tables.a2a
    x_held = x.groupby("backend")["tokens"].transform(lambda s: _held_lines(s)).astype(bool) if x is not None else None

    # tables that never read MLA decode or MoE split into parts that hold none (empty, not None: a
    # part is never completed later by `with_moe_mla` with the unsplit table)
    m = tables.mla_decode if tables.mla_decode is not None else pd.DataFrame(columns=MLA_COLUMNS)
    e = tables.moe if tables.moe is not None else pd.DataFrame(columns=MOE_COLUMNS)
    b = tables.mla_bmm if tables.mla_bmm is not None else pd.DataFrame(columns=MLA_BMM_COLUMNS)
    p = tables.mla_context if tables.mla_context is not None else pd.DataFrame(columns=MLA_CONTEXT_COLUMNS)
    m_held = _held_lines(m["kv_tokens"]) | _held_lines(m["batch"])
    p_held = _held_lines(p["tokens"]) | _held_lines(p["batch"])
    e_held = _held_lines(e["tokens"])
    b_held = _held_lines(b["tokens"])

    def part(held: bool) -> KernelTables:
        return replace(tables, gemm=g[g_held == held], decode_attention=a[a_held == held],
                       allreduce={impl: t[ar_held[impl] == held] for impl, t in tables.allreduce.items()},
                       gather={op: t[gather_held[op] == held] for op, t in tables.gather.items()},
                       a2a=x[x_held == held] if x is not None else None,
                       mla_decode=m[m_held == held], moe=e[e_held == held], mla_bmm=b[b_held == held],
                       mla_context=p[p_held == held],
                       context_attention=c[c_held == held] if c is not None else None)

    return part(False), part(True)
