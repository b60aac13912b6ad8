"""A decoder layer's elementwise passes - RMSNorm, rotary embedding, SiLU-and-mul, the residual add -
costed by bytes, as the engine runs them (issue #20 item 3).

Each pass over `rows` rows of `width` elements (bf16 activations, one GPU's shard) costs

    max(floor_s + width x s_per_element,  rows x bytes a row / (HBM x hbm_efficiency))

- a row-at-a-time kernel's latency (vLLM's and SGLang's norms and activations run one thread block per
token, so a lone wide row takes longer) or its streaming at a share of HBM. The constants are fitted
per GPU on Microsoft Vidur's operator profiles (`sim/catalog/fitted_elementwise.yaml`, written by
`scripts/fit_elementwise.py` from `sim/catalog/vidur_elementwise_ops.csv`), which time each pass
apart. Bytes a row (h hidden, I the MLP's intermediate width on one GPU, q + k the rotated query and
key widths on one GPU):

    RMSNORM        reads and writes h                         2 h x 2 B
    ADD_RMSNORM    residual add fused into it (vLLM's          4 h x 2 B  (RMSNorm's fit, twice the bytes)
                   fused_add_rms_norm): reads x and the
                   residual, writes both
    HEAD_NORMS     the attention's own RMSNorms (Qwen3's      2 w x 2 B  (RMSNorm's fit; a per-head norm a
                   per-head q / k, MLA's latent q_a / kv_a)              row of head_dim per head)
    ROPE           reads and writes q and k                   2 (q + k) x 2 B
    SILU_MUL       reads 2 I, writes I                        3 I x 2 B
    ADD            reads 2 h, writes h                        3 h x 2 B

Which passes a layer runs is the engine's (`engine_passes`, read from each engine's Llama decoder layer);
TensorRT-LLM's fused kernels are not modelled (it keeps the flat `layer_overhead_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.inputs import catalog

RMSNORM, ADD_RMSNORM, ROPE, SILU_MUL, ADD = "rmsnorm", "add_rmsnorm", "rope", "silu_mul", "add"
HEAD_NORMS = "head_norms"  # the attention's own RMSNorms: Qwen3's per-head q / k norms, MLA's q_a / kv_a norms
FITTED = (RMSNORM, ROPE, SILU_MUL, ADD)  # the passes Vidur times; ADD_RMSNORM and HEAD_NORMS take RMSNorm's fit
ACTIVATION_BYTES = 2  # bf16
# elements moved a row per element of its width
ROW_ELEMENTS = {RMSNORM: 2, ADD_RMSNORM: 4, ROPE: 2, SILU_MUL: 3, ADD: 3, HEAD_NORMS: 2}
FIT_OF = {ADD_RMSNORM: RMSNORM, HEAD_NORMS: RMSNORM}
WIDTHS_OF = {ADD_RMSNORM: RMSNORM}  # whose widths a pass takes (`layer_passes_s`), where not its own

# A layer as Vidur times it (sim/studies/elementwise_accuracy.py): two RMSNorms, rope, SiLU-and-mul, one add.
VIDUR_PASSES = (RMSNORM, ROPE, RMSNORM, SILU_MUL, ADD)
# vLLM vllm/model_executor/models/llama.py `LlamaDecoderLayer.forward` and SGLang
# python/sglang/srt/models/llama.py `LlamaDecoderLayer.forward`: input_layernorm(hidden, residual) and
# post_attention_layernorm(hidden, residual), each the fused add + RMSNorm kernel, rotary_emb(q, k) in
# place, the MLP's SiluAndMul; no add apart. The attention's own norms where the model has them: Qwen3's
# q_norm / k_norm over each head (qwen3.py `Qwen3Attention.forward`: q.view(..., heads, head_dim)), DeepSeek's
# q_a_layernorm / kv_a_layernorm over the latent (deepseek_v2.py `DeepseekV2MLAAttention`).
VLLM_SGLANG_PASSES = (ADD_RMSNORM, ROPE, ADD_RMSNORM, SILU_MUL, HEAD_NORMS)
# TensorRT-LLM runs other kernels (tensorrt_llm/_torch/models/modeling_llama.py `LlamaDecoderLayer`: rope
# inside the attention kernel, with tensor parallelism the add + RMSNorm inside the all-reduce,
# AllReduceFusionOp.RESIDUAL_RMS_NORM; its TensorRT-engine flow fuses by its own compiler) that no profile
# kvtier holds times: it keeps the flat layer figure (`engine_passes` ()). Vidur's vLLM kernels charged to it
# slowed its prefill-heavy rows by up to 15 points (docs/accuracy.md).
ENGINE_RULE = {"vllm": "vllm/model_executor/models/llama.py LlamaDecoderLayer",
               "sglang": "python/sglang/srt/models/llama.py LlamaDecoderLayer"}


@dataclass(frozen=True)
class PassFit:
    """One pass's fitted constants (`pass_s`)."""

    floor_s: float
    s_per_element: float
    hbm_efficiency: float


