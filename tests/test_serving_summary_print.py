"""`kvsim run` prints the serving summary of every arrival kind (issue #23: closed-loop and trace
runs wrote their folder, then crashed printing `None` figures), and any summary figure that can be
None prints as "-"."""

from __future__ import annotations

import json
import typing

import pytest
import yaml

from sim.outputs.run_folder import serving_summary_rows, summary_rows
from sim.outputs.schema import ServingSummary, SimRunSummary

from .conftest import run_cli
from .promise import tiny_serving_scenario

ARRIVALS = {
    "poisson": {"kind": "poisson", "rate_per_s": 50.0, "requests": 12},
    "gamma": {"kind": "gamma", "rate_per_s": 50.0, "cv": 2.0, "requests": 12},
    "closed_loop": {"kind": "closed_loop", "concurrency": 3, "requests": 12},
    "trace": {"kind": "trace", "path": "trace.csv"},
}
LOAD_TEXT = {"poisson": "Poisson at 50 req/s", "gamma": "gamma at 50 req/s", "closed_loop": "closed loop, 3 clients",
             "trace": "trace"}
LABELS = ("scenario", "scheduler", "fits", "duration", "request / output throughput", "TTFT mean / p50 / p99",
          "TPOT mean / p50 / p99", "ITL p50 / p99", "E2E mean / p99", "concurrency mean / running mean / max",
          "queue mean", "preemptions", "HBM peak / KV budget", "host peak")


@pytest.mark.parametrize("kind", ARRIVALS)
def test_the_printed_summary_of_every_arrival_kind(tmp_path, kind):
    # one request of one token in the trace: no TPOT, no ITL - figures the summary leaves None
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,16,1\n0.01,16,4\n")
    doc = tiny_serving_scenario()
    doc["workload"]["arrivals"] = ARRIVALS[kind]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    res = run_cli("run", "s.yaml", "--out", "out", cwd=tmp_path)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    for label in LABELS:
        assert label in res.stdout, (label, res.stdout)
    assert LOAD_TEXT[kind] in res.stdout
    assert "wrote out/" in res.stdout
    as_json = run_cli("run", "s.yaml", "--out", "out2", "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["arrivals"] == kind


def _optional(model) -> list[str]:
    return [name for name, f in model.model_fields.items() if type(None) in typing.get_args(f.annotation)]


@pytest.fixture(scope="module")
def serving_summary() -> ServingSummary:
    from sim.inputs.scenario import scenario_from_dict
    from sim.serving.run import simulate_serving

    doc = tiny_serving_scenario()
    doc["workload"]["arrivals"] = ARRIVALS["poisson"]
    return simulate_serving(scenario_from_dict(doc, "s.yaml")).summary


def test_any_serving_figure_that_can_be_none_prints(serving_summary):
    """Each optional figure None in turn, then all at once, for every arrival kind and swap on or off."""
    fields = _optional(ServingSummary)
    assert {"offered_rate_per_s", "clients", "tpot_p99_s", "e2e_mean_s", "duration_s"} <= set(fields)
    for kind in ARRIVALS:
        for swap in ("recompute", "swap"):
            base = serving_summary.model_copy(update={"arrivals": kind, "preemption": swap})
            cases = [{f: None} for f in fields] + [dict.fromkeys(fields)]
            for change in cases:
                rows = serving_summary_rows(base.model_copy(update=change))
                assert all(isinstance(v, str) and v for _, v in rows), (kind, change)
            assert ("TPOT mean / p50 / p99", "- / - / -") in serving_summary_rows(
                base.model_copy(update=dict.fromkeys(fields)))


def test_any_closed_batch_figure_that_can_be_none_prints():
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import scenario_from_dict

    from .promise import tiny_scenario

    s = simulate(scenario_from_dict(tiny_scenario(), "t.yaml")).summary
    fields = _optional(SimRunSummary)
    for change in [{f: None} for f in fields] + [dict.fromkeys(fields)]:
        assert all(isinstance(v, str) for _, v in summary_rows(s.model_copy(update=change)))
