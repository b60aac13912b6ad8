"""Built-in catalogs (models, GPUs, host links, default efficiencies) and Hugging Face configs."""

from __future__ import annotations

import copy
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, model_validator

from sim.model.dtypes import TENSOR_CORE_PATHS
from sim.model.spec import ModelSpec
from sim.model.units import MiB

from .errors import ConfigError
from .hf_config import config_from_mapping, spec_from_config
from .hf_config import model_from_hf_config as from_hf


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Frozen):
    name: str
    aliases: list[str] = []
    source: str
    memory_bytes: float  # what the device reports (memory_total_mib converted at load), else the datasheet's
    memory_source: str
    memory_total_mib: int | None = None  # NVML / nvidia-smi memory.total, as the catalog states it
    hbm_bytes_per_s: float
    bf16_flop_per_s: float
    fp32_flop_per_s: float  # CUDA cores (non-tensor): the dequantisation work of weight-only kernels
    fp8_flop_per_s: float | None = None
    int8_op_per_s: float | None = None
    fp4_flop_per_s: float | None = None  # FP4 tensor cores (Blackwell): NVFP4 W4A4 GEMMs; None: none
    link: str
    host: str = "epyc-9654"  # the host CPU of this part's typical system
    interconnect: str = "nvlink4"  # GPU-to-GPU fabric for tensor parallelism
    copy_engines: int = 2
    sm_count: int | None = None  # streaming multiprocessors (XQA's split grid is 8 x SMs); None: not known
    host_memory_bytes: float | None = None
    # a catalog GPU of the same silicon whose fitted kernel constants this one takes where no table
    # measures it (`fitted_kernels_for`), and why it is a sibling
    fit_sibling: str | None = None
    fit_sibling_why: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _device_memory(cls, data):
        """memory_total_mib (binary, as the device reports it) -> memory_bytes, converted once here."""
        if isinstance(data, dict) and data.get("memory_total_mib") is not None:
            if data.get("memory_bytes") is not None:
                raise ValueError("give memory_total_mib or memory_bytes, not both")
            data = {**data, "memory_bytes": float(data["memory_total_mib"] * MiB)}
        return data

    def matmul_peak(self, weight_dtype: str) -> tuple[float, str]:
        """(peak FLOP/s, its precision) a layer GEMM of `weight_dtype` weights runs at: fp8 W8A8 at the fp8
        peak, nvfp4 W4A4 at the fp4 peak, mxfp4 W4A8 at the fp8 peak, where the GPU has the tensor cores each
        needs (`TENSOR_CORE_PATHS`); bf16's otherwise (weight-only)."""
        needs, runs = TENSOR_CORE_PATHS.get(weight_dtype, (None, None))
        peak = getattr(self, f"{runs}_flop_per_s") if needs and getattr(self, f"{needs}_flop_per_s") else None
        return (peak, runs) if peak else (self.bf16_flop_per_s, "bf16")


class HostSpec(_Frozen):
    """One host CPU socket: what host-side attention reads its T1/T2 with."""

    name: str
    aliases: list[str] = []
    source: str
    cores: int
    memory_channels: int
    memory_mt_per_s: int
    theoretical_memory_bytes_per_s: float
    achieved_memory_fraction: float
    fp32_flop_per_s: float

    @property
    def achieved_memory_bytes_per_s(self) -> float:
        return self.theoretical_memory_bytes_per_s * self.achieved_memory_fraction


class HostDefaults(_Frozen):
    host_attention_flop_efficiency: float
    host_attention_dispatch_s: float


class InterconnectSpec(_Frozen):
    name: str
    source: str
    bus_bytes_per_s: float  # NCCL all_reduce busbw, ring, large messages
    per_hop_latency_s: float
    nvlink: bool  # the GPUs reach each other over NVLink (else PCIe): which all-reduce an engine runs
    alltoall_bytes_per_s: float  # expert-parallel dispatch/combine: bytes one GPU sends per second
    alltoall_floor_s: float  # per dispatch or combine call
    alltoall_source: str


