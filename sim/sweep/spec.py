"""The sweep spec: a base scenario, axes over scenario fields, a level of detail, the metrics kept.

    base: ../h200-7b-batch.yaml        # a scenario file (relative to the spec) or an inline mapping
    level: fast                        # full (the scenario's sim.detail; layer: the SimPy reference) |
                                       # fast (sim.detail fast: numpy steps, within 1% of layer) |
                                       # projection (analytic: sampled steps, no re-tier churn)
    max_batch: true                    # search each point's max batch (costs time at level full)
    profile: p.yaml                    # optional measured profile (relative to the spec)
    keep: [fits, throughput_tok_per_s] # optional; default every scalar summary metric
    axes:                              # blocks combine by product, the first varying slowest
      - grid:                          # product of the lists, the first key varying slowest
          hardware.gpu: [h100-sxm, h200-sxm]
          workload.batch_size: {range: [8, 72, 8]}   # like Python's range: stop excluded
      - zip:                           # lists of one length, taken together
          policy.kind: [full_hbm, tiered]
          policy.hbm_ratio: [1.0, 0.5]
      - points:                        # explicit combinations
          - {workload.prompt_tokens: 512, workload.reasoning_tokens: 4096}

Every point is validated as a scenario before any work; bad input is one ConfigError line naming
the spec file and the field.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.inputs.cost import check_sweep_points
from sim.inputs.errors import ConfigError
from sim.inputs.limits import MAX_TEXT_CHARS
from sim.inputs.profile import Profile, load_profile
from sim.inputs.reader import file_sha256, read_yaml
from sim.inputs.scenario import Scenario, scenario_from_dict, validation_error_line
from sim.runner.store import file_digests

from .points import Level, metric_names, point_key

MAX_POINTS = 2**20  # points in one sweep (~1M): far above a study, far below exhausting memory
MAX_RANGE_VALUES = 2**20  # values one range may produce
MAX_RANGE_BOUND = 2**53  # a range's start, stop and step (every integer below it is a float exactly)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class AxisBlock(_Strict):
    """One block of axes: exactly one of `grid`, `zip` or `points` (values checked on expansion)."""

    grid: dict[str, Any] | None = None  # path -> list of values, or {range: [start, stop, step]}
    zip: dict[str, list[Any]] | None = None  # path -> list; all of one length
    points: list[dict[str, Any]] | None = None  # each a mapping path -> value

    @model_validator(mode="after")
    def _one_kind(self):
        given = [k for k in ("grid", "zip", "points") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of grid, zip or points, got {', '.join(given) or 'none'}")
        return self


class SweepSpec(_Strict):
    name: str | None = Field(None, min_length=1, max_length=200)
    description: str = Field("", max_length=MAX_TEXT_CHARS)
    base: str | dict[str, Any]
    level: Literal["full", "fast", "projection"]
    max_batch: bool = True
    profile: str | None = Field(None, min_length=1, max_length=MAX_TEXT_CHARS)
    keep: list[str] | None = Field(None, min_length=1)
    axes: list[AxisBlock] = []


@dataclass(frozen=True)
class ProfileRef:
    path: str
    sha256: str  # of the file's bytes: what the point's hash takes
    profile: Profile


@dataclass(frozen=True)
class Point:
    index: int
    overrides: dict[str, Any]  # swept path -> value, as the spec gives it
    scenario: Scenario  # resolved: base + overrides, validated
    profile: ProfileRef | None
    files: dict[str, str]  # sha256 of files the scenario names (store.file_digests)
    key: str  # sha256 hex of what determines the result (points.point_key)


@dataclass(frozen=True)
class SweepPlan:
    source: str
    name: str
    level: Level
    columns: list[str]  # swept paths, in order of first appearance
    metrics: list[str]  # kept summary metrics, in the summary's order
    points: list[Point]  # in spec order


# ---- loading ------------------------------------------------------------------------------

def load_spec(path: str | Path, *, allow_large: bool = False) -> SweepPlan:
    """Read, validate and expand a sweep spec; every point validated as a scenario. Past
    MAX_SWEEP_POINTS points a ConfigError before any is validated, unless `allow_large`."""
    source = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", source=source)
    try:
        spec = SweepSpec.model_validate(data, strict=True)
    except ValidationError as err:
        raise validation_error_line(err, source) from None
    return plan_sweep(spec, Path(path).parent, source, allow_large=allow_large)


def plan_sweep(spec: SweepSpec, root: Path, source: str, *, allow_large: bool = False) -> SweepPlan:
    level = Level(spec.level, spec.max_batch)
    metrics = _kept_metrics(spec.keep, level, source)
    base = _base_data(spec.base, root, source)
    blocks = [_expand_block(b, i, source) for i, b in enumerate(spec.axes)]
    columns = _columns(blocks, source)
    total = math.prod(len(b) for b in blocks)
    if total > MAX_POINTS:
        raise ConfigError(f"{total:,} points, more than the {MAX_POINTS:,} one sweep may hold", source=source, field="axes")
    check_sweep_points(total, allow=allow_large, source=source)
    spec_profile = _profile_ref(spec.profile, root, source, "profile") if spec.profile else None
    profiles: dict[str, ProfileRef] = {}
    digests: dict[str, str] = {}
    points = []
    for index, combo in enumerate(itertools.product(*blocks)):
        overrides = {k: v for part in combo for k, v in part.items()}
        scenario = _point_scenario(base, overrides, root, source, index)
        if getattr(scenario.workload, "arrivals", None) is not None:
            raise ConfigError(f"point {index}: serving scenarios (requests arriving) are not swept yet; "
                              "sweep closed batches", source=source, field="workload.arrivals")
        profile = spec_profile or _scenario_profile(scenario, root, source, profiles)
        files = file_digests(scenario, digests)
        key = point_key(scenario, profile.sha256 if profile else None, files, level)
        points.append(Point(index, overrides, scenario, profile, files, key))
    name = spec.name or Path(source).stem
    return SweepPlan(source, name, level, columns, metrics, points)


def _kept_metrics(keep: list[str] | None, level: Level, source: str) -> list[str]:
    names = metric_names(level.name)
    if keep is None:
        return names
    for i, name in enumerate(keep):
        if name not in names:
            raise ConfigError(f"unknown metric {name!r} at level {level.name}; one of {', '.join(names)}",
                              source=source, field=f"keep.{i}")
    if len(set(keep)) != len(keep):
        raise ConfigError("a metric is named twice", source=source, field="keep")
    return list(keep)


def _base_data(base: str | dict, root: Path, source: str) -> dict:
    """The base scenario as a mapping, a relative `model.hf_config` made relative to its file."""
    if isinstance(base, dict):
        return _resolve_hf_config(copy.deepcopy(base), root)
    path = Path(base) if Path(base).is_absolute() else root / base
    try:
        data = read_yaml(path)
    except ConfigError as err:
        raise ConfigError(f"{err.line()}", source=source, field="base") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level", source=source, field="base")
    return _resolve_hf_config(data, path.parent)


def _resolve_hf_config(data: dict, root: Path) -> dict:
    model = data.get("model")
    if isinstance(model, dict):
        hf = model.get("hf_config")
        if isinstance(hf, str) and hf and not Path(hf).is_absolute() and (root / hf).exists():
            data["model"] = {**model, "hf_config": str(root / hf)}
    return data


# ---- axes ---------------------------------------------------------------------------------

def _expand_block(block: AxisBlock, i: int, source: str) -> list[dict[str, Any]]:
    """A block's combinations, each a mapping path -> value, in spec order."""
    where = f"axes.{i}"
    if block.grid is not None:
        if not block.grid:
            raise ConfigError("grid names no field", source=source, field=f"{where}.grid")
        lists = {p: _values(v, source, f"{where}.grid.{p}") for p, v in block.grid.items()}
        size = math.prod(len(v) for v in lists.values())
        if size > MAX_POINTS:
            raise ConfigError(f"{size:,} combinations, more than the {MAX_POINTS:,} one sweep may hold",
                              source=source, field=f"{where}.grid")
        return [dict(zip(lists, combo)) for combo in itertools.product(*lists.values())]
    if block.zip is not None:
        if not block.zip:
            raise ConfigError("zip names no field", source=source, field=f"{where}.zip")
        for p in block.zip:
            _check_path(p, source, f"{where}.zip.{p}")
        lengths = {p: len(v) for p, v in block.zip.items()}
        if len(set(lengths.values())) != 1:
            shown = ", ".join(f"{p} {n}" for p, n in lengths.items())
            raise ConfigError(f"zipped lists differ in length ({shown})", source=source, field=f"{where}.zip")
        if not next(iter(lengths.values())):
            raise ConfigError("zipped lists are empty", source=source, field=f"{where}.zip")
        return [dict(zip(block.zip, combo)) for combo in zip(*block.zip.values())]
    if not block.points:
        raise ConfigError("expected at least one point", source=source, field=f"{where}.points")
    for j, point in enumerate(block.points):
        if not point:
            raise ConfigError("a point names no field", source=source, field=f"{where}.points.{j}")
        for p in point:
            _check_path(p, source, f"{where}.points.{j}.{p}")
    return [dict(p) for p in block.points]


