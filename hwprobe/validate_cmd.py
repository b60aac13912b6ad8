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
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import pandas as pd
import typer

from sim.errors import ConfigError

from .ratios import ratio_rows

METRICS = (  # the accuracy figures; "all" aggregates these
    ("throughput_tok_per_s", "throughput tok/s"),
    ("tpot_p50_s", "step time p50 s"),
    ("transfer_share", "transfer share"),
    ("device_memory_peak_bytes", "device memory peak B"),
)
CHECKS = (  # follow from the tier decisions alone: exact when the decisions are replayed
    ("h2d_bytes", "H2D bytes"),
    ("d2h_bytes", "D2H bytes"),
    ("host_peak_bytes", "host memory peak B"),
)
COMPARED = METRICS + CHECKS
# Measured device memory is what torch allocated (no CUDA context, no allocator slack), so the
# prediction drops the simulator's runtime reserve before comparing.
MEMORY_KEY = "device_memory_peak_bytes"
ROW_COLUMNS = ["scenario", "metric", "predicted", "measured", "rel_error"]
STAT_COLUMNS = ["metric", "n", "median_abs_rel_error", "worst_rel_error", "worst_scenario"]
ALL_METRICS = "all"


def relative_error(predicted, measured) -> float | None:
    """(predicted - measured) / measured; None where undefined (a value missing, or measured 0 while
    predicted is not: no finite relative error exists)."""
    if predicted is None or measured is None:
        return None
    p, m = float(predicted), float(measured)
    if math.isnan(p) or math.isnan(m):
        return None
    if m == 0.0:
        return 0.0 if p == 0.0 else None
    return (p - m) / m


def comparison_rows(name: str, predicted: dict, measured: dict) -> list[dict]:
    return [{"scenario": name, "metric": key, "predicted": predicted.get(key), "measured": measured.get(key),
             "rel_error": relative_error(predicted.get(key), measured.get(key))} for key, _ in COMPARED]


def error_stats(rows: pd.DataFrame) -> pd.DataFrame:
    """Per metric (and over all of METRICS, not the CHECKS): median |relative error| and the worst
    error, sign kept."""
    out = []
    headline = [k for k, _ in METRICS]
    for metric in headline + [ALL_METRICS] + [k for k, _ in CHECKS]:
        sel = rows[rows["metric"].isin(headline)] if metric == ALL_METRICS else rows[rows["metric"] == metric]
        sel = sel[sel["rel_error"].notna()]
        if sel.empty:
            out.append({"metric": metric, "n": 0, "median_abs_rel_error": None, "worst_rel_error": None,
                        "worst_scenario": None})
            continue
        err = sel["rel_error"].astype(float)
        worst = int(np.argmax(err.abs().to_numpy()))
        out.append({"metric": metric, "n": len(sel), "median_abs_rel_error": float(err.abs().median()),
                    "worst_rel_error": float(err.iloc[worst]), "worst_scenario": sel["scenario"].iloc[worst]})
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
    """sim.engine.simulate(scenario, profile).summary, the scenario's own profile if none given."""
    from sim.simulate import simulate
    from sim.profile import load_profile

    cache: dict = {}

    def predict(sc) -> dict:
        path = profile_path or sc.hardware.profile
        if path and path not in cache:
            cache[path] = load_profile(path)
        summary = simulate(sc, cache.get(path) if path else None, profile_path=path, with_max_batch=False).summary
        return {**summary, MEMORY_KEY: summary["hbm_peak_bytes"] - summary["runtime_reserve_bytes"]}

    return predict


def hwprobe_measurer(opts, runs_dir: Path | None = None):
    """Scenario -> measured summary; with `runs_dir`, each run's directory (summary.json,
    steps.csv, resolved scenario) is kept under runs_dir/<scenario name>."""
    from sim.output import write_run_dir

    from .decode import measure

    def run(sc) -> dict:
        result = measure(sc, opts)
        if runs_dir is not None:
            write_run_dir(runs_dir / sc.name, sc, result.summary, result.steps)
        return {**result.summary, MEMORY_KEY: result.summary["hbm_peak_bytes"]}

    return run