class LinkSpec(_Frozen):
    name: str
    source: str
    theoretical_bytes_per_s: float
    pinned_h2d_bytes_per_s: float
    pinned_d2h_bytes_per_s: float
    pageable_h2d_bytes_per_s: float
    pageable_d2h_bytes_per_s: float
    bidirectional_bytes_per_s: float
    per_copy_latency_s: float
    pageable_per_copy_latency_s: float


SOURCE_KINDS = ("measured", "derived", "assumed")


class EfficiencyDefaults(_Frozen):
    source: str
    weight_hbm_efficiency: dict[str, float]
    dequant_ops_per_weight: dict[str, float]  # CUDA-core lane operations per weight of a weight-only kernel
    attention_hbm_efficiency: float
    attention_latency_s: float
    gemm_floor_s: float  # one GEMM call's floor
    gemm_flop_efficiency_by_rows: list[tuple[float, float]]
    attention_flop_efficiency: float
    prefill_attention_floor_s: float  # one prefill-attention call's floor
    layer_overhead_s: float
    step_overhead_s: float
    host_pack_bytes_per_s: float
    runtime_reserve_bytes: float
    default_host_memory_bytes: float
    sources: dict[str, str]  # figure -> how it was obtained ("measured: ...", "derived: ...", "assumed: ...")

    @model_validator(mode="after")
    def _every_figure_sourced(self):
        figures = [name for name in type(self).model_fields if name not in ("source", "sources")]
        missing = [name for name in figures if name not in self.sources]
        if missing:
            raise ValueError(f"no entry in sources for {', '.join(missing)}")
        bad = [name for name, text in self.sources.items() if not text.startswith(SOURCE_KINDS)]
        if bad:
            raise ValueError(f"sources of {', '.join(bad)} must start with one of {', '.join(SOURCE_KINDS)}")
        return self


class FitErrors(_Frozen):
    median: float
    worst: float
    mean: float
    points: int


class _Fitted(_Frozen):
    tune: FitErrors
    held_out: FitErrors
    file: str = "fitted_kernels.yaml"  # the catalog file it was read from (`fitted_kernels_file`: one per engine)
    borrowed: str = ""  # a sibling GPU's fit (`fitted_kernels_for`): "<sibling>: <why>"; "" for the GPU's own

    def says(self, what: str) -> str:
        """The figure's source line: what it was fitted on and how well it predicts held-out points."""
        h = self.held_out
        sibling, _, why = self.borrowed.partition(": ")
        on, taken = (f"{sibling}'s ", f"; taken as its sibling's: {why}") if self.borrowed else ("", "")
        return (f"fitted on {on}measured {what} ({self.file}): held-out |error| {'there ' if on else ''}median "
                f"{h.median:.1%}, worst {h.worst:.0%}{taken}")


class FittedGemm(_Fitted):
    floor_s: float
    weight_hbm_efficiency: float  # weights and activations streamed
    flop_efficiency: float  # plateau of the default curve by rows
    output_hbm_efficiency: float  # the m x n output written, as a fraction of HBM per element (may exceed 1: it overlaps)
    quant_row_s: float = 0.0  # W8A8: the activation's dynamic per-tensor quantisation, per row
    quant_hbm_efficiency: float = 0.0  # ... its pass over the m x k activation, per element as a fraction of HBM (0: none)
    weight_reread: float = 0.0  # W8A8 tiles: the share of the weights each further 128-row tile streams again
    half_tiles: float = 0.0  # ... the output tiles at which the weight stream runs at half rate (0: none)
    half_tiles_decode: float = 0.0  # ... the same for the small-M kernels (m <= 64)