def _values(raw: Any, source: str, field: str) -> list[Any]:
    _check_path(field.split(".grid.", 1)[1], source, field)
    if isinstance(raw, list):
        if not raw:
            raise ConfigError("expected at least one value", source=source, field=field)
        return raw
    if isinstance(raw, dict) and set(raw) == {"range"}:
        return _range(raw["range"], source, f"{field}.range")
    raise ConfigError(f"expected a list of values or {{range: [start, stop, step]}}, got {_shown(raw)}",
                      source=source, field=field)


def _range(r: Any, source: str, field: str) -> list[int | float]:
    """[start, stop, step] like Python's range (stop excluded); floats allowed, values rounded to 12 digits."""
    def number(x):  # an int of any size, or a finite float
        return isinstance(x, int) and not isinstance(x, bool) or isinstance(x, float) and math.isfinite(x)

    if not (isinstance(r, list) and len(r) == 3 and all(number(x) for x in r)):
        raise ConfigError(f"expected [start, stop, step], three numbers, got {_shown(r)}", source=source, field=field)
    start, stop, step = r
    if any(abs(x) > MAX_RANGE_BOUND for x in r):
        raise ConfigError(f"expected start, stop and step within +-{MAX_RANGE_BOUND:,}, got {_shown(r)}",
                          source=source, field=field)
    if step == 0:
        raise ConfigError("step must not be 0", source=source, field=field)
    span = (stop - start) / step  # finite unless a tiny step makes the count overflow
    if not math.isfinite(span):
        raise ConfigError(f"more than {MAX_RANGE_VALUES:,} values", source=source, field=field)
    count = math.ceil(span - 1e-9)
    if count <= 0:
        raise ConfigError(f"empty range: no value from {start} towards {stop} by {step}", source=source, field=field)
    if count > MAX_RANGE_VALUES:
        raise ConfigError(f"{count:,} values, more than {MAX_RANGE_VALUES:,}", source=source, field=field)
    if all(isinstance(x, int) for x in r):
        return list(range(start, stop, step))
    return [round(start + i * step, 12) for i in range(count)]


