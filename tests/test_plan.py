"""`kvsim plan` (issues #14 and #21): every TP x DP layout, pruning and the screen, steady-state
rows that re-simulate as they say, the max rate's bracket, ranking (exact before lossy, then cost),
the search stopping at --top, the answer sentence and launch commands, exit codes, the result store."""

from __future__ import annotations

import csv
import inspect
import json
import math
from dataclasses import replace

import pytest
import yaml

from sim.inputs.scenario import load_scenario
from sim.plan import candidates as C
from sim.plan import search as P
from sim.plan.evaluate import CandidateTask, binding, evaluate, probe_at
from sim.plan.probe import Probe
from sim.plan.screen import curve

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
SPEC = C.PlanSpec(rate=16.0, ttft_s=0.5, tpot_s=0.015, top=0)
POLICIES = ["full_hbm", "evict_only"]


@pytest.fixture(scope="module")
def scenario_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan-7b.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


@pytest.fixture(scope="module")
def base(scenario_path):
    return load_scenario(scenario_path)


@pytest.fixture(scope="module")
def result(base):
    return P.search(base, SPEC, GPUS, [1, 2], POLICIES, C.load_prices(), workers=1)


def _row(result, gpu, gpus, tp, policy="full_hbm"):
    return next(r for r in result.rows if (r["gpu"], r["gpus"], r["tp"], r["policy"]) == (gpu, gpus, tp, policy))


def test_every_layout_that_holds_the_model_is_a_candidate(base, result):
    assert C.feasible_splits(base, "h100-sxm", 4) == [1, 2, 4]  # TP1 x 4, TP2 x 2, TP4
    assert C.feasible_splits(base, "rtx-5080", 2) == [2]  # one 5080 cannot hold it: no replicas of TP 1
    assert "cannot shard" in C.prune(base, "h100-sxm", 3)  # 40 heads over 3 GPUs
    h100_2 = {(r["tp"], r["dp"], r["layout"]) for r in result.rows if r["gpu"] == "h100-sxm" and r["gpus"] == 2}
    assert h100_2 == {(1, 2, "TP1 x 2"), (2, 1, "TP2"), (1, 1, "1P(TP1) + 1D(TP1)")}  # and one prefill + one decode
    cands, _ = P.candidates(base, ["h100-sxm"], [2], ["full_hbm"], layouts=False, disagg=False)
    assert [(c.tp_size, c.replicas) for c in cands] == [(2, 1)]  # --no-replicas --no-disagg: one TP group


def test_pruned_and_screened_rows_say_why_and_are_not_simulated(result):
    pruned = [r for r in result.rows if r["status"] == "pruned"]
    assert {(r["gpu"], r["gpus"]) for r in pruned} == {("rtx-5080", 1)}
    assert all("weights" in r["reason"] and r["rank"] is None for r in pruned)
    # two 5080s hold the weights, but at 960 GB/s reading a 14.8 GB shard takes longer than the 15 ms TPOT target
    screened = [r for r in result.rows if r["status"] == "screened"]
    assert {(r["gpu"], r["gpus"]) for r in screened} == {("rtx-5080", 2)}
    assert all("even at batch 1" in r["reason"] and r["binding"] == "HBM bandwidth" for r in screened)
    simulated = {p["candidate"].split(" ")[0] for p in result.probes}
    assert simulated == {"h100-sxm"}


def test_passing_rows_hold_when_simulated_again(base, result):
    """A pass at the rate, at the max rate, and a fail at the next rate tried, each re-simulated."""
    r = _row(result, "h100-sxm", 1, 1)
    assert r["status"] == "pass" and not r["max_rate_capped"]
    assert SPEC.rate <= r["max_rate_per_s"] < r["next_rate_per_s"] <= r["max_rate_per_s"] * (1 + SPEC.tolerance) + 1e-9
    cand = C.Candidate("h100-sxm", 1, "full_hbm")
    cv = curve(C.candidate_scenario(base, cand, SPEC.rate, SPEC))
    assert probe_at(base, cand, SPEC, SPEC.rate, cv).passed
    assert probe_at(base, cand, SPEC, r["max_rate_per_s"], cv).passed
    assert not probe_at(base, cand, SPEC, r["next_rate_per_s"], cv).passed