class FittedAttention(_Fitted):
    floor_s: float
    hbm_efficiency: float  # bf16 KV
    fp8_hbm_efficiency: float  # fp8 KV (the bf16 one where the tables time no fp8 KV)
    half_ctas: float  # thread blocks (batch x KV heads) at half the streaming rate
    per_cta_s: float  # each block's serial cost
    fp8_floor_s: float | None = None  # fp8 KV's own floor and per-block cost (the engines run other kernels for it);
    fp8_per_cta_s: float | None = None  # None: the bf16 ones
    # TensorRT-LLM's XQA (fitted on 2-32 query heads per KV head): True where its sequence split and the
    # additive form fit the tune split better (`physics.gqa_datasheet_attention_s`), with a per-block cost
    # per query head the block serves; False: the overlapping form above
    per_cta_head_s: float = 0.0
    sequence_split: bool = False


class FittedWindowAttention(FittedAttention):
    """A sliding window's decode attention at one head dim: the decode form over the window's tokens, plus a
    floor and a per-block cost once a sequence is longer than its window (`physics.window_datasheet_attention_s`);
    with XQA's sequence split, its blocks counted over the whole sequence."""

    past_window_floor_s: float = 0.0
    past_window_per_cta_s: float = 0.0


class FittedPrefill(_Fitted):
    floor_s: float  # one prefill-attention call's floor
    flop_efficiency: float  # of the bf16 peak, its plateau over long prompts
    half_tokens: float = 0.0  # the prompt length at which it is half the plateau (0: flat)
    half_tiles: float = 0.0  # the query tiles (prompts x heads x ceil(n / 128)) at which it is half (0: none)
    kv_write_s: float = 0.0  # each new token's K/V written to the cache, per KV head
    # the FLOP efficiency at head dim 64 (gpt-oss) over head dim 128's, fitted on the head-dim-64 rows with the
    # rest held (1: none timed), and its held-out errors there
    head_dim_64_flop_scale: float = 1.0
    held_out_head_dim_64: FitErrors | None = None
    # a sliding window's fit: the kernel skips the key tiles outside the window (its pairs at min(n, W)'s rate)
    # or masks them (the whole causal prompt's at n's)
    skips_window: bool = True


class AllReduceProtocols(_Frozen):
    """One group size's all-reduce: a latency protocol and a bandwidth protocol, each a floor and a bus
    bandwidth (`collectives.two_protocol_allreduce_s` takes the faster)."""

    latency_floor_s: float
    latency_bus_bytes_per_s: float
    bandwidth_floor_s: float
    bandwidth_bus_bytes_per_s: float

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.latency_floor_s, self.latency_bus_bytes_per_s, self.bandwidth_floor_s,
                self.bandwidth_bus_bytes_per_s)


class FittedMla(_Fitted):
    floor_s: float
    hbm_efficiency: float  # bf16 latents
    fp8_hbm_efficiency: float
    flop_efficiency: float  # of the bf16 peak: absorbed MLA with many heads per GPU is compute-bound
    half_blocks: float  # thread blocks (batch x ceil(heads / 64)) at which the latent stream runs at half rate


class FittedMlaBmm(_Fitted):
    """Absorbed MLA's batched matmuls (q_nope x W_UK, latent x W_UV) of one dtype."""

    floor_s: float
    flop_efficiency: float  # of the dtype's peak
    hbm_efficiency: float


class FittedMoe(_Fitted):
    floor_s: float
    per_expert_s: float  # each expert the call touches
    weight_hbm_efficiency: float
    flop_efficiency: float  # of the format's MMA peak (fp8 formats: fp8; W4A16: bf16)
    half_rows: float  # rows per touched expert at half that efficiency
    pair_hbm_efficiency: float  # routed rows gathered and scattered; may exceed 1 (50: the term is off)
    token_hbm_efficiency: float  # tokens entering the layer (top-k, alignment, output): a per-token cost


class FittedAllToAll(_Fitted):
    """One DeepEP kernel's phase (dispatch or combine): floor + bytes a rank sends / rate."""

    floor_s: float
    bytes_per_s: float


class FittedAllReduce(_Fitted):
    by_gpus: dict[int, AllReduceProtocols]  # per group size the tables measure


