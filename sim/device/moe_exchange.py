"""How an attention-data-parallel group's tokens reach the GPUs that hold their experts and come back
(scenario `parallel.moe_comm`), as each engine does it by default on one NVLink node, read from its code
(stored copies of the public repositories):

- vLLM (vllm-project/vllm main): vllm/config/parallel.py `all2all_backend` defaults to
  "allgather_reducescatter"; vllm/distributed/device_communicators/all2all.py `AgRsAll2AllManager`
  dispatches with all_gatherv (hidden states with the top-k weights and ids) and combines with
  reduce_scatterv (bf16); an fp8 model's activations are quantised before the gather
  (naive_dp_ep.py), block scales with them.
- SGLang (sgl-project/sglang main): `moe_a2a_backend` defaults to "none"; dp_attention.py `dp_gather`
  all-gathers the bf16 hidden states of every rank (the router runs after it), and
  `dp_reduce_scatter_tensor` reduce-scatters the experts' partial outputs.
- TensorRT-LLM (PyTorch backend, MoE backend CUTLASS): fused_moe_cutlass.py enables its all-to-all only
  with moe_ep_size > top_k and MNNVL (the code of the 2025 performance overview's runs): otherwise
  torch.ops.trtllm.allgather of the bf16 hidden states (a block-scaled fp8 model quantises in the
  kernel; an NVFP4 model quantises first - forward_chunk's run_post_quant_allgather: fp4_quantize, then
  the packed FP4 values with their fp8 scale per 16 are gathered) with the int32 expert ids and fp32
  weights, and reducescatter of the bf16 outputs, both over NCCL. Later code (after Nov 2025) prefers
  NVLink all-to-alls where the node supports them.

So by default every GPU gathers the whole group's tokens, runs its own experts on those routed to them,
and the partial outputs are reduce-scattered back: NCCL's all_gather and reduce_scatter over the whole
group (`Hardware.gather_s`). `alltoall` is the engines' opt-in instead (vLLM --all2all-backend
deepep_high_throughput / deepep_low_latency, SGLang --moe-a2a-backend deepep, TensorRT-LLM's DeepEP or
NVLink one-sided): each token goes only to the ranks of its experts. Measured mode reads DeepEP's
tables (AIConfigurator moe_a2a_perf: TensorRT-LLM's and vLLM's, SGLang taking vLLM's), the
low-latency kernels up to `LL_MAX_TOKENS` tokens a rank and the high-throughput ones above - DeepEP's
own split (low latency for decode, normal for prefill: SGLang's deepep_mode auto, AIConfigurator's
registry), by tokens a rank since a layer's cost does not know its step's phase; TensorRT-LLM's wires
as it sends them (its HT kernels carry an fp8 model's activations in bf16, its LL dispatch in fp8). The
datasheet model costs each phase floor + bytes / rate, fitted on those tables per kernel and phase
(`Hardware.alltoall_s`; the catalog fabric's figures where no fit covers the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.dtypes import WEIGHT_DTYPES

ALLGATHER_REDUCESCATTER = "allgather_reducescatter"
ALLTOALL = "alltoall"
MOE_COMMS = ("engine", ALLTOALL)  # scenario parallel.moe_comm: the engine's default, or an all-to-all
BF16_BYTES = 2.0
FP8_WITH_BLOCK_SCALES = 1.0 + 4.0 / 128  # one byte an element, an fp32 scale per 128 (vLLM's block-quantised dispatch)
NVFP4_BYTES = WEIGHT_DTYPES["nvfp4"].packed_bytes_per_element  # TensorRT-LLM's post-quant all-gather
ROUTING_BYTES_PER_PICK = 8.0  # an int32 expert id and an fp32 weight per routed pick, gathered with the token
LL_MAX_TOKENS = 256  # tokens a rank DeepEP's low-latency tables reach (TensorRT-LLM's and vLLM's: 1-256)
A2A_PHASES = ("dispatch", "combine")
A2A_WIRE_BYTES = {"bf16": 2.0, "fp8": 1.0, "default": 2.0}  # an all-to-all wire's bytes an element (default: vLLM's)


@dataclass(frozen=True)
class MoeExchange:
    """One engine's dispatch and combine: `method`, the dispatch's bytes per hidden element and per
    routed pick (the combine is bf16 hidden states either way), and the sentence saying where from."""

    method: str = ALLTOALL
    dispatch_bytes_per_element: float = BF16_BYTES
    routing_bytes_per_pick: float = 0.0
    source: str = "kvtier's all-to-all (no engine rule applied)"
    # an all-to-all's wires in DeepEP's tables: (HT both phases, LL dispatch, LL combine); "default": vLLM's
    a2a_wires: tuple[str, str, str] = ("default", "default", "default")

    def a2a_kernel(self, tokens_per_rank: float, phase: str) -> tuple[str, str]:
        """(backend, wire) of one all-to-all phase: DeepEP's low-latency kernels up to LL_MAX_TOKENS a rank."""
        if tokens_per_rank <= LL_MAX_TOKENS:
            return "ll", self.a2a_wires[1 if phase == "dispatch" else 2]
        return "ht", self.a2a_wires[0]

    def dispatch_bytes_per_token(self, hidden: int, experts_per_token: int) -> float:
        return hidden * self.dispatch_bytes_per_element + experts_per_token * self.routing_bytes_per_pick


