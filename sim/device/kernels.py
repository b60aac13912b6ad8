"""The operator-cost seam: what a step's cost asks of the device, one operator at a time - a GEMM
(m rows x n outputs x k inputs, a weight dtype), one layer's decode attention (batch, cached tokens
per sequence, heads, KV heads, head dim, KV dtype), one layer's causal prefill attention (prompts,
tokens each, the same heads), an all-reduce (bytes over N GPUs, an implementation) and NCCL's
all-gather / reduce-scatter (the whole buffer's bytes over N GPUs) - answered two ways:

- `datasheet`: kvtier's own model, the formulas the step cost uses (`physics.weight_gemm_s`,
  `physics.gqa_datasheet_attention_s`, `physics.datasheet_prefill_attention_s`, `Hardware.allreduce_s` of
  the operator's implementation, `Hardware.gather_s`) on the catalog GPU, with the constants fitted on the measured tables
  where they cover it (sim/catalog/fitted_kernels.yaml), the catalog's defaults elsewhere;
- `measured`: AIConfigurator's kernel tables (`measured_kernels`), where they cover the GPU.

`kvsim ops` and benchmarks/operator_accuracy.py ask through here; the step cost asks the same
tables through `Hardware.kernels` (`physics`), the scenario engine's where it names one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import FRAMEWORK, tables_from_profile
from sim.inputs.scenario import EfficiencyCfg, HardwareCfg
from sim.model.dtypes import KV_DTYPES, WEIGHT_DTYPES
from sim.model.experts import expected_remote_ranks
from sim.model.layers import window_prefill_work
from sim.model.power_law import power_law_load, routing_alpha
from sim.model.units import ATTN_MATMULS, FLOP_PER_MAC

from .elementwise import elementwise_for, pass_s, row_bytes
from .hardware import Hardware, resolve_hardware, window_decode, with_allreduce
from .measured_kernels import MeasuredKernels, measured_kernels_for
from .moe_datasheet import power_law_fit
from .moe_exchange import A2A_WIRE_BYTES
from .moe_mla_costs import datasheet_mla_bmm_s
from .moe_op import QUANT_AS, MoeExperts, datasheet_moe_op_s, table_format
from .physics import (
    datasheet_prefill_attention_s,
    gqa_datasheet_attention_s,
    weight_gemm_s,
    window_datasheet_attention_s,
)

KERNELS = ("datasheet", "measured")
DEFAULT_GROUP_SIZE = 128


@dataclass(frozen=True)
class Gemm:
    m: int
    n: int
    k: int
    dtype: str = "bf16"


@dataclass(frozen=True)
class DecodeAttention:
    batch: int
    kv_tokens: int  # cached tokens each sequence attends, its new one included
    heads: int  # query heads per GPU
    kv_heads: int  # per GPU
    head_dim: int
    kv_dtype: str = "bf16"
    window: int = 0  # a sliding window: each sequence attends its last min(kv_tokens, window) (0: all)


@dataclass(frozen=True)
class PrefillAttention:
    batch: int
    prompt_tokens: int  # each prompt's tokens, nothing cached before them (causal: token i attends i)
    heads: int  # query heads per GPU
    kv_heads: int  # per GPU
    head_dim: int
    kv_dtype: str = "bf16"
    window: int = 0  # a sliding window: token i attends min(i, window) (0: all)


@dataclass(frozen=True)
class AllReduce:
    nbytes: float
    gpus: int
    impl: str = "custom"  # custom (the engine's one-shot / two-shot kernel) or nccl


@dataclass(frozen=True)
class Gather:
    nbytes: float  # the whole buffer: the gathered output (all_gather), the input every GPU reduces (reduce_scatter)
    gpus: int
    op: str = "all_gather"  # or reduce_scatter (NCCL's)


@dataclass(frozen=True)
class AllToAll:
    """One DeepEP dispatch or combine of `tokens` a rank (the engines' opt-in MoE exchange)."""

    tokens: int
    hidden: int
    top_k: int
    experts: int
    ep: int
    phase: str = "dispatch"  # or combine
    kernel: str = "ll"  # DeepEP's low-latency (ll) or high-throughput (ht) kernels
    wire: str = "bf16"  # what crosses: bf16, fp8 (TensorRT-LLM's tables), default (vLLM's)


@dataclass(frozen=True)
class MlaBmm:
    """One of absorbed MLA decode's batched matmuls (DeepSeek-V3 widths) over `tokens` x `heads` on one GPU."""

    tokens: int
    heads: int
    op: str = "pre"  # pre: q_nope x W_UK; post: the latent output x W_UV
    dtype: str = "bf16"  # or fp8


@dataclass(frozen=True)
class ElementwisePass:
    """One elementwise pass (`device.elementwise`: rmsnorm, add_rmsnorm, rope, silu_mul, add) over `rows`
    rows of `width` elements (bf16, one GPU)."""

    kind: str
    rows: int
    width: int


Operator = (Gemm | DecodeAttention | PrefillAttention | AllReduce | Gather | AllToAll | MlaBmm | ElementwisePass
            | MoeExperts)
GATHER_OPS = {"allgather": "all_gather", "reducescatter": "reduce_scatter"}  # kvsim ops' name -> NCCL's


@dataclass(frozen=True)
class OpCost:
    seconds: float | None  # None: no table covers the GPU
    source: str  # the formula, or the table (system, framework, version)
    inside: bool = True  # measured: the query lay inside the table in every dimension
    note: str = ""


def _datasheet_decode(gpu: str, op: DecodeAttention, framework: str, fit_from: str | None) -> OpCost:
    """A decode-attention call, datasheet, as the step cost asks it: the decode fit over every cached token; a
    window layer's on its window kernel's fit at the op's head dim (`hardware.window_decode`,
    `physics.window_datasheet_attention_s`), else the decode fit over the window's tokens."""
    hw = datasheet_hardware(gpu, framework=framework, fit_from=fit_from)
    kv_layer = 2 * op.kv_heads * op.head_dim * KV_DTYPES[op.kv_dtype].bytes_per_element
    n = min(op.kv_tokens, op.window) if op.window else op.kv_tokens  # a window layer's, as the step cost asks
    flop = ATTN_MATMULS * FLOP_PER_MAC * op.batch * n * op.heads * op.head_dim
    kv_bytes = (op.batch * n + op.batch) * kv_layer  # reads every attended token, writes the new one
    fp8 = KV_DTYPES[op.kv_dtype].bytes_per_element < 1.5  # int8 KV streams as fp8 does (the step cost's rule)
    kernel = window_decode(hw.gpu, EfficiencyCfg(), framework, op.head_dim, fit_from).value if op.window else None
    if kernel is not None:
        return OpCost(window_datasheet_attention_s(hw, kernel, op.batch, op.kv_heads, op.heads / op.kv_heads,
                                                   op.kv_tokens, op.window, kv_bytes, flop, fp8),
                      f"datasheet: physics.window_datasheet_attention_s (the window fit at head dim {op.head_dim})")
    return OpCost(gqa_datasheet_attention_s(hw, op.batch, op.kv_heads, flop, kv_bytes, fp8,
                                            heads_per_kv=op.heads / op.kv_heads, tokens_per_seq=n),
                  "datasheet: physics.gqa_datasheet_attention_s" + (" over the window" if op.window else ""))


@lru_cache(maxsize=64)
def datasheet_hardware(gpu: str, weight_dtype: str = "bf16", tp: int = 1, framework: str = FRAMEWORK,
                       fit_from: str | None = None) -> Hardware:
    """The catalog GPU as a run resolves it with no scenario overrides and no profile, its datasheet
    constants those fitted on `framework`'s tables (`fit_from`: another GPU's, `catalog.fitted_kernels_for`)."""
    return resolve_hardware(HardwareCfg(gpu=gpu, kernels="datasheet"), weight_dtype, pinned=True, tp=tp,
                            framework=framework, fit_from=fit_from)


def datasheet_cost(gpu: str, op: Operator, framework: str = FRAMEWORK, fit_from: str | None = None) -> OpCost:
    """kvtier's datasheet model of one operator, its constants fitted on `framework`'s tables (`fit_from`:
    on another GPU's, `catalog.fitted_kernels_for`)."""
    if isinstance(op, Gemm):
        hw = datasheet_hardware(gpu, op.dtype, framework=framework, fit_from=fit_from)
        params = op.n * op.k
        w_bytes = WEIGHT_DTYPES[op.dtype].bytes_for(params, DEFAULT_GROUP_SIZE)
        seconds = weight_gemm_s(hw, w_bytes, params, FLOP_PER_MAC * op.m * params, op.m, shapes=((op.n, op.k),))
        return OpCost(seconds, f"datasheet: physics.weight_gemm_s ({hw.weight_kernel})")
    if isinstance(op, DecodeAttention):
        return _datasheet_decode(gpu, op, framework, fit_from)
    if isinstance(op, PrefillAttention):
        hw = datasheet_hardware(gpu, framework=framework, fit_from=fit_from)
        kv_layer = 2 * op.kv_heads * op.head_dim * KV_DTYPES[op.kv_dtype].bytes_per_element
        tokens, fp8 = op.batch * op.prompt_tokens, KV_DTYPES[op.kv_dtype].bytes_per_element < 1.5
        if op.window and hw.prefill_attention_shape.window is not None:  # its own fit (`physics._window_prefill_s`)
            pairs, length = window_prefill_work(op.prompt_tokens, op.window,
                                                hw.prefill_attention_shape.of(fp8, window=True).skips_window)
            flop = ATTN_MATMULS * FLOP_PER_MAC * op.heads * op.head_dim * (op.batch * pairs)
            seconds = datasheet_prefill_attention_s(hw, flop, tokens * kv_layer, length, op.batch, tokens, op.heads,
                                                    op.kv_heads, fp8, op.head_dim, window=True)
            return OpCost(seconds, "datasheet: physics.datasheet_prefill_attention_s (the window fit)")
        pairs = op.batch * op.prompt_tokens * (op.prompt_tokens + 1) / 2
        if op.window:  # no window fit: the step's bound on a window layer's pairs (`physics._bounded_prefill_flop`)
            pairs = min(pairs, op.batch * op.prompt_tokens * op.window)
        flop = ATTN_MATMULS * FLOP_PER_MAC * op.heads * op.head_dim * pairs
        seconds = datasheet_prefill_attention_s(hw, flop, tokens * kv_layer, op.prompt_tokens, op.batch, tokens, op.heads,
                                                op.kv_heads, fp8, op.head_dim)
        return OpCost(seconds, "datasheet: physics.datasheet_prefill_attention_s")
    if isinstance(op, (AllToAll, MlaBmm)):
        return _datasheet_moe_mla_op(gpu, op, framework, fit_from)
    if isinstance(op, MoeExperts):
        return _datasheet_experts(gpu, op, framework, fit_from)
    if isinstance(op, ElementwisePass):
        ew = elementwise_for(gpu, None)
        return OpCost(pass_s(ew.fit(op.kind), op.rows, op.width, row_bytes(op.kind, op.width),
                             catalog.gpu(gpu).hbm_bytes_per_s),
                      f"datasheet: elementwise.pass_s ({ew.fitted})")
    if isinstance(op, Gather):
        hw = datasheet_hardware(gpu, tp=op.gpus, framework=framework, fit_from=fit_from)
        how = ("fitted protocols per group size" if dict(hw.gather_protocols).get(op.op) else
               "ring: catalog interconnect busbw + per-hop latency")
        return OpCost(hw.gather_s(op.op, op.nbytes), f"datasheet: Hardware.gather_s ({op.op}; {how})")
    hw = with_allreduce(datasheet_hardware(gpu, tp=op.gpus, framework=framework, fit_from=fit_from), op.impl)
    how = ("fitted protocols per group size" if hw.allreduce_protocols else "ring: catalog interconnect busbw + per-hop latency")
    return OpCost(hw.allreduce_s(op.nbytes), f"datasheet: Hardware.allreduce_s ({op.impl}; {how})")


def _datasheet_moe_mla_op(gpu: str, op: AllToAll | MlaBmm, framework: str, fit_from: str | None) -> OpCost:
    """DeepEP's all-to-all (`Hardware.alltoall_s` of tokens x remote ranks x hidden x wire bytes) and an
    absorbed-MLA BMM (`moe_mla_costs.datasheet_mla_bmm_s`; None without a fit of the engine's BMMs)."""
    if isinstance(op, AllToAll):
        hw = datasheet_hardware(gpu, tp=op.ep, framework=framework, fit_from=fit_from)
        nbytes = op.tokens * expected_remote_ranks(op.experts, op.top_k, op.ep) * op.hidden * A2A_WIRE_BYTES[op.wire]
        how = "fitted per kernel and phase" if hw.alltoall_fits else "the catalog fabric's figures"
        return OpCost(hw.alltoall_s(nbytes, op.kernel, op.phase), f"datasheet: Hardware.alltoall_s ({how})")
    hw = datasheet_hardware(gpu, framework=framework, fit_from=fit_from)
    if op.dtype not in {d for d, *_ in hw.mla_bmm_fits}:
        return OpCost(None, "", False, f"no fit of {framework}'s {op.dtype} MLA BMMs for {gpu}")
    return OpCost(datasheet_mla_bmm_s(hw, op.dtype, op.tokens, op.heads), "datasheet: moe_mla_costs.datasheet_mla_bmm_s")


def _datasheet_experts(gpu: str, op: MoeExperts, framework: str, fit_from: str | None) -> OpCost:
    """A fused-experts call, datasheet (`moe_op.datasheet_moe_op_s`): a power-law routing at its draw's load
    where the GPU has a power-law fit, else uniform routing (balanced's fit)."""
    quant = table_format(datasheet_hardware(gpu, framework=framework, fit_from=fit_from), op.dtype)
    hw = datasheet_hardware(gpu, QUANT_AS[quant][0], framework=framework, fit_from=fit_from)
    seconds = datasheet_moe_op_s(hw, quant, op.tokens, op.experts, op.top_k, op.hidden, op.inter, op.tp, op.ep,
                                 op.routing)
    power_law = power_law_fit(hw, quant, op.routing) is not None
    how = f"the {quant} fused-experts fit" if quant in dict(hw.moe_fits) else "no fused-experts fit: the GEMM model"
    if power_law:
        touched, pairs = power_law_load(op.tokens, op.experts, op.top_k, op.ep, routing_alpha(op.routing))
        how = (f"the {quant} fused-experts fit on power-law rows, at the {op.routing} draw's load: {touched:.1f} "
               f"experts, {pairs:,.0f} pairs on the busiest GPU")
    note = "" if op.routing == "balanced" or power_law else f"uniform routing: no {op.routing} fit for {gpu}"
    return OpCost(seconds, f"datasheet: moe_op.datasheet_moe_op_s ({how})", True, note)


def _measured_experts(gpu: str, op: MoeExperts, mk: MeasuredKernels, framework: str) -> OpCost:
    """A fused-experts call on the tables' slice of its format and routing; the datasheet model, saying so,
    where they time neither (a profile's own tables have no MoE)."""
    quant = table_format(datasheet_hardware(gpu, framework=framework), op.dtype)
    try:
        timed = quant in mk.moe_quants() and op.routing in mk.moe_routings()
    except (KeyError, AttributeError):
        timed = False
    if not timed:
        d = datasheet_cost(gpu, op, framework)
        return OpCost(d.seconds, d.source, False, f"no measured {quant} fused experts with {op.routing} routing: "
                      "the datasheet model")
    r = mk.moe_s(op.tokens, op.experts, op.top_k, op.hidden, op.inter, op.tp, op.ep, quant, op.routing)
    note = r.note or ("" if bool(r.inside[0]) else "outside the table: its edge's ratio held")
    return OpCost(float(r.seconds[0]), f"{r.source}, {op.routing} routing", bool(r.inside[0]), note)


def measured_kernels(gpu: str, framework: str = FRAMEWORK) -> MeasuredKernels:
    """The measured tables of a catalog GPU under `framework` (a ConfigError where none cover it or the
    extra is missing)."""
    return measured_kernels_for(gpu, framework)


def measured_cost(gpu: str, op: Operator, mk: MeasuredKernels | None = None, framework: str = FRAMEWORK) -> OpCost:
    """The measured tables' answer: AIConfigurator's for `gpu` as `framework` runs it, or `mk` (a
    profile's own tables)."""
    if isinstance(op, ElementwisePass):  # no table times them (AIConfigurator has none)
        d = datasheet_cost(gpu, op, framework)
        return OpCost(d.seconds, d.source, False, "no measured elementwise table: the datasheet model")
    mk = mk or measured_kernels(gpu, framework)
    if isinstance(op, MoeExperts):
        return _measured_experts(gpu, op, mk, framework)
    if isinstance(op, Gemm):
        if op.dtype not in mk.gemm_dtypes() or not len(mk.tables.gemm):
            d = datasheet_cost(gpu, op, framework)
            return OpCost(d.seconds, d.source, False, f"no measured {op.dtype} GEMM table: the datasheet model")
        r = mk.gemm_s(op.m, op.n, op.k, op.dtype)
    elif isinstance(op, DecodeAttention):
        if not len(mk.tables.decode_attention):
            d = datasheet_cost(gpu, op, framework)
            return OpCost(d.seconds, d.source, False, "no measured attention points: the datasheet model")
        r = mk.decode_attention_s(op.batch, op.kv_tokens, op.heads, op.kv_heads, op.head_dim, op.kv_dtype, op.window)
    elif isinstance(op, PrefillAttention):
        if not mk.has_context_attention():
            d = datasheet_cost(gpu, op, framework)
            return OpCost(d.seconds, d.source, False, "no measured prefill-attention table: the datasheet model")
        r = mk.context_attention_s(op.batch, op.prompt_tokens, op.heads, op.kv_heads, op.head_dim, op.kv_dtype,
                                   op.window)
    elif isinstance(op, AllToAll) and mk.a2a_slices():
        r = mk.a2a_s(op.kernel, op.phase, op.wire, op.tokens, op.hidden, op.top_k, op.experts, op.ep)
    elif isinstance(op, MlaBmm) and op.dtype in mk.mla_bmm_dtypes():
        return OpCost(mk.mla_bmm_one_s(op.op, op.dtype, op.tokens, op.heads),
                      mk.tables.source(f"mla_bmm {op.op} {op.dtype}"))
    elif isinstance(op, (AllToAll, MlaBmm)):
        d = datasheet_cost(gpu, op, framework)
        return OpCost(d.seconds, d.source, False, f"no measured {type(op).__name__} table: {d.note or 'the datasheet model'}")
    elif isinstance(op, Gather):
        if not mk.has_gather():
            d = datasheet_cost(gpu, op, framework)
            return OpCost(d.seconds, d.source, False, f"no measured {op.op} table: the datasheet model")
        r = mk.gather_s(op.op, op.nbytes, op.gpus)
    elif not mk.allreduce_impls() and op.gpus > 1:
        d = datasheet_cost(gpu, op, framework)
        return OpCost(d.seconds, d.source, False, "no measured all-reduce table: the datasheet model")
    else:
        r = mk.allreduce_s(op.nbytes, op.gpus, op.impl)
    note = r.note or ("" if bool(r.inside[0]) else "outside the table: its edge's ratio held")
    return OpCost(float(r.seconds[0]), r.source, bool(r.inside[0]), note)


def cost(gpu: str, op: Operator, kernels: str, mk: MeasuredKernels | None = None, framework: str = FRAMEWORK) -> OpCost:
    return measured_cost(gpu, op, mk, framework) if kernels == "measured" else datasheet_cost(gpu, op, framework)


def operator_of(q) -> Operator:
    """The operator an `inputs.op_queries.OpQuery` asks for."""
    if q.op == "gemm":
        return Gemm(q.m, q.n, q.k, q.dtype)
    if q.op == "attention":
        return DecodeAttention(q.batch, q.kv_tokens, q.heads, q.kv_heads, q.head_dim, q.kv_dtype, q.window)
    if q.op == "prefill":
        return PrefillAttention(q.batch, q.kv_tokens, q.heads, q.kv_heads, q.head_dim, q.kv_dtype, q.window)
    if q.op in GATHER_OPS:
        return Gather(q.bytes, q.gpus, GATHER_OPS[q.op])
    if q.op == "alltoall":
        return AllToAll(q.tokens, q.hidden, q.top_k, q.experts, q.gpus, q.phase, q.kernel, q.wire)
    if q.op == "mlabmm":
        return MlaBmm(q.tokens, q.heads, q.bmm, q.dtype)
    if q.op == "elementwise":
        return ElementwisePass(q.kind, q.m, q.width)
    if q.op == "moe":
        return MoeExperts(q.tokens, q.experts, q.top_k, q.hidden, q.inter, q.tp, q.ep, q.dtype, q.routing)
    return AllReduce(q.bytes, q.gpus, q.impl)


def profile_kernels(profile, gpu: str) -> MeasuredKernels:
    """A `hwprobe calibrate` profile's own timed kernels as measured tables, on `gpu`'s roofline."""
    spec = catalog.gpu(gpu)
    return MeasuredKernels(tables_from_profile(profile), spec, catalog.interconnect(spec.interconnect).bus_bytes_per_s)


def predict(q, kernels: tuple[str, ...], mk: MeasuredKernels | None = None, framework: str = FRAMEWORK) -> dict:
    """{`<kernels>_s`, `<kernels>_source`, ...} of one query for each asked kernel model (measured: the
    `framework`'s tables); measured fields say so where no table covers the GPU (a ConfigError only
    when measured is all that was asked)."""
    op, out = operator_of(q), {}
    for kind in kernels:
        try:
            c = cost(q.gpu, op, kind, mk, framework)
        except ConfigError as err:
            if len(kernels) == 1:
                raise ConfigError(err.message, field="--kernels") from None
            c = OpCost(None, "", False, err.message)
        out.update({f"{kind}_s": c.seconds, f"{kind}_source": c.source, f"{kind}_note": c.note})
        if kind == "measured":
            out["measured_inside"] = c.inside
    return out