class FittedKernels(_Frozen):
    """One GPU's datasheet-model constants fitted on measured kernel tables (fitted_kernels.yaml)."""

    source: str
    gemm: dict[str, FittedGemm]  # by the dtype of the GEMM: bf16, fp8
    attention: FittedAttention
    allreduce: dict[str, FittedAllReduce]  # custom, nccl
    gather: dict[str, FittedAllReduce] | None = None  # NCCL's all_gather and reduce_scatter (the whole buffer's size)
    alltoall: dict[str, dict[str, FittedAllToAll]] | None = None  # DeepEP: kernel (ht, ll) -> phase -> fit
    prefill_attention: dict[str, FittedPrefill] | None = None  # by KV dtype, where the tables have a context table
    # MLA prefill (not absorbed) by KV dtype, fitted on TensorRT-LLM's context-MLA rows, where the tables time it
    mla_prefill: dict[str, FittedPrefill] | None = None
    # a sliding window's prefill by KV dtype, fitted on the context table's window rows, where the tables time them
    window_prefill: dict[str, FittedPrefill] | None = None
    # a sliding window's decode attention by head dim, fitted on the decode table's window rows, where they time them
    window_attention: dict[int, FittedWindowAttention] | None = None
    mla_attention: FittedMla | None = None  # absorbed MLA decode, where the tables time it
    # TensorRT-LLM's multi-head decode kernel (MMHA) on its own: the tables' one-query-head-per-KV-head rows
    mha_attention: FittedAttention | None = None
    mla_bmm: dict[str, FittedMlaBmm] | None = None  # absorbed MLA's BMMs by dtype (bf16, fp8), the engine's own
    moe: dict[str, FittedMoe] | None = None  # fused routed experts by the table's weight format (bfloat16, fp8_block, ...)
    moe_power_law: dict[str, FittedMoe] | None = None  # the same on the power-law routings' rows, at their draw's load


class _ModelEntry(_Frozen):
    name: str
    aliases: list[str] = []
    source: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int | None = None  # as config.json (rope types that leave it as is: see models.yaml)

    def spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.name,
            num_layers=self.num_hidden_layers,
            hidden_size=self.hidden_size,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            tie_embeddings=self.tie_word_embeddings,
            explicit_head_dim=self.head_dim,
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            source=self.source,
            context_tokens=self.max_position_embeddings,
        )


class _ConfigModelEntry(_Frozen):
    """A catalog model given by its config.json fields (`config:`, the file's own names and values),
    read by the same code as a config.json on disk: layers by kind, experts, MLA."""

    name: str
    aliases: list[str] = []
    source: str
    config: dict

    def spec(self) -> ModelSpec:
        cfg = config_from_mapping(self.config, source=f"sim/catalog/models.yaml: {self.name}")
        return spec_from_config(cfg, self.name, self.source)


def _entry(e: dict) -> ModelSpec:
    return (_ConfigModelEntry(**e) if "config" in e else _ModelEntry(**e)).spec()


def _read_catalog(filename: str) -> dict:
    """A catalog file's YAML, parsed once per process (a plan asks for some hundreds of times); a copy,
    so a caller that changes it changes nothing else."""
    return copy.deepcopy(_parsed_catalog(filename))


@lru_cache(maxsize=None)
def _parsed_catalog(filename: str) -> dict:
    return yaml.safe_load(resources.files("sim").joinpath("catalog", filename).read_text())


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@lru_cache(maxsize=None)
def models() -> dict[str, ModelSpec]:
    return {e["name"]: _entry(e) for e in _read_catalog("models.yaml")["models"]}


@lru_cache(maxsize=None)
def _model_aliases() -> dict[str, str]:
    table = {}
    for e in _read_catalog("models.yaml")["models"]:
        for n in [e["name"], *e.get("aliases", [])]:
            table[_key(n)] = e["name"]
    return table


