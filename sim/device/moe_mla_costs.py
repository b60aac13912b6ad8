"""AIConfigurator's measured MoE-experts and MLA-decode kernels in the step cost (`physics`), where
the run has measured tables (`hardware.kernels`) that hold the operator:

- MoE: one GPU's fused routed experts (the engine's: vLLM's `fused_experts`, SGLang's and TensorRT-LLM's
  own MoE tables where the scenario's engine has them, `kernel_tables.with_moe_mla`; both grouped GEMMs;
  no router, shared expert or collective) from `MeasuredKernels.moe_one_s`, for the rows entering the layer
  (the group's batch), the experts' full width split tp ways under tensor parallelism or whole ep
  ways under expert parallelism, in the table's format for the weight dtype
  (`kernel_tables.moe_quant_for`) and the routing the model reads (`ModelSpec.moe_routing`: by default
  AIConfigurator's power-law rows for the model's family, sim/inputs/moe_routing.py) - so not with a
  routing skew, the datasheet model's Zipf popularity, which the table does not know. The rest of the
  layer (attention projections, router, shared experts, dense MLP layers) takes the measured GEMM tables
  where every layer's attention is GQA and each format has a table (`measured_moe_rest_s`), else the
  datasheet weight kernel.
- MLA decode: the absorbed MLA kernel (TensorRT-LLM's, FlashMLA-class; the W_UK / W_UV products are
  in kvtier's projections, not here) from `MeasuredKernels.mla_decode_one_s` for one rank's
  sequences, query heads per GPU, at the batch's mean context; DeepSeek's 512 + 64 latent only.

Where no table applies (no measured tables, another latent, int8 weights, a skew) these return None
and physics keeps the datasheet model. benchmarks/moe_mla_accuracy.py: what the datasheet model
misses against these tables (MoE 25-61% median, mostly too fast; MLA 12-57%).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from sim.inputs.kernel_tables import TWIN_APART, moe_quant_for
from sim.inputs.moe_routing import BALANCED_ROUTING
from sim.model.dtypes import WEIGHT_DTYPES
from sim.model.experts import busiest_routing_share
from sim.model.layers import GQA_KINDS, MLA, SPARSE
from sim.model.spec import MLP_MATRICES, ModelSpec
from sim.model.units import FLOP_PER_MAC

from .engine_rules import SM100_GPUS
from .hardware import Hardware
from .measured_kernels import MEASURED_MLA, MEASURED_MLA_CONTEXT, mla_bmm_work
from .moe_exchange import A2A_PHASES


@lru_cache(maxsize=64)
def _measured_keys(kernels, family: str) -> frozenset[str]:
    """The formats or KV dtypes one family of `kernels` measured (`family` the method naming them:
    moe_quants, mla_kv_dtypes, mla_context_kv_dtypes); empty for tables without it (a profile's own)."""
    try:
        return frozenset(getattr(kernels, family)())
    except (KeyError, AttributeError):
        return frozenset()


def _moe_quants(kernels) -> frozenset[str]:
    return _measured_keys(kernels, "moe_quants")


def moe_routing(model: ModelSpec, hw: Hardware) -> str | None:
    """The table routing this run's routed experts read: the model's (`ModelSpec.moe_routing`); where the
    table times no such rows, balanced (a `hwprobe calibrate` profile's own), else None (A100's tables
    time only power-law rows: a balanced run there keeps the datasheet model)."""
    timed = _measured_keys(hw.kernels, "moe_routings")
    return next((r for r in (model.moe_routing, BALANCED_ROUTING) if r in timed), None)


def _mla_dtypes(kernels) -> frozenset[str]:
    return _measured_keys(kernels, "mla_kv_dtypes")


def moe_quant(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int) -> str | None:
    """The measured MoE format this run's routed experts take (in their own format where the checkpoint sets
    one apart: `ModelSpec.expert_format`), or None where the datasheet model stays."""
    if hw.kernels is None or not model.moe_layers or model.routing_skew > 0 or moe_routing(model, hw) is None:
        return None
    quant = moe_format(hw, model.expert_format(weight_dtype), group_size)
    return quant if quant in _moe_quants(hw.kernels) else None


def moe_format(hw: Hardware, weight_dtype: str, group_size: int) -> str | None:
    """The MoE table format this run's experts take on its GPU (`kernel_tables.moe_quant_for`): mxfp4 as
    W4A8 where the GPU runs it at the fp8 peak (Blackwell), W4A16 elsewhere."""
    return moe_quant_for(weight_dtype, group_size, w4a8=hw.gpu.matmul_peak(weight_dtype)[1] != "bf16")


def routed_work(model: ModelSpec, weight_dtype: str, group_size: int, rows: int) -> tuple[float, float, float]:
    """(weight bytes, linear params, FLOP) of the mean layer's routed experts over `rows` tokens: the
    share of them in `ModelSpec.layer_weight_bytes_read` / `layer_linear_params_read` / `gemm_flop`,
    which the measured kernel replaces (moe layers / L of one MoE layer's)."""
    share = model.moe_layers / model.num_layers
    touched = model.expected_experts_touched(rows)
    expert = model.expert_params()
    nbytes = share * touched * model.one_expert_bytes(weight_dtype, group_size)
    per_token = model.experts_per_token * expert
    if model.expert_parallel > 1:
        ep = model.expert_parallel
        per_token = per_token / ep * busiest_routing_share(model.num_experts, model.experts_per_token, ep, model.routing_skew)
    return nbytes, share * touched * expert, FLOP_PER_MAC * rows * share * per_token


def moe_shape(model: ModelSpec, hw: Hardware) -> tuple[int, int, int, int, int, int]:
    """(experts, top-k, hidden, one expert's full width, moe tp, ep) of the table slice this run reads:
    the shard's width x tp is one expert's full width; under expert parallelism the experts are whole."""
    ep = model.expert_parallel
    tp = 1 if ep > 1 else hw.tp
    return model.num_experts, model.experts_per_token, model.hidden_size, model.moe_intermediate_size * tp, tp, ep


def measured_moe_s(model: ModelSpec, hw: Hardware, quant: str, rows: int) -> float:
    """The mean layer's measured routed experts: moe layers / L x one MoE layer's fused experts."""
    one = hw.kernels.moe_one_s(float(rows), *moe_shape(model, hw), quant, moe_routing(model, hw))
    return model.moe_layers / model.num_layers * one


ROUTER_FORMAT = "bf16"  # the router's gate: an unquantised linear in the engines (h -> E logits)


@lru_cache(maxsize=64)
def moe_rest_gemms(model: ModelSpec, weight_dtype: str) -> tuple[tuple[int, int, str, bool, float], ...] | None:
    """The mean MoE layer's dense GEMMs around its routed experts, each as (n, k, format, attention rows, share of the
    layers): qkv and o in the attention's formats (`ModelSpec.attention_formats`) in every layer; the router's gate
    (h -> E, `ROUTER_FORMAT`) and a shared expert's gate_up and down (weight dtype) in the MoE layers; a dense MLP's in
    the dense-MLP layers. `attention rows`: the GEMM runs over one attention rank's tokens, else the dense parts'
    rows. None where a layer's attention is not GQA (MLA, sparse, linear: their projections stay datasheet)."""
    if not all(kind in GQA_KINDS for kind in model.kind_counts):
        return None
    h, moe, dense = model.hidden_size, model.moe_layers / model.num_layers, model.dense_mlp_layers / model.num_layers
    qkv_format, o_format = model.attention_formats(weight_dtype)
    gemms = [(model.q_dim + 2 * model.kv_dim, h, qkv_format, True, 1.0), (h, model.q_dim, o_format, True, 1.0),
             (model.num_experts, h, ROUTER_FORMAT, True, moe)]
    for width, share in ((model.shared_expert_intermediate_size, moe), (model.intermediate_size, dense)):
        if width and share:
            gate_up = ((MLP_MATRICES - 1) * width, h, weight_dtype, False, share)
            gemms += [gate_up, (h, width, weight_dtype, False, share)]
    return tuple(gemms)


def measured_moe_rest_s(model: ModelSpec, hw: Hardware, weight_dtype: str, rows: int, dense_rows: int) -> float | None:
    """The mean MoE layer's GEMMs besides the routed experts (`moe_rest_gemms`) over `rows` tokens from the measured
    GEMM tables, as a dense model's take them: attention projections and router over one attention rank's
    ceil(rows / D), shared experts and dense MLPs over `dense_rows` (`physics.rank_rows`). None - the datasheet weight
    kernel - without measured tables, with a layer that is not GQA, or a format the tables do not time."""
    gemms = moe_rest_gemms(model, weight_dtype)
    if hw.kernels is None or gemms is None or not {fmt for _, _, fmt, _, _ in gemms} <= hw.kernels.gemm_dtypes():
        return None
    return _rest_s(hw.kernels, gemms, attention_rank_rows(model, rows), int(dense_rows))


def attention_rank_rows(model: ModelSpec, rows: int) -> int:
    """The tokens of a group's `rows` one attention rank multiplies (its projections and router): the busiest rank's
    ceil(rows / D) under attention data parallelism, else all of them."""
    dp = model.attention_dp
    return math.ceil(rows / dp) if dp > 1 else int(rows)


@lru_cache(maxsize=8192)
def _rest_s(kernels, gemms: tuple, attention_rows: int, dense_rows: int) -> float:
    return sum(share * float(kernels.gemm_s(attention_rows if attention else dense_rows, n, k, fmt).seconds[0])
               for n, k, fmt, attention, share in gemms)


def measured_a2a_s(model: ModelSpec, hw: Hardware, tokens_per_rank: float) -> float:
    """One MoE layer's DeepEP dispatch + combine of `tokens_per_rank` tokens a rank, as the tables time
    them (`MeasuredKernels.a2a_s`), each phase on the kernel and wire `hw.moe_exchange` picks."""
    total = 0.0
    for phase in A2A_PHASES:
        backend, wire = hw.moe_exchange.a2a_kernel(tokens_per_rank, phase)
        total += float(hw.kernels.a2a_s(backend, phase, wire, tokens_per_rank, model.hidden_size, model.experts_per_token,
                                        model.num_experts, model.expert_parallel).seconds[0])
    return total


def measured_mla_prefill_s(model: ModelSpec, hw: Hardware, prompt_tokens: float, seqs: int,
                           kv_dtype: str) -> float | None:
    """A step's MLA prefill attention from TensorRT-LLM's context-MLA table (`MeasuredKernels.mla_context_one_s`,
    the engines' stand-in as its decode table is), for a model whose every layer is MLA of DeepSeek's
    head dims (q / k 128 + 64, v 128): its `seqs` chunks as that many prompts of `prompt_tokens`, the length
    that attends as many (query, key) pairs (`physics.equivalent_prompt_tokens`). None (the datasheet
    formula) where the table or the shape does not apply."""
    if hw.kernels is None or seqs <= 0 or not _mla_prefill_applies(model, hw.kernels):
        return None
    return hw.kernels.mla_context_one_s(seqs, prompt_tokens, model.num_heads, kv_dtype)


def mla_prefill_measured(model: ModelSpec, hw: Hardware) -> bool:
    """Whether this run's MLA prefill takes the context-MLA table (`measured_mla_prefill_s`)."""
    return hw.kernels is not None and _mla_prefill_applies(model, hw.kernels)


def _mla_prefill_applies(model: ModelSpec, kernels) -> bool:
    shape = model.mla
    return (shape is not None and model.kind_counts == {MLA: model.num_layers}
            and (shape.qk_nope_head_dim + shape.qk_rope_head_dim, shape.v_head_dim) == MEASURED_MLA_CONTEXT
            and bool(_measured_keys(kernels, "mla_context_kv_dtypes")))


def datasheet_mla_bmm_s(hw: Hardware, dtype: str, tokens: float, heads: int) -> float:
    """One absorbed-MLA BMM, datasheet, fitted on the engine's BMM tables (`hw.mla_bmm_fits`):
    floor + max(FLOP / (peak x ef), bytes / (HBM x eh)), the fp8 peak for an fp8 BMM."""
    floor, ef, eh = next((f, e, h) for d, f, e, h in hw.mla_bmm_fits if d == dtype)
    gpu = hw.gpu
    peak = gpu.matmul_peak(dtype)[0]
    flop, nbytes = mla_bmm_work(tokens, heads, 1.0 if dtype == "fp8" else 2.0)
    return floor + max(flop / (peak * ef), nbytes / (gpu.hbm_bytes_per_s * eh))


def absorbed_bmm_swap(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int,
                      rows: float) -> tuple[float, float, float, float] | None:
    """An absorbed MLA decode's kv_b as the engine runs it: not a GEMM over the rows but two batched
    matmuls per head around the attention kernel (q_nope x W_UK, the latent output x W_UV), timed by the
    engine's MLA BMM table (datasheet: its fit, `datasheet_mla_bmm_s`). Returns what the mean layer's
    kv_b GEMM carries over `rows` decode rows (weight bytes, linear params, FLOP - one rank's rows / D
    tokens) and the seconds the BMMs take instead; None without MLA layers of DeepSeek-V3's widths (512
    latent, 128 a head) or a table or fit of the engine's BMMs.
    The BMMs run in the kv projection's dtype where the table times it (TensorRT-LLM: fp8 block-scaled
    when kv_b is, modules/attention.py `create_weights` / `fp8_block_scaling_bmm_out`; SGLang's bmm_fp8),
    else bf16 (vLLM times only torch's bf16 bmm); kv_b in the attention's format (`ModelSpec.attention_formats`:
    an NVFP4 checkpoint of R1 keeps it bf16)."""
    a = model.mla
    if a is None or (a.kv_lora_rank, a.qk_nope_head_dim, a.v_head_dim) != (512, 128, 128):
        return None
    dtypes = hw.kernels.mla_bmm_dtypes() if hw.kernels is not None else {d for d, *_ in hw.mla_bmm_fits}
    kv_b = model.attention_formats(weight_dtype)[0]
    dtype = "fp8" if kv_b == "fp8" and "fp8" in dtypes else "bf16"
    if dtype not in dtypes:
        return None
    share = (model.kind_counts.get(MLA, 0) + model.kind_counts.get(SPARSE, 0)) / model.num_layers
    params = a.kv_lora_rank * model.num_heads * (a.qk_nope_head_dim + a.v_head_dim)
    tokens = rows / model.attention_dp
    if hw.kernels is not None:
        seconds = sum(hw.kernels.mla_bmm_one_s(op, dtype, tokens, model.num_heads) for op in ("pre", "post"))
    else:  # the datasheet fit: pre and post alike (the same FLOP and bytes)
        seconds = 2 * datasheet_mla_bmm_s(hw, dtype, tokens, model.num_heads)
    return (share * WEIGHT_DTYPES[kv_b].bytes_for(params, group_size), share * params,
            FLOP_PER_MAC * tokens * share * params, share * seconds)


def measured_mla_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, kv_dtype: str):
    """One MLA layer's measured decode kernel over `attended_tokens` latents of `batch` sequences (one
    attention rank's under attention data parallelism), or None where no table applies."""
    if hw.kernels is None or model.mla is None or (model.mla.kv_lora_rank, model.mla.qk_rope_head_dim) != MEASURED_MLA:
        return None
    if kv_dtype not in _mla_dtypes(hw.kernels):
        return None
    dp = model.attention_dp
    if np.ndim(batch) or np.ndim(attended_tokens):
        b = np.maximum(np.asarray(batch, dtype=float) / dp, 1.0)
        n = np.maximum(np.asarray(attended_tokens, dtype=float) / np.maximum(np.asarray(batch, dtype=float), 1.0), 1.0)
        return hw.kernels.mla_decode_s(b, n, model.num_heads, kv_dtype).seconds
    b = max(float(batch) / dp, 1.0)
    return hw.kernels.mla_decode_one_s(b, max(float(attended_tokens) / max(float(batch), 1.0), 1.0), model.num_heads,
                                       kv_dtype)