def recorded_measurer(measured_dir: Path):
    """Scenario -> the summary a past `hwprobe run` kept under measured_dir/<name> (validate's
    --runs-dir): the model can be re-checked against a GPU's measurements without the GPU."""
    import json

    def read(sc) -> dict:
        path = measured_dir / sc.name / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no measured run {path}", field="--measured") from None
        except (OSError, ValueError) as err:
            raise ConfigError(f"unreadable measured run {path}: {err}", field="--measured") from None
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
        import json

        from sim.atomic import write_text_atomic
        from sim.output import default_run_path
        from sim.scenario import load_scenario

        from .decode import RunOptions
        from .run_cmd import DeviceUnavailable, fail, resolve_device, with_source

        try:
            dev = None if measured else resolve_device(device)
            loaded = [load_scenario(p, set_) for p in scenarios]
            if measured and not measured.is_dir():
                raise ConfigError(f"not a directory: {measured}", field="--measured")
        except DeviceUnavailable as err:
            fail("validate", str(err))
        except ConfigError as err:
            fail("validate", err.line())
        predict = simulator_predictor(str(profile) if profile else None)
        measure = recorded_measurer(measured) if measured else hwprobe_measurer(
            RunOptions(device=dev, layers=layers, attention=attention, cpu_threads=threads, scores=scores), runs_dir)
        source = {id(sc): path for sc, path in zip(loaded, scenarios)}

        def named(fn):
            def call(sc):
                try:
                    return fn(sc)
                except ConfigError as err:
                    raise with_source(err, source[id(sc)]) from None
            return call

        out_path = out or default_run_path("validate", ".csv")
        ratios_path = out_path.with_suffix(".ratios.csv")

        clock = [time.monotonic()]

        def keep(so_far: pd.DataFrame) -> None:  # after every scenario: a cut-short grid keeps its rows
            write_text_atomic(out_path, so_far.to_csv(index=False))
            write_text_atomic(ratios_path, ratio_rows(loaded, so_far).to_csv(index=False))
            done = so_far["scenario"].nunique()
            last = so_far.iloc[-len(COMPARED):].set_index("metric")
            now = time.monotonic()
            elapsed_s, clock[0] = now - clock[0], now
            print(f"[{done}/{len(loaded)}] {last['scenario'].iloc[0]}: throughput predicted "
                  f"{_cell(last.at['throughput_tok_per_s', 'predicted'])}, measured "
                  f"{_cell(last.at['throughput_tok_per_s', 'measured'])} tok/s ({elapsed_s:.0f} s)",
                  file=sys.stderr, flush=True)

        failed = []

        def report(sc, what: str, err: Exception) -> None:
            failed.append(sc.name)
            print(f"hwprobe validate: {sc.name}: {what} failed: {_one_line(err)}", file=sys.stderr)

        def exit_if_failed() -> None:
            if failed:
                print(f"hwprobe validate: {len(failed)} of {len(loaded)} scenario(s) failed: {', '.join(failed)}",
                      file=sys.stderr)
                raise typer.Exit(1)

        rows, stats = validate(loaded, named(predict), named(measure), progress=keep, on_error=report)
        ratios = ratio_rows(loaded, rows)
        write_text_atomic(out_path, rows.to_csv(index=False))
        write_text_atomic(ratios_path, ratios.to_csv(index=False))
        write_text_atomic(out_path.with_suffix(".errors.csv"), stats.to_csv(index=False))
        if as_json:
            print(json.dumps({"rows": rows.to_dict(orient="records"), "errors": stats.to_dict(orient="records"),
                              "ratios": ratios.to_dict(orient="records")}, indent=2, default=float))
            exit_if_failed()
            return
        print_tables(rows, stats, ratios)
        if scores == "simulator" and not measured:
            checks = rows[rows["metric"].isin([k for k, _ in CHECKS])]
            off = checks[checks["rel_error"].abs() > 0]
            print("re-tier decisions replayed from the simulator: traffic and host memory "
                  + ("agree exactly" if off.empty else f"DIFFER in {len(off)} row(s): the cache and the simulator disagree"))
        if dev == "cpu" and not profile:
            print("note: measured on the CPU; predictions are for each scenario's GPU unless a CPU profile is given")
        print("note: device memory compares allocated bytes: the prediction leaves out the simulator's runtime reserve")
        print(f"wrote {out_path}, {out_path.with_suffix('.errors.csv')} and {ratios_path}")
        exit_if_failed()
