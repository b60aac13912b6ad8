"""`kvsim plan` (issue #14 item 3): pruning, SLO rows that re-simulate as they say, the max rate's
bracket, cost ranking, --price, bad options; the result store (--cache) and the probes' goodput."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from sim.inputs.scenario import load_scenario
from sim.plan import search as P

from .conftest import SCENARIOS, run_cli

GPUS = ["rtx-5080", "h100-sxm"]  # a 14B in bf16 (about 30 GB) does not fit one 16 GB RTX 5080; two hold it
SCENARIO = {
    "name": "plan-7b", "model": {"name": "deepseek-r1-distill-qwen-14b", "weight_dtype": "bf16", "kv_dtype": "bf16"},
    "hardware": {"gpu": "h100-sxm"},
    "workload": {"prompt_tokens": 256, "reasoning_tokens": {"dist": "lognormal", "mean": 128, "std": 64, "min": 8, "max": 512},
                 "seed": 0, "arrivals": {"kind": "poisson", "rate_per_s": 1, "requests": 10}},
    "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
    "policy": {"kind": "full_hbm"}, "sim": {"detail": "step"},
}
SPEC = P.PlanSpec(rate=16.0, ttft_s=0.5, tpot_s=0.015, requests=200)


@pytest.fixture(scope="module")
def scenario_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan-7b.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


@pytest.fixture(scope="module")
def rows(scenario_path):
    base = load_scenario(scenario_path)
    return P.plan(base, SPEC, GPUS, [1, 2], ["full_hbm", "tiered:0.5"], P.load_prices(), workers=1, replicas=True)


def _summary(scenario_path, row, rate):
    base = load_scenario(scenario_path)
    return P._run(base, P.Candidate(row["gpu"], row["gpus"], row["policy"]), rate, SPEC)


def test_pruning_removes_configurations_that_cannot_hold_the_weights(rows):
    pruned = [r for r in rows if r["status"] == "pruned"]
    assert {(r["gpu"], r["gpus"]) for r in pruned} == {("rtx-5080", 1)}
    assert all("weights" in r["reason"] and r["rank"] is None for r in pruned)
    assert {(r["gpu"], r["gpus"]) for r in rows if r["status"] != "pruned"} == {("rtx-5080", 2), ("h100-sxm", 1), ("h100-sxm", 2)}


def test_a_model_that_cannot_be_sharded_is_pruned(scenario_path):
    base = load_scenario(scenario_path)
    assert "cannot shard" in P.prune(base, "h100-sxm", 3)  # 40 heads over 3 GPUs


def test_passing_rows_meet_the_slo_at_the_rate_and_the_max_rate_is_bracketed(rows, scenario_path):
    passing = [r for r in rows if r["status"] == "pass"]
    assert passing and any(r["status"] == "fail" for r in rows)
    for r in passing:
        assert not P.slo_misses(_summary(scenario_path, r, SPEC.rate), SPEC)
    r = next(r for r in passing if not r["max_rate_capped"])
    assert r["max_rate_per_s"] >= SPEC.rate and r["next_rate_per_s"] <= r["max_rate_per_s"] * (1 + SPEC.tolerance) + 1e-9
    assert not P.slo_misses(_summary(scenario_path, r, r["max_rate_per_s"]), SPEC)
    assert P.slo_misses(_summary(scenario_path, r, r["next_rate_per_s"]), SPEC)
    for r in rows:
        if r["status"] == "fail":
            assert r["reason"] and r["binding"]


def test_ranked_by_cost_then_max_rate(rows):
    passing = [r for r in rows if r["status"] == "pass"]
    assert [r["rank"] for r in passing] == list(range(1, len(passing) + 1))
    keys = [(r["usd_per_hour"], -r["max_rate_per_s"]) for r in passing]
    assert keys == sorted(keys)
    prices = P.load_prices()
    assert all(r["usd_per_hour"] == pytest.approx(r["gpus"] * prices[r["gpu"]][0]) for r in rows)
    assert all(src.startswith("assumed:") for _, src in prices.values())
    assert set(prices) >= set(P.catalog.gpus())  # every catalog GPU priced


def test_cli_json_out_and_price_override(scenario_path, tmp_path):
    out = tmp_path / "plan"
    res = run_cli("plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--tpot-p99-ms", "20",
                  "--gpus", "rtx-5080,H100", "--counts", "2", "--policies", "full_hbm", "--requests", "40",
                  "--price", "h100-sxm=0.1", "--workers", "1", "--replicas", "--json", "--out", str(out))
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    h100 = [r for r in rows if r["gpu"] == "h100-sxm"]  # TP 2, and two replicas of TP 1
    assert sorted((r["tp"], r["dp"]) for r in h100) == [(1, 2), (2, 1)]
    assert all(r["usd_per_hour"] == pytest.approx(0.2) for r in h100)
    assert rows[0]["gpu"] == "h100-sxm" and rows[0]["rank"] == 1  # cheapest now
    with open(out / "plan.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [t["gpu"] for t in table] == [r["gpu"] for r in rows] and table[0]["rank"] == "1"


def test_cli_table(scenario_path):
    res = run_cli("plan", str(scenario_path), "--rate", "4", "--gpus", "h100-sxm", "--counts", "1",
                  "--policies", "full_hbm", "--requests", "30", "--ttft-p99-ms", "500", "--workers", "1")
    assert res.returncode == 0, res.stderr
    assert "h100-sxm" in res.stdout and "assumptions" in res.stdout


@pytest.mark.parametrize("args, field", [
    (["--rate", "0", "--ttft-p99-ms", "500"], "--rate"),
    (["--rate", "4"], "--ttft-p99-ms"),  # no SLO given, none in the scenario
    (["--rate", "4", "--ttft-p99-ms", "500", "--gpus", "tpu-v9"], "--gpus"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--counts", "1,x"], "--counts"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--policies", "tiered:2"], "--policies"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--policies", "tiered:automatic"], "--policies"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--policies", "full_hbm/split"], "--policies"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--policies", "tiered:0.5/cpu"], "--policies"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--access", "prefetch,gpu"], "--access"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--price", "h100-sxm"], "--price"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--requests", "0"], "--requests"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--executor", "threads"], "--executor"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--address", "auto"], "--address"),
    (["--rate", "4", "--ttft-p99-ms", "500", "--workers", "0"], "--workers"),
])
def test_bad_option_is_one_line_exit_2(scenario_path, args, field):
    res = run_cli("plan", str(scenario_path), *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in res.stderr


def test_policies_cover_auto_and_access_strategies():
    assert P.parse_policies(None) == ["full_hbm", "evict_only", "tiered:0.25", "tiered:0.5", "tiered:auto"]
    assert P.parse_policies("tiered") == ["tiered:0.25", "tiered:0.5", "tiered:0.75", "tiered:auto"]
    assert P.parse_policies("full_hbm,tiered:0.5,tiered:auto", "prefetch,host_attention") == [
        "full_hbm", "tiered:0.5", "tiered:0.5/host_attention", "tiered:auto", "tiered:auto/host_attention"]
    assert P.parse_policies("tiered:auto/split,evict_only", "host_attention") == ["tiered:auto/split", "evict_only"]
    assert P.parse_policies("tiered:0.5/prefetch") == ["tiered:0.5"]


def test_candidate_scenarios_carry_auto_and_the_access_strategy(scenario_path):
    base = load_scenario(scenario_path)
    sc = P.candidate_scenario(base, P.Candidate("h100-sxm", 1, "tiered:auto/host_attention"), 2.0, SPEC)
    assert sc.policy.kind == "tiered" and sc.policy.hbm_ratio == "auto" and sc.policy.access == "host_attention"
    sc = P.candidate_scenario(base, P.Candidate("h100-sxm", 1, "tiered:0.25"), 2.0, SPEC)
    assert sc.policy.hbm_ratio == 0.25 and sc.policy.access == "prefetch"


def test_a_link_bound_run_names_the_host_link():
    from types import SimpleNamespace

    from sim.inputs.scenario import load_scenario
    from sim.plan.search import binding

    sc = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml")
    s = SimpleNamespace(fits=True, preemptions=0, hbm_peak_bytes=1.0, hbm_capacity_bytes=100.0, host_peak_bytes=0.0,
                        host_capacity_bytes=100.0, h2d_utilization=0.95, d2h_utilization=0.1, max_running=10)
    assert binding(s, sc) == "host link (busy 95% of the run)"
    assert binding(SimpleNamespace(**{**vars(s), "h2d_utilization": 0.5}), sc) == "compute/bandwidth"


def test_replicas_split_the_rate_and_multiply_the_max_rate(rows, scenario_path):
    """2 x H100 holds the 14B model on one GPU too: the plan also tries two replicas of TP 1, each
    simulated at half the rate; its max rate is the whole configuration's."""
    h100_2 = [r for r in rows if r["gpu"] == "h100-sxm" and r["gpus"] == 2]
    assert {(r["tp"], r["dp"]) for r in h100_2} == {(1, 2), (2, 1)}
    base = load_scenario(scenario_path)
    one = P._run(base, P.Candidate("h100-sxm", 1, "full_hbm"), SPEC.rate / 2, SPEC)
    two = P._run(base, P.Candidate("h100-sxm", 2, "full_hbm", tp=1), SPEC.rate, SPEC)
    assert two.ttft_p99_s == one.ttft_p99_s and two.tpot_p99_s == one.tpot_p99_s  # the same replica at rate / 2
    assert P.feasible_splits(base, "rtx-5080", 2) == [2]  # one 5080 cannot hold it: no replicas of TP 1


