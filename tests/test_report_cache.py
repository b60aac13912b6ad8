"""The report's projection on the sweep machinery: tables identical with and without a result store,
a rerun computes nothing, a deleted or killed-off cell is all a rerun computes, and bad
--executor / --address / --cache / --workers values are one line and exit 2 before any work."""

from __future__ import annotations

import io
import signal
from dataclasses import replace

import pandas as pd
import pytest

from sim.runner.options import Execution
from sim.studies.projection_grid import DEFAULT_GRID, run_grid

from .conftest import SCENARIOS, run_cli
from .test_sweep import HANG_S, _children, start_paused, wait_gone

GRID = replace(DEFAULT_GRID, models=(("7B", "deepseek-r1-distill-qwen-7b"),), weight_dtypes=("bf16", "int4"),
               gpus=("rtx-4090", "h100-sxm"), batches=(1, 4, 16, 64), lengths=(2048, 4096))  # 8 cells


def tables(grid) -> tuple[str, str]:
    return grid.points.to_csv(index=False), grid.limits.to_csv(index=False)


@pytest.fixture(scope="module")
def fresh():
    """The grid without a store, in this process."""
    return tables(run_grid(GRID, workers=1))


def test_store_leaves_tables_alone_and_a_rerun_computes_nothing(tmp_path, fresh):
    cache = tmp_path / "cache"
    first = run_grid(GRID, execution=Execution(workers=2, cache=cache))
    assert (first.computed, first.stored) == (8, 0) and tables(first) == fresh
    assert len(list(cache.glob("*/*.json"))) == 8
    again = run_grid(GRID, execution=Execution(workers=1, cache=cache))
    assert (again.computed, again.stored) == (0, 8) and tables(again) == fresh


def test_deleted_cells_are_all_a_rerun_computes(tmp_path, fresh):
    cache = tmp_path / "cache"
    run_grid(GRID, execution=Execution(workers=1, cache=cache))
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.glob("*/*.json")}
    gone = sorted(before)[:3]
    for p in gone[:2]:
        p.unlink()
    gone[2].write_text("{not json")  # an unreadable file counts as missing too
    res = run_grid(GRID, execution=Execution(workers=2, cache=cache))
    assert (res.computed, res.stored) == (3, 5) and tables(res) == fresh
    after = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.glob("*/*.json")}
    assert set(after) == set(before)
    assert {p for p in before if after[p] == before[p]} == set(before) - set(gone)  # only those written again


GRID_SCRIPT = """
import sys
from pathlib import Path
from sim.studies import projection_grid as G
from sim.runner.options import Execution
from tests.test_report_cache import GRID

G.run_grid(GRID, execution=Execution(workers=2, cache=Path(sys.argv[1])))
"""


def test_killed_grid_loses_nothing_and_resumes(tmp_path, fresh):
    cache = tmp_path / "cache"
    proc = start_paused(["-c", GRID_SCRIPT, str(cache)], tmp_path / "paused", after=3)
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=HANG_S)
    wait_gone(workers)
    kept = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.glob("*/*.json")}
    assert len(kept) == 3  # what was stored when the signal came, and nothing after it
    res = run_grid(GRID, execution=Execution(workers=1, cache=cache))
    assert (res.computed, res.stored) == (5, 3) and tables(res) == fresh
    assert all((p.stat().st_ino, p.stat().st_mtime_ns) == v for p, v in kept.items())


def test_cli_cache_says_what_it_computed(tmp_path, monkeypatch):
    import sim.report.command as command

    monkeypatch.setattr(command, "DEFAULT_GRID", GRID)
    monkeypatch.setitem(command.build_report.__kwdefaults__, "grid_spec", GRID)
    out, cache = tmp_path / "r.html", tmp_path / "cache"
    res = run_cli("report", "--out", str(out), "--cache", str(cache), "--workers", "1")
    assert res.returncode == 0 and "projection: 8 cells computed, 0 read from" in res.stderr, res.stderr
    first = out.with_suffix(".points.csv").read_text()
    res = run_cli("report", "--out", str(out), "--cache", str(cache))
    assert res.returncode == 0 and "projection: 0 cells computed, 8 read from" in res.stderr, res.stderr
    assert out.with_suffix(".points.csv").read_text() == first


@pytest.mark.parametrize("args, field, words", [
    (["--executor", "dask"], "--executor", "expected local or ray, got 'dask'"),
    (["--address", "auto"], "--address", "only with --executor ray"),
    (["--executor", "ray", "--address", "http://head:8265"], "--address", "expected auto, HOST:PORT or ray://HOST:PORT"),
    (["--executor", "ray", "--address", "127.0.0.1:1"], "--address", "no Ray cluster answers at 127.0.0.1:1"),
    (["--workers", "0"], "--workers", "expected at least 1, got 0"),
    (["--cache", "FILE"], "--cache", "exists and is not a folder"),
])
def test_bad_execution_option_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, args, field, words):
    if "ray" in args:
        pytest.importorskip("ray", reason="Ray is not installed")
    from sim.runner import executors
    from sim.studies import projection_grid

    def no_work(*a, **k):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(executors.LocalExecutor, "start", no_work)
    monkeypatch.setattr(executors.RayExecutor, "start", no_work)
    monkeypatch.setattr(projection_grid, "cell_rows", no_work)
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / a) if a == "FILE" else a for a in args]
    out = tmp_path / "r.html"
    res = run_cli("report", "--out", str(out), *args)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"kvsim: {field}: ") and words in lines[0], lines[0]
    assert not out.exists()  # refused before any work (no_work above was never called)


def test_runs_of_scenarios_take_no_cache(tmp_path):
    res = run_cli("report", str(SCENARIOS / "h200-7b-batch.yaml"), "--out", str(tmp_path / "r.html"),
                  "--cache", str(tmp_path / "c"))
    assert res.returncode == 2 and res.stderr.startswith("kvsim: --cache: applies to the projection"), res.stderr
    assert not (tmp_path / "c").exists()


def test_cells_come_back_in_grid_order(fresh):
    """Longest cells are handed out first; the table is reassembled in grid order."""
    points = pd.read_csv(io.StringIO(fresh[0]))
    keys = points[["model", "weights", "gpu", "length"]].drop_duplicates().apply(tuple, axis=1).tolist()
    assert keys == [("7B", w, g, n) for w in ("bf16", "int4") for g in ("rtx-4090", "h100-sxm") for n in ("2K", "4K")]


REPORT_SCRIPT = """
import sys
import sim.report.command as command
from tests.test_report_cache import GRID

command.build_report.__kwdefaults__["grid_spec"] = GRID
from sim.cli.main import app
sys.argv = ["kvsim", "report", *sys.argv[1:]]
app()
"""


def test_ctrl_c_says_what_it_kept_in_one_line(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "r.html"
    proc = start_paused(["-c", REPORT_SCRIPT, "--out", str(out), "--cache", str(cache), "--workers", "2"],
                        tmp_path / "paused", after=2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=HANG_S)
    lines = [line for line in stderr.splitlines() if "interrupted" in line]
    assert proc.returncode == 130 and len(lines) == 1 and "Traceback" not in stderr, stderr
    assert len(list(cache.glob("*/*.json"))) == 2
    assert lines[0] == f"kvsim: interrupted: 2 of 8 results stored; run the same command to resume ({cache})"
    assert not out.exists()
