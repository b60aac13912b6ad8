"""One sweep point: its hash, its evaluation and its stored result.

A point's result is a pure function of (resolved scenario, profile contents, files the scenario names,
simulator version, level of detail), so the sha256 of their canonical JSON names it: a rerun finds
it, and executors on other machines need no shared state. Each result is one small JSON file,
`points/<key[:2]>/<key>.json`, written atomically by the process that drives the sweep.
"""

from __future__ import annotations

import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from .. import __version__
from ..atomic import write_text_atomic
from ..profile import Profile
from ..scenario import Scenario
from ..schema import DecodeRates, DecodeTime, Document, LinkFigures, ProjectionSummary, SimRunSummary

LevelName = Literal["full", "fast", "projection"]
# full: the scenario's own sim.detail (layer: the SimPy reference); fast: sim.detail fast (sim/fast.py);
# projection: the analytic projection (sim/projection.py: sampled steps, no re-tier churn)
SUMMARIES = {"full": SimRunSummary, "fast": SimRunSummary, "projection": ProjectionSummary}
# figures that need a run that fits: null when it does not (the full simulation leaves them None itself)
TIMING_FIELDS = frozenset(DecodeTime.model_fields) | frozenset(DecodeRates.model_fields) | frozenset(LinkFigures.model_fields)
LEFT_OUT = ("resolved_scenario",)  # stored once beside the summary, not inside it


@dataclass(frozen=True)
class Level:
    name: LevelName
    max_batch: bool = True  # search each point's max batch

    def key(self) -> dict[str, Any]:
        """What of the level changes a result (it goes into the point's hash)."""
        from ..projection import DEFAULT_SAMPLES

        extra = {"samples": DEFAULT_SAMPLES} if self.name == "projection" else {}
        return {"level": self.name, "max_batch": self.max_batch, **extra}


def _scalar(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return all(_scalar(a) for a in typing.get_args(annotation))
    return origin is None and annotation is not dict


def metric_names(level: LevelName) -> list[str]:
    """The scalar summary fields of a level, in the summary's order: the metrics a table can keep."""
    fields = SUMMARIES[level].model_fields
    return [name for name, info in fields.items() if _scalar(info.annotation) and name not in LEFT_OUT]


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def point_key(scenario: Scenario, profile_sha256: str | None, files: dict[str, str], level: Level) -> str:
    payload = {"scenario": scenario.model_dump(mode="json"), "profile_sha256": profile_sha256, "files": files,
               "simulator": __version__, "level": level.key()}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


# ---- evaluation (runs in worker processes and Ray tasks) --------------------------------------

@dataclass(frozen=True)
class Task:
    key: str
    scenario: Scenario
    profile: Profile | None
    profile_path: str | None
    level: Level


def evaluate_point(task: Task) -> dict[str, Any]:
    """The summary of one point as a JSON-ready dict; a point that does not fit has null timing."""
    if task.level.name in ("full", "fast"):
        from ..simulate import simulate

        scenario = task.scenario
        if task.level.name == "fast":
            scenario = scenario.model_copy(update={"sim": scenario.sim.model_copy(update={"detail": "fast"})})
        summary = simulate(scenario, task.profile, profile_path=task.profile_path,
                           with_max_batch=task.level.max_batch).summary.model_dump(mode="json")
    else:
        from ..projection import project

        summary = project(task.scenario, task.profile, with_max_batch=task.level.max_batch).model_dump(mode="json")
        if not summary["fits"]:
            summary.update({k: None for k in TIMING_FIELDS if k in summary})
    for k in LEFT_OUT:
        summary.pop(k, None)
    return summary


def evaluate_batch(tasks: list[Task]) -> list[tuple[str, dict[str, Any]]]:
    """A batch of points in one call: what a worker process or a Ray task runs."""
    return [(t.key, evaluate_point(t)) for t in tasks]


# ---- the stored result ------------------------------------------------------------------------

class StoredPoint(Document):
    """`points/<key[:2]>/<key>.json`: one point's result and what determined it."""

    key: str
    simulator: str
    level: dict[str, Any]
    profile_sha256: str | None
    scenario: dict[str, Any]  # resolved
    summary: dict[str, Any]


def point_path(out_dir: Path, key: str) -> Path:
    return out_dir / "points" / key[:2] / f"{key}.json"


def _finite(v: Any) -> Any:
    """NaN and infinities as None (JSON has neither), in nested dicts and lists."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def write_point(out_dir: Path, task: Task, profile_sha256: str | None, summary: dict[str, Any]) -> None:
    doc = StoredPoint(key=task.key, simulator=__version__, level=task.level.key(), profile_sha256=profile_sha256,
                      scenario=task.scenario.model_dump(mode="json"), summary=_finite(summary))
    text = json.dumps(doc.model_dump(), separators=(",", ":"), allow_nan=False)
    write_text_atomic(point_path(out_dir, task.key), text + "\n")


def read_point(out_dir: Path, key: str) -> dict[str, Any] | None:
    """A stored point's summary, or None where it is missing or unreadable (then it is computed again)."""
    path = point_path(out_dir, key)
    try:
        doc = StoredPoint.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return None
    return doc.summary if doc.key == key else None
