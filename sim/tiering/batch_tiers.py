"""Token-level tier state of a whole closed batch as 2-D arrays (row = sequence, column = token
position), evolved exactly as `sequence.SequenceTiers` evolves each sequence, but in O(tokens) per
re-tier: ranks come from a selection (`np.partition`) of the few cut points a re-tier needs, not a
full sort, and the batch is one array operation instead of a Python loop over sequences.

Why the rows can share one array: in a closed batch every sequence starts at step 0 and re-tiers at
the same steps, so at a re-tier every unfinished sequence holds the same number of tokens and folds
its scores over the same steps. Rows are kept longest first, so the unfinished ones are a prefix.

Ties are broken as the stable sort of `tiers.assign_tiers` breaks them (lower position first), so the
tiers are identical to the per-sequence evolution, token for token (a test compares them).
"""

from __future__ import annotations

import numpy as np

from .sequence import draw_importance
from .tiers import T0, T3, TierPolicy, protected_mask

TRANSITIONS = 16  # (old tier, new tier) pairs, code = 4 * old + new


def bottom_k_masks(key: np.ndarray, ks: list[np.ndarray], part: np.ndarray | None = None) -> list[np.ndarray]:
    """For each per-row count vector k in `ks`: the mask of each row's k smallest entries of `key`,
    ties to the lower column (what a stable ascending sort's first k are). One partition serves all
    cut points; entries that must never be picked carry +inf and k never exceeds a row's finite count."""
    if part is None:
        part = _partition(key, ks)
    out = []
    ridx = np.arange(key.shape[0])
    for k in ks:
        pick = k > 0
        v = np.where(pick, part[ridx, np.maximum(k - 1, 0)], -np.inf)[:, None]  # the k-th smallest per row
        below = key < v
        equal = key == v
        need = k - below.sum(axis=1)  # how many entries equal to v belong to the k smallest
        mask = below | (equal & (np.cumsum(equal, axis=1) <= need[:, None]) & pick[:, None])
        out.append(mask)
    return out


def _partition(key: np.ndarray, ks: list[np.ndarray]) -> np.ndarray:
    kth = sorted({int(k) - 1 for ks_ in ks for k in ks_ if k > 0})
    return np.partition(key, kth, axis=1) if kth else key


def rank_buckets(key: np.ndarray, ks: list[np.ndarray]) -> np.ndarray:
    """How many of the nested cuts `ks` (per-row counts, ascending) each entry's rank falls below,
    ranks as a stable ascending sort of each row gives them. Selection, not sorting: with v the k-th
    smallest value, rank < k is key <= v unless values tie at a cut; the bucket sizes show whether
    one did, and only then is the tie broken by column (`bottom_k_masks`)."""
    rows = key.shape[0]
    part = _partition(key, ks)
    ridx = np.arange(rows)
    bucket = np.zeros(key.shape, dtype=np.int8)
    for k in ks:
        v = np.where(k > 0, part[ridx, np.maximum(k - 1, 0)], -np.inf)[:, None]
        bucket += key <= v
    sizes = np.bincount((ridx[:, None] * (len(ks) + 1) + bucket).ravel(), minlength=rows * (len(ks) + 1))
    sizes = sizes.reshape(rows, len(ks) + 1)[:, ::-1].cumsum(axis=1)[:, :len(ks)]  # entries below each cut
    if np.array_equal(sizes, np.column_stack(ks)):
        return bucket
    return sum(m.astype(np.int8) for m in bottom_k_masks(key, ks, part))


