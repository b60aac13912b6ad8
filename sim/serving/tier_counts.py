"""Tier counts of a serving sequence at its current length, from the ratios alone (`counts.count_trajectory`,
the same rule the closed batch's capacity uses).

A sequence of prompt P at decode step s (0-based; the step that writes its (s+1)-th generated token's
K/V) holds P + s + 1 tokens: during the step it attends the counts after step s - 1 plus the new
token in T0 (`attended`), and after it holds the counts after step s with its re-tier applied
(`after`). Re-tiers run on each sequence's own step count (`TierPolicy.retier_due`), as in a batch.
"""

from __future__ import annotations

import numpy as np

from sim.tiering.counts import count_trajectory
from sim.tiering.tiers import T0, TIERS, TierPolicy


class TierCounter:
    """Counts (rows: sequences; columns T0..T3) by prompt and decode step, vectorised over
    sequences; one trajectory per distinct prompt, as long as its longest request needs, all in one
    array (`_rows`) so that a step's sequences of many prompt lengths are looked up at once. A
    `prompt` argument is one length for all `steps` or one per step."""

    def __init__(self, policy: TierPolicy, prompts: np.ndarray, outputs: np.ndarray):
        self.policy = policy
        self.tiering = policy.tiering
        if self.tiering:
            self._prompts = np.unique(prompts)  # sorted: a prompt's trajectory is found by searchsorted
            trajs = [count_trajectory(int(p), max(int(outputs[prompts == p].max()), 1), policy)  # one spare row
                     for p in self._prompts]
            self._len = np.array([len(tr) for tr in trajs], dtype=np.int64)
            self._start = np.concatenate([[0], np.cumsum(self._len)[:-1]])
            self._rows = np.concatenate(trajs)

    def _trajectory_rows(self, prompt, steps: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self._prompts, prompt)
        assert np.all(steps < self._len[k]), "a step past its prompt's trajectory"
        return self._rows[self._start[k] + steps]

    def after(self, prompt, steps: np.ndarray) -> np.ndarray:
        """Counts after decode step `steps` (its re-tier applied)."""
        if not self.tiering:
            out = np.zeros((len(steps), len(TIERS)), dtype=np.int64)
            out[:, T0] = prompt + steps + 1
            return out
        return self._trajectory_rows(prompt, steps)

    def attended(self, prompt, steps: np.ndarray) -> np.ndarray:
        """Counts during decode step `steps`: after step - 1 (the prompt alone before step 0), plus the new token."""
        if not self.tiering:
            return self.after(prompt, steps)
        out = self._trajectory_rows(prompt, np.maximum(steps - 1, 0))
        first = steps == 0
        out[first] = 0
        out[first, T0] = np.broadcast_to(prompt, steps.shape)[first]
        out[:, T0] += 1
        return out

    def held(self, prompt, generated: np.ndarray) -> np.ndarray:
        """Counts a sequence holds between steps with `generated` output tokens (>= 1): its cache
        is P + generated - 1 tokens (the last sampled token is written by the next step)."""
        steps = np.asarray(generated) - 2
        out = self.after(prompt, np.maximum(steps, 0)).copy()
        first = steps < 0
        out[first] = 0
        out[first, T0] = np.broadcast_to(prompt, steps.shape)[first]
        return out

    def step_counts(self, prompts: np.ndarray, generated: np.ndarray, decoding: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(during the step, after it) for running requests: a decoding one at its decode step
        generated - 1 (`attended`, `after`); a (re)prefilling one what it holds once prefilled,
        prompt + generated tokens (`held` at generated + 1), both times."""
        if not self.tiering:  # every token in T0: prompt + generated either way
            out = np.zeros((len(prompts), len(TIERS)), dtype=np.int64)
            out[:, T0] = prompts + generated
            return out, out
        if decoding.all():  # no prefills (most steps): look the decodes up directly, no masks or copies
            steps = generated - 1
            return self.attended(prompts, steps), self.after(prompts, steps)
        att = np.empty((len(prompts), len(TIERS)), dtype=np.int64)
        aft = np.empty_like(att)
        dec, pre = decoding, ~decoding
        steps = generated[dec] - 1
        att[dec], aft[dec] = self.attended(prompts[dec], steps), self.after(prompts[dec], steps)
        att[pre] = aft[pre] = self.held(prompts[pre], generated[pre] + 1)
        return att, aft

    def retier_due(self, steps: np.ndarray) -> np.ndarray:
        if not self.tiering:
            return np.zeros(len(steps), dtype=bool)
        return (steps + 1) % self.policy.retier_interval == 0

