"""Tier policy: which tokens live in T0 (HBM), T1 (host, full precision), T2 (host, compressed)
or T3 (evicted). Pure array functions shared by the simulator and the real cache in hwprobe.

Two semantics (DESIGN.md "Tier policy"):
- `global`: ratios apply to all unprotected tokens of a sequence, evicted ones included, so the
  evicted share is a target for the whole sequence and does not compound.
- `paper_prototype`: the authors' code. Candidates are only GPU-resident unprotected tokens; the
  bottom int(n*evict_ratio) are deleted, the top int(n*hbm_ratio) stay, the rest go to the host,
  where they stay forever (never promoted, never evicted). Eviction compounds at every re-tier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.inputs.scenario import DEFAULT_POLICY

T0, T1, T2, T3 = 0, 1, 2, 3
TIERS = (T0, T1, T2, T3)


@dataclass(frozen=True)
class TierPolicy:
    """The tier rule's parameters; defaults are the scenario schema's (sim/inputs/scenario.py DEFAULT_POLICY)."""

    kind: str = DEFAULT_POLICY.kind  # full_hbm | evict_only | tiered
    semantics: str = DEFAULT_POLICY.semantics  # global | paper_prototype
    hbm_ratio: float = DEFAULT_POLICY.hbm_ratio
    evict_ratio: float = DEFAULT_POLICY.evict_ratio
    compressed_ratio: float = DEFAULT_POLICY.compressed_ratio
    retier_interval: int = DEFAULT_POLICY.retier_interval
    sink_tokens: int = DEFAULT_POLICY.sink_tokens
    recent_window: int = DEFAULT_POLICY.recent_window
    protect_prompt: bool = DEFAULT_POLICY.protect_prompt
    # hbm_ratio: auto (sim/tiering/pressure.py): the T0 share is chosen per re-tier by memory pressure, and
    # evict_ratio / compressed_ratio are shares of the tokens pressure pushes out of T0
    auto: bool = False
    hbm_schedule: tuple[float, ...] | None = None  # auto, resolved for one batch: T0 share at each re-tier

    @classmethod
    def from_config(cls, policy) -> "TierPolicy":
        """From a scenario's PolicyCfg. evict_only keeps every non-evicted candidate in T0; `auto`
        starts unresolved (every token in T0 until `pressure.resolve` gives it a schedule)."""
        auto = policy.hbm_ratio == "auto"
        hbm, comp = (1.0 if auto else policy.hbm_ratio), policy.compressed_ratio
        if policy.kind == "evict_only":
            hbm, comp = 1.0 - policy.evict_ratio, 0.0
        return cls(
            kind=policy.kind, semantics=policy.semantics, hbm_ratio=hbm,
            evict_ratio=policy.evict_ratio, compressed_ratio=comp,
            retier_interval=policy.retier_interval, sink_tokens=policy.sink_tokens,
            recent_window=policy.recent_window, protect_prompt=policy.protect_prompt,
            auto=auto and policy.kind == "tiered",
        )

    def at_fraction(self, hbm_fraction: float) -> "TierPolicy":
        """The fixed-ratio rule an auto policy applies at one re-tier: `hbm_fraction` of the
        unprotected tokens stay in T0; of the rest, evict_ratio are deleted and compressed_ratio
        go to T2 (so at 1.0 nothing moves)."""
        out = 1.0 - hbm_fraction
        return replace(self, auto=False, hbm_schedule=None, hbm_ratio=hbm_fraction,
                       evict_ratio=out * self.evict_ratio, compressed_ratio=out * self.compressed_ratio)

    def at_retier(self, steps_done: int) -> "TierPolicy":
        """The rule of the re-tier after `steps_done` decode steps (itself, unless auto)."""
        if not self.auto:
            return self
        if self.hbm_schedule is None:
            raise ValueError("hbm_ratio auto: resolve its pressure schedule for a batch first (sim/tiering/pressure.py)")
        return self.at_fraction(self.hbm_schedule[steps_done // self.retier_interval - 1])

    @property
    def tiering(self) -> bool:
        return self.kind != "full_hbm"

    def retier_due(self, step: int) -> bool:
        """Re-tier after decode step `step` (0-based), as the paper's `(step + 1) % interval == 0`."""
        return self.tiering and (step + 1) % self.retier_interval == 0

    def retier_mask(self, steps: int) -> np.ndarray:
        """`retier_due` of steps 0..steps-1 as one bool array."""
        return (np.arange(steps) + 1) % self.retier_interval == 0 if self.tiering else np.zeros(steps, dtype=bool)