def source_line(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, kv_dtype: str,
                run_backend: str | None = None) -> str | None:
    """What `sources.kernels_moe_mla` says of a run of a mixture of experts or an MLA model on measured
    tables: which of its routed experts and MLA decode take measured kernels, and for TensorRT-LLM's
    table which MoE backend timed it - and, where the scenario names the run's (`run_backend`,
    engine.moe_backend) and the table did not time it, that the table's kernel stands in (None for any
    other run)."""
    if hw.kernels is None or not (model.moe_layers or model.mla is not None):
        return None
    parts = []
    if model.moe_layers:
        quant = moe_quant(model, hw, weight_dtype, group_size)
        parts.append(f"{_moe_part(model, hw, quant, run_backend)}; {_rest_part(model, hw, weight_dtype)}" if quant else
                     "routed experts datasheet (no measured table for this format or routing, or a routing skew)")
    if model.mla is not None:
        measured = (model.mla.kv_lora_rank, model.mla.qk_rope_head_dim) == MEASURED_MLA and kv_dtype in _mla_dtypes(hw.kernels)
        parts.append("MLA decode measured (TensorRT-LLM absorbed-MLA kernel; a sparse layer's indexer datasheet)"
                     if measured else "MLA decode datasheet (latent or KV dtype not in the table)")
        parts.append("MLA prefill measured (TensorRT-LLM's context-MLA kernel, not absorbed; each step's chunks as "
                     "prompts of the length that attends as many pairs)" if _mla_prefill_applies(model, hw.kernels) else
                     "MLA prefill datasheet (no context-MLA table, or not every layer MLA of its head dims)")
    return "; ".join(parts)


