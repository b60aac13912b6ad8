"""The tier plan of a whole batch: which tokens sit in which tier at each decode step, and what each
re-tier moves, from the seeded token-level state of every sequence.

Which tokens sit where depends only on the policy and the seeded importance, never on how long a
step took, so it is computed once; memory (fits) and timing (SimPy) both read this plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .context import RunContext, draw_lengths
from .sequence import SequenceTiers
from .tiers import T0, T1, T2, TIERS, TierPolicy

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

    @property
    def steps(self) -> int:
        return len(self.attended)


def sequence_tiers(scenario, policy: TierPolicy, lengths: np.ndarray) -> list[SequenceTiers]:
    """The seeded per-sequence tier state the plan evolves (one independent stream per sequence).
    hwprobe replays it (`scores: simulator`) so the real cache moves exactly the planned tokens."""
    w = scenario.workload
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence([w.seed, 2]).spawn(len(lengths))]
    return [SequenceTiers(w.prompt_tokens, w.prompt_tokens + int(n), policy, scenario.policy.importance, rng,
                          scenario.policy.scoring) for n, rng in zip(lengths, rngs)]


def plan_tiers(ctx: RunContext) -> TierPlan:
    sc = ctx.scenario
    w = sc.workload
    lengths = draw_lengths(w, w.batch_size)
    steps = int(lengths.max())
    seqs = sequence_tiers(sc, ctx.policy, lengths)
    attend = np.zeros((steps, ATTENDED_COLUMNS), dtype=np.int64)
    after = np.zeros((steps, len(TIERS)), dtype=np.int64)
    moves = np.zeros((steps, MOVE_COLUMNS), dtype=np.int64)
    retier = np.zeros(steps, dtype=bool)
    # running per-sequence counts so the per-step loop stays O(batch)
    counts = np.zeros((w.batch_size, len(TIERS)), dtype=np.int64)
    counts[:, T0] = w.prompt_tokens
    for step in range(steps):
        active = np.flatnonzero(lengths > step)
        due = ctx.policy.retier_due(step)
        retier[step] = due
        counts[active, T0] += 1  # the step's new token; sequences catch up on it at their next re-tier
        a = counts[active]
        attend[step] = (a[:, T0].sum(), a[:, T1].sum(), a[:, T2].sum(), len(active))
        if due:
            for i in active:
                seqs[i].advance(step + 1 - seqs[i].steps_done)
                mv = seqs[i].retier()
                counts[i] = seqs[i].counts()
                moves[step] += (mv.to_t1_from_t0, mv.to_t2_from_t0, mv.to_t0_from_t1, mv.to_t0_from_t2, mv.evicted)
        after[step] = counts[active].sum(axis=0)
    return TierPlan(lengths=lengths, attended=attend, tiers_after=after, retier_moves=moves, retier_due=retier)
