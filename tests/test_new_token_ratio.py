"""SGLang's admission estimate (scheduler admission reserve_ratio, sim/serving/new_token_ratio.py): the
ratio's arithmetic, admission by hand against on_demand and no_evict, and a pressured run."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.inputs.requests import RequestSet
from sim.inputs.scenario import load_scenario
from sim.serving.kv_memory import kv_memory
from sim.serving.new_token_ratio import CLIP_NEW_TOKENS, NewTokenRatio, clipped_remaining
from sim.serving.request import RequestTable
from sim.serving.row_counts import FixedRows
from sim.serving.run import simulate_serving
from sim.serving.scheduler import Scheduler, sglang_retraction_keep, sglang_retraction_order
from sim.serving.tier_counts import TierCounter

from .test_serving import load, serving, workload
from .test_serving_swap import EXAMPLE, PRESSURED


def test_the_ratio_decays_from_0_7_to_0_098_over_600_decode_steps():
    r = NewTokenRatio()
    assert r.current == 0.7 and r.floor == pytest.approx(0.098)
    r.decode_step()
    assert r.current == pytest.approx(0.7 - 0.602 / 600)
    for _ in range(598):
        r.decode_step()
    assert r.current == pytest.approx(0.098 + 0.602 / 600)
    r.decode_step()
    r.decode_step()
    assert r.current == pytest.approx(0.098)  # not below the floor
    r.retracted(np.array([100, 50]), np.array([1000, 1000]))  # (150 + 20 x 2) / (2000 + 1)
    assert r.current == pytest.approx(190 / 2001)
    r.retracted(np.array([990]), np.array([1000]))
    assert r.current == 1.0  # capped
    r.idle()
    assert r.current == 0.7


def test_dp_attention_makes_sglang_three_times_less_conservative():
    """server_args.py `_handle_data_parallelism`: schedule_conservativeness x 0.3 under DP attention, so the ratio
    starts at 0.21 and falls to 0.0294; a conservativeness above 1/0.7 caps the ratio at 1."""
    r = NewTokenRatio(0.3)
    assert r.current == pytest.approx(0.21) and r.floor == pytest.approx(0.0294)
    r.decode_step()
    assert r.current == pytest.approx(0.21 - (0.21 - 0.0294) / 600)
    r.idle()
    assert r.current == pytest.approx(0.21)
    assert NewTokenRatio(2.0).current == 1.0
    moe, dep2 = {"name": "qwen3-30b-a3b"}, {"tp": 2, "ep": 2, "attention_dp": 2}
    dep = load(serving(model=moe, workload=workload(), engine={"name": "sglang"}, parallel=dep2))
    assert dep.scheduler.schedule_conservativeness == 0.3
    assert load(serving(workload=workload(), engine={"name": "sglang"})).scheduler.schedule_conservativeness == 1.0
    mine = load(serving(model=moe, workload=workload(), engine={"name": "sglang"}, parallel=dep2,
                        scheduler={"schedule_conservativeness": 0.6}))
    assert mine.scheduler.schedule_conservativeness == 0.6  # the scenario's value is the one in effect
    assert _scheduler("reserve_ratio", 5.5, schedule_conservativeness=0.3).ratio.current == pytest.approx(0.21)


def test_remaining_outputs_are_clipped_at_4096():
    assert clipped_remaining(np.array([5000, 100, 10]), np.array([0, 30, 20])).tolist() == [CLIP_NEW_TOKENS, 70, 0]


def _scheduler(admission: str, budget_requests: float, n: int = 12, p: int = 1000, out: int = 2000, **sched):
    """A dense full_hbm scheduler with `n` requests of prompt p and output `out` waiting at t = 0, and a
    KV budget of `budget_requests` x (p + out) tokens."""
    sc = load(serving(scheduler={"admission": admission, "max_num_batched_tokens": 65536, **sched}))
    ctx = build_context(sc)
    prompts, outputs = np.full(n, p), np.full(n, out)
    reqs = RequestSet(np.arange(n), np.zeros(n), prompts, outputs)
    mem = kv_memory(ctx, 65536, 256)
    budget = budget_requests * (p + out) * mem.kv_bytes_per_token
    mem = replace(mem, runtime_reserve_bytes=mem.hbm_capacity_bytes - mem.weights_bytes - mem.activation_bytes - budget)
    sched = Scheduler(sc.scheduler, mem, FixedRows(TierCounter(ctx.policy, prompts, outputs), prompts), RequestTable(reqs))
    for i in range(n):
        sched.arrive(i)
    return sched


def _two_steps(admission: str) -> tuple[int, int]:
    sched = _scheduler(admission, 5.5)
    first = sched.schedule(0.0)
    sched.complete(first, 0.1, 0)
    second = sched.schedule(0.1)
    return len(first.chunks), len(second.chunks)


def test_admission_by_hand_between_on_demand_and_no_evict():
    """Budget 5.5 x (p + n) tokens, p = 1,000, n = 2,000. First step, nothing running: a newcomer needs its
    prompt + its output in full beside what this round admitted (SGLang's add_one_req), so admission stops
    at (i + 1) 3,000 >= 16,500: 5 requests, as no_evict's 5. Second step: the 5 hold 1,001 tokens each and
    keep 0.7 x 1,999 free each: 5,005 + 6,996.5 + 3,000 < 16,500 admits a 6th, whose output then counts in
    full: + 1,000 + 2,000 + 3,000 > 16,500 stops. on_demand counts prompts alone (16 fit: the queue's 12)."""
    assert _two_steps("reserve_ratio") == (5, 1)
    assert _two_steps("no_evict") == (5, 0)
    assert _two_steps("on_demand") == (12, 0)


def test_a_pressured_sglang_run_preempts_less_than_on_demand_and_loses_no_token():
    base = load_scenario(EXAMPLE, PRESSURED)
    on_demand = simulate_serving(base).summary
    ratio = simulate_serving(load_scenario(EXAMPLE, [*PRESSURED, "scheduler.admission=reserve_ratio"])).summary
    assert on_demand.preemptions > 0
    assert ratio.preemptions < on_demand.preemptions
    assert ratio.total_output_tokens == on_demand.total_output_tokens and ratio.requests == on_demand.requests
    sglang = load(serving(workload=workload(), engine={"name": "sglang"}))
    assert sglang.scheduler.admission == "reserve_ratio"


def test_the_planners_screen_counts_the_floor_reserve():
    """The screen's HBM cap under reserve_ratio: a running request holds its mean context and keeps the floor
    ratio (0.098) of its remaining output free - E[n n / 2] / E[n], clipped at 4,096."""
    from types import SimpleNamespace

    from sim.plan.screen import concurrency_caps

    mem = kv_memory(build_context(load(serving())), 8192, 256)
    m = SimpleNamespace(running_context_tokens=1500.0, reserved_tokens=2500.0, prompt_tokens=1000.0, output_tokens=1000.0)
    share = np.array([1.0, 0.0, 0.0])

    def hbm_cap(admission):
        sched = SimpleNamespace(admission=admission, max_num_seqs=256, max_num_batched_tokens=8192)
        return concurrency_caps(mem, sched, m, share, 1)["HBM capacity"]

    kv = mem.kv_bytes_per_token
    assert hbm_cap("on_demand") == pytest.approx(mem.kv_budget_bytes / (1500 * kv))
    assert hbm_cap("reserve_ratio") == pytest.approx(mem.kv_budget_bytes / ((1500 + 0.098 * 1000) * kv))
    assert hbm_cap("no_evict") == pytest.approx(mem.kv_budget_bytes / (2500 * kv))


def test_sglang_retracts_the_least_decoded_and_keeps_20_tokens_each():
    """retract_decode's order by hand: most decoded kept first, among equals the shortest prompt; then it
    retracts one at least and goes on while the kept leave fewer than 20 tokens free each; never the last."""
    assert sglang_retraction_order(np.array([5, 0, 5, 3]), np.array([100, 50, 10, 7])).tolist() == [2, 0, 3, 1]
    cum = np.array([1900.0, 4400.0, 5500.0, 8600.0])  # tokens at 1 byte each
    assert sglang_retraction_keep(cum, 3, 8000.0, 1.0) == 3  # 2,500 free >= 3 x 20
    assert sglang_retraction_keep(cum, 3, 5540.0, 1.0) == 2  # 40 free < 60: one more; 1,140 >= 40
    assert sglang_retraction_keep(cum, 4, 9000.0, 1.0) == 3  # a retraction is at least one request
    assert sglang_retraction_keep(cum[:1], 0, 1000.0, 1.0) == 0  # one that cannot fit alone goes
    assert sglang_retraction_keep(cum, 1, 1950.0, 1.0) == 1  # never below one that fits


def _running(admission: str, budget_tokens: float):
    """Four decoding requests (prompts 1,000, 1,000, 3,000, 2,000; 900, 100, 100, 500 generated: 8,600
    tokens in admission order) and a fifth waiting, under `admission`, with a KV budget of `budget_tokens`."""
    sched = _scheduler(admission, 100.0, n=5)
    t = sched.table
    t.prompt[:] = t.target[:] = t.computed[:] = np.array([1000, 1000, 3000, 2000, 1000])
    t.generated[:4] = [900, 100, 100, 500]
    t.computed[4] = 0
    sched.running, sched.waiting = np.arange(4), deque([4])
    mem = sched.memory
    sched.memory = replace(mem, runtime_reserve_bytes=mem.runtime_reserve_bytes + mem.kv_budget_bytes
                           - budget_tokens * mem.kv_bytes_per_token)
    return sched


def test_a_sglang_step_retracts_in_its_order_to_the_back_of_the_queue():
    """8,600 tokens over a budget of 8,000: vLLM's order preempts the newest (request 3) to the front of the
    queue; SGLang's retracts request 2 (100 decoded, the longer prompt) to its back; at 5,540 SGLang keeps
    only what leaves 20 tokens each free (requests 0 and 3)."""
    vllm = _running("on_demand", 8000)
    assert vllm.schedule(0.0).preempted == [3] and list(vllm.waiting)[:2] == [3, 4]
    sglang = _running("reserve_ratio", 8000)
    assert sglang.schedule(0.0).preempted == [2] and list(sglang.waiting) == [4, 2]
    assert sorted(sglang.running.tolist()) == [0, 1, 3]
    tight = _running("reserve_ratio", 5540)
    assert tight.schedule(0.0).preempted == [2, 1] and list(tight.waiting) == [4, 2, 1]