def _rest_part(model: ModelSpec, hw: Hardware, weight_dtype: str) -> str:
    """The clause of `source_line` for the GEMMs around measured routed experts (`measured_moe_rest_s`)."""
    gemms = moe_rest_gemms(model, weight_dtype)
    if gemms is None:
        return "the layer's other GEMMs datasheet (MLA, sparse or linear attention: its projections are not tabled)"
    formats = sorted({fmt for _, _, fmt, _, _ in gemms})
    untimed = [fmt for fmt in formats if fmt not in hw.kernels.gemm_dtypes()]
    if untimed:
        return f"the layer's other GEMMs datasheet (no measured GEMM table for {', '.join(untimed)})"
    extra = "".join(f", {name}" for name, width in (("shared expert", model.shared_expert_intermediate_size),
                                                  ("dense MLP layers", model.dense_mlp_layers)) if width)
    return (f"the layer's other GEMMs (attention projections, router{extra}) measured: the GEMM tables "
            f"({', '.join(formats)})")


def _routing_said(model: ModelSpec, routing: str) -> str:
    """The routing clause of `_moe_part`: the rows read, and the model's where the table lacks them."""
    if routing != model.moe_routing:
        return f"{routing} routing: the table times no {model.moe_routing}"
    return f"{routing} routing (model.moe_routing; by default AIConfigurator's for the model's family)"