def test_every_probe_is_a_steady_state_run_that_says_how_long_it_ran(result):
    for p in result.probes:
        assert p["end"] in ("measured", "ttft_p99", "tpot_p99", "overloaded")
        assert p["measured"] >= (400 if p["end"] == "measured" else 1) and p["requests"] > p["measured"]
        assert p["duration_s"] > 0 and p["window_s"] > 0 and p["runs"] >= 1
        if p["end"] == "measured":
            if p["pool"] != "decode":  # a decode pool's requests arrive with their first token
                assert p["ttft_p99_lo_ms"] <= p["ttft_p99_ms"] <= p["ttft_p99_hi_ms"]
            if p["pool"] != "prefill":  # a prefill pool writes one token a request
                assert p["tpot_p99_lo_ms"] <= p["tpot_p99_ms"] <= p["tpot_p99_hi_ms"]
        else:  # stopped at its verdict: no percentile to print
            assert not p["passed"] and p["ttft_p99_ms"] is None and p["certain"]


def test_ranked_exact_first_then_by_cost_then_max_rate(result):
    passing = [r for r in result.rows if r["status"] == "pass"]
    assert [r["rank"] for r in passing] == list(range(1, len(passing) + 1))
    assert [r["output"] for r in passing] == sorted((r["output"] for r in passing), key=lambda o: o != "exact")
    assert {r["output"] for r in passing if r["policy"] == "evict_only"} == {"lossy"}
    exact = [r for r in passing if r["output"] == "exact"]
    keys = [(r["usd_per_hour"], -r["max_rate_per_s"]) for r in exact]
    assert keys == sorted(keys)
    prices = C.load_prices()
    assert all(r["usd_per_hour"] == pytest.approx(r["gpus"] * prices[r["gpu"]][0]) for r in result.rows)
    assert set(prices) >= set(C.catalog.gpus())  # every catalog GPU priced
    r = passing[0]  # $ per million output tokens at the rate asked, by hand
    mean_out = P.mean_output_tokens(load_scenario_from_dict())
    assert r["usd_per_million_tokens"] == pytest.approx(r["usd_per_hour"] / (SPEC.rate * 3600 * mean_out) * 1e6)


def load_scenario_from_dict():
    from sim.inputs.scenario import scenario_from_dict

    return scenario_from_dict(SCENARIO, "plan")


def test_the_search_stops_once_top_exact_configurations_pass(base, result):
    one = P.search(base, replace(SPEC, top=1), GPUS, [1, 2], POLICIES, C.load_prices(), workers=1)
    first = next(r for r in one.rows if r["rank"] == 1)
    assert first == next(r for r in result.rows if r["rank"] == 1)  # the same answer, for less work
    left = [r for r in one.rows if r["status"] == "unsearched"]
    assert left and all("not simulated" in r["reason"] and r["screen_max_rate_per_s"] for r in left)
    assert all(r["usd_per_hour"] >= first["usd_per_hour"] for r in left)
    assert len(one.probes) < len(result.probes)
    two = P.search(base, replace(SPEC, top=1), GPUS, [1, 2], POLICIES, C.load_prices(), workers=2)
    assert two.rows == one.rows and two.probes == one.probes  # the same rows whichever worker finished first


