"""Pure cost functions of decode: per-layer roofline, LM head, prefill, one decode step composed
(`decode_step_cost`), a continuous-batching step of decodes and prefill chunks (`mixed_step_cost`),
a re-tier's link traffic (`retier_traffic`), the layerwise prefetch pipeline; host access's path
(`host_path`) and its step closed form with the host DRAM shared (sim/device/host_pipeline.py).

Layers by kind (full, MLA, sliding window, linear state; sim/model/layers.py): decode attention is
the mean of each kind's call over the L layers (`kinds_attention_s`), prefill likewise
(`kinds_prefill_flop`); a dense GQA model takes exactly the formulas it always did.

No SimPy here: the engine only schedules what these compute. Formulas are in the docstrings.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from sim.model.dtypes import KV_DTYPES, WEIGHT_DTYPES
from sim.model.experts import expected_remote_ranks
from sim.model.layers import (
    CHUNKED,
    FULL,
    LINEAR,
    MLA,
    SPARSE,
    TIERED_KINDS,
    WINDOW,
    capped_pairs,
    chunk_pairs,
    window_prefill_work,
)
from sim.model.spec import ModelSpec
from sim.model.units import ATTN_MATMULS, FLOP_PER_MAC

from .elementwise import ADD, HEAD_NORMS, RMSNORM, ROPE, SILU_MUL, layer_passes_s
from .engine_rules import DECODE, MIXED, PREFILL, decode_rows, host_times
from .hardware import DecodeKernel, Hardware
from .host_pipeline import HostLayer, HostStepTimes, host_pipeline
from .kinds_prefill import measured_kinds_prefill_s
from .moe_exchange import A2A_PHASES, A2A_WIRE_BYTES, ALLGATHER_REDUCESCATTER
from .moe_datasheet import moe_fit_for
from .moe_fit import model_moe_s
from .moe_mla_costs import (absorbed_bmm_swap, attention_rank_rows, measured_a2a_s, measured_mla_prefill_s,
                            measured_mla_s, measured_moe_rest_s, measured_moe_s, moe_quant, moe_rest_gemms,
                            routed_work)
from .sparse_fetch import SparseFetch, fetch_layer, mean_layer_share

ALLREDUCES_PER_LAYER = 2  # tensor parallelism: after the attention output and after the MLP down projection
GEMM_CALLS_PER_LAYER = 4  # qkv, o, gate_up, down as engines fuse them (an MoE layer's experts: counted as these)
ACTIVATION_BYTES = 2  # bf16 activations all-reduced
ONE_BYTE_KV = ("fp8", "int8")  # KV dtypes the datasheet streams at the fp8 rate (int8 as fp8, as the tables stand in)


def roofline_s(flop: float, bytes_moved: float, flop_per_s: float, bytes_per_s: float) -> float:
    """time = max(FLOP / achieved FLOP/s, bytes / achieved bytes/s)."""
    return max(flop / flop_per_s, bytes_moved / bytes_per_s)


@dataclass(frozen=True)
class LayerCost:
    """One layer on the device timeline. Device work = GEMMs + attention + per-layer kernel
    overhead (launch gaps on the device: additive). `host_s` is the host's time to enqueue the
    layer; the device runs asynchronously to it (eager CUDA), so the layer takes whichever is
    longer: max(device work, host_s). host_s = 0 where launches are hidden (CUDA graphs) or the
    host time is already inside `overhead_s` (a synchronous device, e.g. the CPU)."""

    gemm_s: float
    attention_s: float
    overhead_s: float
    qkv_share: float = 0.0  # share of gemm_s spent in the q/k/v projection (before attention)
    host_s: float = 0.0
    allreduce_s: float = 0.0  # the layer's collectives: TP all-reduces, EP dispatch/combine (`layer_comm_s`)

    @property
    def device_s(self) -> float:
        return self.gemm_s + self.attention_s + self.overhead_s + self.allreduce_s

    @property
    def total_s(self) -> float:
        return max(self.device_s, self.host_s)

    @property
    def host_bound(self) -> bool:
        return self.host_s > self.device_s

    @property
    def pre_attention_s(self) -> float:
        """Norm + QKV projection: what runs before attention needs the staged tokens (stretched
        in proportion when the host sets the pace)."""
        stretch = self.total_s / self.device_s if self.device_s > 0 else 1.0
        return self.gemm_s * self.qkv_share * stretch

    @property
    def post_attention_s(self) -> float:
        return self.total_s - self.pre_attention_s


def gemm_flop(model: ModelSpec, batch: int) -> float:
    """Projection + MLP FLOP of one layer for one decode step: 2 * active linear params * B."""
    return FLOP_PER_MAC * _active_linear_params(model) * batch


# Per-model figures every step's cost needs, computed once per model (a ModelSpec is frozen, so it
# keys a cache); the serving engine costs tens of thousands of steps per run.
@lru_cache(maxsize=64)
def _active_linear_params(model: ModelSpec) -> int:
    return model.active_linear_params_layer()


@lru_cache(maxsize=4096, typed=True)  # typed: an int and a numpy int of `rows` are cached apart, as computed
def _layer_weights_read(model: ModelSpec, weight_dtype: str, group_size: int, rows: int) -> tuple[float, float]:
    """(weight bytes, linear params) one layer reads over `rows` tokens (MoE: the experts they touch)."""
    return model.layer_weight_bytes_read(weight_dtype, rows, group_size), model.layer_linear_params_read(rows)


def attention_flop(model: ModelSpec, attended_tokens: int) -> float:
    """Decode attention FLOP of one layer: sum_b 4 * n_b * H * d (QK^T and PV, 2 FLOP per MAC).
    With layer kinds: what the tiered layers (full, MLA) spend on these tokens, over all L layers / L
    (the mean layer; `kind_attention_flop_per_token`)."""
    if model.layer_kinds:
        per_token = sum(n * kind_attention_flop_per_token(model, k) for k, n in model.kind_counts.items()
                        if k in TIERED_KINDS)
        return per_token * attended_tokens / model.num_layers
    flop = ATTN_MATMULS * FLOP_PER_MAC * attended_tokens * model.num_heads * model.head_dim
    return flop / model.attention_dp if model.attention_dp > 1 else flop


def kind_attention_flop_per_token(model: ModelSpec, kind: str) -> float:
    """FLOP one attended token costs one layer of `kind` in decode. Full and window: 4 * H * d (QK^T
    and PV). MLA, absorbed as engines decode it: 2 * H * (kv_lora_rank + qk_rope_head_dim) for QK^T
    over the latent + 2 * H * kv_lora_rank for PV. Linear: per sequence, not per token
    (`LinearShape.state_flop_per_token`), so 0 here. An attention-data-parallel shard: / attention_dp
    (a GPU attends 1/D of the group's tokens; `ModelSpec.shard`)."""
    if kind in (MLA, SPARSE):  # a sparse layer: per token it attends (one of its top-k)
        a = model.mla
        flop = FLOP_PER_MAC * model.num_heads * (a.latent_dim + a.kv_lora_rank)
    elif kind == LINEAR:
        return 0.0
    else:
        flop = ATTN_MATMULS * FLOP_PER_MAC * model.num_heads * model.head_dim
    return flop / model.attention_dp if model.attention_dp > 1 else flop


def kind_prefill_flop_per_pair(model: ModelSpec, kind: str) -> float:
    """FLOP one (query, key) pair costs one layer of `kind` in prefill. MLA layers run unabsorbed there,
    as engines prefill them (vLLM's MLA backend up-projects the latent to K and V and runs plain
    attention): 2 * H * (qk_nope + qk_rope) for QK^T + 2 * H * v_head_dim for PV - DeepSeek-V3: 640 H,
    where the absorbed decode form costs 2,176 H. Sparse (DeepSeek sparse attention) layers keep the
    absorbed form: DSA runs in MLA's MQA mode in prefill too. Other kinds: `kind_attention_flop_per_token`."""
    if kind != MLA:
        return kind_attention_flop_per_token(model, kind)
    a = model.mla
    flop = FLOP_PER_MAC * model.num_heads * (a.qk_head_dim + a.v_head_dim)
    return flop / model.attention_dp if model.attention_dp > 1 else flop


def prefill_attention_flop(model: ModelSpec, position_sum: float) -> float:
    """Prefill attention FLOP of one (mean) layer whose chunk tokens attend `position_sum` pairs in all:
    `attention_flop` with each tiered kind at its prefill cost (`kind_prefill_flop_per_pair`); chunked
    layers attend within their chunks, `_bounded_prefill_flop`."""
    if not model.layer_kinds:
        return attention_flop(model, position_sum)
    per_pair = sum(n * kind_prefill_flop_per_pair(model, k) for k, n in model.kind_counts.items()
                   if k in TIERED_KINDS and k != CHUNKED)
    return per_pair * position_sum / model.num_layers


def linear_state_flop(model: ModelSpec) -> float:
    """One sequence's decode FLOP in one linear layer (`LinearShape.state_flop_per_token`), / attention_dp
    in an attention-data-parallel shard (a GPU updates the states of its rank's sequences only)."""
    flop = model.linear.state_flop_per_token
    return flop / model.attention_dp if model.attention_dp > 1 else flop


@lru_cache(maxsize=256)
def kv_dtype_of(model: ModelSpec, kv_bytes_per_token_layer: float) -> str:
    """The KV dtype whose `ModelSpec.kv_bytes_per_token_layer` the engines passed (they pass the run's);
    bf16 where none gives those bytes (a model with no tiered layer, whose per-token bytes are 0)."""
    for name in KV_DTYPES:
        if model.kv_bytes_per_token_layer(name) == kv_bytes_per_token_layer:
            return name
    return "bf16"


def kinds_attention_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, kv_bytes, kv_bytes_per_token_layer: float,
                      chunk_tokens=None):
    """Decode attention of a model with layer kinds, as the mean of its L layers' calls (scalars, or
    arrays over steps):
      tiered (full, MLA; n_t layers): `kv_bytes` is the mean layer's, so one tiered layer reads
        kv_bytes x L / n_t, at `kind_attention_flop_per_token` x attended tokens;
      window (n_w): min(attended, B x W) tokens read and B written at its bytes/token/layer (exact when
        every sequence is at least W long), FLOP as full attention over those tokens;
      chunked (n_c): the tokens of each sequence's current chunk (`chunk_tokens`, sum_b ((n_b - 1) mod C)
        + 1, where the caller knows each sequence's length; else the bound min(attended, B x C), exact
        while every sequence is in its first chunk), the tiered layer's bytes in that share;
      linear (n_l): each sequence's state read and written, 2 x B x state bytes, B x state FLOP;
    time = sum_kind n_kind x call_kind / L. Full and window layers are GQA calls (`gqa_attention_s`:
    the measured table where the run has one; a window layer the table's rows of its window where it
    times them, `_measured_window_s`); MLA layers the measured MLA table where it applies (`_mla_s`),
    linear layers the datasheet `attention_s`."""
    L = model.num_layers
    arrays = bool(np.ndim(kv_bytes) or np.ndim(attended_tokens) or np.ndim(batch))
    call = attention_s_array if arrays else attention_s
    kv_dtype = kv_dtype_of(model, kv_bytes_per_token_layer)
    total = 0.0
    for kind, n in model.kind_counts.items():
        if kind == LINEAR:
            flop = np.asarray(batch, dtype=float) * linear_state_flop(model)
            t = call(flop if arrays else float(flop), 2 * batch * model.state_bytes_per_sequence() / n, hw)
        elif kind == MLA:
            flop = kind_attention_flop_per_token(model, MLA) * np.asarray(attended_tokens, dtype=float)
            t = _mla_s(model, hw, batch, attended_tokens, kv_bytes * L / model.tiered_layers, flop, kv_dtype, call, arrays)
        elif kind == SPARSE:
            t = _sparse_s(model, hw, batch, attended_tokens, kv_dtype, call, arrays)
        elif kind == WINDOW and (table := _measured_window_s(model, hw, batch, attended_tokens, kv_dtype)) is not None:
            t = table
        elif kind == WINDOW and hw.kernels is None and hw.window_decode is not None:
            t = _datasheet_window_s(model, hw, batch, attended_tokens, kv_dtype)
        else:  # the GQA kinds: full, chunked, window
            per_token = model.kind_kv_bytes_per_token_layer(kind, kv_dtype)
            tokens, nbytes = _gqa_kind_read(model, kind, batch, attended_tokens, kv_bytes, per_token, chunk_tokens)
            flop = kind_attention_flop_per_token(model, kind) * np.asarray(tokens, dtype=float)
            shape, kernel = model, None
            if kind == CHUNKED and hw.chunked_decode_per_query_head:  # each query head's block reads its KV head
                g = model.num_heads / model.num_kv_heads
                shape, nbytes, per_token, kernel = per_query_head(model), nbytes * g, per_token * g, hw.mha_decode
            t = gqa_attention_s(shape, hw, batch, tokens, nbytes, per_token, flop if arrays else float(flop), kernel)
        total = total + n * t
    return total / L


