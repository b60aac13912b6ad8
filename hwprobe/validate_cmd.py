"""`hwprobe validate`: each scenario predicted by the simulator and measured on the real cache;
a table (and CSV) of predicted, measured and relative error = (predicted - measured) / measured,
with the median and the worst error per metric.

By default the real cache replays the simulator's re-tier decisions (`--scores simulator`), so both
move the same tokens: the traffic and host-memory rows must then agree exactly for equal-length
batches (a check of the two implementations; unequal lengths copy padding, see hwprobe/cache/cache.py),
and the timing rows measure the timing model alone. `--scores attention` lets the
real cache re-tier on its own attention instead; traffic then differs by the churn of its scores.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import pandas as pd
import typer

from sim.inputs.errors import ConfigError
from sim.outputs.schema import (
    DEVICE_MEMORY_PEAK,
    ROW_COLUMNS,
    STAT_COLUMNS,
    THROUGHPUT,
    VALIDATION_CHECKS,
    VALIDATION_METRICS,
    ErrorStat,
    ValidationRow,
    relative_error,
)

from .ratios import ratio_rows

METRICS = VALIDATION_METRICS  # the accuracy figures; "all" aggregates these
CHECKS = VALIDATION_CHECKS  # follow from the tier decisions alone: exact when the decisions are replayed
COMPARED = METRICS + CHECKS
# Measured device memory is what torch allocated (no CUDA context, no allocator slack), so the
# prediction drops the simulator's runtime reserve before comparing.
MEMORY_KEY = DEVICE_MEMORY_PEAK.key
ALL_METRICS = "all"


def comparison_rows(name: str, predicted: dict, measured: dict) -> list[dict]:
    return [ValidationRow(scenario=name, metric=key, predicted=predicted.get(key), measured=measured.get(key),
                          rel_error=relative_error(predicted.get(key), measured.get(key))).model_dump()
            for key, _ in COMPARED]


def error_stats(rows: pd.DataFrame) -> pd.DataFrame:
    """Per metric (and over all of METRICS, not the CHECKS): median |relative error| and the worst
    error, sign kept."""
    out = []
    headline = [k for k, _ in METRICS]
    for metric in headline + [ALL_METRICS] + [k for k, _ in CHECKS]:
        sel = rows[rows["metric"].isin(headline)] if metric == ALL_METRICS else rows[rows["metric"] == metric]
        sel = sel[sel["rel_error"].notna()]
        if sel.empty:
            out.append(ErrorStat(metric=metric, n=0, median_abs_rel_error=None, worst_rel_error=None,
                                 worst_scenario=None).model_dump())
            continue
        err = sel["rel_error"].astype(float)
        worst = int(np.argmax(err.abs().to_numpy()))
        out.append(ErrorStat(metric=metric, n=len(sel), median_abs_rel_error=float(err.abs().median()),
                             worst_rel_error=float(err.iloc[worst]),
                             worst_scenario=sel["scenario"].iloc[worst]).model_dump())
    return pd.DataFrame(out, columns=STAT_COLUMNS)


def validate(scenarios: list, predict: Callable[[object], dict], measure: Callable[[object], dict],
             progress: Callable[[pd.DataFrame], None] | None = None,
             on_error: Callable[[object, str, Exception], None] | None = None):
    """scenarios: loaded Scenario objects. predict / measure: Scenario -> summary dict.
    `progress(rows so far)` runs after each scenario, so a long grid keeps what it measured.
    `on_error(scenario, "predict" | "measure", error)`: given, a scenario that fails (out of device
    memory, say) leaves its side of the rows empty and the grid goes on; else the error propagates.
    Returns (rows, stats) DataFrames."""

    def side(fn, sc, name) -> dict:
        if on_error is None:
            return fn(sc)
        try:
            return fn(sc)
        except Exception as err:  # noqa: BLE001 - one scenario's failure must not end a GPU grid
            on_error(sc, name, err)
            return {}

    rows = []
    for sc in scenarios:
        rows += comparison_rows(sc.name, side(predict, sc, "predict"), side(measure, sc, "measure"))
        if progress:
            progress(pd.DataFrame(rows, columns=ROW_COLUMNS))
    frame = pd.DataFrame(rows, columns=ROW_COLUMNS)
    return frame, error_stats(frame)


def simulator_predictor(profile_path: str | None):
    """Scenario -> sim.decode.simulate.simulate(scenario, profile).summary as a dict, the scenario's own
    profile if none given."""
    from sim.decode.simulate import simulate
    from sim.inputs.profile import load_profile

    cache: dict = {}

    def predict(sc) -> dict:
        path = profile_path or sc.hardware.profile
        if path and path not in cache:
            cache[path] = load_profile(path)
        summary = simulate(sc, cache.get(path) if path else None, profile_path=path, with_max_batch=False).summary
        return {**summary.model_dump(), MEMORY_KEY: summary.hbm_peak_bytes - summary.runtime_reserve_bytes}

    return predict


def hwprobe_measurer(opts, runs_dir: Path | None = None):
    """Scenario -> measured summary; with `runs_dir`, each run's directory (summary.json,
    steps.csv, resolved scenario) is kept under runs_dir/<scenario name>."""
    from sim.outputs.run_folder import safe_name, write_run_dir

    from .decode import measure_run

    def run(sc) -> dict:
        result = measure_run(sc, opts)
        if runs_dir is not None:
            write_run_dir(runs_dir / safe_name(sc.name), sc, result.summary, result.steps)
        return {**result.summary.model_dump(), MEMORY_KEY: result.summary.hbm_peak_bytes}

    return run


def recorded_measurer(measured_dir: Path):
    """Scenario -> the summary a past `hwprobe run` kept under measured_dir/<name> (validate's
    --runs-dir): the model can be re-checked against a GPU's measurements without the GPU."""
    from sim.inputs.reader import read_json
    from sim.outputs.run_folder import safe_name

    def read(sc) -> dict:
        path = measured_dir / safe_name(sc.name) / "summary.json"
        if not os.path.lexists(path):
            raise ConfigError(f"no measured run {path}", field="--measured")
        try:
            summary = read_json(path)
        except ConfigError as err:
            raise ConfigError(f"unreadable measured run {err.line()}", field="--measured") from None
        if not isinstance(summary, dict):
            raise ConfigError(f"unreadable measured run {path}: expected a JSON object", field="--measured")
        return {**summary, MEMORY_KEY: summary.get("hbm_peak_bytes")}

    return read


