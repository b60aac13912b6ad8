"""Every CSV the tools write neutralises text a spreadsheet would run as a formula (issue #23, OWASP's
CSV-injection advice): a text cell beginning with = + - @ tab or CR gets a leading quote. Numbers are
never touched, nor text that reads as a plain number (a negative number is not a formula) or a lone
"-"; the readers of these files undo the quote, so what was written comes back exactly; and a table
with nothing to neutralise is written byte for byte as before (the golden files are unchanged:
tests/test_golden.py)."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.outputs.csv_text import csv_text, neutralise, restore

from .conftest import run_cli
from .test_sweep import small_spec, write_spec


@pytest.mark.parametrize("text, written", [
    ("=1+1", "'=1+1"), ("+x", "'+x"), ("-2+3", "'-2+3"), ("@x", "'@x"), ("\tx", "'\tx"), ("\rx", "'\rx"),
    ("-1.5", "-1.5"), ("+3", "+3"), ("-2e-3", "-2e-3"), ("-inf", "'-inf"), ("-", "-"), ("plain", "plain"), ("", ""),
    ("'=x", "''=x"), ("'plain", "'plain"), ("a=b", "a=b"),
])
def test_cells_are_neutralised_as_owasp_advises(text, written):
    assert neutralise(text) == written
    assert restore(written) == text


@given(st.text(max_size=30))
def test_restore_undoes_neutralise_for_any_text(text):
    assert restore(neutralise(text)) == text
    assert neutralise(text) == text or neutralise(text) == "'" + text


def test_numbers_are_never_neutralised_and_a_plain_table_is_pandas_own():
    frame = pd.DataFrame({"a": [-1, 2], "b": [-0.5, float("nan")], "c": ["-3", "x"], "d": [True, False]})
    assert csv_text(frame) == frame.to_csv(index=False)
    risky = pd.DataFrame({"n": [-1.25, 3.0], "name": ["=cmd|' /C calc'!A0", "ok"], "=col": [1, 2]})
    text = csv_text(risky)
    back = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    assert list(back.columns) == ["n", "name", "'=col"]
    assert back["n"].tolist() == ["-1.25", "3.0"] and back["name"].tolist() == ["'=cmd|' /C calc'!A0", "ok"]


def test_a_swept_name_lands_in_table_csv_as_text_and_parquet_unchanged(tmp_path):
    names = ["=1+1", "+x", "-y", "@z", "-1.5", "plain"]
    spec = write_spec(tmp_path, small_spec(axes=[{"grid": {"name": names}}]))
    res = run_cli("sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", "1", "--no-progress")
    assert res.returncode == 0, res.stderr
    table = pd.read_csv(tmp_path / "o" / "table.csv", dtype=str, keep_default_na=False)
    assert table["name"].tolist() == ["'=1+1", "'+x", "'-y", "'@z", "-1.5", "plain"]
    assert pd.read_parquet(tmp_path / "o" / "table.parquet")["name"].tolist() == names  # not a spreadsheet format
    assert table["point_hash"].str.fullmatch("[0-9a-f]{64}").all()


def test_plan_csvs_neutralise_and_the_report_reads_them_back():
    from sim.plan.files import PLAN_COLUMNS, PROBE_COLUMNS, plan_csv, probes_csv

    row = dict.fromkeys(PLAN_COLUMNS)
    row.update(rank=None, gpu="h100-sxm", gpus=1, tp=1, dp=1, policy="full_hbm", status="fail", usd_per_hour=2.0,
               binding="-", reason="=evil()")
    text = plan_csv([row])
    assert ",'=evil()," in text and ",-," in text
    probe = dict.fromkeys(PROBE_COLUMNS)
    probe.update(candidate="@x", reason="+y")
    assert "'@x" in probes_csv([probe]) and "'+y" in probes_csv([probe])


def test_validation_tables_neutralise_and_read_back(tmp_path):
    from hwprobe.validate_cmd import _write_tables
    from sim.report.validation_table import load_validation

    rows = pd.DataFrame({"scenario": ["=cmd", "-ok"], "metric": ["throughput_tok_per_s", "h2d_bytes"],
                         "predicted": [1.0, -2.0], "measured": [2.0, 4.0], "rel_error": [-0.5, -1.5]})
    ratios = pd.DataFrame({"scenario": ["=cmd"], "predicted_ratio": [1.0], "measured_ratio": [1.1]})
    stats = pd.DataFrame({"metric": ["@m"], "median_abs_rel_error": [0.1]})
    out = tmp_path / "v.csv"
    _write_tables(out, rows, stats, ratios)
    assert "'=cmd" in out.read_text() and "'-ok" in out.read_text() and ",-2.0," in out.read_text()
    assert "'@m" in (tmp_path / "v.errors.csv").read_text()
    back = load_validation(out)
    assert back["scenario"].tolist()[:2] == ["=cmd", "-ok"]
    assert back["predicted"].tolist()[:2] == [1.0, -2.0]


def test_run_folders_write_their_tables_through_the_neutraliser(tmp_path):
    """requests.csv, timeline.csv and steps.csv hold numbers: written as pandas writes them."""
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import scenario_from_dict
    from sim.outputs.run_folder import write_run_dir

    from .promise import tiny_scenario

    sc = scenario_from_dict(tiny_scenario(), "t.yaml")
    res = simulate(sc)
    write_run_dir(tmp_path / "run", sc, res.summary, res.steps)
    assert (tmp_path / "run" / "steps.csv").read_text() == res.steps.to_csv(index=False)
    tables = {"odd.csv": pd.DataFrame({"label": ["=x"], "v": [-1]})}
    write_run_dir(tmp_path / "run2", sc, res.summary, tables=tables)
    assert (tmp_path / "run2" / "odd.csv").read_text() == "label,v\n'=x,-1\n"