@dataclass(frozen=True)
class Elementwise:
    """A run's elementwise passes: the GPU's fits (kind -> PassFit, `FITTED`), the passes a layer runs
    (`engine_passes`) and where both come from."""

    fits: dict[str, PassFit]
    passes: tuple[str, ...]
    source: str  # the passes and the fit, for a run's sources
    fitted: str = ""  # where the fit comes from and its held-out error

    def fit(self, kind: str) -> PassFit:
        return self.fits[FIT_OF.get(kind, kind)]


FALLBACK_GPU = "h100-sxm"  # whose constants a GPU without its own fit takes (against its own HBM)


def elementwise_for(gpu: str, engine: str | None) -> Elementwise:
    """The GPU's fitted passes (its own, else FALLBACK_GPU's) run as `engine` runs a layer (`engine_passes`)."""
    data = catalog.fitted_elementwise()
    own = gpu in data["gpus"]
    entry = data["gpus"][gpu if own else FALLBACK_GPU]
    fits = {k: PassFit(**v) for k, v in entry["passes"].items()}
    held = entry["layer_error_held_out"]
    rule = ENGINE_RULE.get(engine or "vllm")
    passes = engine_passes(engine)
    whose = "its" if own else f"{FALLBACK_GPU}'s"
    fitted = (f"fitted on {whose} Vidur profiles (sim/catalog/fitted_elementwise.yaml): a layer held out |error| "
              f"median {held['median']:.1%}, worst {held['worst']:.1%}")
    said = f"elementwise passes by bytes ({', '.join(passes)} a layer: {rule}), {fitted}"
    return Elementwise(fits, passes, said, fitted)


def engine_passes(engine: str | None) -> tuple[str, ...]:
    """The elementwise passes of one decoder layer as `engine` runs it (None: kvtier's default, vLLM's);
    () where they are not modelled (TensorRT-LLM: module constants)."""
    return () if engine == "tensorrt-llm" else VLLM_SGLANG_PASSES


def row_bytes(kind: str, width: float) -> float:
    """Bytes a row of `width` elements of pass `kind` moves (module docstring's table)."""
    return ROW_ELEMENTS[kind] * width * ACTIVATION_BYTES


def pass_s(fit: PassFit, rows: float, width: float, row_bytes: float, hbm_bytes_per_s: float) -> float:
    """One pass over `rows` rows of `width` elements moving `row_bytes` a row: the larger of a row's
    latency and the rows' streaming (module docstring)."""
    return max(fit.floor_s + width * fit.s_per_element, rows * row_bytes / (hbm_bytes_per_s * fit.hbm_efficiency))


def layer_passes_s(ew: Elementwise, rows: float, widths: dict[str, tuple[tuple[float, ...], ...]],
                   hbm_bytes_per_s: float, passes: tuple[str, ...] | None = None) -> float:
    """The mean layer's elementwise passes over `rows` tokens: each of `passes` (default the engine's) at
    its widths (`widths`: kind -> ((elements a row on one GPU, share of the layers with it[, rows a
    token]), ...), a kind absent from it absent from the layer; a model's layers may differ, e.g. a
    dense MLP in some, a shared expert's in the others; a per-head norm runs a row per head)."""
    total = 0.0
    for kind in passes or ew.passes:
        fit = ew.fit(kind)
        for width, share, *per_token in widths.get(WIDTHS_OF.get(kind, kind), ()):
            if width > 0 and share > 0:
                total += share * pass_s(fit, rows * (per_token[0] if per_token else 1), width, row_bytes(kind, width),
                                        hbm_bytes_per_s)
    return total
