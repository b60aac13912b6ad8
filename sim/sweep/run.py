"""`run_sweep`: load the spec, compute the points not stored yet, store each as it arrives, write the table."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .executors import LocalExecutor, RayExecutor
from .points import Task, read_point, write_point
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
    seconds: float
    csv: Path
    parquet: Path


class SweepInterrupted(Exception):
    """Ctrl-C: what had finished is stored; the same command resumes."""

    def __init__(self, stored: int, total: int):
        self.stored, self.total = stored, total
        super().__init__(f"interrupted: {stored} of {total} points stored; run the same command to resume")


def _batch_size(executor: str, level: str, tasks: int, workers: int) -> int:
    if executor == "ray":
        return RAY_BATCH
    if level == "full":  # a point takes a tenth of a second or more: one at a time balances best
        return 1
    return max(1, min(LOCAL_BATCH_MAX, tasks // (workers * 16)))


def _task(point: Point, level) -> Task:
    prof = point.profile
    return Task(point.key, point.scenario, prof.profile if prof else None, prof.path if prof else None, level)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not enabled)


def run_sweep(spec_path: str | Path, out_dir: str | Path, *, executor: Literal["local", "ray"] = "local",
              workers: int | None = None, address: str | None = None, batch: int | None = None,
              progress: bool = True) -> SweepOutcome:
    """Bad input raises ConfigError before anything is written; Ctrl-C raises SweepInterrupted."""
    t0 = time.perf_counter()
    plan = load_spec(spec_path)
    out = Path(out_dir)
    unique: dict[str, Point] = {}
    for p in plan.points:
        unique.setdefault(p.key, p)
    summaries: dict[str, dict] = {}
    missing: list[Task] = []
    for key, p in unique.items():
        stored = read_point(out, key)
        if stored is None:
            missing.append(_task(p, plan.level))
        else:
            summaries[key] = stored
    stored_before = len(summaries)
    out.mkdir(parents=True, exist_ok=True)

    n_workers = workers or os.cpu_count() or 1
    size = batch or _batch_size(executor, plan.level.name, len(missing), n_workers)
    batches = [missing[i:i + size] for i in range(0, len(missing), size)]
    by_key = {t.key: (t, unique[t.key].profile) for t in missing}
    if batches:
        runner = RayExecutor(address, workers) if executor == "ray" else LocalExecutor(n_workers)
        results = runner.start(batches)
        try:
            with _progress(progress) as bar:
                task = bar.add_task(f"sweep {plan.name}", total=len(unique), completed=stored_before)
                for batch_results in results:
                    for key, summary in batch_results:
                        t, prof = by_key[key]
                        write_point(out, t, prof.sha256 if prof else None, summary)
                        summaries[key] = summary
                    bar.advance(task, len(batch_results))
        except KeyboardInterrupt:
            raise SweepInterrupted(len(summaries), len(unique)) from None
        finally:
            results.close()  # stops the workers where the sweep ends early
    csv, parquet = write_table(build_table(plan, summaries), out)
    return SweepOutcome(len(plan.points), len(unique), len(unique) - stored_before, stored_before,
                        time.perf_counter() - t0, csv, parquet)
