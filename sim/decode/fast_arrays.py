"""The fast level's shared arrays: every step's cost at once (`step_arrays`), the layerwise pipeline
over all steps (`pipeline_finish_s`), steps with the link to themselves (`uncontended_step_s`), and
what a fast timing hands back (`FastTiming`). Used by the prefetch timing (`fast`) and the host
access timing (`fast_host`) alike."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.device.engine_rules import host_loop_steps_s
from sim.device.physics import KV_SPLIT_COPIES, T2_BLOCKS, decode_attention_s, decode_layer_cost, step_tail_s
from sim.tiering.tier_plan import ACTIVE, ATT_T0, ATT_T1, ATT_T2

from .context import RunContext


@dataclass(frozen=True)
class StepArrays:
    """`physics.decode_step_cost` of every step, the fields the timing reads (per layer unless named)."""

    pre_s: np.ndarray
    post_s: np.ndarray
    tail_s: np.ndarray
    compute_s: np.ndarray  # the step: L * layer + tail
    prefetch_bytes: np.ndarray
    prefetch_copies: np.ndarray
    pack_s: np.ndarray


def step_arrays(ctx: RunContext, att: np.ndarray, steps: np.ndarray | None = None) -> StepArrays:
    """The step cost of `physics.decode_step_cost` (prefetch access) for every row of `att` (columns
    `tier_plan.ATT_*`: T0, T1, T2 attended and sequences; the rows of decode `steps`, default every step
    in order) at once: the batch-dependent parts (GEMMs, all-reduces, overheads, tail) once per distinct
    batch, attention as `physics.attention_s_array`. Same formulas, same order of operations: the same floats."""
    m, pol, hw, model = ctx.scenario.model, ctx.scenario.policy, ctx.hw, ctx.model
    batch, t0, t1, t2 = att[:, ACTIVE], att[:, ATT_T0], att[:, ATT_T1], att[:, ATT_T2]
    steps = np.arange(len(att)) if steps is None else steps
    s1, s2 = staged_columns(ctx, att, steps)
    uniq, inv = np.unique(batch, return_inverse=True)
    per_batch = [decode_layer_cost(model, hw, m.weight_dtype, m.weight_group_size, int(b), 0,
                                   ctx.kv_bytes_per_token_layer) for b in uniq]
    gemm = np.array([c.gemm_s for c in per_batch])[inv]
    overhead = np.array([c.overhead_s for c in per_batch])[inv]
    allreduce = np.array([c.allreduce_s for c in per_batch])[inv]
    host = np.array([c.host_s for c in per_batch])[inv]
    qkv = per_batch[0].qkv_share if per_batch else 0.0
    tail = np.array([step_tail_s(model, hw, int(b)) for b in uniq])[inv]
    kvl, t2b = ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer
    attended = t0 + t1 + t2
    kv_bytes = (attended + batch) * kvl + s2 * (t2b + kvl)
    attn = decode_attention_s(model, hw, batch, attended, kv_bytes, kvl, ctx.closed_chunk_tokens(att, steps))
    device = gemm + attn + overhead + allreduce
    total = np.maximum(device, host)
    stretch = np.where(device > 0, total / np.where(device > 0, device, 1.0), 1.0)
    pre = gemm * qkv * stretch
    staged = ctx.policy.tiering and pol.prefetch != "per_interval"
    zeros = np.zeros(len(batch))
    if staged:
        nbytes = (s1 * kvl + s2 * t2b).astype(float)
        per_tier = KV_SPLIT_COPIES if pol.prefetch == "sync_per_step" else 1
        copies = per_tier * (s1 > 0) + T2_BLOCKS * (s2 > 0)
        pack = s1 * kvl / hw.host_pack_bytes_per_s if pol.prefetch == "sync_per_step" else zeros
    else:
        nbytes, copies, pack = zeros, np.zeros(len(batch), dtype=np.int64), zeros
    return StepArrays(pre, total - pre, tail, ctx.num_layers * total + tail, nbytes, copies, pack)


def staged_columns(ctx: RunContext, att: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (T1, T2) columns the mean layer stages at decode `steps` (`RunContext.closed_staged_tokens`):
    `att`'s own T1 and T2 without chunked layers."""
    staged = ctx.closed_staged_tokens(att, steps)
    return (att[:, ATT_T1], att[:, ATT_T2]) if staged is None else staged


def copy_times_s(link, nbytes: np.ndarray, copies: np.ndarray, both_busy: bool) -> np.ndarray:
    """`LinkModel.transfer_time_s` of each step's per-layer prefetch (once per distinct size)."""
    uniq, inv = np.unique(np.column_stack([nbytes, copies]), axis=0, return_inverse=True)
    return np.array([link.transfer_time_s(b, int(c), both_busy) for b, c in uniq])[inv.ravel()]


def pipeline_finish_s(pre: np.ndarray, rest: np.ndarray, copy: np.ndarray, layers: int, buffers: int) -> np.ndarray:
    """`physics.layerwise_pipeline` of `layers` identical layers per step, every step at once:
    the finish time of the last layer (steps whose copy is 0 need no buffer: plain compute)."""
    link_free = np.zeros_like(pre)
    end = np.zeros_like(pre)
    taken = np.zeros((layers, len(pre)))
    for layer in range(layers):
        start = link_free if layer < buffers else np.maximum(link_free, taken[layer - buffers])
        ready = start + copy
        link_free = ready
        taken[layer] = np.maximum(end + pre, ready)
        end = taken[layer] + rest
    return np.where(copy > 0, end, layers * (pre + rest))


def host_loop_arrays_s(ctx: RunContext, plan) -> np.ndarray:
    """Each step of a closed batch's `plan` (a `TierPlan`): the engine's host loop over its decoding
    sequences (`engine_rules.host_loop_s`), 0 without one; a step lasts at least this."""
    return host_loop_steps_s(ctx.hw.launch, plan.attended[:, ACTIVE], ctx.model.attention_dp)


def uncontended_step_s(ctx: RunContext, a: StepArrays) -> tuple[np.ndarray, np.ndarray]:
    """(step time, one layer's copy time) of every step with the link to itself: the prototype's
    copies before the forward pass, or the layerwise pipeline, or - nothing staged - the compute."""
    pol, L = ctx.scenario.policy, ctx.num_layers
    copy_s = copy_times_s(ctx.hw.h2d, a.prefetch_bytes, a.prefetch_copies, False) + a.pack_s
    if pol.prefetch == "sync_per_step":
        step_s = L * copy_s + a.compute_s
    else:
        step_s = pipeline_finish_s(a.pre_s, a.post_s, copy_s, L, pol.staging_buffers) + a.tail_s
    return np.where(a.prefetch_bytes > 0, step_s, a.compute_s), copy_s


@dataclass
class FastTiming:
    """What the fast level measured: the per-step table and each direction's busy seconds."""

    frame: pd.DataFrame
    decode_s: float
    busy: dict[str, float]
    timeline: list = field(default_factory=list)  # the fast level records no timeline

    def step_frame(self) -> pd.DataFrame:
        return self.frame

    def busy_s(self, *directions: str, until: float) -> float:
        """As `DecodeTiming.busy_s`; `busy` is already clipped at the end of decode."""
        return self.busy["+".join(directions)]