def _moe_part(model: ModelSpec, hw: Hardware, quant: str, run_backend: str | None) -> str:
    """The routed experts' clause of `source_line`: the table, its format and routing, the TensorRT-LLM
    backend whose kernel it timed, and a stand-in where that is not the run's."""
    shape, routing = moe_shape(model, hw), moe_routing(model, hw)
    timed = hw.kernels.moe_backends(*shape, quant, hw.gpu.name in SM100_GPUS, routing)
    kernel = f" on TensorRT-LLM's {' and '.join(timed)} backend{'s' if len(timed) > 1 else ''}" if timed else ""
    table = hw.kernels.moe_table()
    said = f"routed experts measured ({table} fused-experts table, {quant}{kernel}, {_routing_said(model, routing)})"
    twin, points = hw.kernels.moe_twin_points(*shape, quant, routing)
    if twin:
        said += (f"; {twin} of the slice's {points} points stood >= {TWIN_APART}x from the same die's other system's "
                 "and from the four Blackwell tables' median, and take that system's time "
                 "(kernel_tables.twin_checked_moe)")
    if run_backend is None or not timed or run_backend in timed:
        return said
    return (f"{said}; the run's {run_backend} backend (engine.moe_backend) is not measured for {quant}: the table's "
            f"{' and '.join(timed)} kernel stands in")