# ---- the sweep machinery: result store, goodput over the arrival window -----------------------

SMALL_SPEC = P.PlanSpec(rate=4.0, ttft_s=0.5, tpot_s=0.02, requests=40)


def test_cache_reuses_stored_candidates_and_their_probes(scenario_path, tmp_path):
    from dataclasses import replace

    from sim.runner.options import Execution

    base = load_scenario(scenario_path)
    args = (base, SMALL_SPEC, ["h100-sxm"], [1, 2], ["full_hbm", "tiered:0.5"])
    fresh = P.search(*args, P.load_prices(), workers=1)
    cache = tmp_path / "cache"
    first = P.search(*args, P.load_prices(), execution=Execution(workers=2, cache=cache))
    assert (first.computed, first.stored) == (4, 0)
    assert first.rows == fresh.rows and first.probes == fresh.probes and len(fresh.probes) > 4
    cheap = P.search(*args, P.parse_prices(["h100-sxm=0.5"]), execution=Execution(workers=1, cache=cache))
    assert (cheap.computed, cheap.stored) == (0, 4)  # prices are applied after the search
    assert cheap.probes == fresh.probes and {r["usd_per_hour"] for r in cheap.rows} == {0.5, 1.0}
    victim = sorted(cache.glob("*/*.json"))[0]
    victim.unlink()
    again = P.search(*args, P.load_prices(), execution=Execution(workers=1, cache=cache))
    assert (again.computed, again.stored) == (1, 3) and again.rows == fresh.rows and again.probes == fresh.probes
    other = P.search(base, replace(SMALL_SPEC, tpot_s=0.03), *args[2:], P.load_prices(),
                     execution=Execution(workers=1, cache=cache))
    assert (other.computed, other.stored) == (4, 0)  # another SLO is another search


