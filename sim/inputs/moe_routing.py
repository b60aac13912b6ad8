"""Which routing of the measured fused-experts tables a mixture of experts reads.

AIConfigurator's MoE tables time each shape under three routings (`distribution`; its collector's
helper.py `balanced_logits` and `power_law_logits_v3`):
- `balanced`: token i picks experts (i + j ceil(E/k)) mod E, every expert equally loaded;
- `power_law_<alpha>`: each expert's token count drawn from a power law x^-alpha on [1, 0.8 x tokens],
  scaled to tokens x top-k; under expert parallelism the busiest rank is the one timed.

Balanced routing is the optimistic case: one step's tokens seldom spread evenly over the experts, and a
fused-experts kernel waits for its busiest expert. AIConfigurator's own estimates read the power-law rows
(sdk/config.py ModelConfig.workload_distribution 'power_law'), with an alpha per model family; kvtier
takes the same by default (`moe_routing_for`), and a scenario's `model.moe_routing` overrides it.
"""

from __future__ import annotations

from typing import Literal, get_args

MoeRouting = Literal["balanced", "power_law_1.01", "power_law_1.2"]  # as scenarios and `kvsim ops moe` take it
MOE_ROUTINGS = get_args(MoeRouting)
BALANCED_ROUTING = MOE_ROUTINGS[0]
# config.json model_types whose family aiconfigurator-core 0.12.0 prices at alpha 1.01 (sdk/common.py
# ARCHITECTURE_TO_MODEL_FAMILY: DEEPSEEK*, KIMIK*, NEMOTRONH, HYBRIDMOE (Llama 4, MiMo-V2), MINIMAXM3, GEMMA4MIX,
# STEP3P7 - `_power_law_alpha` 1.01 in their sdk/models/*.py); its MOE family (Mixtral, gpt-oss, Qwen2/3-MoE,
# MiniMax-M2; Qwen3-VL-MoE and Qwen3.5 after it) at 1.2 (sdk/models/moe.py), as is any other model_type here
ALPHA_1_01_MODEL_TYPES = ("deepseek", "kimi", "glm_moe_dsa", "nemotron_h", "llama4", "mimo", "minimax_m3", "gemma4",
                          "step3")


def moe_routing_for(model_type: str) -> str:
    """The fused-experts table routing a mixture of experts of this config.json `model_type` reads by
    default: AIConfigurator's own for its family."""
    return "power_law_1.01" if model_type.startswith(ALPHA_1_01_MODEL_TYPES) else "power_law_1.2"
