"""A fleet of replicas behind a load balancer (sim/serving/fleet.py): round-robin reproduces one
replica simulated alone on every k-th arrival, exactly; least-outstanding balances what is in each
replica and, at the same load, queues less; bad input says what was expected."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sim.inputs.errors import ConfigError
from sim.inputs.requests import RequestSet
from sim.inputs.scenario import load_scenario
from sim.serving.engine import ServingSim
from sim.serving.fleet import LEAST_OUTSTANDING, ROUND_ROBIN, VLLM, pick_replica, simulate_fleet
from sim.serving.request import RequestTable
from sim.serving.run import prepare, row_counts
from sim.serving.scheduler import Scheduler

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "serving-h100-70b-tp4.yaml"


def fleet_scenario(rate: float, requests: int = 240, seqs: int = 32):
    # a small batch cap, so that the replicas queue and the balancer matters
    return load_scenario(SCENARIO, [f"workload.arrivals.rate_per_s={rate}", f"workload.arrivals.requests={requests}",
                                    f"scheduler.max_num_seqs={seqs}", "hardware.kernels=datasheet"])


def alone(scenario, every: int, first: int):
    """One replica simulated by itself on arrivals first, first + every, ... of the scenario's stream."""
    ctx, reqs, memory, why = prepare(scenario)
    assert why is None
    pick = np.arange(first, len(reqs), every)
    sub = RequestSet(np.arange(len(pick)), reqs.arrival_s[pick], reqs.prompt_tokens[pick], reqs.output_tokens[pick])
    table = RequestTable(sub)
    ServingSim(ctx, sub, Scheduler(scenario.scheduler, memory, row_counts(ctx, memory, sub), table)).run()
    return pick, table


def test_round_robin_fleet_is_each_replica_alone_exactly():
    sc = fleet_scenario(rate=6.0)
    res = simulate_fleet(sc, 3, ROUND_ROBIN)
    r = res.requests.set_index("id")
    assert r["finish_s"].notna().all()
    for j in range(3):
        pick, table = alone(sc, 3, j)
        assert (r.loc[pick, "replica"] == j).all()
        np.testing.assert_array_equal(r.loc[pick, "first_token_s"].to_numpy(), table.first_token_s)
        np.testing.assert_array_equal(r.loc[pick, "finish_s"].to_numpy(), table.finish_s)


def test_least_outstanding_sends_each_arrival_to_the_least_loaded_replica():
    def replica(in_system: int, waiting: int) -> SimpleNamespace:
        running = np.arange(in_system - waiting)
        return SimpleNamespace(in_system=in_system, scheduler=SimpleNamespace(waiting=[0] * waiting, running=running))

    four = [replica(3, 0), replica(1, 1), replica(1, 0), replica(2, 0)]
    assert pick_replica(LEAST_OUTSTANDING, 7, four) == 1  # the first of the least loaded
    assert pick_replica(ROUND_ROBIN, 7, four) == 3
    assert pick_replica(VLLM, 7, four) == 2  # scores 3, 4, 1, 2: a waiting request weighs 4


def test_vllms_balancer_reads_published_counts_and_counts_what_it_sent():
    import simpy

    from sim.serving.fleet import VLLM_STATS_INTERVAL_S, VllmBalancer

    idle = [SimpleNamespace(scheduler=SimpleNamespace(waiting=[], running=[])) for _ in range(3)]
    env = simpy.Environment()
    lb = VllmBalancer(idle, env)
    assert [lb.pick(i) for i in range(4)] == [0, 1, 2, 0]  # each sent one raises its replica's waiting
    idle[1].scheduler.running = [7]  # replica 1 takes a request: not seen until the next publication
    env.run(until=VLLM_STATS_INTERVAL_S * 1.5)
    assert lb.counts == [[0, 0], [0, 1], [0, 0]] and lb.pick(4) == 0
    sc = fleet_scenario(rate=6.0)
    res = simulate_fleet(sc, 3, LEAST_OUTSTANDING)
    r = res.requests
    assert r["finish_s"].notna().all() and len(r) == 240  # every request served, by one replica
    assert set(r["replica"]) == {0, 1, 2}
    assert res.summary.requests == 240 and res.summary.total_output_tokens == int(r["output_tokens"].sum())


def test_least_outstanding_queues_less_than_round_robin_under_load():
    sc = fleet_scenario(rate=3.0, requests=400, seqs=16)  # near the two replicas' capacity: they queue
    rr, lo = simulate_fleet(sc, 2, ROUND_ROBIN).summary, simulate_fleet(sc, 2, LEAST_OUTSTANDING).summary
    assert lo.queue_mean_s < rr.queue_mean_s
    assert lo.ttft_p99_s < rr.ttft_p99_s
    vllm = simulate_fleet(sc, 2, VLLM).summary  # also balances on load
    assert vllm.queue_mean_s < rr.queue_mean_s


