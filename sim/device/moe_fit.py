"""The datasheet model of one GPU's fused routed experts (an MoE layer's grouped GEMMs), fitted per GPU
and weight format on the measured fused-experts tables (scripts/fit_datasheet.py `_moe`), for runs the
measured MoE table does not cost (datasheet mode, a format or skew it lacks): once on the tables' balanced
rows, for kvtier's uniform routing, and once on their power-law rows at the draw's load, for a model that
routes as a power law (its default, `ModelSpec.moe_routing`).

A grouped GEMM runs each touched expert's rows as its own small GEMM, so its efficiency follows the
rows per touched expert, r = pairs / touched, not the tokens entering the layer: with 3,000 tokens of
DeepSeek-R1 over EP8 each of the 32 local experts sees ~94 rows. The dense GEMM fit indexed by tokens
left the datasheet 25-80% off the tables (mostly too fast); this shape 3-23% (held-out medians per
GPU and format).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.dtypes import WEIGHT_DTYPES
from sim.model.experts import busiest_routing_share
from sim.model.power_law import power_law_load
from sim.model.spec import ModelSpec

ACTIVATION_BYTES = 2.0  # bf16 rows gathered into the experts and scattered back


@dataclass(frozen=True)
class MoeFit:
    """One weight format's fitted constants, as rates (`hardware._moe_fits` from fitted_kernels.yaml)."""

    floor_s: float
    per_expert_s: float
    weight_bytes_per_s: float
    flop_per_s: float
    half_rows: float
    pair_bytes_per_s: float
    token_bytes_per_s: float


def datasheet_moe_s(fit: MoeFit, touched: float, pairs: float, expert_params: float, weight_bytes_per_param: float,
                    hidden: int, inter: int, tokens: float) -> float:
    """One MoE layer's fused routed experts on one GPU:

        floor + touched x per expert + max(touched x expert weights / weight rate,
                                           2 x pairs x expert params / (FLOP rate x r / (r + half_rows)))
        + pairs x (h + I) x 2 B / pair rate + tokens x h x 2 B / token rate,       r = pairs / touched

    `touched` experts read, `pairs` token-expert pairs routed to the GPU, an expert of `expert_params`
    (3 h I, I the GPU's share of its width) at `weight_bytes_per_param`. Example (H200 fp8_block fit,
    DeepSeek-R1 EP8, 3,000 tokens): 32 experts, 3,000 pairs, 44 M params each - about 0.73 ms."""
    if tokens <= 0 or pairs <= 0:
        return 0.0
    r = pairs / max(touched, 1e-9)
    stream = touched * expert_params * weight_bytes_per_param / fit.weight_bytes_per_s
    mma = 2.0 * pairs * expert_params / (fit.flop_per_s * r / (r + fit.half_rows))
    moved = pairs * (hidden + inter) * ACTIVATION_BYTES / fit.pair_bytes_per_s + tokens * hidden * ACTIVATION_BYTES / fit.token_bytes_per_s
    return fit.floor_s + touched * fit.per_expert_s + max(stream, mma) + moved


def model_moe_s(model: ModelSpec, fit: MoeFit, weight_dtype: str, group_size: int, rows: float,
                alpha: float | None = None) -> float:
    """The mean layer's routed experts over `rows` tokens entering it: MoE layers / L x `datasheet_moe_s`
    at the fit's routing - with `alpha` (a fit on the tables' power-law rows) the expected experts and pairs
    that power law's draw puts on the busiest GPU (`sim.model.power_law.power_law_load`); else kvtier's
    uniform routing, the GPU's expected touched experts (`ModelSpec.expected_experts_touched`: the busiest
    rank's under expert parallelism) and its pairs, rows x k, / ep x the busiest rank's share."""
    e, k, ep = model.num_experts, model.experts_per_token, model.expert_parallel
    if alpha is not None:
        touched, pairs = power_law_load(rows, e, k, ep, alpha)
    else:
        touched = model.expected_experts_touched(rows)
        pairs = rows * k / ep * busiest_routing_share(e, k, ep, model.routing_skew) if ep > 1 else rows * k
    expert = model.expert_params()
    per_param = WEIGHT_DTYPES[weight_dtype].bytes_for(expert, group_size) / expert
    one = datasheet_moe_s(fit, touched, pairs, expert, per_param, model.hidden_size, model.moe_intermediate_size, rows)
    return model.moe_layers / model.num_layers * one