def moe_exchange(engine: str, weight_dtype: str, moe_comm: str = "engine") -> MoeExchange:
    """The exchange `engine` runs (see the module docstring), or the all-to-all `moe_comm` asks for."""
    if moe_comm == ALLTOALL:
        wires = ("bf16", "fp8" if weight_dtype == "fp8" else "bf16", "bf16") if engine == "tensorrt-llm" else \
            ("default", "default", "default")
        return MoeExchange(source="parallel.moe_comm alltoall: each token to its experts' ranks only (DeepEP; the "
                                  f"engines' opt-in), low-latency kernels up to {LL_MAX_TOKENS} tokens a rank",
                           a2a_wires=wires)
    if moe_comm != "engine":
        raise ValueError(f"moe_comm must be one of {', '.join(MOE_COMMS)}, got {moe_comm!r}")
    if engine == "vllm":
        fp8 = weight_dtype == "fp8"
        return MoeExchange(ALLGATHER_REDUCESCATTER, FP8_WITH_BLOCK_SCALES if fp8 else BF16_BYTES, ROUTING_BYTES_PER_PICK,
                           "vLLM's default all2all_backend allgather_reducescatter (vllm/config/parallel.py; "
                           "all2all.py AgRsAll2AllManager): all_gatherv of the "
                           f"{'fp8-quantised' if fp8 else 'bf16'} hidden states with the top-k ids and weights, "
                           "reduce_scatterv of the bf16 outputs")
    if engine == "sglang":
        return MoeExchange(ALLGATHER_REDUCESCATTER, BF16_BYTES, 0.0,
                           "SGLang's default moe_a2a_backend none (dp_attention.py dp_gather, dp_reduce_scatter_tensor): "
                           "all-gather of the bf16 hidden states (the router runs after it), reduce-scatter of the outputs")
    if engine == "tensorrt-llm":
        fp4 = weight_dtype == "nvfp4"  # quantised before the gather (run_post_quant_allgather)
        return MoeExchange(ALLGATHER_REDUCESCATTER, NVFP4_BYTES if fp4 else BF16_BYTES, ROUTING_BYTES_PER_PICK,
                           "TensorRT-LLM's CUTLASS MoE without an all-to-all (fused_moe_cutlass.py: moe_ep_size > top_k "
                           f"and MNNVL needed for one): allgather of the {'NVFP4-quantised' if fp4 else 'bf16'} hidden "
                           "states with the expert ids and weights, reducescatter of the bf16 outputs, over NCCL")
    raise ValueError(f"engine must be vllm, sglang or tensorrt-llm, got {engine!r}")
