"""Memory over a run, whether it fits, and the largest batch that fits."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sim.inputs.lengths import draw_lengths
from sim.tiering.counts import count_trajectory
from sim.tiering.memory_trace import MemoryTrace, memory_trace
from sim.tiering.pressure import resolve
from sim.tiering.tiers import T0, T1, T2, TIERS, TierPolicy

from .context import RunContext


@lru_cache(maxsize=4096)
def _trajectory(prompt: int, length: int, policy: TierPolicy) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's counts (attended during each step, after each step); read-only, shared."""
    traj = count_trajectory(prompt, length, policy)
    start = np.zeros((1, len(TIERS)), dtype=np.int64)
    start[0, T0] = prompt
    before = np.vstack([start, traj[:-1]])
    before[:, T0] += 1  # the step's own new token
    traj.flags.writeable = before.flags.writeable = False
    return before, traj


@dataclass(frozen=True)
class BatchCounts:
    """Tier counts summed over a batch, per decode step, from the ratios alone (columns T0..T3).
    `attended` = counts during step s's forward (after step s-1's re-tier, plus the new token);
    `tiers_after` = counts after step s (its re-tier applied)."""

    attended: np.ndarray  # (steps, 4)
    tiers_after: np.ndarray  # (steps, 4)
    active: np.ndarray  # (steps,)

    @property
    def net_demoted(self) -> np.ndarray:
        """(steps, 2): tokens a re-tier adds to T1 and to T2 (net of promotions: the counts carry
        no churn, which is small next to the first re-tier's demotion that sets the peak)."""
        host = [T1, T2]
        return np.maximum(self.tiers_after[:, host] - self.attended[:, host], 0)

    def trace(self, ctx: RunContext) -> MemoryTrace:
        a = self.attended
        return memory_trace(ctx, a[:, T0], a[:, T1], a[:, T2], self.active, self.tiers_after, self.net_demoted,
                            ctx.closed_kept(np.arange(len(a))))


def batch_counts(ctx: RunContext, batch: int, policy: TierPolicy | None = None) -> BatchCounts:
    w = ctx.scenario.workload
    lengths = draw_lengths(w, batch)
    policy = resolve(ctx, lengths, policy or ctx.policy)  # hbm_ratio auto: its shares under this batch's pressure
    steps = int(lengths.max())
    uniq, mult = np.unique(lengths, return_counts=True)
    if len(uniq) == 1:  # equal lengths: every sequence the same
        before, traj = _trajectory(w.prompt_tokens, steps, policy)
        return BatchCounts(attended=batch * before, tiers_after=batch * traj, active=np.full(steps, batch, dtype=np.int64))
    attend = np.zeros((steps, len(TIERS)), dtype=np.int64)
    after = np.zeros((steps, len(TIERS)), dtype=np.int64)
    active = np.zeros(steps, dtype=np.int64)
    for n, k in zip(uniq, mult):
        before, traj = _trajectory(w.prompt_tokens, int(n), policy)
        attend[: int(n)] += k * before
        after[: int(n)] += k * traj
        active[: int(n)] += k
    return BatchCounts(attended=attend, tiers_after=after, active=active)


def batch_memory_trace(ctx: RunContext, batch: int, policy: TierPolicy | None = None) -> MemoryTrace:
    """Memory of `batch` sequences (lengths drawn from the workload seed) from tier counts alone."""
    return batch_counts(ctx, batch, policy).trace(ctx)


def fits(trace: MemoryTrace, ctx: RunContext) -> tuple[bool, float, float]:
    """(fits, HBM shortfall bytes, host shortfall bytes)."""
    hbm_short = max(0.0, trace.hbm_peak_bytes - ctx.hw.memory_bytes)
    host_short = max(0.0, trace.host_peak_bytes - ctx.hw.host_memory_bytes)
    return hbm_short == 0 and host_short == 0, hbm_short, host_short


def max_batch(ctx: RunContext, limit: int | None = None, policy: TierPolicy | None = None) -> int:
    """Largest batch whose peak HBM and host bytes fit (0 if not even one sequence fits).
    Memory grows with batch, so a doubling then bisection search finds the edge."""
    limit = limit or ctx.scenario.sim.max_batch_limit

    def ok(b: int) -> bool:
        return fits(batch_memory_trace(ctx, b, policy), ctx)[0]

    if not ok(1):
        return 0
    guess = _affine_max_batch(ctx, policy or ctx.policy, limit)
    if guess is not None and ok(guess) and (guess == limit or not ok(guess + 1)):
        return guess  # the closed form, confirmed at the edge by the exact traces
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _affine_max_batch(ctx: RunContext, policy: TierPolicy, limit: int) -> int | None:
    """With equal lengths every sequence has the same trace, so memory is affine in the batch:
    HBM(b) = fixed + b * per-sequence(step), host(b) = b * per-sequence(step). The largest b under
    both capacities, or None where lengths vary or the policy is `auto` (its shares depend on the
    batch): then only the search knows."""
    if not isinstance(ctx.scenario.workload.reasoning_tokens, int) or policy.auto:
        return None
    one = batch_memory_trace(ctx, 1, policy)
    fixed = ctx.weights_bytes + ctx.hw.runtime_reserve_bytes
    per_seq_hbm = float((one.hbm_bytes - fixed).max())
    per_seq_host = one.host_peak_bytes
    b = limit
    if per_seq_hbm > 0:
        b = min(b, int((ctx.hw.memory_bytes - fixed) // per_seq_hbm))
    if per_seq_host > 0:
        b = min(b, int(ctx.hw.host_memory_bytes // per_seq_host))
    return max(1, b)


def full_hbm_peak_bytes(ctx: RunContext) -> float:
    """Peak HBM of the same workload with no tiering (the `full_hbm` baseline)."""
    full = TierPolicy(kind="full_hbm")
    return batch_memory_trace(ctx, ctx.scenario.workload.batch_size, full).hbm_peak_bytes


def baseline_max_batches(ctx: RunContext) -> dict[str, int]:
    """Max batch of the same workload under the two baselines, so "how many more requests fit"
    can be read off one run: full_hbm, and evict_only at this scenario's evict_ratio."""
    evict_only = TierPolicy.from_config(ctx.scenario.policy.model_copy(update={"kind": "evict_only"}))
    return {"full_hbm": max_batch(ctx, policy=TierPolicy(kind="full_hbm")), "evict_only": max_batch(ctx, policy=evict_only)}