def test_fleet_refuses_bad_input():
    sc = fleet_scenario(rate=6.0)
    with pytest.raises(ConfigError, match="unknown load balancer 'random'; expected one of round-robin, least-outstanding, vllm"):
        simulate_fleet(sc, 2, "random")
    with pytest.raises(ConfigError, match="at least 1 replica"):
        simulate_fleet(sc, 0)
    closed = load_scenario(SCENARIO, ["workload.arrivals={kind: closed_loop, concurrency: 4, requests: 8}"])
    with pytest.raises(ConfigError, match="open-loop arrivals"):
        simulate_fleet(closed, 2)


# ---- the planner with --balancer --------------------------------------------------------------
PLAN_SCENARIO = {
    "name": "plan-fleet", "model": {"name": "deepseek-r1-distill-qwen-14b", "weight_dtype": "bf16", "kv_dtype": "bf16"},
    "hardware": {"gpu": "h100-sxm", "kernels": "datasheet"},
    "workload": {"prompt_tokens": 256, "reasoning_tokens": {"dist": "lognormal", "mean": 128, "std": 64, "min": 8, "max": 512},
                 "seed": 0, "arrivals": {"kind": "poisson", "rate_per_s": 1, "requests": 10}},
    "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
    "policy": {"kind": "full_hbm"}, "sim": {"detail": "step"},
}


@pytest.fixture(scope="module")
def plan_base(tmp_path_factory):
    import yaml

    path = tmp_path_factory.mktemp("fleet") / "plan-fleet.yaml"
    path.write_text(yaml.safe_dump(PLAN_SCENARIO))
    return path, load_scenario(path)


def test_a_least_outstanding_probe_runs_the_replicas_together(plan_base):
    from dataclasses import replace

    from sim.plan.candidates import Candidate, PlanSpec
    from sim.plan.evaluate import CandidateTask, probe_at

    _, base = plan_base
    cand = Candidate("h100-sxm", 2, "full_hbm", tp=1)
    rr = PlanSpec(rate=8.0, ttft_s=0.5, tpot_s=0.015, top=0)
    lo = replace(rr, balancer=LEAST_OUTSTANDING)
    p_rr, p_lo = probe_at(base, cand, rr, 8.0), probe_at(base, cand, lo, 8.0)
    assert p_rr.rate_per_s == p_lo.rate_per_s == 4.0  # a replica's share, for the binding
    # round-robin measures one replica's arrivals (rate / 2), the fleet every arrival: its 400-odd measured
    # requests (steady.MIN_MEASURED) arrive in about half the time
    assert min(p_rr.measured, p_lo.measured) >= 400
    assert 0.4 < p_lo.window_s / p_rr.window_s < 0.6
    assert "balancer" not in CandidateTask(base, cand, rr, None, 0.0).inputs()["spec"]  # old store keys hold
    assert CandidateTask(base, cand, lo, None, 0.0).key != CandidateTask(base, cand, rr, None, 0.0).key


def test_plan_cli_takes_a_balancer_and_refuses_an_unknown_one(plan_base):
    from .conftest import run_cli

    path, _ = plan_base
    args = ["plan", str(path), "--rate", "8", "--ttft-p99-ms", "500", "--tpot-p99-ms", "15", "--gpus", "h100-sxm",
            "--counts", "2", "--policies", "full_hbm", "--no-disagg", "--workers", "1"]
    res = run_cli(*args, "--balancer", "least-outstanding")
    assert res.returncode == 0, res.stderr
    assert "TP1 x 2" in res.stdout and "least-outstanding" in res.stdout
    bad = run_cli(*args, "--balancer", "random")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "--balancer: unknown load balancer 'random'; expected one of round-robin, least-outstanding, vllm" in bad.stderr


def test_launch_lines_say_the_engines_balancer_against_the_planned_one():
    from sim.plan.answer import SGLANG_SHORTEST_QUEUE, balanced

    dp2 = {"vllm": "vllm serve M --tensor-parallel-size 1 --data-parallel-size 2 --max-num-seqs 8",
           "sglang": "python -m sglang.launch_server --tp-size 1 --dp-size 2  # a note"}
    rr, lo, vl = (balanced(dp2, b, 2) for b in (ROUND_ROBIN, LEAST_OUTSTANDING, VLLM))
    assert "routes by load (4 x waiting + running), not round-robin as planned" in rr["vllm"]
    assert rr["sglang"] == dp2["sglang"]  # SGLang's --dp-size deals round-robin by default
    assert lo["sglang"] == f"python -m sglang.launch_server --tp-size 1 --dp-size 2 {SGLANG_SHORTEST_QUEUE}  # a note"
    assert vl["vllm"] == dp2["vllm"]  # planned with vLLM's own balancer: nothing to say
    one = {"vllm": "vllm serve M --tensor-parallel-size 2 --data-parallel-size 1", "sglang": "x --dp-size 1"}
    assert balanced(one, LEAST_OUTSTANDING, 1) == one  # one replica: no balancer
