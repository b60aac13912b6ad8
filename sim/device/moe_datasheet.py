"""Which datasheet form a mixture of experts' routed experts take (`physics.weight_kernel_s` where no measured
table costs them), and what the run's sources say of it: the fused-experts fit on the tables' power-law rows at
that power law's draw (`sim.model.power_law`) for a model routing as one (`ModelSpec.moe_routing`, no
`routing_skew`); else the fit on their balanced rows at uniform routing; else the dense GEMM model."""

from __future__ import annotations

from sim.model.power_law import routing_alpha
from sim.model.spec import ModelSpec

from .hardware import Hardware
from .moe_fit import MoeFit
from .moe_mla_costs import moe_format, moe_quant


def power_law_fit(hw: Hardware, quant: str, routing: str) -> MoeFit | None:
    """`hw`'s fit of `quant` on the tables' power-law rows where `routing` is a power law (None otherwise, or
    where the GPU has none)."""
    return dict(hw.moe_power_law_fits).get(quant) if routing_alpha(routing) is not None else None


def moe_fit_for(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int) -> tuple[MoeFit | None, float | None]:
    """(the fitted fused-experts constants for this run's expert weight format, the power law's alpha they
    are priced at): a model routing as a power law takes the fit on the tables' power-law rows
    (`hw.moe_power_law_fits`) where the GPU has one; else (the fit on balanced rows, `hw.moe_fits`, None:
    uniform routing); (None, None) where neither fits the format."""
    if not model.moe_layers or not (hw.moe_fits or hw.moe_power_law_fits):
        return None, None
    quant = moe_format(hw, model.expert_format(weight_dtype), group_size)
    power_law = None if model.routing_skew else power_law_fit(hw, quant, model.moe_routing)
    if power_law is not None:
        return power_law, routing_alpha(model.moe_routing)
    return dict(hw.moe_fits).get(quant), None


def datasheet_moe_source(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int) -> str | None:
    """What `sources.routed_experts` says of a run whose routed experts take the datasheet model (None where a
    measured table costs them, `moe_mla_costs.source_line` saying so, or the model has none)."""
    if not model.moe_layers or moe_quant(model, hw, weight_dtype, group_size) is not None:
        return None
    fit, alpha = moe_fit_for(model, hw, weight_dtype, group_size)
    quant = moe_format(hw, model.expert_format(weight_dtype), group_size)
    if fit is None:
        return f"datasheet: the dense GEMM model over the touched experts (no fused-experts fit of {quant} weights)"
    if alpha is not None:
        return (f"datasheet: the {quant} fused-experts fit on the tables' power-law rows, at the {model.moe_routing} "
                "draw's expected experts and pairs on the busiest GPU (sim/model/power_law.py)")
    why = "routing_skew" if model.routing_skew else f"moe_routing {model.moe_routing}"
    if not model.routing_skew and model.moe_routing != "balanced":
        why = f"no {model.moe_routing} fit for this GPU"
    return f"datasheet: the {quant} fused-experts fit on the tables' balanced rows, at uniform routing ({why})"
