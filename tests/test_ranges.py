"""Numbers that must mean something physically are held to ranges (issue #23): trace arrivals within
the horizon a run may span, plan rates, prices and SLO targets; a sweep range whose bounds overflow;
a CSV naming a column twice. Each refusal is one line naming the file or flag and what was expected,
exit 2, nothing written. JSON the tools print or write never holds NaN or Infinity."""

from __future__ import annotations

import json
import math

import pytest

from sim.inputs.limits import MAX_ARRIVAL_S
from sim.inputs.requests import read_trace

from .conftest import run_cli
from .promise import assert_refused, dump_yaml, files_under, tiny_scenario, tiny_serving_scenario
from .test_sweep import small_spec, write_spec


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, which are not JSON."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


# ---- serving: arrivals within the horizon ------------------------------------------------------

def _serve(tmp_path, trace: str | None = None, **arrivals):
    doc = tiny_serving_scenario()
    if trace is not None:
        (tmp_path / "t.csv").write_text(trace)
        arrivals = {"kind": "trace", "path": "t.csv"}
    doc["workload"]["arrivals"] = {**doc["workload"]["arrivals"], **arrivals} if trace is None else arrivals
    (tmp_path / "s.yaml").write_text(dump_yaml(doc))
    before = files_under(tmp_path)
    res = run_cli("run", "s.yaml", "--out", "o", cwd=tmp_path)
    return res, before


@pytest.mark.parametrize("arrival", ["1e20", "10000000.5", "1e308"])
def test_a_trace_arrival_beyond_the_horizon_is_refused(tmp_path, arrival):
    """At 1e20 s a step time vanishes beside the clock (every latency 0.0): refused, with the line."""
    res, before = _serve(tmp_path, f"arrival_s,prompt_tokens,output_tokens\n0,16,4\n{arrival},16,4\n")
    assert_refused(res, "s.yaml", "workload.arrivals.path", "t.csv", "line 3: arrival_s: expected at most 1e+07 s",
                   repr(arrival))
    assert files_under(tmp_path) == before


def test_a_trace_at_the_horizon_is_accepted(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(f"arrival_s,prompt_tokens,output_tokens\n0,16,4\n{MAX_ARRIVAL_S:.0f},16,4\n")
    assert read_trace(trace).arrival_s.max() == MAX_ARRIVAL_S


@pytest.mark.parametrize("kind", ["poisson", "gamma"])
def test_a_drawn_process_beyond_the_horizon_is_refused(tmp_path, kind):
    extra = {"cv": 1.0} if kind == "gamma" else {}
    res, before = _serve(tmp_path, kind=kind, rate_per_s=1e-9, requests=12, **extra)
    assert_refused(res, "s.yaml", "workload.arrivals.rate_per_s", "beyond the 1e+07 s")
    assert files_under(tmp_path) == before


def test_a_trace_naming_a_column_twice_is_refused(tmp_path):
    res, _ = _serve(tmp_path, "arrival_s,prompt_tokens,output_tokens,arrival_s\n0,16,4,5\n")
    assert_refused(res, "t.csv", "header: column 'arrival_s' given twice")


def test_a_validation_csv_naming_a_column_twice_is_refused(tmp_path):
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_scenario()))
    (tmp_path / "v.csv").write_text("scenario,metric,predicted,measured,measured\nx,throughput_tok_per_s,1,2,3\n")
    res = run_cli("report", "s.yaml", "--validation", "v.csv", "--out", "r.html", cwd=tmp_path)
    assert_refused(res, "v.csv", "header: column 'measured' given twice")


# ---- kvsim plan -------------------------------------------------------------------------------

PLAN = ["--gpus", "h100-sxm", "--counts", "1", "--policies", "full_hbm", "--requests", "12", "--workers", "1"]


@pytest.mark.parametrize("args, fragments", [
    (["--rate", "1e12"], ["--rate", "expected at most 1e+06 req/s"]),
    (["--rate", "300000"], ["--rate", "probes up to 1.2e+06"]),  # x --max-factor 4
    (["--rate", "1e-9"], ["--rate", "beyond the horizon"]),
    (["--rate", "nan"], ["--rate", "expected a positive number"]),
    (["--rate", "20", "--price", "h100-sxm=1e308"], ["--price", "expected at most 10,000 $ per GPU-hour"]),
    (["--rate", "20", "--price", "h100-sxm=inf"], ["--price", "expected GPU=DOLLARS_PER_HOUR"]),
    (["--rate", "20", "--ttft-p99-ms", "1e308"], ["--ttft-p99-ms", "expected at most 3,600,000 ms"]),
    (["--rate", "20", "--tpot-p99-ms", "-5"], ["--tpot-p99-ms", "expected a positive number, got -5"]),
    (["--rate", "20", "--max-factor", "1e9"], ["--max-factor", "expected 1 to 1000"]),
])
def test_plan_figures_out_of_range_are_one_line(tmp_path, args, fragments):
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_serving_scenario()))
    res = run_cli("plan", "s.yaml", *PLAN, *args, "--out", "plan", cwd=tmp_path)
    assert_refused(res, *fragments)
    assert not (tmp_path / "plan").exists()


def test_plan_json_and_plan_folder_hold_only_finite_numbers(tmp_path):
    """The most expensive price allowed still gives finite $/h: --json and plan.json parse as strict
    JSON, and `kvsim report --plan` reads back the folder the plan wrote."""
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_serving_scenario()))
    res = run_cli("plan", "s.yaml", *PLAN, "--rate", "20", "--price", "h100-sxm=10000", "--json", "--out", "plan",
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = strict_json(res.stdout)
    assert rows[0]["usd_per_hour"] == 10000.0
    strict_json((tmp_path / "plan" / "plan.json").read_text())
    (tmp_path / "r.yaml").write_text(dump_yaml(tiny_scenario()))
    rep = run_cli("report", "r.yaml", "--plan", "plan", "--out", "r.html", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr


def test_to_json_never_writes_nan_or_infinity():
    import numpy as np

    from sim.outputs.run_folder import to_json

    text = to_json({"a": math.inf, "b": [math.nan, -math.inf, np.float32("nan"), np.float64(2.5)], "c": {"d": np.inf}})
    assert strict_json(text) == {"a": None, "b": [None, None, None, 2.5], "c": {"d": None}}


# ---- sweep ranges -----------------------------------------------------------------------------

@pytest.mark.parametrize("bounds, expected", [
    ([0, 1e308, 1e-308], "expected start, stop and step within"),
    ([0.0, 1.0, 5e-324], "more than 1,048,576 values"),
    ([-1e300, 1e300, 1e299], "expected start, stop and step within"),
    ([0, 10**400, 1], "expected start, stop and step within"),
])
def test_a_sweep_range_that_would_overflow_is_one_line(tmp_path, bounds, expected):
    spec = write_spec(tmp_path, small_spec(axes=[{"grid": {"workload.batch_size": {"range": bounds}}}]))
    res = run_cli("sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress")
    assert_refused(res, "spec.yaml", "axes.0.grid.workload.batch_size.range", expected)
    assert not (tmp_path / "o").exists()
