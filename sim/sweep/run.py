"""`run_sweep`: load the spec, compute the points not stored yet, store each as it arrives, write the table."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sim.runner.options import Execution
from sim.runner.store import ResultStore
from sim.runner.tasks import Interrupted, run_tasks

from .points import PointTask
from .spec import Point, load_spec
from .table import build_table, write_table

RAY_BATCH = 32  # points per Ray task: keeps the per-task overhead (~ms) small against the work
LOCAL_BATCH_MAX = 64


@dataclass(frozen=True)
class SweepOutcome:
    points: int  # rows of the table
    unique: int  # distinct points (equal scenarios are computed once)
    computed: int
    stored_before: int  # found from an earlier run
    damaged: int  # held by the store but not verified: computed again (sim.runner.store)
    seconds: float
    csv: Path
    parquet: Path


class SweepInterrupted(Interrupted):
    """Ctrl-C: what had finished is stored; the same command resumes."""

    def __init__(self, stored: int, total: int):
        super().__init__(stored, total, "points")


def _batch_size(executor: str, level: str, tasks: int, workers: int) -> int:
    if executor == "ray":
        return RAY_BATCH
    if level == "full":  # a point takes a tenth of a second or more: one at a time balances best
        return 1
    return max(1, min(LOCAL_BATCH_MAX, tasks // (workers * 16)))


def _task(point: Point, level) -> PointTask:
    prof = point.profile
    return PointTask(point.key, point.scenario, prof.profile if prof else None, prof.path if prof else None,
                prof.sha256 if prof else None, point.files, level)


def _progress(enabled: bool):
    """Refreshed as points arrive, never from a thread of its own: workers fork after it starts."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=Console(stderr=True), auto_refresh=False, disable=not enabled)


def run_sweep(spec_path: str | Path, out_dir: str | Path, *, executor: Literal["local", "ray"] = "local",
              workers: int | None = None, address: str | None = None, batch: int | None = None,
              progress: bool = True, allow_large: bool = False) -> SweepOutcome:
    """Bad input (and, unless `allow_large`, a sweep past MAX_SWEEP_POINTS) raises ConfigError before
    anything is written; Ctrl-C raises SweepInterrupted."""
    t0 = time.perf_counter()
    plan = load_spec(spec_path, allow_large=allow_large)
    out = Path(out_dir)
    unique: dict[str, Point] = {}
    for p in plan.points:
        unique.setdefault(p.key, p)
    tasks = [_task(p, plan.level) for p in unique.values()]
    n_workers = workers or os.cpu_count() or 1
    size = batch or (lambda missing: _batch_size(executor, plan.level.name, missing, n_workers))
    out.mkdir(parents=True, exist_ok=True)
    with _progress(progress) as bar:
        task = bar.add_task(f"sweep {plan.name}", total=len(unique))

        def advance(n: int) -> None:
            bar.advance(task, n)
            bar.refresh()

        def found(n: int) -> None:  # not a speed sample: the ETA counts computed points alone
            bar.reset(task, total=len(unique), completed=n)
            bar.refresh()

        try:
            done = run_tasks(tasks, Execution(executor, address, workers).runner(),
                             store=ResultStore(out / "points", "--out"), batch=size, advance=advance, found=found)
        except Interrupted as err:
            raise SweepInterrupted(err.stored, err.total) from None
    summaries = {t.key: s for t, s in zip(tasks, done.results)}
    csv, parquet = write_table(build_table(plan, summaries), out)
    return SweepOutcome(len(plan.points), len(unique), done.computed, done.stored_before, done.damaged,
                        time.perf_counter() - t0, csv, parquet)
