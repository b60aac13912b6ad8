"""One sweep point: its inputs and key, and its evaluation (full simulation, fast level or projection).

A point's result is a pure function of (resolved scenario, profile contents, files the scenario names,
simulator version, level of detail): `sim.runner.store` names it by their hash and keeps it.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from sim.inputs.profile import Profile
from sim.inputs.scenario import Scenario
from sim.outputs.schema import DecodeRates, DecodeTime, LinkFigures, ProjectionSummary, SimRunSummary
from sim.runner.store import INT64, result_key

KIND = "sweep point"
LevelName = Literal["full", "fast", "projection"]
# full: the scenario's own sim.detail (layer: the SimPy reference); fast: sim.detail fast (sim/decode/fast.py);
# projection: the analytic projection (sim/decode/projection.py: sampled steps, no re-tier churn)
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
        from sim.decode.projection import DEFAULT_SAMPLES

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


def point_inputs(scenario: Scenario, profile_sha256: str | None, files: dict[str, str], level: Level) -> dict[str, Any]:
    """What determines a point's result (with the simulator version): its hash's input and its stored record."""
    return {"scenario": scenario.model_dump(mode="json"), "profile_sha256": profile_sha256, "files": files,
            "level": level.key()}


def point_key(scenario: Scenario, profile_sha256: str | None, files: dict[str, str], level: Level) -> str:
    return result_key(KIND, point_inputs(scenario, profile_sha256, files, level))


# ---- evaluation (runs in worker processes and Ray tasks) --------------------------------------

@dataclass(frozen=True)
class PointTask:
    """A sweep point as a task (`sim.runner.tasks`)."""

    kind: ClassVar[str] = KIND
    key: str
    scenario: Scenario
    profile: Profile | None
    profile_path: str | None
    profile_sha256: str | None
    files: dict[str, str]
    level: Level

    def inputs(self) -> dict[str, Any]:
        return point_inputs(self.scenario, self.profile_sha256, self.files, self.level)

    def run(self) -> dict[str, Any]:
        return evaluate_point(self)  # looked up at call time

    def accepts(self, result: Any) -> bool:
        return accepts_summary(self.level.name, result)


def _value_ok(annotation: Any, value: Any, nullable: bool) -> bool:
    """`value` (from JSON) is of the scalar type `annotation` names: a bool a bool, an int an int
    within int64, a float a finite number, a str a str; None where the field may be None."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    kinds = [a for a in args if a is not type(None)] or [annotation]
    if value is None:
        return nullable or type(None) in args
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int):
        return (int in kinds or float in kinds) and -INT64 <= value < INT64
    if isinstance(value, float):
        return float in kinds and math.isfinite(value)
    return isinstance(value, str) and str in kinds


def accepts_summary(level: LevelName, result: Any) -> bool:
    """`result` has the shape evaluate_point gives at `level`: the summary's keys (LEFT_OUT and
    quiet ones aside), every metric a table keeps of its field's type (timing figures None where a
    projected point does not fit)."""
    if not isinstance(result, dict):
        return False
    model = SUMMARIES[level]
    fields = set(model.model_fields) - set(LEFT_OUT)
    required = fields - set(getattr(model, "QUIET_DEFAULTS", {}))
    if not required <= set(result) <= fields:
        return False
    return all(_value_ok(model.model_fields[m].annotation, result.get(m), m in TIMING_FIELDS or m not in result)
               for m in metric_names(level))


def evaluate_point(task: PointTask) -> dict[str, Any]:
    """The summary of one point as a JSON-ready dict; a point that does not fit has null timing."""
    if task.level.name in ("full", "fast"):
        from sim.decode.simulate import simulate

        scenario = task.scenario
        if task.level.name == "fast":
            scenario = scenario.model_copy(update={"sim": scenario.sim.model_copy(update={"detail": "fast"})})
        summary = simulate(scenario, task.profile, profile_path=task.profile_path,
                           with_max_batch=task.level.max_batch).summary.model_dump(mode="json")
    else:
        from sim.decode.projection import project

        summary = project(task.scenario, task.profile, with_max_batch=task.level.max_batch).model_dump(mode="json")
        if not summary["fits"]:
            summary.update({k: None for k in TIMING_FIELDS if k in summary})
    for k in LEFT_OUT:
        summary.pop(k, None)
    return summary