def _measured_window_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, kv_dtype: str):
    """A window layer's decode attention from the measured table's rows of its window: `batch` sequences at
    their mean context, attended / batch (the kernel reads each one's last W), one rank's call under
    attention data parallelism (its 1/D of the batch, as `gqa_attention_s`). None where the run's tables
    do not time that window or the step attends nothing: the caller then costs each sequence's last
    min(n, W) tokens as a full layer's call."""
    k, window = hw.kernels, model.sliding_window
    shape = (model.num_heads, model.num_kv_heads, model.head_dim, kv_dtype)
    if k is None or np.all(np.asarray(batch) <= 0) or np.all(np.asarray(attended_tokens) <= 0) \
            or not k.has_decode_slice(*shape, window):
        return None
    dp = model.attention_dp
    if not (np.ndim(batch) or np.ndim(attended_tokens)):  # one step: scalars
        b = max(float(batch) / dp, 1.0)
        return k.decode_attention_one_s(b, max(float(attended_tokens) / dp / b, 1.0), *shape, window=window)
    b = np.maximum(np.asarray(batch, dtype=float) / dp, 1.0)
    n = np.maximum(np.asarray(attended_tokens, dtype=float) / dp / b, 1.0)
    return k.decode_attention_s(b, n, *shape, window=window).seconds


def _datasheet_window_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, kv_dtype: str):
    """A window layer's datasheet decode attention on its own kernel figures (`hw.window_decode`), one rank's call
    under attention data parallelism (its 1/D of the batch): `batch` sequences at their mean context n =
    attended / batch, each reading its last min(n, W) tokens and writing one (`window_datasheet_attention_s`)."""
    one, dp = _one_rank(model), model.attention_dp
    b = np.asarray(batch, dtype=float) / dp
    n = _tokens_per_seq(batch, attended_tokens)
    read = b * np.minimum(n, model.sliding_window)
    nbytes = (read + b) * one.kind_kv_bytes_per_token_layer(WINDOW, kv_dtype)
    flop = kind_attention_flop_per_token(model, WINDOW) * read
    if not (np.ndim(batch) or np.ndim(attended_tokens)):  # one step: scalars
        b, n, nbytes, flop = float(b), float(n), float(nbytes), float(flop)
    return window_datasheet_attention_s(hw, hw.window_decode, b, model.num_kv_heads,
                                        model.num_heads / model.num_kv_heads, n, model.sliding_window, nbytes, flop,
                                        kv_dtype in ONE_BYTE_KV)


def window_datasheet_attention_s(hw: Hardware, kernel: DecodeKernel, batch, kv_heads: int, heads_per_kv: float,
                                 tokens_per_seq, window: int, kv_bytes, flop, fp8_kv: bool):
    """One window layer's decode attention, datasheet, on the window kernel's own figures (`hardware.window_decode`,
    fitted per head dim on the tables' window rows; scalars, or arrays over steps): `gqa_datasheet_attention_s`
    of the window's bytes and FLOP, XQA's split (where the fit kept it) counted over each sequence's whole
    length `tokens_per_seq`, not its window - TensorRT-LLM's window-128 call over 64 sequences takes 43 us past
    128 tokens where it took 23 us within them (H200) -, plus, for a sequence longer than its window, the
    kernel's floor and per-block cost past it: c = batch x KV heads blocks, + past floor + c x past per block.
    Example, H200 on vLLM's fit at head dim 64 (floor 9.54 us, 0.891 of HBM at half rate by 293 blocks, 25.4 ns
    a block; past the window 2.89 us + 17.3 ns a block): gpt-oss's 64 sequences x 8 KV heads, window 128, 512
    blocks reading 16.9 MB: 9.54 us + max(16.9 MB / (4.8 TB/s x 0.891 x 512 / 805), 512 x 25.4 ns) = 22.5 us
    within the window; at 2,048 cached tokens + 2.89 us + 512 x 17.3 ns = 34.3 us (the table: 20 and 33 us)."""
    base = gqa_datasheet_attention_s(hw, batch, kv_heads, flop, kv_bytes, fp8_kv, heads_per_kv=heads_per_kv,
                                     tokens_per_seq=tokens_per_seq, kernel=kernel)
    past = np.asarray(tokens_per_seq, dtype=float) > window
    ctas = np.asarray(batch, dtype=float) * kv_heads
    extra = np.where(past, kernel.past_window_floor_s + kernel.past_window_per_cta_s * ctas, 0.0)
    out = base + extra
    return out if np.ndim(out) else float(out)


@lru_cache(maxsize=64)
def per_query_head(model: ModelSpec) -> ModelSpec:
    """`model` as a decode kernel with one thread block per query head sees it (TensorRT-LLM's MMHA on a GQA
    model's chunked layers): every query head streams its KV head's cache, as multi-head attention of
    num_heads heads does. The measured tables time that kernel in their MHA rows (`kernel_tables` kv_heads 0),
    which run well below HBM bandwidth (H200: 31-45% at 8k-16k tokens), so L2 serving a group's repeated reads
    would save little: assumed, no table times MMHA on a GQA cache."""
    return replace(model, num_kv_heads=model.num_heads)


def _gqa_kind_read(model: ModelSpec, kind: str, batch, attended_tokens, kv_bytes, per_token: float, chunk_tokens):
    """(tokens attended, bytes read) of one GQA layer of `kind` in a decode step (`kinds_attention_s`). A
    chunked layer attends `chunk_tokens` where the caller counted them per sequence, else min(attended,
    B x C) - an upper bound, each sequence attending ((n - 1) mod C) + 1 <= min(n, C) tokens."""
    tiered_bytes = kv_bytes * model.num_layers / model.tiered_layers
    if kind == FULL:
        return attended_tokens, tiered_bytes
    if kind == CHUNKED:
        tokens = np.minimum(attended_tokens, batch * model.attention_chunk if chunk_tokens is None else chunk_tokens)
        return tokens, tiered_bytes * tokens / np.maximum(attended_tokens, 1)
    tokens = np.minimum(attended_tokens, batch * model.sliding_window)
    return tokens, (tokens + batch) * per_token


def _mla_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, nbytes, flop, kv_dtype: str, call, arrays: bool):
    """One MLA layer's decode attention: the measured kernel where the run's tables hold it
    (`moe_mla_costs.measured_mla_s`) plus what it does not move (T2's dequantisation traffic) at the
    datasheet attention rate, else the datasheet `attention_s` of its FLOP and bytes."""
    measured = measured_mla_s(model, hw, batch, attended_tokens, kv_dtype)
    if measured is None:
        if hw.mla_fit is not None:
            return mla_datasheet_attention_s(hw, batch, model.num_heads, flop, nbytes, kv_dtype in ONE_BYTE_KV)
        return call(flop if arrays else float(flop), nbytes, hw)
    latent = model.kind_kv_bytes_per_token_layer(MLA, kv_dtype)
    extra = np.maximum(np.asarray(nbytes, dtype=float) - (np.asarray(attended_tokens, dtype=float) + batch) * latent, 0.0)
    out = measured + extra / hw.attention_hbm_bytes_per_s
    return out if arrays else float(out)


MLA_BLOCK_HEADS = 64  # query heads one block of the absorbed MLA decode kernel takes (FlashMLA's tile)


def mla_datasheet_attention_s(hw: Hardware, batch, heads: int, flop, kv_bytes, fp8_kv: bool):
    """One MLA layer's absorbed decode attention, datasheet, fitted on the measured MLA tables
    (`hw.mla_fit`; scalars, or arrays over steps): floor + max(latent bytes / (rate(KV dtype) x b /
    (b + half_blocks)), FLOP / FLOP rate), b = batch x ceil(heads / 64) the kernel's blocks. Absorbed MLA
    with many heads per GPU is compute-bound (DeepSeek-V3 at 128 heads: 484 FLOP a byte), so its own
    FLOP rate matters: 0.21-0.62 of the bf16 peak fitted, where the generic form took the prefill plateau."""
    f = hw.mla_fit
    rate = f.fp8_bytes_per_s if fp8_kv else f.bytes_per_s
    if not (np.ndim(batch) or np.ndim(kv_bytes) or np.ndim(flop)):  # a serving step's one call: plain floats
        blocks = float(batch) * math.ceil(heads / MLA_BLOCK_HEADS)
        stream = kv_bytes * (blocks + f.half_blocks) / (rate * blocks) if blocks > 0 else 0.0
        return f.floor_s + max(stream, flop / f.flop_per_s)
    blocks = np.asarray(batch, dtype=float) * math.ceil(heads / MLA_BLOCK_HEADS)
    with np.errstate(divide="ignore", invalid="ignore"):
        stream = np.where(blocks > 0, np.asarray(kv_bytes, dtype=float) * (blocks + f.half_blocks) / (rate * blocks), 0.0)
    out = f.floor_s + np.maximum(stream, np.asarray(flop, dtype=float) / f.flop_per_s)
    return out if np.ndim(out) else float(out)


def _sparse_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, kv_dtype: str, call, arrays: bool):
    """One sparse layer's decode attention (`sparse_attention_work`): with measured MLA tables, the
    indexer (datasheet) then the MLA kernel over the top-k picks (the measured dense MLA kernel at
    k tokens a sequence - a sparse kernel's gather over scattered rows is not in the table); else one
    datasheet call for both."""
    flop, nbytes = sparse_attention_work(model, batch, attended_tokens, kv_dtype)
    selected = np.minimum(np.asarray(attended_tokens, dtype=float), np.asarray(batch, dtype=float) * model.sparse.index_topk)
    measured = measured_mla_s(model, hw, batch, selected if arrays else float(selected), kv_dtype)
    if measured is None:
        return call(flop if arrays else float(flop), nbytes if arrays else float(nbytes), hw)
    dp, tokens = model.attention_dp, np.asarray(attended_tokens, dtype=float)
    idx_flop, idx_bytes = model.sparse.flop_per_token / dp * tokens, model.sparse.key_bytes_per_token / dp * tokens
    indexer = call(idx_flop if arrays else float(idx_flop), idx_bytes if arrays else float(idx_bytes), hw)
    return measured + indexer


def sparse_attention_work(model: ModelSpec, batch, attended_tokens, kv_dtype: str):
    """(FLOP, bytes) of one sparse layer's decode attention (DeepSeek sparse attention): the indexer
    scores every attended token (`SparseShape.flop_per_token`, reading its HBM-resident key) and MLA
    attends only the top-k it selects - min(tokens, B x k) over the batch, exact when every sequence
    holds at least k tokens (or all fewer) - reading their latents and writing B new ones. The
    latents read come from T0 or from where the access put the host-resident ones (staged)."""
    selected = np.minimum(np.asarray(attended_tokens, dtype=float), np.asarray(batch, dtype=float) * model.sparse.index_topk)
    dp = model.attention_dp
    flop = (kind_attention_flop_per_token(model, SPARSE) * selected
            + model.sparse.flop_per_token / dp * np.asarray(attended_tokens, dtype=float))
    latent = model.kind_kv_bytes_per_token_layer(SPARSE, kv_dtype)
    nbytes = (selected + batch) * latent + np.asarray(attended_tokens, dtype=float) * model.sparse.key_bytes_per_token / dp
    return flop, nbytes


