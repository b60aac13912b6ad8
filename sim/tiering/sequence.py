"""Token-level tier state of one sequence in the simulator, with seeded long-tailed importance.

The simulator has no real attention: each token gets an importance drawn as
Gamma(shape) ** power (defaults fitted to the paper's measured shape), and its cumulative score
grows by its importance for every decode step it is attended (paper: cumulative, no decay).
Only which tokens migrate depends on this; the tier sizes follow from the ratios.
"""

from __future__ import annotations

import numpy as np

from .tiers import T0, T3, Moves, TierPolicy, assign_tiers, diff_moves, protected_mask, tier_counts


def draw_importance(rng: np.random.Generator, n: int, shape: float, power: float) -> np.ndarray:
    return rng.gamma(shape, size=n) ** power


class SequenceTiers:
    def __init__(self, prompt_tokens: int, final_tokens: int, policy: TierPolicy, importance_cfg,
                 rng: np.random.Generator, scoring: str = "cumulative"):
        self.prompt_tokens = prompt_tokens
        self.policy = policy
        self.cfg = importance_cfg
        self.rng = rng
        self.scoring = scoring
        self.tier = np.full(final_tokens, T0, dtype=np.int8)
        self.importance = draw_importance(rng, final_tokens, importance_cfg.gamma_shape, importance_cfg.gamma_power)
        self.score = np.zeros(final_tokens)
        self.n = prompt_tokens
        self._scored_upto_step = 0  # steps already folded into `score`
        self.steps_done = 0

    def append_token(self) -> None:
        """One decode step: the new token's K/V is written to T0."""
        self.advance(1)

    def advance(self, steps: int) -> None:
        """`steps` decode steps without a re-tier: each writes one new token to T0."""
        self.n += steps
        self.steps_done += steps

    def _fold_scores(self) -> None:
        """Cumulative attention since the last fold: importance x steps attended (T3 gets none)."""
        n = self.n
        alive = self.tier[:n] != T3
        if self.scoring == "recent":
            self.score[:n] = np.where(alive, self.importance[:n], 0.0)
        else:
            # token i (position) exists from decode step max(0, i - prompt) onward
            born = np.maximum(0, np.arange(n) - self.prompt_tokens)
            steps = self.steps_done - np.maximum(born, self._scored_upto_step)
            self.score[:n] += np.where(alive, self.importance[:n] * np.maximum(steps, 0), 0.0)
        self._scored_upto_step = self.steps_done
        if self.cfg.drift > 0:
            fresh = draw_importance(self.rng, n, self.cfg.gamma_shape, self.cfg.gamma_power)
            self.importance[:n] = (1 - self.cfg.drift) * self.importance[:n] + self.cfg.drift * fresh

    def retier(self) -> Moves:
        self._fold_scores()
        n = self.n
        old = self.tier[:n]
        rule = self.policy.at_retier(self.steps_done)
        new = assign_tiers(old, self.score[:n], protected_mask(n, self.prompt_tokens, rule), rule)
        moves = diff_moves(old, new)
        self.tier[:n] = new
        return moves

    def counts(self) -> tuple[int, int, int, int]:
        return tier_counts(self.tier[: self.n])