def test_the_front_search_finds_the_exhaustive_front_for_less(base, result):
    from sim.plan.answer import pareto

    front = P.search(base, replace(SPEC, top=1), GPUS, [1, 2], POLICIES, C.load_prices(), workers=1, front=True)
    assert front.front and inspect.signature(P.search).parameters["front"].default is False  # off by default
    out = P.mean_output_tokens(base)
    off = [r for r in front.rows if r["status"] == "unsearched"]
    tied = [r for r in off if "ties with" in r["reason"]]
    beaten = [r for r in off if r not in tied]
    assert beaten and all("not simulated for the Pareto front of 2 GPUs: off it" in r["reason"] and "1.25 x" in r["reason"]
                          and "1.1 x in tokens/s per user" in r["reason"] for r in beaten)
    key = lambda n, p: (n, p["gpu"], p["layout"], p["policy"])  # noqa: E731
    twins = {(r["gpus"], r["gpu"], r["layout"], r["policy"]) for r in tied}
    whole = pareto(result.rows, out)
    assert whole and pareto(front.rows, out) == {n: [p for p in ps if key(n, p) not in twins] for n, ps in whole.items()}
    for n, ps in whole.items():  # a twin of the exhaustive front: its stand-in's point is within 1% of its own
        for p in (p for p in ps if key(n, p) in twins):
            r = next(r for r in tied if (r["gpus"], r["gpu"], r["layout"], r["policy"]) == key(n, p))
            them = next(q for q in whole[n] if f"{q['gpu']} {q['layout']} {q['policy']} (" in r["reason"])
            assert them["tokens_per_s_per_gpu"] == pytest.approx(p["tokens_per_s_per_gpu"], rel=0.01)
            assert them["tokens_per_s_per_user"] == pytest.approx(p["tokens_per_s_per_user"], rel=0.01)
    assert front.computed < result.computed
    for r in beaten:  # each was beaten, in the simulation that was skipped, by a passing one of its count
        full = next(f for f in result.rows if P.row_candidate(f) == P.row_candidate(r))
        assert full["status"] != "pass" or any(
            q["status"] == "pass" and q["gpus"] == r["gpus"] and q["max_rate_per_s"] >= full["max_rate_per_s"]
            and q["tpot_p99_ms"] <= full["tpot_p99_ms"] for q in front.rows)


def test_the_rows_kept_are_the_prefix_up_to_the_top_exact_pass(base):
    order = [C.Candidate("h100-sxm", 1, p) for p in ("full_hbm", "evict_only", "full_hbm", "full_hbm")]
    prefix = P._passes_prefix(order, base, top=2)
    ok, no = {"status": "pass"}, {"status": "fail"}
    assert prefix([ok, None, ok, None]) is None  # the second may yet pass: not known
    assert prefix([ok, ok, no, ok]) == 4  # the lossy pass (evict_only) does not count
    assert prefix([ok, no, ok, None]) == 3  # what comes after the second exact pass is not waited for
    assert prefix([no, no, no, no]) == 4  # nothing more to wait for
    assert P._passes_prefix(order, base, top=0)([ok, ok, ok, None]) is None  # top 0: every candidate


def test_binding_names_the_resource_or_the_scheduler_setting():
    from types import SimpleNamespace

    sc = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml")
    s = SimpleNamespace(fits=True, preemptions=0, hbm_peak_bytes=1.0, hbm_capacity_bytes=100.0, host_peak_bytes=0.0,
                        host_capacity_bytes=100.0, h2d_utilization=0.95, d2h_utilization=0.1, max_running=10)
    assert binding(Probe(1.0, s), sc, None) == "host link (busy 95% of the run)"
    full = SimpleNamespace(**{**vars(s), "h2d_utilization": 0.5, "max_running": 256})
    assert binding(Probe(1.0, full), sc, None) == "scheduler: max_num_seqs=256 (batch full)"
    assert binding(Probe(1.0, SimpleNamespace(**{**vars(s), "preemptions": 3})), sc, None) == "HBM capacity (3 preemptions)"


def test_cli_leads_with_the_answer_and_the_launch_commands(scenario_path, tmp_path):
    out = tmp_path / "plan"
    res = run_cli("plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--tpot-p99-ms", "20",
                  "--gpus", "h100-sxm", "--counts", "1,2", "--policies", "full_hbm", "--top", "1", "--workers", "1",
                  "--out", str(out))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Cheapest: 1 x H100 SXM as TP1, full_hbm (exact); at 4 req/s p99 TTFT")
    assert "steady state:" in lines[0] and "per million output tokens" in lines[0]
    assert lines[1].strip().startswith("vllm: vllm serve deepseek-ai/DeepSeek-R1-Distill-Qwen-14B --tensor-parallel-size 1")
    assert "sglang: python -m sglang.launch_server" in lines[2] and "--enable-mixed-chunk" in lines[2]  # mixed steps
    fewest = next(x for x in lines if x.startswith("Fewest GPUs"))
    assert fewest.startswith("Fewest GPUs for 4 req/s: 1 x H100 SXM as TP1, full_hbm (exact); sustains ")
    assert "of those simulated" not in fewest  # nothing with fewer GPUs was left unsimulated
    with open(out / "plan.csv") as fh:
        table = list(csv.DictReader(fh))
    assert table[0]["rank"] == "1" and table[0]["layout"] == "TP1" and table[0]["output"] == "exact"
    doc = json.loads((out / "plan.json").read_text())
    assert doc["requests"] is None and doc["top"] == 1