def weight_kernel_s(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, rows: int,
                    absorbed: bool = False) -> float:
    """Projections + MLP of one layer over `rows` tokens. The kernel streams its weights from HBM
    while its compute pipeline dequantises each weight on the CUDA cores (weight-only int8/int4, or
    fp8 without fp8 tensor cores) and runs the tensor-core MMA; the slower of the two sets the time:

    time = max(weight bytes / weight streaming rate,
               weights x dequant ops per weight / CUDA-core op rate + 2 * P * rows / GEMM FLOP/s(rows))

    With no dequantisation (bf16, fp16, fp8 on fp8 tensor cores) this is the roofline
    max(FLOP / FLOP/s, bytes / bytes/s). The dequantisation is paid once per weight per call, the MMA
    grows with rows: a weight-only kernel turns compute-bound at a smaller batch on a GPU whose
    CUDA cores are slow against its memory (Marlin's speedup fades past batch 16-32 for this reason).
    A profile that timed the dtype's kernel across rows replaces the model: weight bytes / measured rate.
    `absorbed` (decode rows): an MLA layer's kv_b runs as the engine's measured BMMs where a table times
    them (`moe_mla_costs.absorbed_bmm_swap`), the rest as above. Attention projections a checkpoint keeps in
    their own format (`ModelSpec.attention_formats`) stream their own bytes; the measured tables time a dense
    layer's GEMMs each in its format, the datasheet model takes the layer's FLOP at the weight dtype's rate
    (DeepSeek-R1's bf16 projections are ~0.4% of its active FLOP). A mixture of experts: the routed experts from
    the fused-experts table or fit; a GQA model's other GEMMs each as its own call, from the GEMM tables
    (`measured_moe_rest_s`) or the datasheet kernel (`datasheet_moe_rest_s`); an MLA model's as one kernel."""
    profiled = bool(hw.weight_kernel_bytes_per_s_by_rows)
    if not profiled and hw.kernels is not None and model.gqa_gemms:
        formats = model.layer_gemm_formats(weight_dtype)
        if set(formats) <= set(hw.kernels.gemm_dtypes()):
            return _measured_layer_gemms_s(hw.kernels, model, tuple(formats), int(rows))
    w_bytes, params_read = _layer_weights_read(model, weight_dtype, group_size, rows)
    if profiled:  # a profile timed this dtype's kernel across rows
        return hw.measured_weight_kernel_s(w_bytes, rows)
    flop, bmm_s = gemm_flop(model, rows), 0.0
    swap = absorbed_bmm_swap(model, hw, weight_dtype, group_size, rows) if absorbed and rows > 0 else None
    if swap is not None:
        w_bytes, params_read, flop, bmm_s = w_bytes - swap[0], params_read - swap[1], flop - swap[2], swap[3]
    quant = moe_quant(model, hw, weight_dtype, group_size)
    fitted, alpha = (None, None) if quant is not None else moe_fit_for(model, hw, weight_dtype, group_size)
    if quant is not None or fitted is not None:  # the routed experts from the MoE table or its fit
        r_bytes, r_params, r_flop = routed_work(model, weight_dtype, group_size, rows)
        rest = measured_moe_rest_s(model, hw, weight_dtype, rows, rank_rows(model, rows)) if quant is not None else None
        if rest is None:
            rest = datasheet_moe_rest_s(model, hw, weight_dtype, group_size, rows)
        if rest is None:  # MLA, sparse or linear attention: the rest's weights as one kernel
            rest = weight_gemm_s(hw, w_bytes - r_bytes, params_read - r_params, flop - r_flop, rank_rows(model, rows),
                                 GEMM_CALLS_PER_LAYER)
        routed = (measured_moe_s(model, hw, quant, rows) if quant is not None
                  else model_moe_s(model, fitted, model.expert_format(weight_dtype), group_size, rows, alpha))
        return rest + routed + bmm_s
    return weight_gemm_s(hw, w_bytes, params_read, flop, rank_rows(model, rows), GEMM_CALLS_PER_LAYER,
                         _layer_shapes(model) if model.gqa_gemms else ()) + bmm_s


def datasheet_moe_rest_s(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, rows: int) -> float | None:
    """A GQA mixture of experts' GEMMs besides its routed experts (`moe_mla_costs.moe_rest_gemms`) by the datasheet
    weight kernel, each its own call in its format over its rows - one attention rank's ceil(rows / D) for the
    projections and the router, `rank_rows` for shared experts and dense MLPs - as the measured tables take them
    (`measured_moe_rest_s`): each call pays its floor, grid fill and activation terms (`weight_gemm_s`). None where a
    layer's attention is not GQA (the caller prices the rest as one kernel)."""
    gemms = moe_rest_gemms(model, weight_dtype)
    if gemms is None:
        return None
    attention_rows, dense_rows = attention_rank_rows(model, rows), rank_rows(model, rows)
    total = 0.0
    for n, k, fmt, attention, share in gemms:
        m = attention_rows if attention else dense_rows
        total += share * weight_gemm_s(hw, WEIGHT_DTYPES[fmt].bytes_for(n * k, group_size), n * k,
                                       FLOP_PER_MAC * m * n * k, m, 1, ((n, k),))
    return total


def rank_rows(model: ModelSpec, rows: int) -> int:
    """The rows one GPU's dense GEMMs (all but the routed experts) run over: under attention data parallelism
    with data-parallel dense parts (`ModelSpec.dense_dp`, TensorRT-LLM's DEP) its busiest rank's ceil(rows / D)
    - each rank multiplies its own tokens through the whole weights, so the GEMM's tiles, re-reads and
    per-row work are a rank's (the FLOP is already the rank's share, `_parallel_active_params`); else the
    group's rows (tensor-parallel dense parts run every token)."""
    return math.ceil(rows / model.attention_dp) if model.dense_dp and model.attention_dp > 1 else rows


@lru_cache(maxsize=64)
def _layer_shapes(model: ModelSpec) -> tuple[tuple[float, float], ...]:
    """(n, k) of a dense layer's fused GEMMs (`ModelSpec.layer_gemm_shapes`)."""
    return tuple((float(n), float(k)) for n, k in model.layer_gemm_shapes())


def _measured_layer_gemms_s(kernels, model: ModelSpec, formats: tuple[str, ...], rows: int) -> float:
    """A dense layer's fused GEMMs (`ModelSpec.layer_gemm_shapes`) from the measured tables, each in its weight
    format (`ModelSpec.layer_gemm_formats`), one table query per format."""
    shapes = model.layer_gemm_shapes()
    return sum(_measured_gemms_s(kernels, tuple(s for s, f in zip(shapes, formats) if f == fmt), fmt, rows)
               for fmt in dict.fromkeys(formats))


@lru_cache(maxsize=8192)
def _measured_gemms_s(kernels, shapes: tuple[tuple[int, int], ...], weight_dtype: str, rows: int) -> float:
    """The layer's fused GEMMs (`ModelSpec.layer_gemm_shapes`) from the measured tables, summed."""
    n, k = np.array(shapes).T
    return float(kernels.gemm_s(np.full(len(n), rows), n, k, weight_dtype).seconds.sum())


TILE_ROWS = 128  # rows of a W8A8 output tile (vLLM's sm90 fp8 dispatch past 64 rows: 128 x 128)
SMALL_M_ROWS = 64  # up to here the small-M (swap-AB) kernels run, with their own grid


def weight_gemm_s(hw: Hardware, weight_bytes: float, params: float, flop: float, rows: int, calls: int = 1,
                  shapes: tuple[tuple[float, float], ...] = ()) -> float:
    """The datasheet weight kernel (`weight_kernel_s`) of any weight matrix or set of them, in `calls`
    kernel calls, `shapes` = (n outputs, k inputs) of each call:

        calls x floor + max(weight stream (`weight_stream_s`),
                            (params x dequant ops / CUDA-core rate + FLOP / GEMM FLOP/s(rows)) / grid fill)
        + rows x sum n x per output element + calls x rows x per-row quantisation + rows x sum k x per input element

    The activation terms (`hw.gemm_io`) are fitted with the rest on the measured tables: the output
    write, and W8A8's dynamic per-tensor quantisation of its input (a reduction, then a pass over m x k,
    before the fp8 MMA) - without them one FLOP efficiency had to average fp8's small-matrix,
    many-row calls (slow) with its large ones (fast), a 19-22% held-out median. A grid of few output
    tiles leaves SMs idle for the stream and the compute alike (`tile_fills`). `shapes` (): weights
    alone (a layer whose matrices are not given, e.g. an MoE layer's rest)."""
    io = hw.gemm_io
    n, k = sum(s[0] for s in shapes), sum(s[1] for s in shapes)
    dequant_s = params * hw.dequant_ops_per_weight / hw.dequant_op_per_s
    activation_s = rows * (n * io.output_element_s + calls * io.quant_row_s + k * io.quant_element_s)
    fills = tile_fills(hw, rows, shapes)
    nk = sum(a * b for a, b in shapes)
    slow = sum(a * b / nk / f for (a, b), f in zip(shapes, fills)) if shapes else 1.0
    return (calls * hw.gemm_floor_s + max(weight_stream_s(hw, weight_bytes, rows, shapes, fills),
                                          (dequant_s + flop / hw.gemm_flop_per_s(rows)) * slow) + activation_s)


def tile_fills(hw: Hardware, rows: int, shapes: tuple[tuple[float, float], ...]) -> list[float]:
    """Each call's grid fill, B / (B + half tiles) over its B = ceil(m / 128) x ceil(n / 128) output
    tiles (fitted, `hw.gemm_io`: fp8 W8A8, whose small-M kernels - m <= 64, one 64-wide tile a block -
    have their own half point, and TensorRT-LLM's weight-only int4/int8 on A100); 1 without the fit."""
    io = hw.gemm_io
    half = io.half_tiles_decode if rows <= SMALL_M_ROWS else io.half_tiles
    if not half:
        return [1.0] * len(shapes)
    tiles_m = math.ceil(rows / TILE_ROWS) if rows > 0 else 1
    return [(t := tiles_m * math.ceil(n / TILE_ROWS)) / (t + half) for n, _ in shapes]


def weight_stream_s(hw: Hardware, weight_bytes: float, rows: int, shapes: tuple[tuple[float, float], ...] = (),
                    fills: list[float] | None = None) -> float:
    """The weights and the rows x k input streamed at the weight rate, each call (its share n k of the
    bytes) at its grid's fill (`tile_fills`: a grid of few output tiles cannot keep HBM busy). fp8
    W8A8's fitted tiles (`hw.gemm_io`): each output tile of 128 rows streams the weights of its
    columns, so each further tile re-reads a share `weight_reread` that L2 misses (0.12-0.80 fitted
    across GPUs and engines). Example, H100 (0.61 re-read, 11.6 half tiles up to 64 rows): m = 1, n =
    5,120: B = 40, the stream at 40 / 51.6 of its rate. Without shapes only the re-read (no n: a full grid).
    `fills`: the calls' `tile_fills` where the caller has them."""
    io = hw.gemm_io
    tiles_m = math.ceil(rows / TILE_ROWS) if rows > 0 else 1
    reread = 1.0 + io.weight_reread * (tiles_m - 1)
    rate = hw.weight_hbm_bytes_per_s
    if not shapes:
        return weight_bytes * reread / rate
    nk = sum(n * k for n, k in shapes)
    fills = tile_fills(hw, rows, shapes) if fills is None else fills
    return sum((weight_bytes * n * k / nk * reread + rows * k * io.activation_bytes) / (rate * fill)
               for (n, k), fill in zip(shapes, fills))


def attention_s(flop: float, kv_bytes: float, hw: Hardware) -> float:
    """One decode-attention call: latency + KV bytes / achieved bandwidth, or its FLOP if they bind:
    max(FLOP / attention FLOP/s, latency + bytes / attention bytes/s). The latency is the floor a
    short context cannot hide; a long one streams at the split-KV kernel's fraction of HBM bandwidth,
    so the achieved fraction grows with tokens per sequence and batch."""
    return max(flop / hw.attention_flop_per_s, hw.attention_latency_s + kv_bytes / hw.attention_hbm_bytes_per_s)


def attention_s_array(flop: np.ndarray, kv_bytes: np.ndarray, hw: Hardware) -> np.ndarray:
    """`attention_s` over arrays (the fast level's steps); a test holds the two equal."""
    return np.maximum(flop / hw.attention_flop_per_s, hw.attention_latency_s + kv_bytes / hw.attention_hbm_bytes_per_s)


