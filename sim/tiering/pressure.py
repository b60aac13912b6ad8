"""`policy.hbm_ratio: auto`, a pressure-driven tiered policy: T0 holds every token while HBM allows,
and only under memory pressure do the lowest-scored tokens move to T1/T2 (and back when pressure
falls, as sequences finish), so tiering costs nothing until it buys capacity.

The rule, at each re-tier: the batch's T0 share f (of each sequence's unprotected tokens) is the
largest for which the memory trace (`memory_trace`, the same HBM sum that decides whether a
run fits) stays within HBM until the next re-tier, counting
- the new tokens every unfinished sequence writes to T0 meanwhile, with activations and staging, and
- at the next re-tier's step, room for that re-tier's demotions while they are in transit (gathered
  on the device until the offload lands): `TRANSIT_INTERVALS` intervals of new tokens per sequence at
  full KV bytes. Under steady pressure a re-tier moves out about one interval of tokens net, and churn
  adds more: tokens trading places between T0 and T1, whose demoted half transits too. Counts carry no
  churn, so it is an allowance, checked against the token-level plan (tests/test_pressure.py).
Of the tokens pressure pushes out (share 1 - f), `evict_ratio` are deleted and `compressed_ratio`
go to T2 (`TierPolicy.at_fraction`); at f = 1 nothing moves. Where not even f = 0 fits, f = 0 and
the run's memory trace reports the shortfall.

In a closed batch every unfinished sequence has written the same tokens at a re-tier and has seen
the same shares, so it holds the same counts, and one f serves the batch: the schedule (f per
re-tier) follows from counts alone, before any token-level work, and the counts, the token-level
plan, the fast level and hwprobe's replay all apply it (`TierPolicy.at_retier`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .counts import protected_count, retier_counts
from .memory_trace import memory_trace
from .tiers import T0, T1, T2, TierPolicy

# Transit room per sequence, in re-tier intervals of tokens: one for the net demotion, one for churn
# (the token-level plan's demotions reach 1.35 intervals on the shipped scenarios, drift up to 0.3).
TRANSIT_INTERVALS = 2


def resolve(ctx, lengths: np.ndarray, policy: TierPolicy | None = None) -> TierPolicy:
    """`policy` (default the run's) with its pressure schedule for a batch of these reasoning lengths;
    any other policy unchanged."""
    policy = policy or ctx.policy
    if not policy.auto or policy.hbm_schedule is not None:
        return policy
    return replace(policy, hbm_schedule=hbm_schedule(ctx, np.asarray(lengths), policy))


def hbm_schedule(ctx, lengths: np.ndarray, policy: TierPolicy) -> tuple[float, ...]:
    """T0 share f at each re-tier of the batch (see the module docstring)."""
    prompt = ctx.scenario.workload.prompt_tokens
    steps = int(lengths.max())
    ordered = np.sort(lengths)
    interval = policy.retier_interval
    counts = (prompt, 0, 0, 0)  # of every unfinished sequence, after the last re-tier
    last = -1
    schedule: list[float] = []
    for s in np.flatnonzero(policy.retier_mask(steps)).tolist():
        before = (counts[0] + s - last, *counts[1:])
        n_tokens = prompt + s + 1
        unprotected = n_tokens - protected_count(n_tokens, prompt, policy)
        window = np.arange(s + 1, min(s + interval, steps - 1) + 1)  # steps until the next re-tier's
        if unprotected == 0 or len(window) == 0:  # nothing to move, or no step left to make room for
            f = schedule[-1] if schedule else 1.0
        else:
            active = len(lengths) - np.searchsorted(ordered, window, side="right")  # sequences running each step
            grown = window - s  # new T0 tokens per sequence since this re-tier
            transit = np.where(window == s + interval, active * TRANSIT_INTERVALS * interval * ctx.kv_bytes_per_token, 0.0)

            def peak_bytes(keep: int) -> float:
                c = retier_counts(before, n_tokens, prompt, policy.at_fraction(share_keeping(keep, unprotected)))
                trace = memory_trace(ctx, active * (c[T0] + grown), active * c[T1], active * c[T2], active)
                return float((trace.hbm_bytes + transit).max())

            f = share_keeping(_largest_keep(peak_bytes, unprotected, ctx.hw.memory_bytes), unprotected)
        schedule.append(f)
        counts = retier_counts(before, n_tokens, prompt, policy.at_fraction(f))
        last = s
    return tuple(schedule)


def share_keeping(keep: int, unprotected: int) -> float:
    """A T0 share whose `int(unprotected * share)` is exactly `keep` (k / n can land a hair under k
    after the multiplication; the middle of the interval cannot)."""
    return 1.0 if keep >= unprotected else (keep + 0.5) / unprotected


def _largest_keep(peak_bytes, unprotected: int, capacity_bytes: float) -> int:
    """The most unprotected tokens per sequence T0 can keep with the peak within capacity (memory
    grows with what T0 keeps); 0 where nothing fits."""
    if peak_bytes(unprotected) <= capacity_bytes:
        return unprotected
    lo, hi = 0, unprotected  # peak(hi) > capacity; lo fits, or nothing does
    if peak_bytes(lo) > capacity_bytes:
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak_bytes(mid) <= capacity_bytes else (lo, mid)
    return lo