class BatchTiers:
    """The tier state of a batch whose sequences all start at step 0. `lengths` are reasoning tokens;
    `rngs` one generator per sequence (the streams `tier_plan.sequence_tiers` gives SequenceTiers)."""

    def __init__(self, prompt_tokens: int, lengths: np.ndarray, policy: TierPolicy, importance_cfg,
                 rngs: list[np.random.Generator], scoring: str = "cumulative"):
        self.order = np.argsort(-np.asarray(lengths), kind="stable")  # longest first: unfinished rows are a prefix
        self.lengths = np.asarray(lengths)[self.order]
        self.rngs = [rngs[i] for i in self.order]
        self.prompt_tokens, self.policy, self.cfg, self.scoring = prompt_tokens, policy, importance_cfg, scoring
        width = prompt_tokens + int(self.lengths.max(initial=0))
        self.tier = np.full((len(self.lengths), width), T0, dtype=np.int8)
        self.importance = np.zeros((len(self.lengths), width))
        for row, n in enumerate(self.lengths):  # the same draw per sequence as SequenceTiers
            rng = rngs[self.order[row]]
            self.importance[row, : prompt_tokens + n] = draw_importance(
                rng, prompt_tokens + int(n), importance_cfg.gamma_shape, importance_cfg.gamma_power)
        self.score = np.zeros_like(self.importance)
        self.scored_upto_step = 0

    def unfinished(self, steps_done: int) -> int:
        """Rows (a prefix) still decoding after `steps_done` steps."""
        return int(np.count_nonzero(self.lengths >= steps_done))

    def _fold_scores(self, rows: int, n: int, steps_done: int) -> None:
        """`SequenceTiers._fold_scores` for the first `rows` rows at once."""
        # An evicted (T3) token's score is never read again (it is no candidate of either semantics), so
        # it is left to grow rather than masked: the ranks of the others are unchanged.
        imp = self.importance[:rows, :n]
        if self.scoring == "recent":
            self.score[:rows, :n] = imp
        else:
            born = np.maximum(0, np.arange(n) - self.prompt_tokens)
            steps = np.maximum(steps_done - np.maximum(born, self.scored_upto_step), 0)
            self.score[:rows, :n] += imp * steps
        self.scored_upto_step = steps_done
        if self.cfg.drift > 0:
            for row in range(rows):
                fresh = draw_importance(self.rngs[row], n, self.cfg.gamma_shape, self.cfg.gamma_power)
                imp[row] = (1 - self.cfg.drift) * imp[row] + self.cfg.drift * fresh

    def retier(self, steps_done: int) -> np.ndarray:
        """Re-tier every unfinished row after `steps_done` decode steps. Returns the transitions per
        row, shape (rows, 4, 4): [row, old tier, new tier] token counts."""
        rows, n = self.unfinished(steps_done), self.prompt_tokens + steps_done
        self._fold_scores(rows, n, steps_done)
        old = self.tier[:rows, :n].copy()
        rule = self.policy.at_retier(steps_done)
        protected = protected_mask(n, self.prompt_tokens, rule)
        if rule.semantics == "paper_prototype":
            new = self._paper_prototype(old, protected, rows, n, rule)
        else:
            new = self._global(old, protected, rows, n, rule)
        self.tier[:rows, :n] = new
        codes = (np.arange(rows)[:, None] * TRANSITIONS + old.astype(np.int64) * 4 + new).ravel()
        return np.bincount(codes, minlength=rows * TRANSITIONS).reshape(rows, 4, 4)

    def _ranked(self, old: np.ndarray, cand: np.ndarray, rows: int, n: int, k1, k2, k3) -> np.ndarray:
        """New tiers of the candidates by ascending rank r: r < k1 -> T3, < k2 -> T2, < k3 -> T1,
        else T0 (tier codes are 0..3, so the tier is the number of cuts a token falls below)."""
        key = np.where(cand, self.score[:rows, :n], np.inf)
        return np.where(cand, rank_buckets(key, [k1, k2, k3]), old).astype(np.int8)

    def _global(self, old: np.ndarray, protected: np.ndarray, rows: int, n: int, p: TierPolicy) -> np.ndarray:
        """`tiers.assign_tiers`, global semantics, for every row."""
        unprot = ~protected
        n_unprot = int(unprot.sum())
        cand = unprot & (old != T3)
        alive = cand.sum(axis=1)
        evict = np.maximum(0, int(n_unprot * p.evict_ratio) - (n_unprot - alive))
        rest = alive - evict
        keep = np.minimum(int(n_unprot * p.hbm_ratio), rest)
        comp = np.minimum(int(n_unprot * p.compressed_ratio), rest - keep)
        new = self._ranked(old, cand, rows, n, evict, evict + comp, alive - keep)
        new[:, protected] = np.where(new[:, protected] != T3, T0, T3)
        return new

    def _paper_prototype(self, old: np.ndarray, protected: np.ndarray, rows: int, n: int, p: TierPolicy) -> np.ndarray:
        """`tiers.assign_tiers`, the prototype's semantics (candidates: GPU-resident unprotected)."""
        cand = ~protected & (old == T0)
        count = cand.sum(axis=1)
        evict = (count * p.evict_ratio).astype(np.int64)
        keep = (count * p.hbm_ratio).astype(np.int64)
        k3 = count - keep
        k1 = np.minimum(evict, k3)  # the top `keep` stay in T0 even where the evicted share overlaps them
        comp = np.minimum((count * p.compressed_ratio).astype(np.int64), np.maximum(k3 - evict, 0))
        return self._ranked(old, cand, rows, n, k1, k1 + comp, k3)