def gqa_datasheet_attention_s(hw: Hardware, batch, kv_heads: int, flop, kv_bytes, fp8_kv: bool, *,
                              heads_per_kv=1.0, tokens_per_seq=None, kernel: DecodeKernel | None = None):
    """One GQA layer's decode attention, datasheet (scalars, or arrays over steps): the kernel's grid is
    one thread block per (sequence, KV head), c = batch x KV heads, and

        time = max(FLOP / attention FLOP/s, floor + max(bytes / (rate x c / (c + half)), c x per block))

    rate: HBM x the streaming efficiency of the KV dtype (fp8 dequantises as it reads: 0.59-0.90 of HBM
    where bf16 KV streams at 0.73-0.93); a grid of few blocks cannot keep HBM busy (half the rate at
    `half_ctas` blocks, 0-2.2 fitted); a long thin grid (thousands of sequences of short contexts) pays
    each block's serial cost (11-40 ns); fp8 KV has its own floor and per-block cost (engines run other
    kernels for it). `hw.attention_shape` holds the fitted figures; its defaults (no fit, a profile, a
    scenario override) leave `attention_s`. Example, H100 with (12.9 us, 0.906, half 0.76, 30.7 ns): 1
    sequence x 8 KV heads x 4,096 bf16 tokens, 16.8 MB: 12.9 us + 16.8 MB / (3.35 TB/s x 0.906 x 8 / 8.76)
    = 19.0 us; 2,048 x 8 KV heads x 16 tokens: 12.9 us + 16,384 x 30.7 ns = 516 us.
    Where the shape has XQA's sequence split (`split_ctas`: TensorRT-LLM on H100, H200, GH200, A100) the stream
    and the blocks add, each block also paying per query head it serves (g = `heads_per_kv`):
    floor + bytes / (rate x c / (c + half)) + `xqa_ctas` x (per block + g x per head), the blocks over
    `tokens_per_seq` cached tokens a sequence (None: no split). `kernel`: another kernel's fitted floor, rate
    and shape in place of the decode fit's (`Hardware.mha_decode`, MMHA)."""
    shape = kernel.shape if kernel else hw.attention_shape
    bf16_rate, bf16_floor = (kernel.hbm_bytes_per_s, kernel.floor_s) if kernel else (hw.attention_hbm_bytes_per_s,
                                                                                      hw.attention_latency_s)
    rate = shape.fp8_hbm_bytes_per_s if fp8_kv and shape.fp8_hbm_bytes_per_s else bf16_rate
    floor = shape.fp8_floor_s if fp8_kv and shape.fp8_floor_s is not None else bf16_floor
    per_cta = shape.fp8_per_cta_s if fp8_kv and shape.fp8_per_cta_s is not None else shape.per_cta_s
    split = shape.split_ctas and (np.ndim(heads_per_kv) or np.ndim(tokens_per_seq))
    if np.ndim(batch) or np.ndim(kv_bytes) or np.ndim(flop) or split:
        ctas, nbytes = np.asarray(batch, dtype=float) * kv_heads, np.asarray(kv_bytes, dtype=float)
        stream = nbytes / rate
        if shape.half_ctas:  # a small grid streams at c / (c + half) of the rate; an empty one reads nothing
            with np.errstate(divide="ignore", invalid="ignore"):
                stream = np.where(ctas > 0, nbytes / (rate * (ctas / (ctas + shape.half_ctas))), 0.0)
        if shape.split_ctas:
            body = stream + xqa_ctas(ctas, tokens_per_seq, shape.split_ctas) * (
                per_cta + np.asarray(heads_per_kv, dtype=float) * shape.per_cta_head_s)
        else:
            body = np.maximum(stream, per_cta * ctas)
        return np.maximum(np.asarray(flop, dtype=float) / hw.attention_flop_per_s, floor + body)
    ctas = float(batch) * kv_heads
    stream = kv_bytes / rate if not shape.half_ctas else (kv_bytes / (rate * ctas / (ctas + shape.half_ctas)) if ctas > 0 else 0.0)
    if shape.split_ctas:
        body = stream + float(xqa_ctas(ctas, tokens_per_seq, shape.split_ctas)) * (per_cta + heads_per_kv * shape.per_cta_head_s)
    else:
        body = max(stream, per_cta * ctas)
    return max(flop / hw.attention_flop_per_s, floor + body)


def xqa_ctas(ctas, tokens_per_seq, split_ctas: float):
    """TensorRT-LLM XQA's thread blocks (its multi-block split, computeMultiBlockCount): each of the c =
    batch x KV heads blocks splits a sequence of n cached tokens into m0 = max(1, min(k, round(sqrt(8 k))))
    blocks, k = floor(n / 128), unless the grid would pass `split_ctas` (8 waves of SMs):
    max(c, min(c x m0, split_ctas)). Scalars or arrays; `tokens_per_seq` None: no split (c)."""
    if tokens_per_seq is None:
        return ctas
    k = np.floor(np.asarray(tokens_per_seq, dtype=float) / 128.0)
    m0 = np.maximum(1.0, np.minimum(k, np.round(np.sqrt(8.0 * k))))
    return np.maximum(ctas, np.minimum(ctas * m0, split_ctas))


def decode_attention_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, kv_bytes,
                       kv_bytes_per_token_layer: float, chunk_tokens=None):
    """One layer's decode attention of `batch` sequences attending `attended_tokens` in all, reading
    and writing `kv_bytes` (scalars, or arrays over steps). Datasheet: `attention_s`. Measured
    kernels: the table's call at the batch's mean context per sequence, plus what the table's kernel
    does not move (T2's dequantisation traffic) at the datasheet attention rate. A model with layer
    kinds: `kinds_attention_s` (`chunk_tokens`: its chunked layers' tokens, counted per sequence). Attention
    data parallelism: the busiest rank's share (`busiest_rank_factor`)."""
    if model.attention_dp > 1:
        f = busiest_rank_factor(batch, model.attention_dp)
        batch, attended_tokens, kv_bytes = batch * f, attended_tokens * f, kv_bytes * f
        chunk_tokens = None if chunk_tokens is None else chunk_tokens * f
    if model.layer_kinds:
        return kinds_attention_s(model, hw, batch, attended_tokens, kv_bytes, kv_bytes_per_token_layer, chunk_tokens)
    return gqa_attention_s(model, hw, batch, attended_tokens, kv_bytes, kv_bytes_per_token_layer,
                           attention_flop(model, attended_tokens))


def busiest_rank_factor(batch, ranks: int):
    """Attention data parallelism spreads B sequences over D ranks, and the step waits for the rank with
    the most: ceil(B / D) sequences against the mean B / D (1 when D divides B; 2 for 4 sequences over 8
    ranks). The engines' per-GPU figures are the mean rank's, so attention scales by this (each rank's
    sequences taken as the batch's mean length)."""
    b = np.maximum(np.asarray(batch, dtype=float), 1.0)
    out = np.ceil(b / ranks) * ranks / b
    return out if np.ndim(out) else float(out)


def gqa_attention_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, kv_bytes, kv_bytes_per_token_layer: float,
                    flop, kernel: DecodeKernel | None = None):
    """One GQA layer's decode attention (`decode_attention_s` of a dense model; a full or window layer
    of a model with kinds), its FLOP given: the measured table where the run has one, else `attention_s`
    (`kernel`: another datasheet kernel's figures, `gqa_datasheet_attention_s`'s). An attention-data-parallel
    shard is one rank's call over its 1/D of the batch (same bytes and FLOP)."""
    if model.attention_dp > 1:
        dp = model.attention_dp
        return gqa_attention_s(_one_rank(model), hw, batch / dp, attended_tokens / dp, kv_bytes,
                               kv_bytes_per_token_layer * dp, flop, kernel)
    if hw.kernels is not None and _plain(batch) and _plain(attended_tokens) and _plain(kv_bytes) and batch > 0 \
            and attended_tokens > 0:  # a serving step's one call: the scalar path below, without the array tests
        return _measured_gqa_one_s(model, hw, batch, attended_tokens, kv_bytes, kv_bytes_per_token_layer)
    if hw.kernels is None or np.all(np.asarray(batch) <= 0) or np.all(np.asarray(attended_tokens) <= 0):
        # (no tokens attended: the fast level's per-batch costs, whose attention it computes apart)
        return gqa_datasheet_attention_s(hw, batch, model.num_kv_heads, flop, kv_bytes,
                                         _measured_kv_dtype(model, kv_bytes_per_token_layer) == "fp8",
                                         heads_per_kv=model.num_heads / model.num_kv_heads,
                                         tokens_per_seq=_tokens_per_seq(batch, attended_tokens), kernel=kernel)
    if not (np.ndim(batch) or np.ndim(attended_tokens) or np.ndim(kv_bytes)):  # one step: scalars, same bits
        return _measured_gqa_one_s(model, hw, batch, attended_tokens, kv_bytes, kv_bytes_per_token_layer)
    kv_dtype = _measured_kv_dtype(model, kv_bytes_per_token_layer)
    b = np.maximum(np.asarray(batch, dtype=float), 1.0)
    per_seq = np.maximum(np.asarray(attended_tokens, dtype=float) / b, 1.0)
    t = hw.kernels.decode_attention_s(b, per_seq, model.num_heads, model.num_kv_heads, model.head_dim, kv_dtype).seconds
    extra = np.maximum(np.asarray(kv_bytes, dtype=float) - (np.asarray(attended_tokens) + b) * kv_bytes_per_token_layer, 0.0)
    out = t + extra / hw.attention_hbm_bytes_per_s
    return out if np.ndim(kv_bytes) else float(out[0])


def _plain(x) -> bool:
    return type(x) is int or type(x) is float


def _measured_kv_dtype(model: ModelSpec, kv_bytes_per_token_layer: float) -> str:
    element = kv_bytes_per_token_layer / (2 * model.num_kv_heads * model.head_dim)
    return "fp8" if element < 1.5 else "bf16"  # int8 KV stands in as fp8: one byte + scales


def _measured_gqa_one_s(model: ModelSpec, hw: Hardware, batch, attended_tokens, kv_bytes,
                        kv_bytes_per_token_layer: float) -> float:
    """`gqa_attention_s` of one step (scalars) from the measured table: the call at the batch's mean
    context, plus the bytes its kernel does not move at the datasheet attention rate."""
    b1 = max(float(batch), 1.0)
    t1 = hw.kernels.decode_attention_one_s(b1, max(float(attended_tokens) / b1, 1.0), model.num_heads,
                                           model.num_kv_heads, model.head_dim,
                                           _measured_kv_dtype(model, kv_bytes_per_token_layer))
    extra1 = max(float(kv_bytes) - (float(attended_tokens) + b1) * kv_bytes_per_token_layer, 0.0)
    return float(t1 + extra1 / hw.attention_hbm_bytes_per_s)


def _tokens_per_seq(batch, attended_tokens):
    """Cached tokens a sequence attends: attended / batch (0 where the batch is empty); scalars or arrays."""
    if not (np.ndim(batch) or np.ndim(attended_tokens)):
        return attended_tokens / batch if batch > 0 else 0.0
    b = np.asarray(batch, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, np.asarray(attended_tokens, dtype=float) / b, 0.0)


@lru_cache(maxsize=64)
def _one_rank(model: ModelSpec) -> ModelSpec:
    """An attention-data-parallel shard seen as its own attention rank (per-token figures undivided)."""
    return replace(model, attention_dp=1)


