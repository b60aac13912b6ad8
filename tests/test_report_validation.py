"""Reading `hwprobe validate` CSVs for the report: the long table it writes, rel_error filled in
when missing, and one-line errors (exit 2, nothing written) for files that are not such a table."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sim.inputs.errors import ConfigError
from sim.report.summary_text import validation_sentences
from sim.report.validation_table import load_validation

from .conftest import run_cli

GOOD = """scenario,metric,predicted,measured,rel_error
a,throughput_tok_per_s,110.0,100.0,0.1
a,transfer_share,0.0,0.0,0.0
a,hbm_peak_bytes,2.2e9,2.0e9,
b,throughput_tok_per_s,90,100,-0.1
b,transfer_share,0.2,0.0,
"""


def _write(tmp_path, text, name="v.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_reads_the_hwprobe_validate_table_and_fills_rel_error(tmp_path):
    t = load_validation(_write(tmp_path, GOOD))
    assert list(t.columns) == ["scenario", "metric", "predicted", "measured", "rel_error"]
    assert t.rel_error[2] == pytest.approx(0.1)  # computed: (2.2 - 2.0) / 2.0
    assert math.isnan(t.rel_error[4])  # measured 0, predicted not: undefined
    assert t.rel_error[1] == 0.0
    text = validation_sentences(t)[0]
    assert "throughput_tok_per_s: median |error| 10.0% over 2 scenario(s), 100% within +-10%" in text


@pytest.mark.parametrize("text, expected", [
    ("", "empty file"),
    ("metric,n,median_abs_rel_error\nthroughput_tok_per_s,2,0.1\n", "missing column(s) scenario, predicted, measured"),
    ("scenario,metric,predicted,measured\na,x,1.0,abc\n", "measured: expected a number, got 'abc' (data row 1)"),
    ("scenario,metric,predicted,measured\na,x,,1.0\n", "no row has both a predicted and a measured value"),
])
def test_bad_tables_fail_with_one_line(tmp_path, text, expected):
    with pytest.raises(ConfigError) as err:
        load_validation(_write(tmp_path, text))
    assert expected in err.value.line()
    assert "\n" not in err.value.line()


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_validation(tmp_path / "nope.csv")


def test_cli_bad_validation_file_is_one_line_exit_2_nothing_written(tmp_path):
    bad = _write(tmp_path, "not,a\nvalidation,table\n")
    out = tmp_path / "r.html"
    res = run_cli("report", "--validation", str(bad), "--out", str(out))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: ") and str(bad) in lines[0]
    assert not out.exists()
    assert not list(tmp_path.glob(".r.html.*"))  # no temporary file left behind


def test_table_values_survive_a_round_trip_through_pandas(tmp_path):
    t = load_validation(_write(tmp_path, GOOD))
    again = load_validation(_write(tmp_path, t.to_csv(index=False), "again.csv"))
    pd.testing.assert_frame_equal(t, again)


def test_throughput_ratios_beside_the_table_become_one_more_metric(tmp_path):
    table = _write(tmp_path, GOOD)
    _write(tmp_path, "scenario,baseline,predicted_ratio,measured_ratio,rel_error\nb,a,0.9,0.75,0.2\n", "v.ratios.csv")
    t = load_validation(table)
    ratio = t[t.metric == "throughput_vs_full_hbm"]
    assert list(ratio.scenario) == ["b"] and ratio.rel_error.iloc[0] == pytest.approx((0.9 - 0.75) / 0.75)
    assert len(t) == 6  # the five rows of the table, then the ratio
    _write(tmp_path, "scenario,baseline\nb,a\n", "v.ratios.csv")
    with pytest.raises(ConfigError, match="missing column"):
        load_validation(table)
