"""Interpolation of measured kernel times: each table becomes a grid of log(measured / baseline) over
log coordinates (sizes, batch, tokens, heads), so between measured points the baseline carries the
physics and the grid only its smooth correction (a kernel's efficiency). The baseline is the
roofline plus `floor_s`, the table's smallest time (`floored`): a kernel's launch floor, which a bare
roofline would leave to the grid to bend around at the knee (the held-out interpolation median fell
from 4.5-6.8% to 3.1-4.4% for decode attention with it).

- Inside the grid: multilinear in the log coordinates (log-log in size).
- Outside it: the nearest edge's ratio is held and the roofline scales it - the datasheet model
  scaled to the table's edge, per dimension.
- Cells the table did not measure (a ragged or staircase table) are filled before any query, so a
  query never blends with a hole: with the ratio of the nearest measured cell in grid-index space
  (`fill_nearest`), or, for decode attention and MLA decode, the smallest ratio of the nearest
  measured cells below along each axis (`fill_from_below`).
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class RatioGrid:
    axes: tuple[np.ndarray, ...]  # log coordinates of each dimension, increasing
    log_ratio: np.ndarray  # shape = lengths of the axes, no NaN
    floor_s: float = 0.0  # added to the roofline to make the baseline the ratio is taken over

    @classmethod
    def from_points(cls, coords: np.ndarray, ratio: np.ndarray, floor_s: float = 0.0,
                    fill: Callable[[np.ndarray], np.ndarray] | None = None) -> RatioGrid:
        """`coords` (points, dims) > 0 and `ratio` (points,) > 0: measured / baseline at each point.
        `fill`: how the cells the table did not measure are filled (default `fill_nearest`)."""
        logs = np.log(np.asarray(coords, dtype=float))
        axes = tuple(np.unique(logs[:, d]) for d in range(logs.shape[1]))
        index = tuple(np.searchsorted(ax, logs[:, d]) for d, ax in enumerate(axes))
        grid = np.full(tuple(len(ax) for ax in axes), np.nan)
        grid[index] = np.log(np.asarray(ratio, dtype=float))
        return cls(axes, (fill or fill_nearest)(grid), float(floor_s))

    @classmethod
    def floored(cls, coords: np.ndarray, seconds: np.ndarray, roofline_s: np.ndarray,
                fill: Callable[[np.ndarray], np.ndarray] | None = None) -> RatioGrid:
        """The grid of measured `seconds` over (their smallest + `roofline_s`) at each point."""
        seconds = np.asarray(seconds, dtype=float)
        floor = float(seconds.min())
        return cls.from_points(coords, seconds / (np.asarray(roofline_s, dtype=float) + floor), floor, fill)

    def __call__(self, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ratio, inside) at each row of `coords` (points, dims): the interpolated measured /
        roofline ratio, and whether the point lies within the grid in every dimension."""
        coords = np.atleast_2d(np.asarray(coords, dtype=float))
        if len(coords) == 1:  # a step's one query: the same arithmetic on scalars, without array overhead
            ratio, inside = self._at(coords[0])
            return np.array([ratio]), np.array([inside])
        logs = np.log(coords)
        lo_idx, frac, inside = [], [], np.ones(len(logs), dtype=bool)
        for d, ax in enumerate(self.axes):
            x = logs[:, d]
            inside &= (x >= ax[0] - 1e-12) & (x <= ax[-1] + 1e-12)
            x = np.clip(x, ax[0], ax[-1])
            if len(ax) == 1:
                lo_idx.append(np.zeros(len(x), dtype=int))
                frac.append(np.zeros(len(x)))
                continue
            i = np.clip(np.searchsorted(ax, x, side="right") - 1, 0, len(ax) - 2)
            lo_idx.append(i)
            frac.append((x - ax[i]) / (ax[i + 1] - ax[i]))
        out = np.zeros(len(logs))
        for corner in itertools.product((0, 1), repeat=len(self.axes)):
            w = np.ones(len(logs))
            idx = []
            for d, c in enumerate(corner):
                w = w * (frac[d] if c else 1.0 - frac[d])
                idx.append(np.minimum(lo_idx[d] + c, len(self.axes[d]) - 1))
            out += w * self.log_ratio[tuple(idx)]
        return np.exp(out), inside


    @cached_property
    def _axes_lists(self) -> tuple[list[float], ...]:
        return tuple(ax.tolist() for ax in self.axes)

    @cached_property
    def _corners(self) -> tuple[tuple[int, ...], ...]:
        return tuple(itertools.product((0, 1), repeat=len(self.axes)))

    @cached_property
    def _flat(self) -> tuple[list[float], tuple[int, ...]]:
        """log_ratio as a flat list of Python floats (the same doubles) and each axis's stride in it."""
        strides = tuple(s // self.log_ratio.itemsize for s in np.ascontiguousarray(self.log_ratio).strides)
        return np.ascontiguousarray(self.log_ratio).ravel().tolist(), strides

    def _at(self, point) -> tuple[float, bool]:
        """__call__ for one point, operation for operation (numpy's log and exp on scalars, IEEE
        products and sums in the same order), so it gives the same bits."""
        if len(self.axes) == 3:
            return self._at3(point)
        lo_idx, frac, inside = [], [], True
        for d, ax in enumerate(self._axes_lists):
            x = float(np.log(point[d]))
            inside = inside and (ax[0] - 1e-12 <= x <= ax[-1] + 1e-12)
            x = min(max(x, ax[0]), ax[-1])
            if len(ax) == 1:
                lo_idx.append(0)
                frac.append(0.0)
                continue
            i = min(max(bisect_right(ax, x) - 1, 0), len(ax) - 2)
            lo_idx.append(i)
            frac.append((x - ax[i]) / (ax[i + 1] - ax[i]))
        out = 0.0
        flat, strides = self._flat
        last = [len(ax) - 1 for ax in self._axes_lists]
        for corner in self._corners:
            w = 1.0
            offset = 0
            for d, c in enumerate(corner):
                w = w * (frac[d] if c else 1.0 - frac[d])
                offset += min(lo_idx[d] + c, last[d]) * strides[d]
            out += w * flat[offset]
        return float(np.exp(out)), inside

    def _at3(self, point) -> tuple[float, bool]:
        """`_at` of a three-dimensional grid written out (a serving step asks one per layer kind): the
        same operations in the same order - weights ((1 x a0) x a1) x a2 over the corners in
        itertools.product order."""
        axes = self._axes_lists
        lo, fr, inside = [0, 0, 0], [0.0, 0.0, 0.0], True
        for d in range(3):
            ax = axes[d]
            x = float(np.log(point[d]))
            inside = inside and (ax[0] - 1e-12 <= x <= ax[-1] + 1e-12)
            x = min(max(x, ax[0]), ax[-1])
            if len(ax) > 1:
                i = min(max(bisect_right(ax, x) - 1, 0), len(ax) - 2)
                lo[d], fr[d] = i, (x - ax[i]) / (ax[i + 1] - ax[i])
        flat, (s0, s1, s2) = self._flat
        n0, n1, n2 = (len(ax) - 1 for ax in axes)
        i0, i1, i2 = lo
        f0, f1, f2 = fr
        r0, r1, r2 = 1.0 - f0, 1.0 - f1, 1.0 - f2
        a0, b0 = i0 * s0, min(i0 + 1, n0) * s0
        a1, b1 = i1 * s1, min(i1 + 1, n1) * s1
        a2, b2 = i2 * s2, min(i2 + 1, n2) * s2
        out = 0.0
        out += r0 * r1 * r2 * flat[a0 + a1 + a2]
        out += r0 * r1 * f2 * flat[a0 + a1 + b2]
        out += r0 * f1 * r2 * flat[a0 + b1 + a2]
        out += r0 * f1 * f2 * flat[a0 + b1 + b2]
        out += f0 * r1 * r2 * flat[b0 + a1 + a2]
        out += f0 * r1 * f2 * flat[b0 + a1 + b2]
        out += f0 * f1 * r2 * flat[b0 + b1 + a2]
        out += f0 * f1 * f2 * flat[b0 + b1 + b2]
        return float(np.exp(out)), inside


class LazyGrids(Mapping):
    """Grids by key, each built on first use: a table holds many slices (KV dtypes, head counts, head
    dims) and a run asks for one or two, so building every one up front cost seconds for nothing."""

    def __init__(self, build: Callable[[object], RatioGrid], parts: dict):
        self._build, self._parts, self._grids = build, parts, {}  # parts: key -> what build makes its grid of

    def __getitem__(self, key) -> RatioGrid:
        if key not in self._grids:
            self._grids[key] = self._build(self._parts[key])
        return self._grids[key]

    def __contains__(self, key) -> bool:  # (Mapping's would build the grid to find out)
        return key in self._parts

    def __iter__(self) -> Iterator:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


def fill_from_below(grid: np.ndarray) -> np.ndarray:
    """Every NaN cell takes the smallest ratio among the nearest measured cells below it along each
    axis (`_below_along`): a larger problem runs at least as efficiently as the smaller ones it
    contains, and a table's holes are mostly the large corner its collector could not fit (batch x
    tokens past its memory). A cell with no measured cell below it on any axis then takes the nearest
    cell's, measured or so filled (`fill_nearest`). The decode-attention and MLA-decode grids take it:
    held against those tables' own staircase frontier (benchmarks/staircase_fill.py) it is the closer
    fill there; on the context-attention tables the nearest cell is."""
    missing = np.isnan(grid)
    if not missing.any():
        return grid
    below = np.stack([_below_along(grid, d) for d in range(grid.ndim)])
    best = np.where(np.isnan(below), np.inf, below).min(axis=0)
    best[np.isinf(best)] = np.nan
    out = np.where(missing, best, grid)
    return fill_nearest(out) if np.isnan(out).any() else out


def fill_cold_side(grid: np.ndarray) -> np.ndarray:
    """Every NaN cell with a measured cell above it along some axis takes the largest ratio among the
    nearest measured cells above it (`_above_along`): a smaller call runs no more efficiently than the
    larger ones around it. The interior holes of a decode-attention table are mostly the points dropped
    as served from a warm L2 (`kernel_tables.cache_served`), and the larger calls beside them read cold;
    the partly warm points left below them would carry that warmth into the hole. The rest - the large
    corner the collector could not fit - fill from below (`fill_from_below`)."""
    missing = np.isnan(grid)
    if not missing.any():
        return grid
    above = np.stack([_above_along(grid, d) for d in range(grid.ndim)])
    with np.errstate(all="ignore"):
        best = np.where(np.isnan(above), -np.inf, above).max(axis=0)
    best[np.isinf(best)] = np.nan
    return fill_from_below(np.where(missing, best, grid))


def fill_past_window(grid: np.ndarray, window_index: int) -> np.ndarray:
    """A sliding window's decode-attention grid (heads, batch, tokens): every NaN cell past the window
    (token index >= `window_index`) with a measured cell past it at fewer tokens in its row takes the
    nearest one's ratio. There a call's work does not grow with the tokens cached, nor does its roofline
    (`attention_roofline_s` at min(n, W)), so the ratio carries along the tokens axis; filling from smaller
    batches (`fill_from_below`) would carry their lower ratio to a kernel that runs no better with more
    tokens. Cells left: `fill_cold_side`."""
    missing = np.isnan(grid)
    if not missing.any():
        return grid
    past = np.arange(grid.shape[-1]) >= window_index
    carried = _below_along(np.where(past, grid, np.nan), grid.ndim - 1)
    return fill_cold_side(np.where(missing & past, carried, grid))


def _above_along(grid: np.ndarray, axis: int) -> np.ndarray:
    """Each cell's nearest measured value at a higher index along `axis` (NaN where none): a backward fill."""
    return np.flip(_below_along(np.flip(grid, axis), axis), axis)


def _below_along(grid: np.ndarray, axis: int) -> np.ndarray:
    """Each cell's nearest measured value at a lower index along `axis` (NaN where none): a forward fill."""
    g = np.moveaxis(grid, axis, -1)
    idx = np.where(np.isnan(g), 0, np.arange(g.shape[-1]))
    np.maximum.accumulate(idx, axis=-1, out=idx)
    filled = np.take_along_axis(g, idx, axis=-1)
    shifted = np.full_like(filled, np.nan)
    shifted[..., 1:] = filled[..., :-1]  # strictly below: a measured cell keeps its own value elsewhere
    return np.moveaxis(shifted, -1, axis)


def fill_nearest(grid: np.ndarray) -> np.ndarray:
    """Every NaN cell takes the value of the nearest measured cell (Euclidean in index space; ties:
    the first in C order)."""
    missing = np.isnan(grid)
    if not missing.any():
        return grid
    known = np.argwhere(~missing)
    if not len(known):
        raise ValueError("a measured table with no points")
    out = grid.copy()
    cells = np.argwhere(missing)
    chunk = max(1, 4_000_000 // len(known))  # distance rows per pass: a bounded matrix
    for s in range(0, len(cells), chunk):
        part = cells[s:s + chunk]
        nearest = np.argmin(((part[:, None, :] - known[None, :, :]) ** 2).sum(axis=2), axis=1)  # first tie: C order
        out[tuple(part.T)] = grid[tuple(known[nearest].T)]
    return out
