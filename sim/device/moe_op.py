"""One GPU's fused routed experts as an operator (`kvsim ops moe`, the operator-level accuracy study), not a
model's layer (`moe_mla_costs` prices those): the table format a kvtier weight dtype runs as on a GPU, and
kvtier's datasheet cost of the call - at a power-law routing the fit on the tables' power-law rows at its
draw's expected load (`sim.model.power_law`), else at uniform routing the fit on their balanced rows
(`moe_fit.datasheet_moe_s`), else the dense weight-kernel model over the experts touched."""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.dtypes import WEIGHT_DTYPES
from sim.model.experts import busiest_rank_experts_touched, busiest_routing_share, expected_experts_touched
from sim.model.power_law import power_law_load, routing_alpha
from sim.model.spec import MLP_MATRICES
from sim.model.units import FLOP_PER_MAC

from .hardware import Hardware
from .moe_datasheet import power_law_fit
from .moe_fit import datasheet_moe_s
from .moe_mla_costs import moe_format
from .physics import weight_gemm_s

MOE_CALLS = 2  # of physics.GEMM_CALLS_PER_LAYER (qkv, o, gate_up, down): the experts' gate_up and down
QUANT_AS = {"bfloat16": ("bf16", 128), "fp8": ("fp8", 128), "fp8_block": ("fp8", 128), "int4_wo": ("int4", 128),
            "w4a16_mxfp4": ("mxfp4", 32), "w4a8_mxfp4_mxfp8": ("mxfp4", 32),
            "nvfp4": ("nvfp4", 16)}  # table format -> the dtype and group it runs as


@dataclass(frozen=True)
class MoeExperts:
    """One call of a GPU's fused routed experts: `tokens` entering the layer, each routed to `top_k` of
    `experts` (split whole `ep` ways), an expert `inter` wide in full (split `tp` ways), `hidden` in and out,
    weights in `dtype`, routing one of the tables' (`inputs.moe_routing.MOE_ROUTINGS`)."""

    tokens: int
    experts: int
    top_k: int
    hidden: int
    inter: int
    tp: int = 1
    ep: int = 1
    dtype: str = "bf16"
    routing: str = "balanced"


def table_format(hw: Hardware, dtype: str) -> str | None:
    """The fused-experts table format `dtype` runs as on `hw`'s GPU (`moe_mla_costs.moe_format`; int4 in groups of
    128, Marlin's; nvfp4 and mxfp4 fix their own); None for int8."""
    return moe_format(hw, dtype, 128)


def datasheet_moe_op_s(hw: Hardware, quant: str, tokens: int, experts: int, top_k: int, hidden: int, inter: int,
                       tp: int, ep: int, routing: str = "balanced") -> float:
    """kvtier's datasheet cost of one GPU's routed experts for `tokens` tokens: at a power-law `routing` the
    power-law fit at the draw's expected experts and pairs on the busiest GPU (`power_law_load`), where `hw`
    has that fit; else at uniform routing the fused-experts fit at the expected touched experts and routed
    pairs (the busiest GPU's under EP), or weight_gemm_s(touched x expert bytes, touched x expert params,
    2 T k / ep x expert params x the busiest GPU's share, rows T, 2 calls) where `hw` has no fit of `quant`;
    an expert I/tp wide, E/ep on the GPU."""
    fit = power_law_fit(hw, quant, routing)
    if fit is not None:
        touched, pairs = power_law_load(tokens, experts, top_k, ep, routing_alpha(routing))
        return experts_kernel_s(hw, quant, touched, pairs, tokens, hidden, inter // tp, fit)
    if ep > 1:
        touched = busiest_rank_experts_touched(experts, top_k, tokens, ep)
        share = busiest_routing_share(experts, top_k, ep, 0.0)
    else:
        touched, share = expected_experts_touched(experts, top_k, tokens), 1.0
    return experts_kernel_s(hw, quant, touched, tokens * top_k / ep * share, tokens, hidden, inter // tp)


def experts_kernel_s(hw: Hardware, quant: str, touched: float, pairs: float, tokens: int, hidden: int,
                     inter: int, fit=None) -> float:
    """The datasheet kernel of one GPU's fused experts, its routing given: `touched` experts read, `pairs`
    token-expert pairs, each expert `inter` wide on the GPU - `fit` (by default the fused-experts fit of
    `quant` on balanced rows), else weight_gemm_s over the touched experts' weights and 2 x pairs x expert
    params FLOP in 2 calls."""
    weight_dtype, group = QUANT_AS[quant]
    expert = MLP_MATRICES * hidden * inter
    per_expert_bytes = WEIGHT_DTYPES[weight_dtype].bytes_for(expert, group)
    fit = fit or dict(hw.moe_fits).get(quant)
    if fit is not None:  # fitted on the tune split of the tables (scripts/fit_datasheet.py `_moe`)
        return datasheet_moe_s(fit, touched, pairs, expert, per_expert_bytes / expert, hidden, inter, tokens)
    return weight_gemm_s(hw, touched * per_expert_bytes, touched * expert, FLOP_PER_MAC * pairs * expert, tokens,
                         MOE_CALLS)