def test_nothing_passes_exit_1_and_says_what_came_closest(scenario_path):
    res = run_cli("plan", str(scenario_path), "--rate", "200", "--ttft-p99-ms", "500", "--tpot-p99-ms", "20",
                  "--gpus", "h100-sxm", "--counts", "1", "--policies", "full_hbm", "--workers", "1", "--max-factor", "1")
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stdout.startswith("Nothing passes at 200 req/s")


def test_cli_json_and_price_override(scenario_path):
    res = run_cli("plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--tpot-p99-ms", "20",
                  "--gpus", "rtx-5080,H100", "--counts", "2", "--policies", "full_hbm", "--top", "0",
                  "--price", "h100-sxm=0.1", "--workers", "1", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    h100 = [r for r in rows if r["gpu"] == "h100-sxm"]
    assert sorted((r["tp"], r["dp"], r["layout"]) for r in h100) == [(1, 1, "1P(TP1) + 1D(TP1)"), (1, 2, "TP1 x 2"),
                                                                      (2, 1, "TP2")]
    assert all(r["usd_per_hour"] == pytest.approx(0.2) for r in h100)
    assert rows[0]["gpu"] == "h100-sxm" and rows[0]["rank"] == 1  # cheapest now


def test_all_lists_every_row(scenario_path):
    args = ["plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--gpus", "rtx-5080,h100-sxm",
            "--counts", "1", "--policies", "full_hbm", "--requests", "60", "--workers", "1"]
    short, every = run_cli(*args), run_cli(*args, "--all")
    assert short.returncode == every.returncode == 0, short.stderr
    assert "does not fit" not in short.stdout and "does not fit" in every.stdout


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
    (["--rate", "4", "--ttft-p99-ms", "500", "--top", "-1"], "--top"),
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
    assert C.parse_policies(None) == ["full_hbm", "evict_only", "tiered:0.25", "tiered:0.5", "tiered:auto"]
    assert C.parse_policies("tiered") == ["tiered:0.25", "tiered:0.5", "tiered:0.75", "tiered:auto"]
    assert C.parse_policies("full_hbm,tiered:0.5,tiered:auto", "prefetch,host_attention") == [
        "full_hbm", "tiered:0.5", "tiered:0.5/host_attention", "tiered:auto", "tiered:auto/host_attention"]
    assert C.parse_policies("tiered:auto/split,evict_only", "host_attention") == ["tiered:auto/split", "evict_only"]
    assert C.parse_policies("tiered:0.5/prefetch") == ["tiered:0.5"]


def test_candidate_scenarios_carry_the_layout_auto_and_the_access_strategy(base):
    sc = C.candidate_scenario(base, C.Candidate("h100-sxm", 1, "tiered:auto/host_attention"), 2.0, SPEC)
    assert sc.policy.kind == "tiered" and sc.policy.hbm_ratio == "auto" and sc.policy.access == "host_attention"
    sc = C.candidate_scenario(base, C.Candidate("h100-sxm", 4, "tiered:0.25", tp=2), 2.0, SPEC, requests=7)
    assert sc.policy.hbm_ratio == 0.25 and sc.parallel.tp == 2 and sc.workload.arrivals.requests == 7
    assert C.lossy("tiered:0.25", base) == (base.policy.evict_ratio > 0) and C.lossy("evict_only", base)
    assert not C.lossy("full_hbm", base)


def test_a_replica_sees_the_arrivals_a_round_robin_balancer_leaves_it(base):
    import numpy as np

    from sim.inputs.requests import build_requests

    one = C.candidate_scenario(base, C.Candidate("h100-sxm", 1, "full_hbm"), 8.0, SPEC, requests=20_000)
    assert one.workload.arrivals.kind == "poisson"
    four = C.candidate_scenario(base, C.Candidate("h100-sxm", 4, "full_hbm", tp=1), 2.0, SPEC, requests=20_000)
    assert four.workload.arrivals.kind == "gamma" and four.workload.arrivals.cv == 0.5  # 1 / sqrt(4)
    # every 4th arrival of the Poisson stream: the same mean gap, a quarter of the variance
    stream = np.diff(build_requests(one.workload).arrival_s)
    dealt = np.diff(np.cumsum(stream)[::4])
    gaps = np.diff(build_requests(four.workload).arrival_s)
    for g in (dealt, gaps):
        assert abs(g.mean() - 0.5) < 0.01 and abs(g.std() / g.mean() - 0.5) < 0.02
    tp4 = C.candidate_scenario(base, C.Candidate("h100-sxm", 4, "full_hbm", tp=4), 8.0, SPEC)
    assert tp4.workload.arrivals.kind == "poisson"  # one group: nothing to deal out


# ---- the sweep machinery: result store, goodput over the measured window -----------------------

SMALL_SPEC = C.PlanSpec(rate=4.0, ttft_s=0.5, tpot_s=0.02, requests=60, top=0)


def test_cache_reuses_stored_candidates_and_their_probes(base, tmp_path):
    from sim.runner.options import Execution

    args = (base, SMALL_SPEC, ["h100-sxm"], [1, 2], ["full_hbm"])
    fresh = P.search(*args, C.load_prices(), workers=1, disagg=False)
    cache = tmp_path / "cache"
    first = P.search(*args, C.load_prices(), execution=Execution(workers=2, cache=cache), disagg=False)
    assert (first.computed, first.stored) == (3, 0)  # TP1, TP2, TP1 x 2
    assert first.rows == fresh.rows and first.probes == fresh.probes and len(fresh.probes) > 3
    cheap = P.search(*args, C.parse_prices(["h100-sxm=0.5"]), execution=Execution(workers=1, cache=cache), disagg=False)
    assert (cheap.computed, cheap.stored) == (0, 3)  # prices are applied after the search
    assert cheap.probes == fresh.probes and {r["usd_per_hour"] for r in cheap.rows} == {0.5, 1.0}
    sorted(cache.glob("*/*.json"))[0].unlink()
    again = P.search(*args, C.load_prices(), execution=Execution(workers=1, cache=cache), disagg=False)
    assert (again.computed, again.stored) == (1, 2) and again.rows == fresh.rows and again.probes == fresh.probes
    other = P.search(base, replace(SMALL_SPEC, tpot_s=0.03), *args[2:], C.load_prices(),
                     execution=Execution(workers=1, cache=cache), disagg=False)
    assert other.computed == 3  # another SLO is another search


def test_cli_pareto_searches_the_front_and_says_so(scenario_path, tmp_path):
    args = ["plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--tpot-p99-ms", "20", "--gpus",
            "h100-sxm", "--counts", "2", "--policies", "full_hbm", "--requests", "60", "--top", "1"]
    plain = run_cli(*args, "--out", str(tmp_path / "a"))
    assert plain.returncode == 0 and "over the configurations simulated: the cheapest; --pareto" in plain.stdout
    front = run_cli(*args, "--pareto", "--out", str(tmp_path / "p"))
    assert front.returncode == 0, front.stderr
    assert "every configuration that may lie on it simulated" in front.stdout
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["pareto"] is True
    assert json.loads((tmp_path / "a" / "plan.json").read_text())["pareto"] is False
    rows = {k: list(csv.DictReader((tmp_path / k / "plan.csv").open())) for k in ("a", "p")}
    left = [r for r in rows["p"] if r["status"] == "unsearched"]
    assert all("for the Pareto front" in r["reason"] for r in left)  # none left for being dearer than the answer
    passed = {k: sum(r["status"] == "pass" for r in v) for k, v in rows.items()}
    assert passed["a"] == 1 and passed["p"] > 1


def test_cli_cache_says_what_it_searched(scenario_path, tmp_path):
    args = ["plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--gpus", "h100-sxm", "--counts", "1",
            "--policies", "full_hbm", "--requests", "60", "--json", "--cache", str(tmp_path / "c")]
    first = run_cli(*args)
    assert first.returncode == 0 and "plan: 1 candidates searched, 0 read from" in first.stderr, first.stderr
    again = run_cli(*args)
    assert again.returncode == 0 and "plan: 0 candidates searched, 1 read from" in again.stderr, again.stderr
    assert json.loads(again.stdout) == json.loads(first.stdout)


def test_probe_goodput_is_the_rate_times_the_measured_share_that_met_the_slo(base):
    for cand in (C.Candidate("h100-sxm", 1, "full_hbm"), C.Candidate("h100-sxm", 2, "full_hbm", tp=1)):
        probe = evaluate(base, cand, SMALL_SPEC)["probes"][0]
        assert probe["passed"] and probe["goodput_req_per_s"] == pytest.approx(SMALL_SPEC.rate, rel=1e-12)
    task = CandidateTask(base, C.Candidate("h100-sxm", 1, "full_hbm"), SMALL_SPEC)
    assert task.accepts(task.run()) and not task.accepts({"gpu": "h100-sxm"})


def test_max_num_seqs_is_a_searched_dimension(base, scenario_path):
    spec = C.PlanSpec(rate=8.0, ttft_s=0.5, tpot_s=0.015, requests=150, top=0)
    res = P.search(base, spec, ["h100-sxm"], [1], ["full_hbm"], C.load_prices(), workers=1, disagg=False, seqs=[4, 64])
    by_seqs = {r["max_num_seqs"]: r for r in res.rows}
    assert set(by_seqs) == {4, 64}
    four, more = by_seqs[4], by_seqs[64]
    # 8 req/s x ~130 tokens x ~12 ms needs ~13 running: four cannot, and the screen says why unsimulated
    assert four["status"] == "screened" and four["binding"] == "scheduler: max_num_seqs=4"
    assert more["status"] == "pass" and more["rank"] == 1
    from sim.plan.answer import launch_lines

    assert "--max-num-seqs 64" in launch_lines(more, base)["vllm"]
    assert C.parse_seqs(None) == [None] and C.parse_seqs("64,16,64") == [16, 64]
    res = run_cli("plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--max-num-seqs", "0,8")
    assert res.returncode == 2 and "--max-num-seqs" in res.stderr


def test_max_num_batched_tokens_is_a_searched_dimension(base, scenario_path, tmp_path):
    from sim.plan.answer import launch_lines

    spec = C.PlanSpec(rate=8.0, ttft_s=0.5, tpot_s=0.015, requests=150, top=0)
    res = P.search(base, spec, ["h100-sxm"], [1], ["full_hbm"], C.load_prices(), workers=1, disagg=False, budgets=[64, 4096])
    by_budget = {r["max_num_batched_tokens"]: r for r in res.rows}
    assert set(by_budget) == {64, 4096} and all(r["status"] in ("pass", "fail") for r in res.rows)
    assert {p["candidate"] for p in res.probes} == {"h100-sxm x1 tp1 full_hbm seqs 64 tokens 64",
                                                    "h100-sxm x1 tp1 full_hbm seqs 64 tokens 4096"}
    small = by_budget[64]
    assert C.candidate_scenario(base, P.row_candidate(small), 8.0, spec).scheduler.max_num_batched_tokens == 64
    if small["status"] == "pass":
        assert "--max-num-batched-tokens 64 " in launch_lines(small, base)["vllm"]
    # 64 tokens a step: a 256-token prompt takes four chunks or more, so its first token comes later
    assert small["ttft_p99_ms"] > by_budget[4096]["ttft_p99_ms"]
    plain = P.search(base, spec, ["h100-sxm"], [1], ["full_hbm"], C.load_prices(), workers=1, disagg=False)
    assert [r["max_num_batched_tokens"] for r in plain.rows] == [None]  # not searched: the scenario's, no column value
    task = CandidateTask(base, C.Candidate("h100-sxm", 1, "full_hbm", max_num_seqs=64), spec)
    assert "token_budget" not in task.inputs()["candidate"]  # keys stored before budgets were searched still hold
    other = CandidateTask(base, C.Candidate("h100-sxm", 1, "full_hbm", max_num_seqs=64, token_budget=64), spec)
    assert other.inputs()["candidate"]["token_budget"] == 64 and other.key != task.key
    stored = {k: v for k, v in small.items() if k in evaluate(base, other.cand, spec)}
    assert other.accepts({**stored, "probes": []}) and not task.accepts({**stored, "probes": []})
    assert C.parse_budgets(None, [None], base) == [None]
    assert C.parse_budgets("4096,64,4096", [None], base) == [64, 4096]
    for text, say in (("0,8", "expected whole numbers from 1"), ("32", "32 is below max_num_seqs 64")):
        out = run_cli("plan", str(scenario_path), "--rate", "4", "--ttft-p99-ms", "500", "--max-num-batched-tokens", text)
        assert out.returncode == 2 and "--max-num-batched-tokens" in out.stderr and say in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    folder = tmp_path / "plan"
    out = run_cli("plan", str(scenario_path), "--rate", "8", "--ttft-p99-ms", "500", "--tpot-p99-ms", "15", "--gpus",
                  "h100-sxm", "--counts", "1", "--policies", "full_hbm", "--no-disagg", "--requests", "150", "--top", "0",
                  "--max-num-batched-tokens", "64,4096", "--workers", "1", "--out", str(folder))
    assert out.returncode == 0, out.stderr
    assert "tokens" in out.stdout and json.loads((folder / "plan.json").read_text())["max_num_batched_tokens"] == [64, 4096]
    from sim.report.figures_serving import max_rate_figure
    from sim.report.plan_input import load_plan

    assert {x for b in max_rate_figure(load_plan(folder)).data for x in b.x} == {"1 x h100-sxm (TP1, 64 tokens)",
                                                                                 "1 x h100-sxm (TP1, 4096 tokens)"}


def test_the_screen_reads_the_length_distribution_not_one_request(base):
    """A candidate scenario asks for one request (the probes size their own runs); the screen's
    moments still come from thousands of draws of the workload's distribution."""
    from sim.plan.screen import MOMENT_SAMPLES, moments

    one = C.candidate_scenario(base, C.Candidate("h100-sxm", 1, "full_hbm"), 4.0, SPEC)
    assert one.workload.arrivals.requests == 1
    m = moments(one)
    assert m == moments(base)  # the same draws, whatever the arrivals ask for
    assert m.output_tokens == pytest.approx(128, rel=0.05) and m.prompt_tokens == 256  # lognormal mean 128
    # a running request is length-biased: prompt + E[n^2] / (2 E[n]) = 256 + (64^2 + 128^2) / 256 = 336
    assert m.running_context_tokens == pytest.approx(336, rel=0.05) and m.short_output_tokens < m.output_tokens
    assert MOMENT_SAMPLES >= 4096


def _probes_to_close(lo, hi, true_max, tol, choose):
    n = 0
    while hi / lo > 1 + tol:
        x = choose(lo, hi, tol)
        n += 1
        lo, hi = (x, hi) if x <= true_max else (lo, x)
    return n


def test_the_max_rate_search_walks_down_from_a_failure_only_where_it_never_costs_a_probe():
    from sim.plan.evaluate import next_rate

    x, step = next_rate(10.0, 12.216, 0.1)  # 1.21 < 1.2216 <= 1.331: just under the failure
    assert step == "below failed" and x == pytest.approx(12.216 / 1.1, rel=1e-5) and 12.216 / x < 1.1
    assert next_rate(10.0, 11.5, 0.1) == (math.sqrt(115.0), "bisect")  # within 1.21: one bisection closes it anyway
    assert next_rate(10.0, 20.0, 0.1) == (math.sqrt(200.0), "bisect")
    ours = lambda lo, hi, tol: next_rate(lo, hi, tol)[0]  # noqa: E731
    bisect = lambda lo, hi, tol: math.sqrt(lo * hi)  # noqa: E731
    fewer = 0
    for ratio in (1.15, 1.25, 1.3, 1.33, 1.5, 2.0, 4.0):
        for k in range(1, 200):
            true_max = 10.0 * ratio ** (k / 200)
            a, b = (_probes_to_close(10.0, 10.0 * ratio, true_max, 0.1, f) for f in (ours, bisect))
            assert a <= b, (ratio, true_max)
            fewer += a < b
    assert fewer > 0


@pytest.mark.parametrize("true_over_screen, steps", [
    (1.05, ["rate", "screen", "above screen"]),  # the screen a little low: one probe above it closes the bracket
    (1.15, ["rate", "screen", "above screen", "above screen", "bisect"]),  # x 1.1 passes, x 1.21 more fails
    (0.95, ["rate", "screen", "below screen"]),  # the screen a little high: one probe under it
])
def test_the_max_rate_search_starts_next_to_the_screens_estimate(base, monkeypatch, true_over_screen, steps):
    """Each probe passes exactly when its rate is at most the true max rate; the search's steps and
    its bracket, against the screen's estimate of 20 req/s (the rate asked: 16)."""
    from types import SimpleNamespace

    from sim.plan import evaluate as E

    monkeypatch.setattr(E, "binding", lambda *a: "-")
    true_max, seen = 20.0 * true_over_screen, []

    def run(rate, step):
        seen.append((step, rate))
        return Probe(rate, SimpleNamespace(fits=True, host_peak_bytes=None), misses=[] if rate <= true_max else [("x", "x")])

    row = E._search(base, C.Candidate("h100-sxm", 1, "full_hbm", 1), SPEC, run, None, 20.0)
    assert [s for s, _ in seen] == steps
    assert row["max_rate_per_s"] <= true_max < row["next_rate_per_s"] <= row["max_rate_per_s"] * 1.1


def test_the_reports_row_names_are_the_probes_names_for_pipelines_and_token_budgets():
    from collections import namedtuple

    from sim.plan.evaluate import key_of
    from sim.report.plan_input import row_key

    Row = namedtuple("Row", "gpu gpus tp policy prefill max_num_seqs experts pp max_num_batched_tokens")
    for cand in (C.Candidate("l40s", 4, "full_hbm", 2, max_num_seqs=256, pp=2),
                 C.Candidate("h100-sxm", 2, "full_hbm", 1, (1, 1), 64, token_budget=2048),
                 C.Candidate("h100-sxm", 1, "evict_only", max_num_seqs=64)):
        row = Row(cand.gpu, cand.count, cand.tp_size, cand.policy, "1xTP1" if cand.prefill else float("nan"),
                  cand.max_num_seqs, float("nan"), cand.pp, cand.token_budget or float("nan"))
        assert row_key(row) == key_of(cand)


def test_token_times_by_hand():
    """Mixed: a share min(1, chunks) of the steps carry a chunk; alone (SGLang's order): every chunk step stalls
    the decodes, so a token waits a decode step and the chunk steps between two of them."""
    from sim.plan.screen import Z99, token_times

    t, tail = token_times(0.010, 0.030, 0.25, False, 100)
    p99 = 0.25 + Z99 * math.sqrt(0.25 * 0.75 / 100)
    assert t == pytest.approx(0.75 * 0.010 + 0.25 * 0.030) and tail == pytest.approx((1 - p99) * 0.010 + p99 * 0.030)
    t, tail = token_times(0.010, 0.025, 0.25, True, 100)
    assert t == pytest.approx(0.010 + 0.25 * 0.025) and tail == pytest.approx(0.010 + p99 * 0.025)
    assert token_times(0.010, 0.025, 2.0, True, 100) == pytest.approx((0.060, 0.060))  # more chunks than decode steps


def test_the_screen_stalls_the_decodes_for_sglangs_prefill_steps(base):
    mixed = curve(base)
    alone = curve(base.model_copy(update={"scheduler": base.scheduler.model_copy(update={"mixed_prefill": False})}))
    assert alone.batch == mixed.batch
    assert all(a >= m for a, m in zip(alone.tpot_p99_s, mixed.tpot_p99_s))
    assert alone.tpot_p99_s[-1] > mixed.tpot_p99_s[-1]  # at the full batch the chunks' stalls show
