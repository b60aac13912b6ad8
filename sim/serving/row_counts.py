"""The scheduler's questions about tier counts, by request rows (indices into the `RequestTable`):
`FixedRows` answers them for fixed ratios from `tier_counts.TierCounter`'s lookups by prompt and step;
`PressureRows` for `policy.hbm_ratio: auto` (sim/tiering/pressure.py for a closed batch).

Under `auto` every token stays in T0 while the KV budget holds it; a request that re-tiers in a step
takes the T0 share the step's memory pressure sets, and takes tokens back into T0 when pressure has
fallen by its next re-tier. Its counts then depend on the pressure at each of its re-tiers, so they
are state: the counts after its last re-tier and that re-tier's decode step; during decode step s it
attends those plus the tokens written to T0 since. Requests re-tier on their own step counts, so a
step's share is chosen for the requests due: the largest that leaves, once they have re-tiered, room
in the KV budget for every running request's T0 plus its growth until its next re-tier (one
interval). Admission is full_hbm's (`PressureRows.admission_bytes`): tiering absorbs the growth of
admitted requests instead of preempting them, and does not pack more requests in. A preempted request keeps its counts (a recomputed cache re-tiers what it recomputes,
as with fixed ratios). Serving memory holds no re-tier transit (`kv_memory`), so none is reserved.
"""

from __future__ import annotations

import numpy as np

from sim.tiering.counts import protected_count, retier_counts
from sim.tiering.pressure import share_keeping
from sim.tiering.tiers import T0, T1, T2, TIERS, TierPolicy

from .kv_memory import KvMemory
from .tier_counts import TierCounter

HOST = [T1, T2]


class FixedRows:
    """Fixed ratios: a request's counts follow from its prompt and step alone."""

    def __init__(self, counter: TierCounter, prompts: np.ndarray):
        self.counter, self.prompts = counter, np.asarray(prompts, dtype=np.int64)

    def begin_step(self, rows: np.ndarray, generated: np.ndarray, decoding: np.ndarray) -> None:
        """Nothing depends on the step's pressure."""

    def step_counts(self, rows, generated, decoding):
        return self.counter.step_counts(self.prompts[rows], generated, decoding)

    def held(self, row: int, generated: int) -> np.ndarray:
        return self.counter.held(int(self.prompts[row]), np.array([generated]))[0]

    def retier_due(self, steps: np.ndarray) -> np.ndarray:
        return self.counter.retier_due(steps)

    @staticmethod
    def admission_bytes(counts: np.ndarray, hbm_bytes: np.ndarray) -> np.ndarray:
        """What admission counts per request: its HBM needs as they are."""
        return hbm_bytes

    def retier_moves(self, att: np.ndarray, aft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(to the host, back to T0) per host tier, summed over re-tiering requests: net counts only
        grow on the host under fixed ratios."""
        return np.maximum(aft[:, HOST] - att[:, HOST], 0).sum(axis=0), np.zeros(2, dtype=np.int64)

    def commit(self, rows, steps, after) -> None:
        """Nothing to remember."""


class PressureRows:
    """`policy.hbm_ratio: auto`: counts as state, shares set by each step's pressure (module doc)."""

    def __init__(self, policy: TierPolicy, memory: KvMemory, prompts: np.ndarray):
        self.policy, self.memory = policy, memory
        self.prompts = np.asarray(prompts, dtype=np.int64)
        self.base = np.zeros((len(prompts), len(TIERS)), dtype=np.int64)  # counts after the last re-tier
        self.base[:, T0] = self.prompts
        self.base_step = np.full(len(prompts), -1, dtype=np.int64)  # that re-tier's decode step (-1: none yet)
        self.share = 1.0  # of the requests that re-tier in the current step

    def attended(self, rows: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Counts during decode step `steps`: the last re-tier's plus the tokens written since, this one's included."""
        out = self.base[rows].copy()
        out[:, T0] += steps - self.base_step[rows]
        return out

    def held(self, row: int, generated: int) -> np.ndarray:
        """Counts of a cache of prompt + generated - 1 tokens (after decode step generated - 2)."""
        return self.attended(np.array([row]), np.array([generated - 2]))[0]

    def retier_due(self, steps: np.ndarray) -> np.ndarray:
        return (np.asarray(steps) + 1) % self.policy.retier_interval == 0

    def admission_bytes(self, counts: np.ndarray, hbm_bytes: np.ndarray) -> np.ndarray:
        """What admission counts per request: every token it holds (T0..T2) as if in T0. Admission is
        full_hbm's, so tiering keeps admitted requests running as they grow (instead of preempting
        them), and never admits more: every tiered token crosses the link at each step, which makes
        packing requests in by tiering a loss wherever the link binds (the report's finding)."""
        return self.memory.hbm_kv_bytes(counts[:, [T0, T1, T2]].sum(axis=1), 0, counts.sum(axis=1))

    def _unprotected(self, rows: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, protected tokens) of each row after decode step `steps`."""
        n = self.prompts[rows] + steps + 1
        prot = np.array([protected_count(int(x), int(p), self.policy) for x, p in zip(n, self.prompts[rows])],
                        dtype=np.int64)
        return n, prot

    def begin_step(self, rows: np.ndarray, generated: np.ndarray, decoding: np.ndarray) -> None:
        """The share of this step's re-tiers, from the running requests (`rows`) as they stand."""
        steps = generated - 1
        due = decoding & self.retier_due(steps)
        self.share = 1.0
        if not due.any():
            return
        m = self.memory
        now = self.attended(rows, steps)  # a prefill: what it holds once prefilled (its step generated - 1 too)
        staged = m.staging_bytes_per_token * (now[decoding][:, HOST]).sum()
        budget = (m.kv_budget_bytes - staged) / m.pool_bytes_per_token - len(rows) * self.policy.retier_interval
        n, prot = self._unprotected(rows[due], steps[due])
        unprot = int((n - prot).sum())
        if unprot:
            fixed = now[~due, T0].sum() + prot.sum()
            self.share = float(np.clip((budget - fixed) / unprot, 0.0, 1.0))

    def step_counts(self, rows, generated, decoding):
        """(during the step, after it): a decode at step generated - 1, re-tiered at the step's share
        if due; a (re)prefilling request what it holds once prefilled, both times."""
        steps = generated - 1  # a prefill holds what it held after step generated - 2, plus the sampled token
        att = self.attended(rows, steps)
        aft = att.copy()
        due = decoding & self.retier_due(steps)
        if due.any():
            n, prot = self._unprotected(rows[due], steps[due])
            for k, i in enumerate(np.flatnonzero(due)):
                unprot = int(n[k] - prot[k])
                rule = self.policy.at_fraction(share_keeping(int(unprot * self.share), unprot) if unprot else 1.0)
                aft[i] = retier_counts(tuple(int(x) for x in att[i]), int(n[k]), int(self.prompts[rows[i]]), rule)
        return att, aft

    @staticmethod
    def retier_moves(att: np.ndarray, aft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(to the host, back to T0) per host tier, net, summed over the re-tiering requests."""
        diff = aft[:, HOST] - att[:, HOST]
        return np.maximum(diff, 0).sum(axis=0), np.maximum(-diff, 0).sum(axis=0)

    def commit(self, rows: np.ndarray, steps: np.ndarray, after: np.ndarray) -> None:
        """The step's decodes ran: those that re-tiered keep their new counts."""
        due = self.retier_due(steps)
        self.base[rows[due]] = after[due]
        self.base_step[rows[due]] = steps[due]