@lru_cache(maxsize=None)
def gpus() -> dict[str, GpuSpec]:
    out = {e["name"]: GpuSpec(**e) for e in _read_catalog("gpus.yaml")["gpus"]}
    for g in out.values():  # a sibling is a catalog GPU with a fit of its own, and says why it is one
        sib = out.get(g.fit_sibling) if g.fit_sibling else None
        if g.fit_sibling and (sib is None or sib.fit_sibling or not g.fit_sibling_why):
            raise ValueError(f"gpus.yaml: {g.name}.fit_sibling: expected a catalog GPU without a sibling of its "
                             f"own, and fit_sibling_why; got {g.fit_sibling!r}")
    return out


@lru_cache(maxsize=None)
def links() -> dict[str, LinkSpec]:
    return {e["name"]: LinkSpec(**e) for e in _read_catalog("links.yaml")["links"]}


FITTED_FRAMEWORK = "vllm"  # whose tables fitted_kernels.yaml was fitted on; the others' have files of their own


def fitted_kernels_file(framework: str = FITTED_FRAMEWORK) -> str:
    """The catalog file of the constants fitted on `framework`'s tables (vLLM's: fitted_kernels.yaml)."""
    return "fitted_kernels.yaml" if framework == FITTED_FRAMEWORK else f"fitted_kernels.{framework}.yaml"


@lru_cache(maxsize=None)
def fitted_kernels(framework: str = FITTED_FRAMEWORK) -> dict[str, FittedKernels]:
    """{catalog GPU: its kernel constants fitted on `framework`'s measured tables (the engine whose
    kernels a run assumes, `EngineCfg.kernel_framework`)}; GPUs the tables do not cover are absent, and
    a framework with no fitted file takes vLLM's."""
    if not resources.files("sim").joinpath("catalog", fitted_kernels_file(framework)).is_file():
        framework = FITTED_FRAMEWORK
    name = fitted_kernels_file(framework)
    data = _read_catalog(name)
    return {gpu: FittedKernels(source=data["source"], **_on_fitted(entry, "file", name)) for gpu, entry in data["gpus"].items()}


def fit_source(gpu: str, framework: str = FITTED_FRAMEWORK) -> str | None:
    """The catalog GPU whose fitted constants `gpu`'s datasheet model takes: itself where `framework`'s
    tables cover it, else its sibling (gpus.yaml `fit_sibling`), else None."""
    return gpu if gpu in fitted_kernels(framework) else gpus()[gpu].fit_sibling


NO_FIT = "none"  # `fitted_kernels_for(..., fit_from=NO_FIT)`: the flat defaults, as for a GPU without tables or sibling


@lru_cache(maxsize=256)
def fitted_kernels_for(gpu: str, framework: str = FITTED_FRAMEWORK, fit_from: str | None = None) -> FittedKernels | None:
    """The constants fitted on `framework`'s tables that the datasheet model of catalog GPU `gpu` takes:
    its own, else its sibling's (gpus.yaml `fit_sibling`: the same silicon, which no table measures,
    e.g. RTX 4090 takes L40S's), or None (the flat defaults of efficiency.yaml). A fit is fractions of
    the datasheet peaks and per-call floors, so it carries over to a sibling's own peaks; its all-reduce
    only over the same fabric. `fit_from` names the GPU whose fit to take instead (a study of how well
    fits carry over; NO_FIT: none)."""
    fits, spec = fitted_kernels(framework), gpus()[gpu]
    source = fit_from or fit_source(gpu, framework)
    if source == gpu or source is None or source == NO_FIT:
        return fits.get(gpu) if source == gpu else None
    why = spec.fit_sibling_why if source == spec.fit_sibling else "a study of how fits carry over"
    said = f"{source}: {why}"
    fit = fits[source].model_dump()
    if gpus()[source].interconnect != spec.interconnect:  # the collectives are the fabric's, not the die's
        fit["allreduce"], fit["gather"], fit["alltoall"] = {}, None, None
    return FittedKernels(**_on_fitted(fit, "borrowed", said))


