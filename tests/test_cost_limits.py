"""Work that cannot finish is not started (issue #23): the cost is estimated before any work - a
serving run's steps and tokens, a plan's simulations, a sweep's points - and past its limit the
command refuses in one line holding the estimate and the limit (exit 2, nothing written), or with
--allow-large says the estimate as a warning and runs. The step estimate is a lower bound: no real
run takes fewer steps."""

from __future__ import annotations

import pytest

import sim.inputs.cost as cost
from sim.inputs.scenario import scenario_from_dict
from sim.serving.run import simulate_serving

from .conftest import run_cli
from .promise import assert_refused, dump_yaml, files_under, tiny_serving_scenario
from .test_sweep import small_spec, write_spec


def _trace_scenario(tmp_path, rows: str) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    doc = tiny_serving_scenario()
    doc["workload"]["arrivals"] = {"kind": "trace", "path": "t.csv"}
    (tmp_path / "s.yaml").write_text(dump_yaml(doc))


def test_one_trace_request_at_the_token_limit_is_refused_before_it_runs(tmp_path):
    _trace_scenario(tmp_path, f"0,16,{2**22}\n")
    before = files_under(tmp_path)
    res = run_cli("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert_refused(res, "s.yaml", "workload.arrivals",
                   "1 request would take at least 4,194,304 simulated steps, more than the 1,048,576 a run may take; "
                   "give --allow-large to run it anyway")
    assert files_under(tmp_path) == before


def test_many_tokens_are_refused_with_the_estimate(tmp_path):
    _trace_scenario(tmp_path, "".join(f"{i * 1e-3},{2**22},1\n" for i in range(40)))
    res = run_cli("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert_refused(res, "40 requests hold 167,772,200 prompt and output tokens, more than the 134,217,728")


def test_allow_large_warns_with_the_estimate_and_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(cost, "MAX_SERVING_STEPS", 5)
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_serving_scenario()))
    refused = run_cli("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert_refused(refused, "more than the 5 a run may take")
    res = run_cli("run", "s.yaml", "--out", "o", "--allow-large", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    warning = [line for line in res.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "more than the 5 a run may take; running it (--allow-large)" in warning[0]
    assert (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("arrivals", [
    {"kind": "poisson", "rate_per_s": 200.0, "requests": 40},
    {"kind": "poisson", "rate_per_s": 0.5, "requests": 10},
    {"kind": "gamma", "rate_per_s": 50.0, "cv": 3.0, "requests": 40},
    {"kind": "closed_loop", "concurrency": 4, "requests": 30},
    {"kind": "closed_loop", "concurrency": 64, "requests": 64},
])
def test_the_step_estimate_is_a_lower_bound(arrivals):
    from sim.inputs.requests import build_requests

    doc = tiny_serving_scenario()
    doc["workload"]["arrivals"] = arrivals
    doc["scheduler"] = {"max_num_seqs": 4, "max_num_batched_tokens": 32}
    sc = scenario_from_dict(doc, "s.yaml")
    steps = cost.serving_steps(build_requests(sc.workload), 4, 32)
    assert 1 <= steps <= simulate_serving(sc).summary.steps


def test_a_plan_past_its_budget_is_refused_before_any_simulation(tmp_path):
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_serving_scenario()))
    doc = tiny_serving_scenario()
    doc["workload"]["reasoning_tokens"] = {"dist": "uniform", "min": 2**18, "max": 2**19}
    (tmp_path / "long.yaml").write_text(dump_yaml(doc))
    # a rate low enough that the analytic screen keeps the candidates (it would rule out 10 req/s unsimulated)
    res = run_cli("plan", "long.yaml", "--rate", "0.001", "--ttft-p99-ms", "1000", "--requests", "400", "--out", "plan",
                  cwd=tmp_path)
    assert_refused(res, "--requests", "candidates x at least", "simulated steps each",
                   "more than the 16,777,216 a plan may take; give --allow-large")
    assert not (tmp_path / "plan").exists()


def test_a_sweep_past_its_points_is_refused_before_any_is_validated(tmp_path, monkeypatch):
    """2^20 points (1,024 x 1,024): refused from the axes' sizes alone, in well under the minutes
    validating them would take; a monkeypatched validator proves none was validated."""
    import sim.sweep.spec as spec_mod

    monkeypatch.setattr(spec_mod, "_point_scenario", lambda *a, **k: pytest.fail("a point was validated"))
    spec = write_spec(tmp_path, small_spec(axes=[{"grid": {"workload.batch_size": {"range": [1, 1025, 1]}}},
                                                 {"grid": {"workload.seed": {"range": [0, 1024, 1]}}}]))
    res = run_cli("sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress")
    assert_refused(res, "spec.yaml", "axes", "1,048,576 points would take about 21.0 GB and 1.7 min to validate",
                   "more than the 100,000 points a sweep may have; give --allow-large")
    assert not (tmp_path / "o").exists()


def test_a_sweep_with_allow_large_warns_and_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(cost, "MAX_SWEEP_POINTS", 4)
    spec = write_spec(tmp_path, small_spec())
    assert_refused(run_cli("sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress"), "8 points would take")
    res = run_cli("sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress", "--workers", "1", "--allow-large")
    assert res.returncode == 0, res.stderr
    assert "kvsim: warning: 8 points would take" in res.stderr and "running it (--allow-large)" in res.stderr
    assert (tmp_path / "o" / "table.csv").exists()
