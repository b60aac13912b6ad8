"""Reading a `kvsim plan --out DIR` folder back for the report (sim/plan/files.py says what is in
it). Bad input fails with one line naming the folder or file, the field and what was expected."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import ValidationError

from sim.inputs.errors import ConfigError
from sim.inputs.reader import read_json
from sim.inputs.scenario import validation_error_line
from sim.plan.files import (
    MISS_KEYS,
    PLAN_COLUMNS,
    PLAN_CSV,
    PLAN_FILES,
    PLAN_JSON,
    PROBE_COLUMNS,
    PROBE_STEPS,
    PROBES_CSV,
    PlanDoc,
    candidate_key,
)

from .validation_table import _numbers, _read_csv

EXPECTED = f"the folder `kvsim plan --out DIR` writes ({', '.join(PLAN_FILES)})"
STATUSES = ("pass", "fail", "unsearched", "screened", "pruned")
PLAN_NUMBERS = ("rank", "gpus", "tp", "pp", "dp", "max_num_seqs", "max_num_batched_tokens", "usd_per_hour", "usd_per_million_tokens", "ttft_p99_ms", "tpot_p99_ms",
                "max_rate_per_s", "next_rate_per_s", "screen_max_rate_per_s", "verdict_requests", "verdict_duration_s",
                "host_peak_bytes")
PROBE_NUMBERS = ("gpus", "tp", "dp", "probe", "offered_rate_per_s", "requests", "measured", "window_s", "duration_s",
                 "runs", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_p99_lo_ms", "ttft_p99_hi_ms", "tpot_p50_ms",
                 "tpot_p90_ms", "tpot_p99_ms", "tpot_p99_lo_ms", "tpot_p99_hi_ms", "e2e_p99_ms", "e2e_mean_ms",
                 "goodput_req_per_s")
COUNTS = ("gpus", "tp", "dp")  # positive whole numbers in both tables


@dataclass(frozen=True)
class PlanFiles:
    folder: str
    doc: PlanDoc
    plan: pd.DataFrame  # PLAN_COLUMNS, in plan.csv's (ranked) order
    probes: pd.DataFrame  # PROBE_COLUMNS


def _count(v) -> int | None:
    """A whole-number cell: None where empty."""
    return None if pd.isna(v) else int(v)


def _text(v) -> str | None:
    """A text cell: None where empty (pandas reads it as NaN)."""
    return None if not isinstance(v, str) and pd.isna(v) else v


def row_key(r) -> str:
    """A plan.csv row's (a namedtuple of itertuples) candidate name, as probes.csv names it."""
    return candidate_key(r.gpu, r.gpus, r.tp, r.policy, _text(r.prefill), _count(r.max_num_seqs), _text(r.experts),
                         int(r.pp), _count(r.max_num_batched_tokens))


def load_plan(path: str | Path) -> PlanFiles:
    folder = Path(path)
    if not folder.is_dir():
        what = "folder not found" if not folder.exists() else "not a folder"
        raise ConfigError(f"{what}; expected {EXPECTED}", source=str(folder), field="--plan")
    for name in PLAN_FILES:  # present; each then read as every input is (a regular file, size-capped)
        if not os.path.lexists(folder / name):
            raise ConfigError(f"file not found; expected {EXPECTED}", source=str(folder / name))
    doc = _doc(folder / PLAN_JSON)
    plan = _table(folder / PLAN_CSV, PLAN_COLUMNS, PLAN_NUMBERS)
    probes = _table(folder / PROBES_CSV, PROBE_COLUMNS, PROBE_NUMBERS)
    _check_plan(plan, str(folder / PLAN_CSV))
    _check_probes(probes, plan, str(folder / PROBES_CSV))
    return PlanFiles(str(folder), doc, plan, probes)


def _doc(path: Path) -> PlanDoc:
    data = read_json(path)
    try:
        return PlanDoc.model_validate(data)
    except ValidationError as err:
        raise validation_error_line(err, str(path)) from None


def _table(path: Path, columns: list[str], numbers: tuple[str, ...]) -> pd.DataFrame:
    source = str(path)
    try:
        frame = _read_csv(path)
    except pd.errors.EmptyDataError:
        raise ConfigError(f"empty file; expected {EXPECTED}", source=source) from None
    if "experts" in columns and "experts" not in frame.columns:  # plan folders written before expert layouts
        frame["experts"] = None
    if "pp" in columns and "pp" not in frame.columns:  # ... and before pipeline layouts: no pipeline
        frame["pp"] = 1
    if "max_num_batched_tokens" in columns and "max_num_batched_tokens" not in frame.columns:  # ... before token
        frame["max_num_batched_tokens"] = None  # budgets were searched: the scenario's
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ConfigError(f"missing column(s) {', '.join(missing)}; expected {', '.join(columns)}", source=source)
    out = frame[columns].copy()
    for col in numbers:
        out[col] = _numbers(frame, col, source)
    for col in COUNTS:
        _require(out, col, source, lambda v: v >= 1 and float(v).is_integer(), "a positive whole number")
        out[col] = out[col].astype(int)
    return out


def _require(frame: pd.DataFrame, column: str, source: str, ok, expected: str) -> None:
    """Every value of `column` passes `ok`; else the first that does not, named with its data row."""
    for i, v in enumerate(frame[column]):
        if not ok(v):
            raise ConfigError(f"expected {expected}, got {str(v)[:40]!r} (data row {i + 1})", source=source, field=column)


def _flags(frame: pd.DataFrame, column: str, source: str, *, empty_ok: bool) -> None:
    """"True"/"False" (as pandas writes booleans) to bool; empty (empty_ok) to None."""
    flags = {"True": True, "False": False}
    _require(frame, column, source, lambda v: (empty_ok and pd.isna(v)) or (isinstance(v, str) and v in flags),
             "True or False" + (" (or empty)" if empty_ok else ""))
    frame[column] = pd.Series([None if pd.isna(v) else flags[v] for v in frame[column]], index=frame.index, dtype=object)


def _check_plan(plan: pd.DataFrame, source: str) -> None:
    _require(plan, "status", source, lambda v: v in STATUSES, " or ".join(STATUSES))
    _require(plan, "usd_per_hour", source, lambda v: v >= 0, "a cost of at least 0")
    _flags(plan, "max_rate_capped", source, empty_ok=True)
    keys = pd.Series([row_key(r) for r in plan.itertuples()])
    twice = keys.duplicated().to_numpy()
    if twice.any():
        i = int(twice.argmax())
        raise ConfigError(f"{keys[i]!r} listed twice (data row {i + 1}); expected one row per gpu, gpus, tp and policy",
                          source=source)
    passing = plan[plan.status == "pass"]
    _require(passing, "max_rate_per_s", source, lambda v: v > 0, "a positive max rate on every passing row")


def _check_probes(probes: pd.DataFrame, plan: pd.DataFrame, source: str) -> None:
    _require(probes, "offered_rate_per_s", source, lambda v: v > 0, "a positive rate")
    _require(probes, "step", source, lambda v: v in PROBE_STEPS, " or ".join(PROBE_STEPS))
    _require(probes, "slo_missed", source, lambda v: pd.isna(v) or set(str(v).split(";")) <= set(MISS_KEYS),
             f"empty or some of {', '.join(MISS_KEYS)} joined by ';'")
    _flags(probes, "passed", source, empty_ok=False)
    _flags(probes, "certain", source, empty_ok=False)
    keys = {row_key(r) for r in plan.itertuples()}
    _require(probes, "candidate", source, lambda v: v in keys, f"a candidate of {PLAN_CSV} in the same folder "
             "(are the files from one search?)")