def _on_fitted(node, key: str, value):
    """`node` with `key: value` in every fitted figure (a mapping with held-out errors): the file it was
    read from, or the sibling it is borrowed from, for its source line."""
    if not isinstance(node, dict):
        return node
    out = {k: _on_fitted(v, key, value) for k, v in node.items()}
    return {**out, key: value} if "held_out" in node else out


def fitted_elementwise() -> dict:
    """sim/catalog/fitted_elementwise.yaml: a decoder layer's elementwise passes fitted per GPU
    (scripts/fit_elementwise.py; read by `device.elementwise`)."""
    return _parsed_catalog("fitted_elementwise.yaml")


@lru_cache(maxsize=None)
def efficiency_defaults() -> EfficiencyDefaults:
    return EfficiencyDefaults(**_read_catalog("efficiency.yaml"))


def model(name: str) -> ModelSpec:
    canonical = _model_aliases().get(_key(name))
    if canonical is None:
        raise ConfigError(f"unknown model {name!r}; expected one of: {', '.join(models())}")
    return models()[canonical]


def _by_name_or_alias(entries: dict, name: str, what: str):
    """The entry whose name or one of whose aliases is `name` (case, `_` and `-` alike)."""
    for spec in entries.values():
        if _key(name) in {_key(spec.name), *map(_key, spec.aliases)}:
            return spec
    raise ConfigError(f"unknown {what} {name!r}; expected one of: {', '.join(entries)}")


def gpu(name: str) -> GpuSpec:
    return _by_name_or_alias(gpus(), name, "GPU")


@lru_cache(maxsize=None)
def hosts() -> dict[str, HostSpec]:
    return {e["name"]: HostSpec(**e) for e in _read_catalog("hosts.yaml")["hosts"]}


@lru_cache(maxsize=None)
def host_defaults() -> HostDefaults:
    data = _read_catalog("hosts.yaml")
    return HostDefaults(**{k: v for k, v in data.items() if k != "hosts"})


def host(name: str) -> HostSpec:
    return _by_name_or_alias(hosts(), name, "host CPU")


@lru_cache(maxsize=None)
def interconnects() -> dict[str, InterconnectSpec]:
    return {e["name"]: InterconnectSpec(**e) for e in _read_catalog("interconnects.yaml")["interconnects"]}


def kv_transfer() -> dict:
    """The fabrics a request's K/V crosses between disaggregated prefill and decode instances."""
    return _read_catalog("interconnects.yaml")["kv_transfer"]


def interconnect(name: str) -> InterconnectSpec:
    spec = interconnects().get(_key(name))
    if spec is None:
        raise ConfigError(f"unknown interconnect {name!r}; expected one of: {', '.join(interconnects())}")
    return spec


def link(name: str) -> LinkSpec:
    spec = links().get(_key(name))
    if spec is None:
        raise ConfigError(f"unknown link {name!r}; expected one of: {', '.join(links())}")
    return spec


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json on disk, validated strictly (sim/inputs/hf_config.py)."""
    return from_hf(path)


def resolve_model(model_cfg) -> ModelSpec:
    """The whole model a scenario's `model` section names: a catalog entry or a Hugging Face config,
    with the section's routing skew (a mixture of experts' expert popularity, `sim/model/experts.py`), the
    measured tables' routing it reads (`moe_routing`, sim/inputs/moe_routing.py) and the weight formats its
    checkpoint sets apart: its experts' (`ModelSpec.expert_format`), its attention's (`ModelSpec.attention_formats`)."""
    spec = model(model_cfg.name) if model_cfg.name else model_from_hf_config(model_cfg.hf_config)
    skew = getattr(model_cfg, "routing_skew", 0.0)
    if skew:
        spec = replace(spec, routing_skew=skew)
    if routing := getattr(model_cfg, "moe_routing", None):
        spec = replace(spec, moe_routing=routing)
    formats = {k: v for k in ("expert_weight_dtype", "attention_weight_dtype", "attention_output_weight_dtype")
               if (v := getattr(model_cfg, k, None))}
    return replace(spec, **formats) if formats else spec