def _check_path(path: str, source: str, field: str) -> None:
    if not path or any(not part for part in path.split(".")):
        raise ConfigError(f"expected a dotted scenario field such as workload.batch_size, got {path!r}",
                          source=source, field=field)


def _columns(blocks: list[list[dict]], source: str) -> list[str]:
    """The swept paths in order of first appearance; a path swept by two blocks is refused."""
    columns: list[str] = []
    owner: dict[str, int] = {}
    for i, block in enumerate(blocks):
        for combo in block:
            for p in combo:
                if p in owner and owner[p] != i:
                    raise ConfigError(f"{p} is swept by axes.{owner[p]} already", source=source, field=f"axes.{i}")
                if p not in owner:
                    owner[p] = i
                    columns.append(p)
    for p in columns:  # a path inside another swept path would be set twice
        for q in columns:
            if q != p and q.startswith(p + "."):
                raise ConfigError(f"{q} lies inside {p}, also swept", source=source, field="axes")
    return columns


def _shown(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- points -------------------------------------------------------------------------------

def _point_scenario(base: dict, overrides: dict[str, Any], root: Path, source: str, index: int) -> Scenario:
    data = dict(base)  # the mappings along each set path are copied; nothing else is changed
    for path, value in overrides.items():
        node = data
        parts = path.split(".")
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = {}
            if not isinstance(child, dict):
                raise ConfigError(f"cannot set {path}: {p!r} is not a mapping in the base scenario",
                                  source=source, field=path)
            node[p] = child = dict(child)
            node = child
        node[parts[-1]] = copy.deepcopy(value) if isinstance(value, (dict, list)) else value
    if "model.hf_config" in overrides:
        _resolve_hf_config(data, root)
    try:
        return scenario_from_dict(data, source)
    except ConfigError as err:
        shown = ", ".join(f"{k}={_shown(v)}" for k, v in overrides.items())
        where = f"point {index}" + (f" ({shown})" if shown else "")
        raise ConfigError(f"{where}: {err.message}", source=source, field=err.field) from None


def _profile_ref(path: str, root: Path, source: str, field: str) -> ProfileRef:
    p = Path(path)
    if not p.is_absolute() and (root / p).exists():
        p = root / p
    try:
        profile = load_profile(p)
        digest = file_sha256(p)
    except ConfigError as err:
        raise ConfigError(err.line(), source=source, field=field) from None
    return ProfileRef(str(p), digest, profile)


def _scenario_profile(scenario: Scenario, root: Path, source: str, cache: dict) -> ProfileRef | None:
    path = scenario.hardware.profile
    if path is None:
        return None
    if path not in cache:
        cache[path] = _profile_ref(path, root, source, "hardware.profile")
    return cache[path]