def protected_mask(n_tokens: int, prompt_tokens: int, policy: TierPolicy) -> np.ndarray:
    """Tokens that never leave T0: the prompt (if protected), the first `sink_tokens` generated
    tokens, and the most recent `recent_window` tokens."""
    mask = np.zeros(n_tokens, dtype=bool)
    prompt = min(prompt_tokens, n_tokens)
    if policy.protect_prompt:
        mask[:prompt] = True
    mask[prompt : min(prompt + policy.sink_tokens, n_tokens)] = True
    if policy.recent_window > 0:
        mask[max(0, n_tokens - policy.recent_window) :] = True
    return mask


def _split_rest(rest: np.ndarray, n_comp: int, out: np.ndarray) -> None:
    """`rest` ascending by score: the lowest n_comp go to T2, the others to T1."""
    n_comp = min(n_comp, len(rest))
    out[rest[:n_comp]] = T2
    out[rest[n_comp:]] = T1


def assign_tiers(tier: np.ndarray, score: np.ndarray, protected: np.ndarray, policy: TierPolicy) -> np.ndarray:
    """New tier of every token after one re-tier. Inputs are per-token arrays of one sequence
    (one layer's view: the simulator and hwprobe rank on scores averaged over heads and layers)."""
    new = tier.copy()
    if not policy.tiering:
        return new
    if policy.auto:
        raise ValueError("assign_tiers takes one re-tier's rule: pass policy.at_retier(steps_done)")
    if policy.semantics == "paper_prototype":
        idx = np.flatnonzero(~protected & (tier == T0))
        n = len(idx)
        order = idx[np.argsort(score[idx], kind="stable")]
        n_evict = int(n * policy.evict_ratio)
        n_keep = int(n * policy.hbm_ratio)
        new[order[:n_evict]] = T3
        new[order[n - n_keep :] if n_keep else order[:0]] = T0
        _split_rest(order[n_evict : n - n_keep], int(n * policy.compressed_ratio), new)
        return new
    # global
    idx = np.flatnonzero(~protected)
    n = len(idx)
    evicted = idx[tier[idx] == T3]
    alive = idx[tier[idx] != T3]
    order = alive[np.argsort(score[alive], kind="stable")]
    n_new_evict = max(0, int(n * policy.evict_ratio) - len(evicted))
    new[order[:n_new_evict]] = T3
    rest = order[n_new_evict:]
    n_keep = min(int(n * policy.hbm_ratio), len(rest))
    new[rest[len(rest) - n_keep :]] = T0
    _split_rest(rest[: len(rest) - n_keep], int(n * policy.compressed_ratio), new)
    new[protected & (new != T3)] = T0
    return new


@dataclass(frozen=True)
class Moves:
    """Token moves of one re-tier. Link traffic: demotions are device->host, promotions host->device."""

    to_t1_from_t0: int = 0  # D2H, full precision
    to_t2_from_t0: int = 0  # D2H, compressed (quantised on the GPU before the copy)
    to_t0_from_t1: int = 0  # H2D, full precision
    to_t0_from_t2: int = 0  # H2D, compressed (dequantised on the GPU)
    host_internal: int = 0  # T1 <-> T2, no link traffic
    evicted: int = 0  # -> T3, no link traffic

    @property
    def offloaded(self) -> int:
        return self.to_t1_from_t0 + self.to_t2_from_t0


def diff_moves(old: np.ndarray, new: np.ndarray) -> Moves:
    def count(a: int, b: int) -> int:
        return int(np.count_nonzero((old == a) & (new == b)))

    return Moves(
        to_t1_from_t0=count(T0, T1),
        to_t2_from_t0=count(T0, T2),
        to_t0_from_t1=count(T1, T0),
        to_t0_from_t2=count(T2, T0),
        host_internal=count(T1, T2) + count(T2, T1),
        evicted=int(np.count_nonzero((old != T3) & (new == T3))),
    )


def tier_counts(tier: np.ndarray) -> tuple[int, int, int, int]:
    c = np.bincount(tier, minlength=4)
    return int(c[0]), int(c[1]), int(c[2]), int(c[3])
