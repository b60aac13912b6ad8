"""Lengths drawn per sequence from the scenario's seed: the distribution schema and the draw rule
shared by closed batches and served requests. Besides the parametric kinds, a distribution may be
named: one read from a published production trace in sim/catalog/length_dists.yaml."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np
import yaml
from pydantic import Field, field_validator, model_validator

from .limits import MAX_NAME_CHARS, MAX_TOKENS
from .strict import Strict

PARAMETRIC = ("uniform", "normal", "lognormal")


class NamedDist(Strict):
    """One entry of sim/catalog/length_dists.yaml: knots [p, tokens] of a piecewise log-linear inverse
    CDF (generated with its source, figures and fit error by scripts/fit_length_dist.py)."""

    name: str
    source: str
    figures_read: str
    figures: dict[str, float]
    fit: str
    fit_error: dict[str, float]
    quantiles: list[tuple[float, float]]

    @model_validator(mode="after")
    def _an_inverse_cdf(self):
        p, q = np.array(self.quantiles).T
        if p[0] != 0 or p[-1] != 1 or (np.diff(p) <= 0).any() or (np.diff(q) < 0).any() or q[0] < 1:
            raise ValueError(f"{self.name}: quantiles must run from p 0 to 1, p increasing, tokens >= 1 "
                             "and non-decreasing")
        return self

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """x(u) = exp(interp(u, p, ln q)): the inverse CDF through the knots, log-linear between them."""
        p, q = np.array(self.quantiles).T
        return np.exp(np.interp(u, p, np.log(q)))


@lru_cache(maxsize=None)
def named_dists() -> dict[str, NamedDist]:
    text = resources.files("sim").joinpath("catalog", "length_dists.yaml").read_text()
    return {e["name"]: NamedDist(**e) for e in yaml.safe_load(text)["length_dists"]}


class LengthDist(Strict):
    """A distribution of lengths (reasoning; for served requests also prompt), drawn per sequence from the
    scenario's seed: a parametric kind, or a name from sim/catalog/length_dists.yaml (min / max clip it)."""

    dist: str = Field(max_length=MAX_NAME_CHARS)
    min: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max: int | None = Field(None, ge=1, le=MAX_TOKENS)
    mean: float | None = Field(None, ge=1, le=MAX_TOKENS)
    std: float | None = Field(None, ge=0, le=MAX_TOKENS)

    @field_validator("dist")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in PARAMETRIC and name not in named_dists():
            raise ValueError(f"expected one of {', '.join([*PARAMETRIC, *named_dists()])}, got {name!r}")
        return name

    @model_validator(mode="after")
    def _params(self):
        if self.dist == "uniform" and (self.min is None or self.max is None):
            raise ValueError("uniform needs min and max")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"{self.dist} needs min <= max, got min {self.min} > max {self.max}")
        if self.dist in ("normal", "lognormal") and (self.mean is None or self.std is None):
            raise ValueError(f"{self.dist} needs mean and std")
        if self.dist in named_dists() and (self.mean is not None or self.std is not None):
            raise ValueError(f"{self.dist} takes no mean or std (sim/catalog/length_dists.yaml fixes its "
                             "shape; min and max clip it)")
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
    elif rt.dist == "lognormal":  # with the given mean and std of the length itself
        var = np.log1p((rt.std / rt.mean) ** 2)
        x = rng.lognormal(np.log(rt.mean) - var / 2, np.sqrt(var), size=batch)
    else:  # named: the catalog's inverse CDF at uniform draws
        x = named_dists()[rt.dist].quantile(rng.random(size=batch))
    lo = rt.min or 1
    hi = rt.max or np.inf
    return np.clip(np.rint(x), lo, hi).astype(np.int64)