def layer_comm_s(model: ModelSpec, hw: Hardware, rows: float) -> float:
    """The collectives of one (mean) layer over `rows` tokens of the group's batch.
    Tensor parallelism, with or without expert parallelism: 2 all-reduces of rows x h x 2 B (after
    attention, after the MLP; with experts split whole the combine is that all-reduce, as vLLM does
    without data parallelism). Attention data parallelism (D ranks, attention tensor-parallel over
    tp / D GPUs): each rank all-reduces its rows / D after attention within its attention group; an
    MoE layer then exchanges them with the experts' GPUs (`moe_exchange_s`), a dense-MLP layer
    all-reduces the group's rows over all tp GPUs (the all-gather + reduce-scatter around it), or with
    `dense_dp` its rank's rows within the attention group as attention does; the mean over the L layers."""
    h = model.hidden_size
    if model.attention_dp <= 1:
        return ALLREDUCES_PER_LAYER * hw.allreduce_s(rows * h * ACTIVATION_BYTES)
    dp = model.attention_dp
    attention = hw.allreduce_s(rows / dp * h * ACTIVATION_BYTES, gpus=hw.tp // dp)
    dense = attention if model.dense_dp else hw.allreduce_s(rows * h * ACTIVATION_BYTES)
    return attention + (model.moe_layers * moe_exchange_s(model, hw, rows) + model.dense_mlp_layers * dense) / model.num_layers


def moe_exchange_s(model: ModelSpec, hw: Hardware, rows: float) -> float:
    """One MoE layer's dispatch and combine of the group's `rows` tokens (`hw.moe_exchange`, the engine's):
      allgather_reducescatter (the engines' default): all_gather of rows x the dispatch's bytes a token
          (hidden x wire bytes + top-k x routing bytes) + reduce_scatter of rows x h x 2 B, each over the
          whole group (`Hardware.gather_s`: every GPU receives the tokens it does not hold);
      alltoall: each token to the ranks of its experts only, and back: DeepEP's measured dispatch +
          combine of rows / D tokens a rank (`measured_a2a_s`) where the tables time it, else for each
          phase `Hardware.alltoall_s` of rows / D x remote ranks per token x h x the wire's bytes, on the
          kernel the exchange picks (`MoeExchange.a2a_kernel`)."""
    h, x = model.hidden_size, hw.moe_exchange
    if x.method == ALLGATHER_REDUCESCATTER:
        return (hw.gather_s("all_gather", rows * x.dispatch_bytes_per_token(h, model.experts_per_token))
                + hw.gather_s("reduce_scatter", rows * h * ACTIVATION_BYTES))
    local = rows / model.attention_dp
    if hw.kernels is not None and hw.kernels.a2a_slices() and local > 0:
        return measured_a2a_s(model, hw, local)
    remote = expected_remote_ranks(model.num_experts, model.experts_per_token, model.expert_parallel)
    total = 0.0
    for phase in A2A_PHASES:
        kernel, wire = x.a2a_kernel(local, phase)
        total += hw.alltoall_s(local * remote * h * A2A_WIRE_BYTES[wire], kernel, phase)
    return total


def decode_layer_cost(
    model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, batch: int,
    attended_tokens: int, kv_bytes_per_token_layer: float,
    t2_staged_tokens: int = 0, t2_bytes_per_token_layer: float = 0.0, chunk_tokens: int | None = None,
) -> LayerCost:
    """One layer of one decode step for a batch.

    gemm_s = `weight_kernel_s` (weights streamed vs dequantised + multiplied)
    attention_s = `attention_s` of 4 * sum_b n_b * H * d FLOP and
                  attended KV bytes + T2 dequant read+write + new K/V write
    `attended_tokens` = sum over the batch of T0 + staged T1/T2 tokens. The GEMMs and collectives run
    over the rows the engine computes (`engine_rules.decode_rows`: TensorRT-LLM pads a batch up to its
    next CUDA graph), the attention over the batch's own sequences (a padding request is one short one).
    """
    rows = decode_rows(hw.launch, batch)
    gemm_s = weight_kernel_s(model, hw, weight_dtype, group_size, rows, absorbed=True)
    attn_s = decode_layer_attention_s(model, hw, batch, attended_tokens, kv_bytes_per_token_layer, t2_staged_tokens,
                                      t2_bytes_per_token_layer, chunk_tokens)
    allreduce_s = layer_comm_s(model, hw, rows)
    return LayerCost(gemm_s, attn_s, layer_overhead_s(model, hw, rows), allreduce_s=allreduce_s,
                     qkv_share=qkv_share(model), host_s=host_times(hw, batch, DECODE)[0])


def layer_overhead_s(model: ModelSpec, hw: Hardware, rows: float) -> float:
    """What a layer costs beside its GEMMs, attention and collectives over `rows` rows: its elementwise
    passes by bytes as the engine runs them (`device.elementwise`; under attention data parallelism the
    busiest rank's rows), or the flat `hw.layer_overhead_s` a scenario or profile gives."""
    if hw.elementwise is None:
        return hw.layer_overhead_s
    rows = math.ceil(rows / model.attention_dp) if model.attention_dp > 1 else rows
    return layer_passes_s(hw.elementwise, rows, elementwise_widths(model), hw.gpu.hbm_bytes_per_s)


@lru_cache(maxsize=64)
def elementwise_widths(model: ModelSpec) -> dict[str, tuple[tuple[float, float], ...]]:
    """One GPU's widths of a layer's elementwise passes (`elementwise.layer_passes_s`), with the share
    of the layers that run each: RMSNorm and the add over the hidden size; rope over the rotated query
    and key heads (MLA: qk_rope_head_dim of each query head and the latent's key), in every layer but the
    linear ones; SiLU-and-mul over a dense MLP's intermediate, and in a mixture of experts' MoE layers
    over the shared experts' (the routed experts' activation is inside their fused kernel's cost); the
    attention's own norms: MLA's over q_lora_rank and kv_lora_rank, Qwen3's q / k norms a head_dim row per
    head."""
    n = model.num_layers
    if model.mla:
        rope = (model.num_heads + 1) * model.mla.qk_rope_head_dim
    else:
        rope = (model.num_heads + model.num_kv_heads) * model.head_dim
    mlp = ((model.intermediate_size, 1.0),)
    if model.is_moe:
        dense = min(model.dense_mlp_layers, n)
        mlp = ((model.intermediate_size, dense / n), (model.shared_expert_intermediate_size, (n - dense) / n))
    attention = 1.0 - model.kind_counts.get(LINEAR, 0) / n  # the layers with softmax attention
    head_norms = ()
    if model.mla:  # q_a_layernorm over the q LoRA (where there is one), kv_a_layernorm over the latent's kv_lora_rank
        head_norms = tuple((w, attention) for w in (model.mla.q_lora_rank, model.mla.kv_lora_rank) if w)
    elif model.qk_norm:  # q_norm and k_norm: a row of head_dim per query head, per KV head
        head_norms = ((model.head_dim, attention, model.num_heads), (model.head_dim, attention, model.num_kv_heads))
    return {RMSNORM: ((model.hidden_size, 1.0),), ADD: ((model.hidden_size, 1.0),), ROPE: ((rope, attention),),
            SILU_MUL: mlp, HEAD_NORMS: head_norms}


def decode_layer_attention_s(model: ModelSpec, hw: Hardware, batch: int, attended_tokens: int,
                             kv_bytes_per_token_layer: float, t2_staged_tokens: int = 0,
                             t2_bytes_per_token_layer: float = 0.0, chunk_tokens: int | None = None) -> float:
    """`decode_layer_cost`'s attention: `decode_attention_s` reading the attended KV, the staged T2's
    dequantisation read + write and writing the new K/V (`chunk_tokens`: the chunked layers' own count)."""
    dequant_bytes = t2_staged_tokens * (t2_bytes_per_token_layer + kv_bytes_per_token_layer)
    kv_bytes = (attended_tokens + batch) * kv_bytes_per_token_layer + dequant_bytes
    return decode_attention_s(model, hw, batch, attended_tokens, kv_bytes, kv_bytes_per_token_layer, chunk_tokens)


def with_decode_attention(cost: StepCost, attention_s: float) -> StepCost:
    """A decode step's cost with its layers' attention replaced: every other part of a decode step
    whose decodes attend T0 only depends on the batch alone, so a run that costs many steps of one
    batch (`sim.serving.engine`) computes those parts once and the attention per step - the same floats."""
    return fields_replaced(cost, layer=fields_replaced(cost.layer, attention_s=attention_s))


def fields_replaced(cost, **changes):
    """`dataclasses.replace` of a LayerCost or StepCost, without running its generated __init__ again
    (they have no __post_init__, so the result is the same): every field copied, `changes` set. A
    serving run replaces tens of thousands of times, and replace took a sixth of a decode step's cost."""
    out = object.__new__(type(cost))
    out.__dict__.update(cost.__dict__)
    out.__dict__.update(changes)
    return out


@lru_cache(maxsize=64)
def qkv_share(model: ModelSpec) -> float:
    """Share of a layer's linear work in the q/k/v projection: h * (q_dim + 2 kv_dim) / linear params
    (layer kinds: `ModelSpec.qkv_params_layer`, the mean layer's)."""
    return model.qkv_params_layer() / _active_linear_params(model)


def lm_head_s(model: ModelSpec, hw: Hardware, batch: int) -> float:
    """LM head per step: GEMM floor + max(2 * V * h * B / gemm FLOP/s, V * h * 2 B / weight bandwidth) -
    in bf16, at the bf16 GEMM's figures where the layers run fp8 W8A8 (`Hardware.lm_head_gemm`). A
    data-parallel LM head (`ModelSpec.dense_dp`) runs on the busiest rank's ceil(B / D) rows."""
    if model.dense_dp:
        batch = math.ceil(batch / model.attention_dp)
    if hw.kernels is not None:
        return _measured_gemms_s(hw.kernels, ((model.vocab_size, model.hidden_size),), "bf16", int(batch))
    flop = FLOP_PER_MAC * model.vocab_size * model.hidden_size * batch
    head = hw.lm_head_gemm
    if head is not None:
        return head.floor_s + roofline_s(flop, model.lm_head_bytes(), head.flop_per_s(batch), head.bytes_per_s)
    return hw.gemm_floor_s + roofline_s(flop, model.lm_head_bytes(), hw.gemm_flop_per_s(batch), hw.weight_hbm_bytes_per_s)


def step_tail_s(model: ModelSpec, hw: Hardware, batch: int, step_kind: str = DECODE) -> float:
    """What a step costs beside its layers: max(LM head + step overhead on the device, the host's
    time for the rest of the step) - the same composition as a layer's; the host's time as the
    scenario engine launches such a step (`engine_rules.host_times`: 0 for a CUDA-graph replay); a decode
    step's LM head over the rows the engine computes (`engine_rules.decode_rows`)."""
    rows = decode_rows(hw.launch, batch) if step_kind == DECODE else batch
    return max(lm_head_s(model, hw, rows) + hw.step_overhead_s, host_times(hw, batch, step_kind)[1])


def prefill_s(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, batch: int, prompt_tokens: int,
              kv_bytes_per_token_layer: float | None = None) -> float:
    """Prefill of B prompts of P tokens: GEMMs over B*P rows plus causal attention
    (`prompts_attention_s`)."""
    if prompt_tokens <= 0:
        return 0.0
    rows = batch * prompt_tokens
    per_layer = (
        weight_kernel_s(model, hw, weight_dtype, group_size, rows)
        + layer_comm_s(model, hw, rows)
        + prompts_attention_s(model, hw, batch, prompt_tokens, kv_bytes_per_token_layer)
        + layer_overhead_s(model, hw, rows)
    )
    return model.num_layers * per_layer + lm_head_s(model, hw, batch)


def prompts_attention_s(model: ModelSpec, hw: Hardware, batch: int, prompt_tokens: int,
                        kv_bytes_per_token_layer: float | None = None) -> float:
    """One layer's causal attention over B whole prompts of P tokens (sum over positions of
    4 * i * H * d = 2 * P^2 * H * d per sequence) at the attention FLOP rate - or, given the KV bytes
    per token per layer, from a measured context-attention table where the run has one
    (`measured_prefill_attention_s`). Attention data parallelism: the busiest rank's ceil(B / D)
    prompts as its own attention rank (`_busiest_rank_prefill_s`'s rule)."""
    if model.attention_dp > 1:
        dp = model.attention_dp
        return prompts_attention_s(_one_rank(model), hw, math.ceil(batch / dp), prompt_tokens,
                                   None if kv_bytes_per_token_layer is None else kv_bytes_per_token_layer * dp)
    rows, pairs = batch * prompt_tokens, batch * prompt_tokens * (prompt_tokens + 1) / 2
    if kv_bytes_per_token_layer is not None:
        measured = measured_prefill_attention_s(model, hw, pairs, batch, kv_bytes_per_token_layer)
        if measured is not None:
            return measured
    window = None if kv_bytes_per_token_layer is None else _window_prefill_s(
        model, hw, pairs, prompt_tokens, batch, rows, kv_bytes_per_token_layer)
    if model.layer_kinds:
        causal_flop = kinds_prefill_flop(model, batch, prompt_tokens, windows=window is None)
    else:
        causal_flop = batch * ATTN_MATMULS * FLOP_PER_MAC * model.num_heads * model.head_dim * prompt_tokens * (prompt_tokens + 1) / 2
    kv_bytes = rows * (kv_bytes_per_token_layer or 0.0)
    fp8 = kv_bytes_per_token_layer is not None and _fp8_kv(model, kv_bytes_per_token_layer)

    def call(scale: float) -> float:  # the mean layer's call (but window layers with a fit of their own), x scale
        return datasheet_prefill_attention_s(hw, causal_flop * scale, kv_bytes * scale, prompt_tokens, batch, rows,
                                             model.num_heads, model.num_kv_heads, fp8, model.head_dim,
                                             model.mla is not None)
    return call(1.0) if window is None else with_window_layers(model, call, window)


def kinds_prefill_flop(model: ModelSpec, batch: int, prompt_tokens: int, windows: bool = True) -> float:
    """Causal attention FLOP of B prompts of P tokens in the mean layer of a model with kinds: tiered
    layers sum_{i<=P} i tokens attended (P (P + 1) / 2), window layers (`windows`: unless their own fit
    costs them) sum_{i<=P} min(i, W), chunked layers causal within each chunk (`chunk_pairs`), linear
    layers P state updates; each at its kind's prefill FLOP (`kind_prefill_flop_per_pair`: MLA
    unabsorbed), summed over the layers / L."""
    P, W = prompt_tokens, model.sliding_window
    flop = 0.0
    for kind, n in model.kind_counts.items():
        if kind == WINDOW and not windows:
            continue
        if kind == LINEAR:
            flop += n * P * linear_state_flop(model)
            continue
        if kind == SPARSE:  # each position attends min(i, k) tokens; the indexer scores all i of them
            k = model.sparse.index_topk
            pairs = min(P, k) * (min(P, k) + 1) / 2 + max(P - k, 0) * k
            flop += n * model.sparse.flop_per_token / model.attention_dp * P * (P + 1) / 2
        elif kind == CHUNKED:
            pairs = chunk_pairs(P, model.attention_chunk)
        else:
            pairs = P * (P + 1) / 2 if kind != WINDOW else (min(P, W) * (min(P, W) + 1) / 2 + max(P - W, 0) * W)
        flop += n * kind_prefill_flop_per_pair(model, kind) * pairs
    return batch * flop / model.num_layers


KV_SPLIT_COPIES = 2  # the paper's prototype copies K and V as separate tensors
T2_BLOCKS = 2  # a compressed block travels as int8 payload + its scales


def host_pack_s(hw: Hardware, t1_bytes: float) -> float:
    """The prototype packs every layer's strided K and V halves of its T1 tokens into contiguous
    blocks on the host before copying them: t1_bytes / host packing rate (T2 blocks are contiguous)."""
    return t1_bytes / hw.host_pack_bytes_per_s


def prefetch_copies_per_layer(prefetch: str, has_t1: bool, has_t2: bool) -> int:
    """Copies one layer's prefetch takes. The batch's T1 (or T2) tokens of one layer are one
    contiguous token-major host block (hwprobe's layout), so one copy for T1 and two for T2
    (payload and scales); `sync_per_step` (the prototype) copies K and V separately."""
    per_tier = KV_SPLIT_COPIES if prefetch == "sync_per_step" else 1
    return per_tier * int(has_t1) + T2_BLOCKS * int(has_t2)


def retier_copies(prefetch: str, num_layers: int, has_t1: bool, has_t2: bool) -> int:
    """Copies one re-tier's moves in one direction take: the moved tokens of all layers are
    gathered into one block per destination tier; the prototype copies per layer, K and V apart."""
    if prefetch == "sync_per_step":
        return num_layers * prefetch_copies_per_layer(prefetch, has_t1, has_t2)
    return int(has_t1) + T2_BLOCKS * int(has_t2)


def layerwise_pipeline(pre_s: list[float], rest_s: list[float], copy_s: list[float], buffers: int) -> tuple[list, list]:
    """Closed form of the layerwise prefetch pipeline for one step, all copies issued at t=0.

    Layer l runs `pre_s` (norm + QKV projection), then its attention waits for copy l, then
    `rest_s` (attention, output projection, MLP). Copy l starts when copy l-1 is done and a staging
    buffer is free; a buffer frees when its layer's attention takes the tokens (they move into the
    attention workspace). A layer without staged tokens (copy_s = 0) needs no buffer.
    Returns ([(copy start, end) or None per layer], [(layer start, end) per layer]).
    The three lists have one entry per layer. (Every step of a serving run calls this: the maxima are
    comparisons rather than `max` calls, the same floats in about half the time.)
    """
    copies: list = []
    layers: list = []
    held: list[float] = []  # when each layer holding a buffer took its staged tokens, in order
    link_free = end = 0.0
    for pre, rest, copy in zip(pre_s, rest_s, copy_s):
        begin, taken = end, end + pre  # taken: max(begin + pre, the copy's end)
        if copy > 0:
            start = link_free
            if len(held) >= buffers and held[-buffers] > start:  # wait for a staging buffer
                start = held[-buffers]
            link_free = start + copy
            copies.append((start, link_free))
            if link_free > taken:
                taken = link_free
            held.append(taken)
        else:
            copies.append(None)
            if 0.0 > taken:
                taken = 0.0
        end = taken + rest
        layers.append((begin, end))
    return copies, layers


def uniform_pipeline_finish_s(pre_s: float, rest_s: float, copy_s: float, layers: int, buffers: int) -> float:
    """When the last layer of `layerwise_pipeline` ends, every one of `layers` layers alike: the same
    operations in the same order, without the per-layer lists (the screen and the closed form of every
    tiered step ask only for the end)."""
    held: deque[float] = deque(maxlen=max(buffers, 1))  # the last `buffers` layers' take times
    link_free = end = 0.0
    for _ in range(layers):
        taken = end + pre_s
        if copy_s > 0:
            start = link_free
            if len(held) >= buffers and held[0] > start:  # (held[0] is held[-buffers] of the full list)
                start = held[0]
            link_free = start + copy_s
            if link_free > taken:
                taken = link_free
            held.append(taken)
        elif 0.0 > taken:
            taken = 0.0
        end = taken + rest_s
    return end


def on_demand_pipeline(pre_s: float, rest_s: float, copy_s: float, layers: int) -> tuple[list, list]:
    """sparse_fetch's step: layer l runs its pre-attention (norm, projections, the indexer), then
    fetches the rows its indexer chose (`copy_s`), then the rest; the next layer needs its output.
    Returns ([(copy start, end) per layer], [(layer start, end) per layer]) as `layerwise_pipeline`."""
    copies, spans, t = [], [], 0.0
    for _ in range(layers):
        copies.append((t + pre_s, t + pre_s + copy_s) if copy_s > 0 else None)
        spans.append((t, t + pre_s + copy_s + rest_s))
        t += pre_s + copy_s + rest_s
    return copies, spans


def layerwise_pipeline_s(pre_s: list[float], rest_s: list[float], copy_s: list[float], buffers: int) -> tuple[float, float]:
    """(finish time, stall = finish - sum of compute) of `layerwise_pipeline`."""
    _, layers = layerwise_pipeline(pre_s, rest_s, copy_s, buffers)
    finish = layers[-1][1] if layers else 0.0
    return finish, finish - sum(pre_s) - sum(rest_s)


QUERY_BYTES_PER_ELEMENT = 2  # the bf16 query of each head goes to the host
PARTIAL_BYTES_PER_ELEMENT = 4  # fp32 partial output (d per head) and its log-sum-exp come back
SPLIT_STEPS = 16  # `split` tries fractions 0, 1/16, ..., 1 of the host-resident tokens prefetched


@dataclass(frozen=True)
class HostPath:
    """One layer's exact attention over host-resident K/V, on the host: the queries go device->host,
    the host attends its tokens, partial outputs + log-sum-exp come back and the GPU merges them
    with its own by their LSEs (the same exact merge as staged tokens). The host's time is its
    thread pool's dispatch, then a stream of `kv_bytes` from host DRAM that takes `stream_s` with the
    DRAM to itself and longer while DMA shares it (`host_pipeline`)."""

    query_bytes: float  # B * H * d * 2
    partial_bytes: float  # B * H * (d + 1) * 4
    stream_s: float  # `HostCpu.stream_s` over the tokens attended on the host
    dispatch_s: float  # the thread pool's fixed cost (no DRAM traffic)
    kv_bytes: float  # what the stream reads
    tokens: float  # host-resident tokens attended there, over the batch

    @property
    def host_s(self) -> float:
        """`HostCpu.attention_s`: the stream with the DRAM to itself + dispatch."""
        return self.stream_s + self.dispatch_s if self.kv_bytes > 0 else 0.0

    def time_s(self, hw: Hardware) -> float:
        """Query copy + host attention + partial-output copy, each at its own latency, nothing contending."""
        return hw.d2h.transfer_time_s(self.query_bytes, 1) + self.host_s + hw.h2d.transfer_time_s(self.partial_bytes, 1)


def host_path(model: ModelSpec, hw: Hardware, batch: int, t1: float, t2: float, kv_bytes_per_token_layer: float,
              t2_bytes_per_token_layer: float) -> HostPath:
    """Host attention over t1 full and t2 compressed tokens of one layer: reads their bytes where
    they live; 4 * n * H * d FLOP as on the GPU (T2 dequantised on the fly, its reads are compressed)."""
    kv_bytes = t1 * kv_bytes_per_token_layer + t2 * t2_bytes_per_token_layer
    flop = attention_flop(model, t1 + t2)
    cpu = hw.host_cpu
    rows = batch / model.attention_dp if model.attention_dp > 1 else batch  # a data-parallel rank's queries
    return HostPath(query_bytes=rows * model.num_heads * model.head_dim * QUERY_BYTES_PER_ELEMENT,
                    partial_bytes=rows * model.num_heads * (model.head_dim + 1) * PARTIAL_BYTES_PER_ELEMENT,
                    stream_s=cpu.stream_s(kv_bytes, flop) if kv_bytes > 0 else 0.0,
                    dispatch_s=cpu.dispatch_s if kv_bytes > 0 else 0.0, kv_bytes=kv_bytes, tokens=t1 + t2)


@dataclass(frozen=True)
class StepCost:
    """One decode step of a batch, composed once for every engine (SimPy layer level, closed-form
    step level, fast projection): `num_layers` identical layers, then the tail (LM head, sampling).
    Staged T1/T2 tokens cross the link once per layer (`prefetch_*`, zero when none are staged)."""

    layer: LayerCost
    num_layers: int
    tail_s: float
    prefetch_bytes_per_layer: float
    prefetch_copies_per_layer: int
    pack_s_per_layer: float = 0.0  # host work each prototype copy waits for (sync_per_step)
    host: HostPath | None = None  # the part of T1/T2 attended on the host (access host_attention / split)
    host_fraction: float = 0.0  # share of the host-resident tokens attended there (1: host_attention)
    on_demand: bool = False  # sparse_fetch: a layer's copy starts once its pre-attention (the indexer) is done

    @property
    def compute_s(self) -> float:
        """Device time with no stall: L * layer + tail."""
        return self.num_layers * self.layer.total_s + self.tail_s

    def host_layer(self, hw: Hardware, copy_s: float) -> HostLayer:
        """One layer of this step as `host_pipeline` takes it, each prefetch copy taking `copy_s`.
        The queries take the bidirectional share while a prefetch copy is in flight (two copy engines
        or more; with one they queue instead)."""
        h, layer = self.host, self.layer
        query_s = hw.d2h.transfer_time_s(h.query_bytes, 1)
        shared_s = hw.d2h.transfer_time_s(h.query_bytes, 1, True) if hw.copy_engines >= 2 else query_s
        return HostLayer(pre_s=layer.pre_attention_s, attention_s=layer.attention_s,
                         after_s=layer.post_attention_s - layer.attention_s, copy_s=copy_s,
                         copy_bytes=self.prefetch_bytes_per_layer, query_s=query_s, query_shared_s=shared_s,
                         dispatch_s=h.dispatch_s, stream_s=h.stream_s, stream_bytes=h.kv_bytes,
                         partials_s=hw.h2d.transfer_time_s(h.partial_bytes, 1))

    def host_times(self, hw: Hardware, copy_s: float, buffers: int) -> HostStepTimes:
        """`host_pipeline` of this step's layers: the host DRAM shared by the host attention stream
        and the step's own prefetch copies; the partial outputs queue behind the prefetches where they
        share the H2D copy engine (fewer than three engines)."""
        return host_pipeline(self.host_layer(hw, copy_s), self.num_layers, buffers, hw.host_cpu.shared_bytes_per_s,
                             hw.copy_engines < 3)

    def closed_form_s(self, hw: Hardware, copy_s: float, buffers: int) -> float:
        """The step with the link to itself: the layerwise pipeline (prefetched part), each layer's
        attention waiting for its host path (`host_times`), then the tail."""
        if self.host is not None:
            return self.host_times(hw, copy_s, buffers).finish_s + self.tail_s
        if copy_s <= 0:
            return self.compute_s
        if self.on_demand:  # every layer waits for its own fetch: nothing overlaps it
            return self.compute_s + self.num_layers * copy_s
        layer = self.layer
        return uniform_pipeline_finish_s(layer.pre_attention_s, layer.post_attention_s, copy_s, self.num_layers,
                                         buffers) + self.tail_s

    @property
    def stages(self) -> bool:
        return self.prefetch_bytes_per_layer > 0

    def prefetch_copy_s(self, link, both_directions_busy: bool = False) -> float:
        """One layer's prefetch on `link` (a LinkModel): copies + bytes / bandwidth, plus the host
        packing the prototype's copies wait for."""
        return link.transfer_time_s(self.prefetch_bytes_per_layer, self.prefetch_copies_per_layer,
                                    both_directions_busy) + self.pack_s_per_layer

    def layerwise_pipeline(self, copy_s: float, buffers: int) -> tuple[list, list]:
        """`layerwise_pipeline` of this step's layers with every layer's copy taking `copy_s` (on demand:
        `on_demand_pipeline`)."""
        L = self.num_layers
        if self.on_demand:
            return on_demand_pipeline(self.layer.pre_attention_s, self.layer.post_attention_s, copy_s, L)
        return layerwise_pipeline([self.layer.pre_attention_s] * L, [self.layer.post_attention_s] * L, [copy_s] * L,
                                  buffers)


def decode_step_cost(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, prefetch: str,
                     batch: int, t0: int, t1: int, t2: int, kv_bytes_per_token_layer: float,
                     t2_bytes_per_token_layer: float, staged: bool = True, access: str = "prefetch",
                     buffers: int = 2, host_fraction: float | None = None, fetch: SparseFetch | None = None,
                     chunk_tokens: int | None = None, staged_tokens: tuple | None = None) -> StepCost:
    """One decode step for tier counts summed over the batch: each layer attends T0 + T1 + T2
    (`decode_layer_cost`), the tail is `step_tail_s`, and - when `staged` (a tiered policy that
    stages its host tiers every step) - each layer's T1/T2 crosses the link:
    bytes = T1 * KV bytes/token/layer + T2 * compressed bytes/token/layer,
    copies = `prefetch_copies_per_layer`; the prototype (sync_per_step) packs its T1 on the host first.
    Host access: `split` tries fractions 1, 15/16, ..., 0 of the host-resident tokens on the host and
    keeps the first fastest by `StepCost.closed_form_s`; `host_fraction` gives the fraction instead
    (one already chosen, e.g. by the fast level's arrays). `sparse_fetch`: `_sparse_fetch_cost`. `chunk_tokens`:
    the tokens the batch's chunked layers attend, counted per sequence (`decode_layer_cost`; host access less
    what the host attends, `gpu_chunk_tokens`; the sparse-fetch path takes their bound). `staged_tokens`: the (T1, T2) the mean layer stages where chunked
    layers stage only their current chunk's (`RunContext.staged_tokens`; None: t1, t2) - the bytes crossing the
    link, the T2 dequantised, the prototype's packing and the host's reads count them."""
    if staged and access == "sparse_fetch" and t1 + t2 > 0:
        return _sparse_fetch_cost(model, hw, weight_dtype, group_size, batch, t0, t1, t2, kv_bytes_per_token_layer,
                                  t2_bytes_per_token_layer, fetch or SparseFetch())
    if staged and access not in ("prefetch", "sparse_fetch") and t1 + t2 > 0:
        args = (model, hw, weight_dtype, group_size, prefetch, batch, t0, t1, t2, kv_bytes_per_token_layer,
                t2_bytes_per_token_layer)
        more = {"staged_tokens": staged_tokens, "chunk_tokens": chunk_tokens}
        if access == "host_attention" or host_fraction is not None:
            return _host_split_cost(*args, fraction_on_host=1.0 if host_fraction is None else host_fraction, **more)
        options = [_host_split_cost(*args, fraction_on_host=1.0 - i / SPLIT_STEPS, **more)
                   for i in range(SPLIT_STEPS + 1)]
        return min(options, key=lambda c: c.closed_form_s(hw, c.prefetch_copy_s(hw.h2d), buffers))
    s1, s2 = (t1, t2) if staged_tokens is None else staged_tokens
    layer = decode_layer_cost(model, hw, weight_dtype, group_size, batch, t0 + t1 + t2, kv_bytes_per_token_layer,
                              s2, t2_bytes_per_token_layer, chunk_tokens)
    tail_s = step_tail_s(model, hw, batch)
    nbytes = float(s1 * kv_bytes_per_token_layer + s2 * t2_bytes_per_token_layer) if staged else 0.0
    copies = prefetch_copies_per_layer(prefetch, s1 > 0, s2 > 0) if staged else 0
    pack_s = host_pack_s(hw, s1 * kv_bytes_per_token_layer) if staged and prefetch == "sync_per_step" else 0.0
    return StepCost(layer, model.num_layers, tail_s, nbytes, copies, pack_s)


def _sparse_fetch_cost(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, batch: int, t0: int,
                       t1: int, t2: int, kv_bytes_per_token_layer: float, t2_bytes_per_token_layer: float,
                       fetch: SparseFetch) -> StepCost:
    """A sparse_fetch step (sim/device/sparse_fetch.py): every layer attends the indexer's top-k of
    T0 + T1 + T2 (`sparse_attention_work`), the T2 rows it fetched dequantised; the T1/T2 picks cross
    the link on demand (`fetch_layer`, the mean layer's share of it)."""
    nbytes, copies, t2_rows = fetch_layer(model, fetch, batch, t0, t1, t2, kv_bytes_per_token_layer,
                                          t2_bytes_per_token_layer)
    share = mean_layer_share(model)
    layer = decode_layer_cost(model, hw, weight_dtype, group_size, batch, t0 + t1 + t2, kv_bytes_per_token_layer,
                              t2_rows, t2_bytes_per_token_layer)
    return StepCost(layer, model.num_layers, step_tail_s(model, hw, batch), nbytes * share,
                    math.ceil(copies * share), on_demand=True)


def prefill_attention_s(model: ModelSpec, hw: Hardware, position_sum: float, kv_tokens: float,
                        kv_bytes_per_token_layer: float, seqs: int = 0, new_tokens: float = 0.0) -> float:
    """Causal attention of one layer over a step's prefill chunks (one variable-length kernel): a
    chunk token at position i (1-based) attends i tokens, so
    FLOP = 4 * H * d * sum over chunk tokens of i  (a whole prompt of P: 2 * P (P + 1) * H * d, as `prefill_s`),
    bytes = (prefix + chunk tokens) x KV bytes/token/layer (the prefix read, the chunk written),
    time = `datasheet_prefill_attention_s` at the chunks' equivalent prompt length
    (`equivalent_prompt_tokens`) over `new_tokens` chunk tokens (0: seqs x that length): compute-bound for
    all but short chunks behind a long prefix. With layer kinds: the tiered layers as above
    (`attention_flop`, the mean layer's), window layers at most min(position sum, kv tokens x W) tokens
    attended and linear layers at most kv tokens state updates - upper bounds, the chunk's own token
    count not being known here. Measured tables with a context-attention table (a dense GQA model or one
    of GQA layer kinds, `seqs` chunks): `measured_prefill_attention_s`. Attention data parallelism: the
    busiest rank's call (`_busiest_rank_prefill_s`)."""
    if position_sum <= 0:
        return 0.0
    if model.attention_dp > 1 and seqs > 0:
        return _busiest_rank_prefill_s(model, hw, position_sum, kv_tokens, kv_bytes_per_token_layer, seqs, new_tokens)
    measured = measured_prefill_attention_s(model, hw, position_sum, seqs, kv_bytes_per_token_layer, new_tokens)
    if measured is not None:
        return measured
    flop = prefill_attention_flop(model, position_sum)
    n = equivalent_prompt_tokens(position_sum, seqs)
    new_tokens = new_tokens or seqs * n
    window = _window_prefill_s(model, hw, position_sum, n, seqs, new_tokens, kv_bytes_per_token_layer)
    if model.layer_kinds:
        flop += _bounded_prefill_flop(model, position_sum, kv_tokens, seqs, windows=window is None,
                                      new_tokens=new_tokens)

    def call(scale: float) -> float:  # the mean layer's call (but window layers with a fit of their own), x scale
        return datasheet_prefill_attention_s(hw, flop * scale, kv_tokens * kv_bytes_per_token_layer * scale, n, seqs,
                                             new_tokens, model.num_heads, model.num_kv_heads,
                                             _fp8_kv(model, kv_bytes_per_token_layer), model.head_dim,
                                             model.mla is not None)
    return call(1.0) if window is None else with_window_layers(model, call, window)


def _window_prefill_s(model: ModelSpec, hw: Hardware, position_sum: float, n: float, seqs: int, new_tokens: float,
                      kv_bytes_per_token_layer: float) -> float | None:
    """One window layer's datasheet prefill attention on the window fit (`PrefillShapes.window`): `seqs`
    prompts of the equivalent length n attending 4 H d x their window's pairs (`window_prefill_work`; at most the
    position sum, and W a new token: chunks behind a prefix), at the rate of a prompt of min(n, W) tokens
    (the kernel's key loop), the new tokens' K/V written - or, where the fit found the engine's kernel
    masking the tiles outside the window instead of skipping them (`PrefillKV.skips_window`), the whole
    position sum at n's rate. None without window layers, a window fit or chunks: the lumped call then
    counts them."""
    shapes = hw.prefill_attention_shape
    if WINDOW not in model.kind_counts or shapes.window is None or seqs <= 0:
        return None
    w, kv_dtype = model.sliding_window, kv_dtype_of(model, kv_bytes_per_token_layer)
    fp8 = kv_dtype in ONE_BYTE_KV
    skips = shapes.of(fp8, window=True).skips_window
    pairs, length = window_prefill_work(n, w, skips)
    # a masking kernel computes the whole position sum; a skipping one at most its window's pairs, W a new token
    pairs = min(position_sum, seqs * capped_pairs(pairs, seqs, new_tokens, w)) if skips else position_sum
    return datasheet_prefill_attention_s(hw, kind_prefill_flop_per_pair(model, WINDOW) * pairs,
                                         new_tokens * model.kind_kv_bytes_per_token_layer(WINDOW, kv_dtype), length,
                                         seqs, new_tokens, model.num_heads, model.num_kv_heads, fp8, model.head_dim,
                                         window=True)


def with_window_layers(model: ModelSpec, call, window_s: float) -> float:
    """The mean layer's prefill attention with the window layers on their own fit: ((L - n_w) x the other
    layers' call + n_w x a window layer's `window_s`) / L, `call(scale)` the lumped call without window
    FLOP at `scale` x the mean layer's FLOP and bytes (L / (L - n_w): one of the other layers')."""
    layers, windows = model.num_layers, model.kind_counts[WINDOW]
    rest = call(layers / (layers - windows)) if layers > windows else 0.0
    return ((layers - windows) * rest + windows * window_s) / layers


def _busiest_rank_prefill_s(model: ModelSpec, hw: Hardware, position_sum: float, kv_tokens: float,
                            kv_bytes_per_token_layer: float, seqs: int, new_tokens: float) -> float:
    """Prefill attention under attention data parallelism: a step's S chunks are spread whole over the
    D ranks (a chunk is one request's, and a request lives on one rank), so the step waits for the
    rank with ceil(S / D) of them, the rule `busiest_rank_factor` gives decode attention (one chunk
    over 8 ranks: one rank's whole chunk, not an eighth of it; each chunk the step's mean). That
    rank's call, as its own attention rank: its chunks, pairs, prefix and new tokens, its heads, its
    KV bytes a token (the shard's figure is the group's mean per GPU: x D)."""
    dp = model.attention_dp
    share = busiest_rank_factor(seqs, dp) / dp  # of the group's chunks, the busiest rank's
    return prefill_attention_s(_one_rank(model), hw, position_sum * share, kv_tokens * share,
                               kv_bytes_per_token_layer * dp, math.ceil(seqs / dp), new_tokens * share)


PREFILL_TILE_TOKENS = 128  # query rows of one attention tile (FlashAttention's block)


def datasheet_prefill_attention_s(hw: Hardware, flop: float, kv_bytes: float, prompt_tokens: float, seqs: float,
                                  new_tokens: float, heads: int, kv_heads: int, fp8_kv: bool,
                                  head_dim: int = 128, mla: bool = False, window: bool = False) -> float:
    """One layer's causal prefill attention, datasheet, over `seqs` prompts (or chunks) of `prompt_tokens`
    (their equivalent length), `new_tokens` in all:

        floor + max(FLOP / rate, K/V bytes / attention bytes/s) + new tokens x KV heads x cache write,
        rate = plateau x n / (n + half_tokens) x tiles / (tiles + half_tiles),
        tiles = seqs x heads x ceil(new tokens / seqs / 128)

    Short prompts fill the kernel's query and key tiles poorly (half the rate at 170-1,250 tokens); few
    query tiles leave SMs idle (B200: half at ~170 tiles; 5-95 elsewhere); each new token's K/V is
    rotated, (fp8: quantised,) and stored. The figures are the KV dtype's (`hw.prefill_attention_shape`),
    fitted per GPU on the measured context-attention tables (`scripts/fit_datasheet.py`) at head dim 128,
    head dim 64 at its own fitted share of that rate (0.6-0.8: half the FLOP a key, not half the time), an
    MLA model's (`mla`) on its own fit of TensorRT-LLM's context-MLA rows where one covers the GPU, a window
    layer's (`window`, `_window_prefill_s`) on its own fit of the tables' window rows; one floor and one flat
    rate where no fit covers the GPU or the scenario sets the attention FLOP efficiency."""
    p = hw.prefill_attention_shape.of(fp8_kv, mla, window)
    rate = hw.attention_flop_per_s * p.flop_scale * (p.head_dim_64_scale if head_dim <= 64 else 1.0)
    if p.half_tokens > 0 and prompt_tokens > 0:
        rate *= prompt_tokens / (prompt_tokens + p.half_tokens)
    if p.half_tiles > 0 and seqs > 0:
        tiles = seqs * heads * math.ceil(new_tokens / seqs / PREFILL_TILE_TOKENS)
        rate *= tiles / (tiles + p.half_tiles)
    return p.floor_s + max(flop / rate, kv_bytes / hw.attention_hbm_bytes_per_s) + p.kv_write_s * new_tokens * kv_heads


def _fp8_kv(model: ModelSpec, kv_bytes_per_token_layer: float) -> bool:
    """The run's KV is one byte an element (fp8, or int8 which streams as it does)."""
    return kv_dtype_of(model, kv_bytes_per_token_layer) in ONE_BYTE_KV


def equivalent_prompt_tokens(position_sum: float, seqs: int) -> float:
    """The prompt length n of `seqs` whole prompts attending as many (query, key) pairs: seqs x n (n + 1) / 2
    = position sum (exact for whole prompts of one length; chunks behind a prefix take that length's rate)."""
    return (math.sqrt(1.0 + 8.0 * position_sum / seqs) - 1.0) / 2.0 if seqs > 0 else 0.0


def measured_prefill_attention_s(model: ModelSpec, hw: Hardware, position_sum: float, seqs: int,
                                 kv_bytes_per_token_layer: float, new_tokens: float = 0.0) -> float | None:
    """A step's prefill attention from the measured context-attention table (`MeasuredKernels.
    context_attention_one_s`): its `seqs` chunks as that many prompts of the length n that attends as
    many (query, key) pairs, seqs x n (n + 1) / 2 = position sum, i.e. n = (sqrt(1 + 8 S / seqs) - 1) / 2 -
    exact for whole prompts of one length; chunks behind a computed prefix and mixed lengths take the
    table's efficiency at that equivalent length. An MLA model takes TensorRT-LLM's context-MLA table
    the same way (`moe_mla_costs.measured_mla_prefill_s`), a model of full, window and chunked layers kind
    by kind (`kinds_prefill.measured_kinds_prefill_s`). None (the datasheet formula) without such a table,
    with other layer kinds, a window the table does not time, or for an attention-data-parallel shard
    (`prefill_attention_s` asks for its busiest rank's call instead)."""
    k = hw.kernels
    if k is None or seqs <= 0 or model.attention_dp > 1:
        return None
    if model.mla is not None:  # TensorRT-LLM's context-MLA kernel, where its table and the shape apply
        return measured_mla_prefill_s(model, hw, equivalent_prompt_tokens(position_sum, seqs), seqs,
                                      kv_dtype_of(model, kv_bytes_per_token_layer))
    if not k.has_context_attention():
        return None
    n = equivalent_prompt_tokens(position_sum, seqs)
    if model.layer_kinds:  # kind by kind, where the table times each kind's kernel
        return measured_kinds_prefill_s(model, k, n, seqs, kv_dtype_of(model, kv_bytes_per_token_layer), new_tokens)
    element = kv_bytes_per_token_layer / (2 * model.num_kv_heads * model.head_dim)
    kv_dtype = "fp8" if element < 1.5 else "bf16"  # as `gqa_attention_s`
    return k.context_attention_one_s(seqs, n, model.num_heads, model.num_kv_heads, model.head_dim, kv_dtype)


def _bounded_prefill_flop(model: ModelSpec, position_sum: float, kv_tokens: float, seqs: int,
                          windows: bool = True, new_tokens: float = 0.0) -> float:
    """The mean layer's window (`windows`: unless their own fit costs them) and linear prefill FLOP of
    `prefill_attention_s` (upper bounds), and its chunked layers': `seqs` whole prompts of the chunks'
    equivalent length attending within their chunks (`chunk_pairs`; exact for whole prompts of one length,
    as `equivalent_prompt_tokens`), at most the position sum and C keys a new token (`new_tokens`: chunks
    behind a prefix)."""
    counts = model.kind_counts
    flop = 0.0
    if windows:
        attended = min(position_sum, kv_tokens * model.sliding_window)
        flop += counts.get(WINDOW, 0) * kind_attention_flop_per_token(model, WINDOW) * attended
    if counts.get(LINEAR):
        flop += counts[LINEAR] * kv_tokens * linear_state_flop(model)
    if counts.get(CHUNKED):
        c = model.attention_chunk
        whole = seqs * capped_pairs(chunk_pairs(equivalent_prompt_tokens(position_sum, seqs), c), seqs, new_tokens, c)
        pairs = min(position_sum, whole) if seqs > 0 else position_sum
        flop += counts[CHUNKED] * kind_attention_flop_per_token(model, CHUNKED) * pairs
    if counts.get(SPARSE):  # the indexer over every attended pair (its MLA part is in `attention_flop`, uncapped)
        flop += counts[SPARSE] * model.sparse.flop_per_token / model.attention_dp * position_sum
    return flop / model.num_layers


def mixed_step_cost(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, prefetch: str,
                    decodes: int, t0: int, t1: int, t2: int, kv_bytes_per_token_layer: float,
                    t2_bytes_per_token_layer: float, prefill_tokens: int = 0, prefill_position_sum: float = 0,
                    prefill_kv_tokens: float = 0, prefill_seqs: int = 0, staged: bool = True,
                    access: str = "prefetch", buffers: int = 2, fetch: SparseFetch | None = None,
                    chunk_tokens: int | None = None, staged_tokens: tuple | None = None) -> StepCost:
    """One continuous-batching step: `decodes` decoding sequences (tier counts t0/t1/t2 summed over
    them, each at its own context) plus prefill chunks of `prefill_tokens` tokens from `prefill_seqs`
    sequences. Per layer:
      GEMMs over rows = decodes + prefill tokens (`weight_kernel_s(rows)`)
      + decode attention as `decode_step_cost` (T0 + staged T1/T2, or host access as the policy says)
      + `prefill_attention_s` (causal over each chunk's prefix)
      + layer overhead + 2 all-reduces of rows x h x 2 B;
    tail = `step_tail_s` over the rows that sample (logits only at each sequence's last token):
    decodes + prefill_seqs. The decodes' T1/T2 cross the link as in `decode_step_cost` (prefill
    chunks attend T0 only). With no prefill this is `decode_step_cost` exactly."""
    if decodes:
        base = decode_step_cost(model, hw, weight_dtype, group_size, prefetch, decodes, t0, t1, t2,
                                kv_bytes_per_token_layer, t2_bytes_per_token_layer, staged, access, buffers,
                                fetch=fetch, chunk_tokens=chunk_tokens, staged_tokens=staged_tokens)
    else:
        base = StepCost(LayerCost(0.0, 0.0, 0.0, qkv_share=qkv_share(model),
                                  host_s=host_times(hw, prefill_tokens, PREFILL)[0]),
                        model.num_layers, 0.0, 0.0, 0)
    return with_prefill(model, hw, weight_dtype, group_size, base, decodes, kv_bytes_per_token_layer, prefill_tokens,
                        prefill_position_sum, prefill_kv_tokens, prefill_seqs)


def with_prefill(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, base: StepCost, decodes: int,
                 kv_bytes_per_token_layer: float, prefill_tokens: int, prefill_position_sum: float,
                 prefill_kv_tokens: float, prefill_seqs: int) -> StepCost:
    """`mixed_step_cost` from its decodes' step (`base`): the GEMMs, collectives and host time over
    every row, the chunks' attention added to the decodes', the tail over the rows that sample."""
    if prefill_tokens <= 0:
        return base
    rows = decodes + prefill_tokens
    attention_s = base.layer.attention_s + prefill_attention_s(model, hw, prefill_position_sum, prefill_kv_tokens,
                                                               kv_bytes_per_token_layer, prefill_seqs, prefill_tokens)
    kind = MIXED if decodes else PREFILL
    layer = fields_replaced(base.layer, gemm_s=weight_kernel_s(model, hw, weight_dtype, group_size, rows),
                            attention_s=attention_s, allreduce_s=layer_comm_s(model, hw, rows),
                            overhead_s=layer_overhead_s(model, hw, rows), host_s=host_times(hw, rows, kind)[0])
    return fields_replaced(base, layer=layer, tail_s=step_tail_s(model, hw, decodes + prefill_seqs, kind))


def _host_split_cost(model: ModelSpec, hw: Hardware, weight_dtype: str, group_size: int, prefetch: str, batch: int,
                     t0: int, t1: int, t2: int, kv_bytes_per_token_layer: float, t2_bytes_per_token_layer: float,
                     fraction_on_host: float, staged_tokens: tuple | None = None,
                     chunk_tokens: int | None = None) -> StepCost:
    """A step whose host-resident tokens are attended `fraction_on_host` on the host and the rest
    prefetched (T1 and T2 in the same proportion): the GPU attends T0 + the prefetched part, the
    host the rest, and each layer waits for the later of the two. The link and the host move the mean
    layer's `staged_tokens` (`decode_step_cost`) in that proportion; the GPU's chunked layers read
    `gpu_chunk_tokens`."""
    g1, g2 = (1.0 - fraction_on_host) * t1, (1.0 - fraction_on_host) * t2  # prefetched to the GPU
    s1, s2 = (t1, t2) if staged_tokens is None else staged_tokens
    p1, p2 = (1.0 - fraction_on_host) * s1, (1.0 - fraction_on_host) * s2  # the prefetched part as the link sees it
    chunk = gpu_chunk_tokens(model, chunk_tokens, t1 + t2, s1 + s2, fraction_on_host)
    layer = decode_layer_cost(model, hw, weight_dtype, group_size, batch, t0 + g1 + g2, kv_bytes_per_token_layer,
                              p2, t2_bytes_per_token_layer, chunk)
    path = host_path(model, hw, batch, s1 - p1, s2 - p2, kv_bytes_per_token_layer, t2_bytes_per_token_layer)
    nbytes = float(p1 * kv_bytes_per_token_layer + p2 * t2_bytes_per_token_layer)
    copies = prefetch_copies_per_layer(prefetch, p1 > 0, p2 > 0)
    return StepCost(layer, model.num_layers, step_tail_s(model, hw, batch), nbytes, copies,
                    host=path if path.tokens > 0 else None, host_fraction=fraction_on_host)


def gpu_chunk_tokens(model: ModelSpec, chunk_tokens, host_tokens, staged_tokens, fraction_on_host):
    """The tokens a host-split step's chunked layers attend on the GPU (scalars or arrays): their current
    chunks' (`chunk_tokens`) less the host tier's tokens there that the host attends, `fraction_on_host` of
    them. Of the `host_tokens` (T1 + T2), the chunks hold (staged - (1 - q) host) / q, the chunked layers'
    part of the mean layer's `staged_tokens` (q = `ModelSpec.chunked_tier_share`; all of them where the
    staged tokens are the host tokens). None where `chunk_tokens` is None (the bound)."""
    if chunk_tokens is None:
        return None
    q = model.chunked_tier_share
    in_chunks = (staged_tokens - (1.0 - q) * host_tokens) / q if q else host_tokens
    return np.maximum(chunk_tokens - fraction_on_host * in_chunks, 0.0)


@dataclass(frozen=True)
class RetierTraffic:
    """Link traffic of one re-tier (all layers): demotions go device->host, promotions host->device."""

    h2d_bytes: float
    h2d_copies: int
    d2h_bytes: float
    d2h_copies: int


def pipeline_send_s(rows: int, hidden_size: int, bytes_per_s: float, floor_s: float) -> float:
    """One pipeline stage's hidden states to the next (vLLM's send of its intermediate tensors):
    rows x hidden x 2 B (bf16) at the fabric's per-GPU rate, plus one call's floor. Each tensor-parallel
    rank sends to its peer in the next stage, in parallel, so the group's time is one GPU's."""
    return floor_s + rows * hidden_size * ACTIVATION_BYTES / bytes_per_s


def pipeline_stage_s(cost: StepCost, pp: int, send_s: float) -> list[float]:
    """Each stage's time for one batch in flight, from the cost of the largest stage (`ModelSpec.stage`:
    its L / pp layers): every stage runs that many layers; stages 0..pp-2 then send their hidden states
    on (`pipeline_send_s`), the last runs the tail (LM head, sampling). Nothing staged from the host
    (pipeline runs keep their K/V in HBM: scenario `_check_pipeline`)."""
    layers_s = cost.num_layers * cost.layer.total_s
    return [layers_s + send_s] * (pp - 1) + [layers_s + cost.tail_s]


def retier_traffic(prefetch: str, num_layers: int, kv_bytes_per_token_layer: float, t2_bytes_per_token_layer: float,
                   to_t1: int, to_t2: int, from_t1: int, from_t2: int,
                   resident_t1: int = 0, resident_t2: int = 0, kept: float = 1.0) -> RetierTraffic:
    """d2h = L * (tokens to T1 * KV bytes + tokens to T2 * compressed bytes), h2d likewise for the
    promoted ones; copies from `retier_copies`. `per_interval` also brings every host-resident
    token (`resident_*`, counts after the re-tier) back once and keeps it on the GPU. `kept`: the share
    of a moved token's bytes that moves (`RunContext.chunk_kept`: chunked layers' copies only within the
    current chunk)."""
    L = num_layers
    if kept != 1.0:
        to_t1, to_t2, from_t1, from_t2 = to_t1 * kept, to_t2 * kept, from_t1 * kept, from_t2 * kept
        resident_t1, resident_t2 = resident_t1 * kept, resident_t2 * kept
    d2h_bytes = L * (to_t1 * kv_bytes_per_token_layer + to_t2 * t2_bytes_per_token_layer)
    h2d_bytes = L * (from_t1 * kv_bytes_per_token_layer + from_t2 * t2_bytes_per_token_layer)
    d2h_copies = retier_copies(prefetch, L, to_t1 > 0, to_t2 > 0)
    h2d_copies = retier_copies(prefetch, L, from_t1 > 0, from_t2 > 0)
    if prefetch == "per_interval":
        h2d_bytes += L * (resident_t1 * kv_bytes_per_token_layer + resident_t2 * t2_bytes_per_token_layer)
        h2d_copies += L * prefetch_copies_per_layer(prefetch, resident_t1 > 0, resident_t2 > 0)
    return RetierTraffic(float(h2d_bytes), h2d_copies, float(d2h_bytes), d2h_copies)
