"""Lengths drawn per sequence from the scenario's seed: the distribution schema and the draw rule
shared by closed batches and served requests."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from .limits import MAX_TOKENS
from .strict import Strict


class LengthDist(Strict):
    """A distribution of lengths (reasoning; for served requests also prompt), drawn per sequence from the
    scenario's seed."""

    dist: Literal["uniform", "normal", "lognormal"]
    min: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max: int | None = Field(None, ge=1, le=MAX_TOKENS)
    mean: float | None = Field(None, ge=1, le=MAX_TOKENS)
    std: float | None = Field(None, ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _params(self):
        if self.dist == "uniform" and (self.min is None or self.max is None):
            raise ValueError("uniform needs min and max")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"{self.dist} needs min <= max, got min {self.min} > max {self.max}")
        if self.dist in ("normal", "lognormal") and (self.mean is None or self.std is None):
            raise ValueError(f"{self.dist} needs mean and std")
        return self


def draw_lengths(workload, batch: int) -> np.ndarray:
    """Reasoning length of each sequence, from the workload seed (first `batch` draws)."""
    rt = workload.reasoning_tokens
    if not isinstance(rt, LengthDist):
        return np.full(batch, int(rt), dtype=np.int64)
    rng = np.random.default_rng([workload.seed, 1])
    if rt.dist == "uniform":
        x = rng.integers(rt.min, rt.max + 1, size=batch)
    elif rt.dist == "normal":
        x = rng.normal(rt.mean, rt.std, size=batch)
    else:  # lognormal with the given mean and std of the length itself
        var = np.log1p((rt.std / rt.mean) ** 2)
        x = rng.lognormal(np.log(rt.mean) - var / 2, np.sqrt(var), size=batch)
    lo = rt.min or 1
    hi = rt.max or np.inf
    return np.clip(np.rint(x), lo, hi).astype(np.int64)
