"""The tier plan of a whole batch: which tokens sit in which tier at each decode step, and what each
re-tier moves, from the seeded token-level state of every sequence.

Which tokens sit where depends only on the policy and the seeded importance, never on how long a
step took, so it is computed once; memory (fits) and timing (SimPy) both read this plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.inputs.lengths import draw_lengths

from .batch_tiers import BatchTiers
from .pressure import resolve
from .sequence import SequenceTiers
from .tiers import T0, T1, T2, T3, TIERS, TierPolicy

# columns of TierPlan.attended (counts attended during the step's forward, before its re-tier)
ATT_T0, ATT_T1, ATT_T2, ACTIVE = range(4)
ATTENDED_COLUMNS = 4
# columns of TierPlan.retier_moves (the re-tier after the step, summed over the batch)
MV_D2H_T1, MV_D2H_T2, MV_H2D_T1, MV_H2D_T2, MV_EVICTED = range(5)
MOVE_COLUMNS = 5


@dataclass(frozen=True)
class TierPlan:
    lengths: np.ndarray  # reasoning tokens per sequence
    attended: np.ndarray  # (steps, 4) see ATT_*
    tiers_after: np.ndarray  # (steps, 4) tokens in T0..T3 (columns `tiers.T0`..`T3`) summed over active sequences after the step
    retier_moves: np.ndarray  # (steps, 5) see MV_*
    retier_due: np.ndarray  # (steps,) bool: a re-tier follows the step
    policy: TierPolicy | None = None  # the rule applied (hbm_ratio auto: with this batch's schedule)

    @property
    def steps(self) -> int:
        return len(self.attended)


def sequence_rngs(workload, n: int, rows=None) -> list[np.random.Generator]:
    """One independent seeded stream per sequence (its importance draws); of `rows` only, if given."""
    seeds = np.random.SeedSequence([workload.seed, 2]).spawn(n)
    return [np.random.default_rng(seeds[i]) for i in (range(n) if rows is None else rows)]


def sequence_tiers(scenario, policy: TierPolicy, lengths: np.ndarray) -> list[SequenceTiers]:
    """The seeded per-sequence tier state, one sequence at a time (the same evolution as `plan_tiers`,
    token for token). hwprobe replays it (`scores: simulator`) so the real cache moves exactly the planned tokens."""
    w = scenario.workload
    return [SequenceTiers(w.prompt_tokens, w.prompt_tokens + int(n), policy, scenario.policy.importance, rng,
                          scenario.policy.scoring) for n, rng in zip(lengths, sequence_rngs(w, len(lengths)))]


def plan_tiers(ctx) -> TierPlan:
    """The whole run's tier plan. Between re-tiers a sequence's counts only grow by one T0 token per
    step, so the per-step sums are prefix sums over the unfinished rows (kept longest first); the
    token-level work happens only at re-tiers (`BatchTiers`)."""
    sc = ctx.scenario
    w = sc.workload
    lengths = draw_lengths(w, w.batch_size)
    steps = int(lengths.max())
    policy = resolve(ctx, lengths)  # hbm_ratio auto: the shares this batch's memory pressure sets
    retier = policy.retier_mask(steps)
    batch = BatchTiers(w.prompt_tokens, lengths, policy, sc.policy.importance, sequence_rngs(w, len(lengths)),
                       sc.policy.scoring)
    active = len(lengths) - np.searchsorted(np.sort(lengths), np.arange(steps), side="right")  # unfinished rows per step
    attend = np.zeros((steps, ATTENDED_COLUMNS), dtype=np.int64)
    after = np.zeros((steps, len(TIERS)), dtype=np.int64)
    moves = np.zeros((steps, MOVE_COLUMNS), dtype=np.int64)
    counts = np.zeros((len(lengths), len(TIERS)), dtype=np.int64)  # per row (longest first) at the last re-tier
    counts[:, T0] = w.prompt_tokens
    ends = np.flatnonzero(retier).tolist()
    begin = 0
    for end in ends + ([steps - 1] if not ends or ends[-1] != steps - 1 else []):
        seg = np.arange(begin, end + 1)
        cum = np.vstack([np.zeros(len(TIERS), dtype=np.int64), np.cumsum(counts, axis=0)])[active[seg]]
        attend[seg, ATT_T0] = cum[:, T0] + active[seg] * (seg - begin + 1)  # each unfinished row's new tokens
        attend[seg, ATT_T1], attend[seg, ATT_T2], attend[seg, ACTIVE] = cum[:, T1], cum[:, T2], active[seg]
        after[seg] = np.column_stack([attend[seg, ATT_T0], cum[:, T1], cum[:, T2], cum[:, T3]])
        if retier[end]:
            trans = batch.retier(end + 1)  # (rows, old, new)
            rows = len(trans)
            counts[:rows] = trans.sum(axis=1)
            total = trans.sum(axis=0)
            moves[end] = (total[T0, T1], total[T0, T2], total[T1, T0], total[T2, T0], total[:T3, T3].sum())
            after[end] = counts[:rows].sum(axis=0)
        begin = end + 1
    return TierPlan(lengths=lengths, attended=attend, tiers_after=after, retier_moves=moves, retier_due=retier,
                    policy=policy)