def _one_line(err: Exception) -> str:
    if isinstance(err, ConfigError):
        return err.line()
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _cell(v, rel: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{100 * v:+.1f} %" if rel else f"{v:.4g}"


def print_tables(rows: pd.DataFrame, stats: pd.DataFrame, ratios: pd.DataFrame) -> None:
    from rich.console import Console
    from rich.table import Table

    from .ratios import print_ratios

    labels = {**dict(COMPARED), ALL_METRICS: "all four above"}
    console = Console(width=shutil.get_terminal_size((150, 40)).columns)
    t = Table(title="predicted (simulator) vs measured (hwprobe run)")
    for col in ("scenario", "metric", "predicted", "measured", "rel. error"):
        t.add_column(col, justify="left" if col in ("scenario", "metric") else "right")
    for r in rows.itertuples():
        t.add_row(r.scenario, labels[r.metric], _cell(r.predicted), _cell(r.measured), _cell(r.rel_error, True))
    console.print(t)
    s = Table(title="relative error = (predicted - measured) / measured")
    for col in ("metric", "n", "median |error|", "worst error", "worst scenario"):
        s.add_column(col, justify="left" if col in ("metric", "worst scenario") else "right")
    for r in stats.itertuples():
        median = "-" if r.median_abs_rel_error is None else f"{100 * r.median_abs_rel_error:.1f} %"
        s.add_row(labels.get(r.metric, r.metric), str(r.n), median,
                  _cell(r.worst_rel_error, True), r.worst_scenario or "-")
    console.print(s)
    print_ratios(ratios, console)


def _load_inputs(paths: list[Path], overrides: list[str], device: str | None, measured: Path | None, *,
                 profile: Path | None = None, out_path: Path | None = None, runs_dir: Path | None = None,
                 options: dict | None = None):
    """(device, loaded scenarios): the device is None when nothing is measured (--measured). Every
    option, input file (scenarios, profiles) and output path is checked here, before any work; bad
    input exits 2 with one line."""
    from sim.inputs.profile import load_profile
    from sim.inputs.scenario import load_scenario
    from sim.outputs.run_folder import check_out_path

    from .run_cmd import DeviceUnavailable, check_run_options, fail, resolve_device

    try:
        check_run_options(**(options or {}))
        dev = None if measured else resolve_device(device)
        loaded = [load_scenario(p, overrides) for p in paths]
        if measured and not measured.is_dir():
            raise ConfigError(f"not a directory: {measured}", field="--measured")
        for prof in {str(profile)} if profile else {sc.hardware.profile for sc in loaded} - {None}:
            load_profile(prof)
        if out_path is not None:
            check_out_path(out_path, folder=False)
            for beside in (_ratios_path(out_path), _errors_path(out_path)):
                check_out_path(beside, folder=False)
        if runs_dir is not None:
            check_out_path(runs_dir, folder=True, field="--runs-dir")
    except DeviceUnavailable as err:
        fail("validate", str(err))
    except ConfigError as err:
        fail("validate", err.line())
    return dev, loaded


def _sides(loaded: list, paths: list[Path], profile: Path | None, measured: Path | None, opts, runs_dir: Path | None):
    """(predict, measure): the simulator, and hwprobe run (or the runs kept in `measured`); a
    ConfigError either raises names the scenario's file."""
    from .run_cmd import with_source

    predict = simulator_predictor(str(profile) if profile else None)
    measure = recorded_measurer(measured) if measured else hwprobe_measurer(opts, runs_dir)
    source = {id(sc): path for sc, path in zip(loaded, paths)}

    def named(fn):
        def call(sc):
            try:
                return fn(sc)
            except ConfigError as err:
                raise with_source(err, source[id(sc)]) from None
        return call

    return named(predict), named(measure)


def _ratios_path(out_path: Path) -> Path:
    return out_path.with_suffix(".ratios.csv")


def _errors_path(out_path: Path) -> Path:
    return out_path.with_suffix(".errors.csv")


class _ProgressWriter:
    """After every scenario: the rows so far and their ratios written (a cut-short grid keeps its
    rows), and one line on stderr with the throughput of the scenario just done."""

    def __init__(self, out_path: Path, loaded: list):
        self.out_path, self.loaded = out_path, loaded
        self.clock = time.monotonic()

    def __call__(self, so_far: pd.DataFrame) -> None:
        from sim.outputs.atomic import write_text_atomic
        from sim.outputs.csv_text import csv_text

        write_text_atomic(self.out_path, csv_text(so_far))
        write_text_atomic(_ratios_path(self.out_path), csv_text(ratio_rows(self.loaded, so_far)))
        done = so_far["scenario"].nunique()
        last = so_far.iloc[-len(COMPARED):].set_index("metric")
        now = time.monotonic()
        elapsed_s, self.clock = now - self.clock, now
        print(f"[{done}/{len(self.loaded)}] {last['scenario'].iloc[0]}: throughput predicted "
              f"{_cell(last.at[THROUGHPUT.key, 'predicted'])}, measured "
              f"{_cell(last.at[THROUGHPUT.key, 'measured'])} tok/s ({elapsed_s:.0f} s)",
              file=sys.stderr, flush=True)


class _Failures:
    """Scenarios whose prediction or measurement failed: each said on stderr as it happens; the
    command exits 1 at the end if there were any."""

    def __init__(self, total: int):
        self.total = total
        self.names: list[str] = []

    def report(self, sc, what: str, err: Exception) -> None:
        self.names.append(sc.name)
        print(f"hwprobe validate: {sc.name}: {what} failed: {_one_line(err)}", file=sys.stderr)

    def exit_if_any(self) -> None:
        if self.names:
            print(f"hwprobe validate: {len(self.names)} of {self.total} scenario(s) failed: {', '.join(self.names)}",
                  file=sys.stderr)
            raise typer.Exit(1)


def _write_tables(out_path: Path, rows: pd.DataFrame, stats: pd.DataFrame, ratios: pd.DataFrame) -> None:
    from sim.outputs.atomic import write_text_atomic
    from sim.outputs.csv_text import csv_text

    write_text_atomic(out_path, csv_text(rows))
    write_text_atomic(_ratios_path(out_path), csv_text(ratios))
    write_text_atomic(_errors_path(out_path), csv_text(stats))


def _print_json(rows: pd.DataFrame, stats: pd.DataFrame, ratios: pd.DataFrame) -> None:
    from sim.outputs.run_folder import to_json

    print(to_json({"rows": rows.to_dict(orient="records"), "errors": stats.to_dict(orient="records"),
                   "ratios": ratios.to_dict(orient="records")}))


def _print_outcome(rows: pd.DataFrame, stats: pd.DataFrame, ratios: pd.DataFrame, out_path: Path, *,
                   replayed: bool, cpu_without_profile: bool) -> None:
    """The tables, what the checks found when the simulator's decisions were replayed, and notes."""
    print_tables(rows, stats, ratios)
    if replayed:
        checks = rows[rows["metric"].isin([k for k, _ in CHECKS])]
        off = checks[checks["rel_error"].abs() > 0]
        print("re-tier decisions replayed from the simulator: traffic and host memory "
              + ("agree exactly" if off.empty else f"DIFFER in {len(off)} row(s): the cache and the simulator disagree"))
    if cpu_without_profile:
        print("note: measured on the CPU; predictions are for each scenario's GPU unless a CPU profile is given")
    print("note: device memory compares allocated bytes: the prediction leaves out the simulator's runtime reserve")
    print(f"wrote {out_path}, {_errors_path(out_path)} and {_ratios_path(out_path)}")


def register(app: typer.Typer) -> None:
    @app.command(name="validate")
    def validate_cmd(
        scenarios: List[Path] = typer.Argument(..., help="scenario YAMLs"),
        profile: Optional[Path] = typer.Option(None, "--profile", help="measured profile for the simulator (hwprobe calibrate)"),
        device: Optional[str] = typer.Option(None, "--device", help="cuda (default) or cpu"),
        out: Optional[Path] = typer.Option(None, "--out", help="CSV of the comparison (default runs/validate-<UTC time>.csv)"),
        set_: List[str] = typer.Option([], "--set", help="override applied to every scenario (repeatable)"),
        layers: Optional[int] = typer.Option(None, "--layers", help="cap layers run per scenario (scaled to full depth)"),
        attention: str = typer.Option("merged", "--attention", help="merged or ordered"),
        scores: str = typer.Option("simulator", "--scores", help="simulator (replay its re-tier decisions: same tokens "
                                   "moved, timing compared alone) or attention (the real cache's own scores)"),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (--device cpu)"),
        as_json: bool = typer.Option(False, "--json", help="print rows and error statistics as JSON"),
        runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help="also keep each measured run directory here"),
        measured: Optional[Path] = typer.Option(None, "--measured", help="measure nothing: compare with the runs kept "
                                                "in this directory by an earlier --runs-dir (no device needed)"),
    ) -> None:
        """Predict each scenario with the simulator, measure it with hwprobe run (or read an earlier
        measurement, --measured), compare."""
        from sim.outputs.run_folder import default_run_path

        from .decode import RunOptions

        out_path = out or default_run_path("validate", ".csv")
        dev, loaded = _load_inputs(scenarios, set_, device, measured, profile=profile, out_path=out_path,
                                   runs_dir=runs_dir, options=dict(layers=layers, threads=threads, attention=attention,
                                                                   scores=scores))
        opts = RunOptions(device=dev, layers=layers, attention=attention, cpu_threads=threads, scores=scores)
        predict, measure = _sides(loaded, scenarios, profile, measured, opts, runs_dir)
        failures = _Failures(len(loaded))
        rows, stats = validate(loaded, predict, measure, progress=_ProgressWriter(out_path, loaded),
                               on_error=failures.report)
        ratios = ratio_rows(loaded, rows)
        _write_tables(out_path, rows, stats, ratios)
        if as_json:
            _print_json(rows, stats, ratios)
        else:
            _print_outcome(rows, stats, ratios, out_path, replayed=scores == "simulator" and not measured,
                           cpu_without_profile=dev == "cpu" and not profile)
        failures.exit_if_any()
