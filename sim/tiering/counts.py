"""Tier sizes without token identities: the ratios alone fix how many tokens sit in each tier.

Used for capacity (max batch) and fast projections. Mirrors `tiers.assign_tiers` exactly; a test
checks it against the token-level state.
"""

from __future__ import annotations

import numpy as np

from .tiers import TierPolicy


def protected_count(n_tokens: int, prompt_tokens: int, policy: TierPolicy) -> int:
    """|prompt (if protected) U first sink_tokens generated U last recent_window| for n tokens."""
    prompt = min(prompt_tokens, n_tokens)
    lo1 = 0 if policy.protect_prompt else prompt
    hi1 = min(prompt + policy.sink_tokens, n_tokens)
    lo2 = max(0, n_tokens - policy.recent_window) if policy.recent_window > 0 else n_tokens
    hi2 = n_tokens
    len1 = max(0, hi1 - lo1)
    len2 = hi2 - lo2
    overlap = max(0, min(hi1, hi2) - max(lo1, lo2))
    return len1 + len2 - overlap


def retier_counts(counts: tuple[int, int, int, int], n_tokens: int, prompt_tokens: int, policy: TierPolicy) -> tuple[int, int, int, int]:
    """(T0, T1, T2, T3) after one re-tier of a sequence of n tokens."""
    t0, t1, t2, t3 = counts
    policy = policy.at_retier(n_tokens - prompt_tokens)
    p = protected_count(n_tokens, prompt_tokens, policy)
    if policy.semantics == "paper_prototype":
        n = t0 - p
        ev, keep = int(n * policy.evict_ratio), int(n * policy.hbm_ratio)
        moved = n - ev - keep
        comp = min(int(n * policy.compressed_ratio), moved)
        return p + keep, t1 + moved - comp, t2 + comp, t3 + ev
    n = n_tokens - p
    ev = max(t3, int(n * policy.evict_ratio))
    rest = n - ev
    keep = min(int(n * policy.hbm_ratio), rest)
    comp = min(int(n * policy.compressed_ratio), rest - keep)
    return p + keep, rest - keep - comp, comp, ev


def count_trajectory(prompt_tokens: int, reasoning_tokens: int, policy: TierPolicy) -> np.ndarray:
    """Tier counts after each decode step (rows = steps, cols = T0..T3), re-tiers applied."""
    out = np.zeros((reasoning_tokens, 4), dtype=np.int64)
    counts = (prompt_tokens, 0, 0, 0)
    for step in range(reasoning_tokens):
        counts = (counts[0] + 1, counts[1], counts[2], counts[3])
        if policy.retier_due(step):
            counts = retier_counts(counts, prompt_tokens + step + 1, prompt_tokens, policy)
        out[step] = counts
    return out


def unprotected_share_of_last(n_tokens, prompt_tokens, policy: TierPolicy, last):
    """Share of a sequence's unprotected positions (those a re-tier may move out of T0: all but
    `protected_count`'s) that lie in its last `last` positions; 0 where it has none. Scalars or arrays
    (broadcast). With a token's tier taken as independent of its position among the unprotected ones,
    this is the share of its T1/T2 tokens there - what a chunked layer reads of them (`last`: its
    current chunk, `layers.chunk_attended`)."""
    n, prompt, last = (np.asarray(x, dtype=np.int64) for x in (n_tokens, prompt_tokens, last))
    prompt = np.minimum(prompt, n)
    lo1 = np.zeros_like(prompt) if policy.protect_prompt else prompt  # [lo1, hi1): the prompt and the sinks
    hi1 = np.minimum(prompt + policy.sink_tokens, n)
    lo2 = np.maximum(0, n - policy.recent_window) if policy.recent_window > 0 else n  # [lo2, n): the recent ones
    first = n - np.minimum(last, n)  # [first, n): the last positions
    protected = np.maximum(0, hi1 - lo1) + (n - lo2) - np.maximum(0, hi1 - np.maximum(lo1, lo2))
    in_last = (np.maximum(0, hi1 - np.maximum(lo1, first)) + (n - np.maximum(lo2, first))
               - np.maximum(0, hi1 - np.maximum(np.maximum(lo1, lo2), first)))
    free, free_last = n - protected, (n - first) - in_last
    return np.where(free > 0, free_last / np.where(free > 0, free, 1), 0.0)