def test_cli_cache_says_what_it_searched(scenario_path, tmp_path):
    args = ["plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--gpus", "h100-sxm", "--counts", "1",
            "--policies", "full_hbm", "--requests", "30", "--json", "--cache", str(tmp_path / "c")]
    first = run_cli(*args)
    assert first.returncode == 0 and "plan: 1 candidates searched, 0 read from" in first.stderr, first.stderr
    again = run_cli(*args)
    assert again.returncode == 0 and "plan: 0 candidates searched, 1 read from" in again.stderr, again.stderr
    assert json.loads(again.stdout) == json.loads(first.stdout)


def test_probe_goodput_is_over_the_arrival_window(scenario_path):
    """Every request meets the SLO: the probe's goodput is the offered rate, for one GPU and for two
    replicas; the summary's own goodput (vLLM's) is per second of the whole run, drain included."""
    from sim.serving.run import simulate_serving

    base = load_scenario(scenario_path)
    for cand in (P.Candidate("h100-sxm", 1, "full_hbm"), P.Candidate("h100-sxm", 2, "full_hbm", tp=1)):
        probe = P.evaluate(base, cand, SMALL_SPEC)["probes"][0]
        assert probe["passed"] and probe["goodput_req_per_s"] == pytest.approx(SMALL_SPEC.rate, rel=1e-12)
    run = simulate_serving(P.candidate_scenario(base, cand, SMALL_SPEC.rate / 2, SMALL_SPEC))
    drain_s = run.summary.duration_s - run.requests["arrival_s"].max()
    assert drain_s > 0.1 and run.summary.goodput_req_per_s == pytest.approx(40 / run.summary.duration_s)


def test_probe_goodput_counts_the_requests_that_met_the_slo():
    from types import SimpleNamespace

    s = SimpleNamespace(goodput_req_per_s=30 / 12.5, duration_s=12.5, requests=40)  # 30 of 40 met it
    assert P.offered_goodput(s, 4.0) == pytest.approx(3.0, rel=1e-12)
    assert P.offered_goodput(SimpleNamespace(goodput_req_per_s=None, duration_s=None, requests=40), 4.0) is None
