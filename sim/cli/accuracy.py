"""`kvsim accuracy`: kvtier held against committed public measurements - end to end (published
engine figures, sim/catalog/e2e_measurements.yaml) and per operator (a held-out split of the kernel
tables) - with the median and worst error per family, GPU, engine and mode (docs/accuracy.md)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Optional

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from sim.inputs.errors import ConfigError
from sim.outputs.run_folder import to_json

MODES_HELP = "measured (the kernel tables, where they cover the GPU), datasheet, or both"


def accuracy(
    mode: str = typer.Option("both", "--mode", help=MODES_HELP),
    table: Optional[Path] = typer.Option(None, "--table", help="measurements in the committed table's form "
                                         "(default: sim/catalog/e2e_measurements.yaml)"),
    only: Optional[str] = typer.Option(None, "--only", help="comma-separated row ids (default: every row)"),
    operators: bool = typer.Option(True, "--operators/--no-operators", help="also the operator-level table"),
    workers: Optional[int] = typer.Option(None, "--workers", help="local processes (default: every core)"),
    out: Optional[Path] = typer.Option(None, "--out", help="write e2e.csv, e2e_summary.csv, operators.csv here"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    write_bands: bool = typer.Option(False, "--write-bands", help="also rewrite sim/catalog/accuracy_bands.yaml "
                                     "(the bands kvsim run, kvsim plan and the report print) from this study"),
) -> None:
    """Predicted against measured: every end-to-end row in each mode, their median and worst error per
    family, GPU and engine, and the operator-level errors on held-out kernel measurements."""
    from sim.outputs.run_folder import check_out_path
    from sim.studies.accuracy import MODES, e2e_summary, operator_table, run, simulations

    modes = MODES if mode == "both" else (mode,)
    if any(m not in MODES for m in modes):
        raise ConfigError(f"expected one of measured, datasheet, both; got {mode!r}", field="--mode")
    if workers is not None and workers < 1:
        raise ConfigError(f"expected at least 1, got {workers}", field="--workers")
    if out is not None:
        check_out_path(out, folder=True)
    if write_bands:
        _check_write_bands(mode, table, only)
    rows = _rows(table, only)
    with _progress(len(simulations(rows, modes))) as advance:
        points = run(rows, modes, workers=workers, advance=advance)
    summary = e2e_summary(points)
    ops = operator_table() if operators else pd.DataFrame()
    if as_json:
        print(to_json({"rows": _records(points), "e2e_summary": _records(summary), "operators": _records(ops)}))
    else:
        _print(points, summary, ops, modes)
    if out is not None:
        _write(out, points, summary, ops)
    if write_bands:
        _write_bands(points)


def _rows(table: Path | None, only: str | None):
    from sim.studies.e2e_table import load_measurements

    rows = load_measurements(table)
    if only is None:
        return rows
    wanted = [i.strip() for i in only.split(",") if i.strip()]
    unknown = sorted(set(wanted) - {m.id for m in rows})
    if unknown or not wanted:
        raise ConfigError(f"no row {unknown[0]!r} in the table" if unknown else "expected row ids", field="--only")
    return [m for m in rows if m.id in wanted]


@contextlib.contextmanager
def _progress(total: int):
    """A progress bar on stderr for a person at a terminal; nothing in a log."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    if not err.is_terminal:
        yield None
        return
    with Progress(TextColumn("kvsim accuracy: simulating"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("accuracy", total=total)
        yield lambda n: bar.advance(task, n)


def _records(df: pd.DataFrame) -> list[dict]:
    """Rows as plain JSON data (numpy numbers as Python ones, NaN as null)."""
    return json.loads(df.to_json(orient="records")) if not df.empty else []


def _pct(v, signed: bool = False) -> str:
    if v is None or v != v:
        return "-"
    return f"{100 * v:+.1f}%" if signed else f"{100 * v:.1f}%"


def _print(points: pd.DataFrame, summary: pd.DataFrame, ops: pd.DataFrame, modes) -> None:
    console = Console(width=shutil.get_terminal_size((160, 40)).columns)
    console.print(_rows_table(points, modes))
    console.print(_summary_table(summary))
    if not ops.empty:
        console.print(_ops_table(ops))


def _rows_table(points: pd.DataFrame, modes) -> Table:
    t = Table(title="end to end: predicted / measured - 1, per row")
    for col in ("row", "metric", "published"):  # the row's published figure, measured on its GPU
        t.add_column(col, justify="right" if col == "published" else "left")
    for mode in modes:  # kvtier's prediction with the measured kernel tables, with the datasheet model
        t.add_column(f"{mode} kernels", justify="right")
        t.add_column("error", justify="right")
    for rid, p in points.groupby("id", sort=False):
        by_mode = {r["mode"]: r for r in p.to_dict("records")}
        cells = [rid, p["metric"].iloc[0], f"{p['measured'].iloc[0]:,.2f}"]
        for mode in modes:
            r = by_mode.get(mode)
            cells += ["-", "-"] if r is None else [_num(r["predicted"]), _pct(r["error"], signed=True)]
        t.add_row(*cells)
    return t


def _num(v) -> str:
    return "-" if v is None or v != v else f"{v:,.2f}"


def _summary_table(summary: pd.DataFrame) -> Table:
    t = Table(title="end to end: |error| per family, GPU, engine, model and workload shape "
                    "(mean: signed, negative = predicted too low)")
    for col in ("mode", "by", "key", "rows", "median", "worst", "mean", "worst row"):
        t.add_column(col, justify="right" if col in ("rows", "median", "worst", "mean") else "left")
    for r in summary.to_dict("records"):
        t.add_row(r["mode"], r["by"], r["key"], str(r["rows"]), _pct(r["median_abs_error"]),
                  _pct(r["worst_abs_error"]), _pct(r["mean_error"], signed=True), r["worst_id"])
    return t


def _ops_table(ops: pd.DataFrame) -> Table:
    t = Table(title="operators: |error| on the held-out kernel measurements (datasheet model vs tables)")
    for col in ("gpu", "family", "points", "datasheet median", "p95", "worst", "tables median", "p95", "worst"):
        t.add_column(col, justify="left" if col in ("gpu", "family") else "right")
    for r in ops.to_dict("records"):
        t.add_row(r["gpu"], r["family"], str(r["points"]), *(_pct(r[f"{mode}_{stat}"]) for mode in ("datasheet", "tables")
                                                            for stat in ("median", "p95", "worst")))
    return t


def _csv_text(df: pd.DataFrame) -> str:
    """As every CSV the tools write: a text cell a spreadsheet would run as a formula neutralised."""
    from sim.outputs.csv_text import neutralise

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([neutralise(c) for c in df.columns])
    for row in df.itertuples(index=False):
        w.writerow(["" if v is None or (isinstance(v, float) and v != v) else neutralise(v) for v in row])
    return buf.getvalue()


def _write(out: Path, points: pd.DataFrame, summary: pd.DataFrame, ops: pd.DataFrame) -> None:
    from sim.outputs.atomic import write_dir_atomic

    files = {"e2e.csv": _csv_text(points), "e2e_summary.csv": _csv_text(summary)}
    if not ops.empty:
        files["operators.csv"] = _csv_text(ops)
    write_dir_atomic(out, files)
    print(f"kvsim: accuracy: {len(points)} predictions, wrote {out}/ ({', '.join(files)})", file=sys.stderr)


def _check_write_bands(mode: str, table: Path | None, only: str | None) -> None:
    """The committed bands come from the whole committed table in both modes: refused otherwise."""
    from sim.inputs.kernel_tables import tables_available

    if mode != "both" or table is not None or only is not None:
        raise ConfigError("the committed bands are the whole committed table in both modes; drop "
                          + ", ".join(o for o, given in (("--mode", mode != "both"), ("--table", table is not None),
                                                         ("--only", only is not None)) if given), field="--write-bands")
    if not tables_available():
        raise ConfigError("needs the measured kernel tables (aiconfigurator-core, the .[measured] extra) for the "
                          "measured mode", field="--write-bands")


def _commit() -> str:
    """The kvtier commit this tree is at ("+ uncommitted changes" where it differs), or "unknown"."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True,
                               text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" + uncommitted changes" if dirty else "")


def _write_bands(points: pd.DataFrame) -> None:
    from datetime import datetime, timezone

    from sim import __version__
    from sim.inputs.accuracy_bands import default_path
    from sim.outputs.atomic import write_text_atomic
    from sim.studies.accuracy import bands_text

    computed_at = {"commit": _commit(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                   "kvtier_version": __version__, "table": "sim/catalog/e2e_measurements.yaml"}
    path = default_path()
    write_text_atomic(path, bands_text(points, computed_at))
    print(f"kvsim: accuracy: wrote {path} (commit {computed_at['commit']})", file=sys.stderr)
