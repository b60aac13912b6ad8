"""Serving capacity planning (issue #14): swap preemption (K/V to host and back instead of a
re-prefill), a PCIe switch shared by a tensor-parallel group, and prompt-length distributions."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.device.hardware import LinkModel, behind_switch, gpus_sharing_uplink, switch_share_bytes_per_s
from sim.inputs.requests import RequestSet, build_requests, draw_prompts
from sim.inputs.scenario import load_scenario, scenario_from_dict
from sim.model.units import GB
from sim.outputs.run_folder import to_json
from sim.outputs.schema import REQUEST_COLUMNS, SERVING_QUIET, SERVING_TIMELINE_COLUMNS, ServingSummary
from sim.serving.kv_memory import kv_memory
from sim.serving.request import RequestTable
from sim.serving.row_counts import FixedRows
from sim.serving.run import simulate_serving
from sim.serving.scheduler import Scheduler
from sim.serving.tier_counts import TierCounter
from sim.tiering.tiers import T0, T1, T2

from .conftest import SCENARIOS, run_cli
from .test_serving import load, run, serving, workload

EXAMPLE = SCENARIOS / "serving-h100-70b-tp4.yaml"
TIERED = {"kind": "tiered", "hbm_ratio": 0.25, "evict_ratio": 0.0, "retier_interval": 32, "recent_window": 32}


def with_kv_budget(sc: dict, tokens: float) -> dict:
    """`sc` with the runtime reserve set so that the KV budget holds `tokens` tokens of full KV."""
    ctx = build_context(load(sc))
    mem = kv_memory(ctx, 8192, 256)
    reserve = mem.hbm_capacity_bytes - mem.weights_bytes - mem.activation_bytes - tokens * ctx.kv_bytes_per_token
    return {**sc, "hardware": {**sc.get("hardware", {}), "efficiency": {"runtime_reserve_bytes": reserve}}}


# ---- swap preemption, by hand ------------------------------------------------------------------
P, N = 100, 200


def two_requests(preemption: str, **scheduler) -> dict:
    """Two requests of 100 + 200 tokens at t = 0 (prefilled together, then decoding in lockstep) and
    a KV budget of 501 tokens: both hold 2 (100 + G) tokens in the step that writes their G-th
    token, so the step with G = 151 overflows and the newer one (request 1) is preempted, holding
    100 + 151 - 1 = 250 tokens' K/V. It resumes once request 0 finishes."""
    sc = serving(workload=workload(prompt_tokens=P, reasoning_tokens=N,
                                   arrivals={"kind": "closed_loop", "concurrency": 2, "requests": 2}),
                 scheduler={"preemption": preemption, **scheduler})
    return with_kv_budget(sc, 2 * (P + 150) + 1)


def test_swap_moves_the_victims_kv_over_the_link_and_never_prefills_it_again():
    ctx = build_context(load(two_requests("swap")))
    kv, L = ctx.kv_bytes_per_token, ctx.num_layers
    swapped_bytes = (P + 151 - 1) * kv  # 250 tokens x 131,072 B (Llama 3.1 8B, bf16)
    swap, recompute = run(two_requests("swap")), run(two_requests("recompute"))
    s = swap.summary
    assert (s.preemptions, s.swaps, s.swap_fallbacks) == (1, 1, 0)
    assert s.swap_out_bytes == s.swap_in_bytes == swapped_bytes and s.swap_ins == 1
    assert swap.requests["swaps"].tolist() == [0, 1] and swap.requests["preemptions"].tolist() == [0, 1]
    # the timeline: the bytes on the step that preempts and on the one that resumes, swapped between
    tl = swap.timeline
    out_at, in_at = np.flatnonzero(tl["swap_out_bytes"]), np.flatnonzero(tl["swap_in_bytes"])
    assert len(out_at) == len(in_at) == 1 and out_at[0] < in_at[0]
    assert tl["swap_out_bytes"][out_at[0]] == tl["swap_in_bytes"][in_at[0]] == swapped_bytes
    assert tl["swapped"].tolist() == [0] * out_at[0] + [1] * (in_at[0] - out_at[0]) + [0] * (len(tl) - in_at[0])
    # the link carried exactly that, once each way (full_hbm: nothing else crosses it)
    hw = ctx.hw
    assert s.d2h_utilization * s.duration_s == pytest.approx(hw.d2h.transfer_time_s(swapped_bytes, L), rel=1e-9)
    assert s.h2d_utilization * s.duration_s == pytest.approx(hw.h2d.transfer_time_s(swapped_bytes, L), rel=1e-9)
    # no re-prefill: the prompts are the only prefill tokens; recompute prefills 100 + 151 again
    assert swap.timeline["prefill_tokens"].sum() == 2 * P
    assert recompute.timeline["prefill_tokens"].sum() == 2 * P + P + 151
    assert recompute.summary.swaps is None and recompute.summary.preemptions == 1
    # tokens conserved: every request gets its N tokens, one per step it runs
    assert swap.requests["output_tokens"].tolist() == [N, N] and swap.requests["finish_s"].notna().all()
    assert swap.timeline["decodes"].sum() + 2 == 2 * N  # the prefills sample the first token of each
    # request 0 runs the same steps either way, but the step that preempts waits for the swap-out
    # (and at 251 tokens a re-prefill is a weight-bound step, about a decode: swap buys little here)
    extra_s = swap.requests["e2e_s"][0] - recompute.requests["e2e_s"][0]
    assert extra_s == pytest.approx(hw.d2h.transfer_time_s(swapped_bytes, L), rel=1e-6)
    # and the host holds the swapped K/V while request 1 waits
    assert s.host_peak_bytes == pytest.approx(swapped_bytes)


PRESSURED = ["workload.arrivals.requests=300", "parallel.tp=2", "workload.arrivals.rate_per_s=4"]  # swaps happen
SWAP_ROWS = ("swapped out / in", "recompute fallbacks")


def test_swap_keys_lines_and_columns_appear_exactly_with_swap(tmp_path):
    runs = {}
    for preemption in ("recompute", "swap"):
        out = tmp_path / preemption
        sets = [a for o in [*PRESSURED, f"scheduler.preemption={preemption}"] for a in ("--set", o)]
        res = run_cli("run", str(EXAMPLE), "--out", str(out), *sets)
        assert res.returncode == 0, res.stderr
        runs[preemption] = (res.stdout, json.loads((out / "summary.json").read_text()),
                            *((out / f).read_text().splitlines()[0].split(",") for f in ("requests.csv", "timeline.csv")))
    # recompute: every other key of the schema, none of swap's; no swap lines, the columns as before
    stdout, s, req_cols, tl_cols = runs["recompute"]
    assert s["preemptions"] > 0
    assert list(s) == [k for k in ServingSummary.model_fields if k not in SERVING_QUIET]
    assert not any(row in stdout for row in SWAP_ROWS)
    assert req_cols == REQUEST_COLUMNS and tl_cols == SERVING_TIMELINE_COLUMNS
    # swap: its keys after preempted_requests (swap_space_bytes only when given), its lines, its columns
    stdout, s, req_cols, tl_cols = runs["swap"]
    keys = list(s)
    at = keys.index("preempted_requests")
    assert keys[at + 1:at + 8] == ["preemption", "swaps", "swap_ins", "swap_fallbacks", "swap_out_bytes",
                                   "swap_in_bytes", "mean_concurrency"]
    assert s["preemption"] == "swap" and s["swaps"] > 0
    line = next(ln for ln in stdout.splitlines() if "swapped out / in" in ln)
    assert f"{s['swaps']:,} / {s['swap_ins']:,} requests" in line and f"{s['swap_out_bytes'] / GB:,.2f} GB" in line
    assert "recompute fallbacks" in stdout
    assert req_cols[req_cols.index("preemptions"):][:2] == ["preemptions", "swaps"]
    assert tl_cols == ["t_s", "running", "waiting", "swapped", "hbm_bytes", "host_bytes", "swap_out_bytes",
                       "swap_in_bytes", "step_s", "decodes", "prefill_tokens"]
    limited = simulate_serving(load_scenario(EXAMPLE, ["workload.arrivals.requests=40", "scheduler.preemption=swap",
                                                       "scheduler.swap_space_bytes=5e9"])).summary
    assert json.loads(to_json(limited))["swap_space_bytes"] == 5e9
    assert "preemption" not in load_scenario(EXAMPLE).model_dump(mode="json")["scheduler"]


@pytest.mark.parametrize("every", [1, 7])
def test_the_timelines_swap_bytes_add_up_to_the_summarys(every):
    """Each row carries the swap bytes since the previous row, so a thinned timeline sums the same."""
    res = simulate_serving(load_scenario(EXAMPLE, [*PRESSURED, "scheduler.preemption=swap", f"sim.record_every={every}"]))
    s, tl = res.summary, res.timeline
    assert s.swaps > 0 and s.swap_in_bytes > 0 and tl["swapped"].max() > 0
    assert tl["swap_out_bytes"].sum() == s.swap_out_bytes and tl["swap_in_bytes"].sum() == s.swap_in_bytes
    if every > 1:
        full = simulate_serving(load_scenario(EXAMPLE, [*PRESSURED, "scheduler.preemption=swap"])).timeline
        assert len(tl) == len(full[::every]) + 1 and tl["swapped"].iloc[:-1].tolist() == full["swapped"][::every].tolist()
        assert (tl["swap_out_bytes"] > 0).sum() < (full["swap_out_bytes"] > 0).sum()  # intervals merged


# ---- swap preemption: tiered, only T0 crosses -------------------------------------------------
def tiered_scheduler(budget_factor: float, host_bytes: float | None = None, g: int = 300):
    """A swap scheduler over two tiered requests (prompt 256, both decoding with g tokens out) whose
    KV budget holds `budget_factor` x one request's need for the next step."""
    sc = load(serving(policy=TIERED, scheduler={"preemption": "swap"}))
    ctx = build_context(sc)
    prompts, outputs = np.array([256, 256]), np.array([1000, 1000])
    reqs = RequestSet(np.arange(2), np.zeros(2), prompts, outputs)
    counter = FixedRows(TierCounter(ctx.policy, prompts, outputs), prompts)
    table = RequestTable(reqs)
    table.generated[:] = g
    table.computed[:] = table.target[:] = prompts  # prefilled: decoding
    mem = kv_memory(ctx, 8192, 256)
    probe = Scheduler(sc.scheduler, mem, counter, table)
    att, aft = counter.step_counts(np.array([0]), table.generated[:1], np.array([True]))
    need = float(probe._needs(att, aft, np.array([True]), prompts[:1])[0][0])
    mem = replace(mem, runtime_reserve_bytes=mem.hbm_capacity_bytes - mem.weights_bytes - mem.activation_bytes
                  - budget_factor * need, **({"host_capacity_bytes": host_bytes} if host_bytes else {}))
    sched = Scheduler(sc.scheduler, mem, counter, table)
    sched.running = np.array([0, 1])
    return sched, ctx


def test_a_tiered_swap_moves_only_the_t0_tokens():
    sched, ctx = tiered_scheduler(1.5)
    kv, t2 = ctx.kv_bytes_per_token, ctx.t2_bytes_per_token
    held = sched.counter.held(0, 300)  # its cache: 256 + 300 - 1 tokens over the tiers
    assert held[T0] + held[T1] + held[T2] == 256 + 300 - 1 and held[T1] > 0
    plan = sched.schedule(0.0)
    assert plan.preempted == [1] and plan.swap_out_requests == 1
    assert plan.swap_out_bytes == held[T0] * kv  # T1/T2 already live on the host
    assert sched.swap.host_bytes[1] == held[T0] * kv + held[T1] * kv + held[T2] * t2
    running_host = plan.host_bytes - sched.swap.held_bytes
    assert running_host > 0  # request 0's T1, beside request 1's swapped K/V
    # request 0 finishes: request 1's T0 comes back and it decodes in the same step
    sched.running = np.zeros(0, dtype=np.int64)
    plan = sched.schedule(1.0)
    assert plan.swap_in_bytes == held[T0] * kv and plan.swap_in_requests == 1
    assert plan.decodes.tolist() == [1] and not len(plan.chunks)
    att, _ = sched.counter.step_counts(np.array([1]), np.array([300]), np.array([True]))
    assert plan.attended.tolist() == att[0].tolist() and len(sched.swap) == 0


def test_a_victim_without_room_on_the_host_is_recomputed_and_counted():
    sched, _ = tiered_scheduler(1.5)
    sched.swap.limit_bytes = 1.0  # swap space of one byte
    plan = sched.schedule(0.0)
    assert plan.preempted == [1] and plan.swap_out_bytes == 0.0
    assert (sched.swaps, sched.swap_fallbacks, sched.preemptions) == (0, 1, 1)
    assert sched.table.computed[1] == 0 and sched.table.target[1] == 256 + 300  # prefilled again


def test_swapped_kv_that_keeps_the_queue_head_out_is_dropped_when_nothing_runs():
    """Liveness: request 1's swapped K/V fills the host; request 0 (recomputed, needing host for its
    T1 once prefilled) heads the queue and nothing runs - the swap is given up, request 0 admitted."""
    sched, _ = tiered_scheduler(4.0)
    t = sched.table
    need_host = sched.memory.host_bytes(*sched.counter.held(0, 301)[[T1, T2]])
    sched.memory = replace(sched.memory, host_capacity_bytes=need_host * 1.5)
    sched.running = np.zeros(0, dtype=np.int64)
    t.recompute(0)
    sched.swap.put(1, 1e6, need_host)  # request 1 swapped, holding two thirds of the host
    sched.waiting.extend([0, 1])
    plan = sched.schedule(0.0)
    assert plan.chunks.tolist()[:1] == [0] and sched.swap_fallbacks == 1 and len(sched.swap) == 0
    assert t.target[1] == 256 + 300 and t.computed[1] == 0


def test_swap_with_no_room_anywhere_is_recompute_exactly():
    sc = with_kv_budget(serving(workload=workload(reasoning_tokens=512, arrivals={"kind": "closed_loop",
                                                                                  "concurrency": 64,
                                                                                  "requests": 160})),
                        40 * (256 + 512))
    recompute = run(sc)
    tiny = run({**sc, "scheduler": {"preemption": "swap", "swap_space_bytes": 1.0}})
    no_host = run({**sc, "hardware": {**sc["hardware"], "host_memory_bytes": 1.0}, "scheduler": {"preemption": "swap"}})
    assert recompute.summary.preemptions > 0
    for res in (tiny, no_host):
        assert res.summary.swaps == 0 and res.summary.swap_fallbacks == recompute.summary.preemptions
        assert res.requests.drop(columns="swaps").equals(recompute.requests)
        swap_cols = ["swapped", "swap_out_bytes", "swap_in_bytes"]
        assert res.timeline.drop(columns=swap_cols).equals(recompute.timeline)
        assert not res.timeline[swap_cols].to_numpy().any()
    # room for some: both kinds happen, every request still completes with all its tokens
    some = run({**sc, "scheduler": {"preemption": "swap", "swap_space_bytes": 2 * 600 * 131_072}})
    s = some.summary
    assert s.swaps > 0 and s.swap_fallbacks > 0 and s.swaps + s.swap_fallbacks == s.preemptions
    assert some.requests["finish_s"].notna().all()
    assert s.swap_in_bytes == pytest.approx(s.swap_out_bytes)  # every swapped request came back
    swapped = run({**sc, "scheduler": {"preemption": "swap"}})
    assert swapped.summary.swap_fallbacks == 0 and swapped.summary.swaps == swapped.summary.preemptions
    assert swapped.timeline["prefill_tokens"].sum() == 160 * 256  # nothing prefilled twice


# ---- PCIe switch ---------------------------------------------------------------------------------
def test_switch_share_by_hand():
    assert switch_share_bytes_per_s(55.4e9, 55.4e9, 2) == 27.7e9  # two GPUs halve a Gen5 uplink
    assert switch_share_bytes_per_s(25e9, 64e9, 2) == 25e9  # a Gen4 link behind a faster uplink: the link binds
    assert switch_share_bytes_per_s(55.4e9, 55.4e9, 1) == 55.4e9
    assert [gpus_sharing_uplink(tp, 2) for tp in (1, 2, 4, 8)] == [1, 2, 2, 2]
    assert gpus_sharing_uplink(4, 8) == 4
    link = LinkModel(per_copy_latency_s=4e-6, bytes_per_s=55.4e9, bidirectional_bytes_per_s=41.5e9)
    assert behind_switch(link, 55.4e9, 1) is link
    shared = behind_switch(link, 55.4e9, 4)
    size = 1e8
    assert shared.copy_time_s(size) == pytest.approx(4e-6 + size / (55.4e9 / 4), rel=1e-12)
    assert shared.copy_time_s(size, True) == pytest.approx(4e-6 + size / (55.4e9 / 4 * 41.5 / 55.4), rel=1e-12)
    assert shared.transfer_time_s(size, 10) == pytest.approx(10 * (4e-6 + size / 10 / (55.4e9 / 4)), rel=1e-12)


def test_one_gpu_per_switch_is_todays_numbers_exactly():
    over = ["workload.arrivals.requests=60", "policy.kind=tiered", "scheduler.preemption=swap"]
    base = simulate_serving(load_scenario(EXAMPLE, over))
    alone = simulate_serving(load_scenario(EXAMPLE, [*over, "hardware.pcie_switch={gpus_per_switch: 1}"]))
    assert alone.requests.equals(base.requests) and alone.timeline.equals(base.timeline)
    skip = {"resolved_scenario", "sources", "versions"}
    assert alone.summary.model_dump(exclude=skip) == base.summary.model_dump(exclude=skip)
    assert "does not bind" in alone.summary.sources["pcie_switch"] and "pcie_switch" not in base.summary.sources


def test_a_shared_switch_slows_a_tp_groups_host_traffic():
    over = ["workload.arrivals.requests=60", "policy.kind=tiered"]
    ctx = build_context(load_scenario(EXAMPLE, [*over, "hardware.pcie_switch={gpus_per_switch: 2}"]))
    size = 1e8  # two of the four TP GPUs behind each switch: half an uplink each
    assert ctx.hw.h2d.copy_time_s(size) == pytest.approx(4e-6 + size / (55.4e9 / 2), rel=1e-12)
    assert ctx.hw.d2h.copy_time_s(size) == pytest.approx(4e-6 + size / (55.2e9 / 2), rel=1e-12)
    assert "2 GPUs per switch" in ctx.hw.sources["pcie_switch"] and "binds" in ctx.hw.sources["pcie_switch"]
    base = simulate_serving(load_scenario(EXAMPLE, over)).summary
    shared = simulate_serving(load_scenario(EXAMPLE, [*over, "hardware.pcie_switch={gpus_per_switch: 2}"])).summary
    assert shared.tpot_mean_s > base.tpot_mean_s and shared.h2d_utilization > base.h2d_utilization
    # an uplink given by the scenario: four GPUs on a 100 GB/s uplink get 25 GB/s each
    ctx = build_context(load_scenario(EXAMPLE, [*over, "hardware.pcie_switch={gpus_per_switch: 4, "
                                                       "uplink_bytes_per_s: 100e9}"]))
    assert ctx.hw.h2d.copy_time_s(size) == pytest.approx(4e-6 + size / 25e9, rel=1e-12)
    assert "pcie_switch" not in load_scenario(EXAMPLE).model_dump(mode="json")["hardware"]


# ---- prompt-length distributions ----------------------------------------------------------------
def served(prompt, seed: int = 1, requests: int = 20_000):
    return load(serving(workload=workload(prompt_tokens=prompt, seed=seed,
                                          arrivals={"kind": "poisson", "rate_per_s": 1.0, "requests": requests})))


def test_prompt_lengths_are_drawn_seeded_with_the_right_mean():
    uniform = {"dist": "uniform", "min": 100, "max": 300}
    a, b = build_requests(served(uniform).workload), build_requests(served(uniform).workload)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.prompt_tokens, build_requests(served(uniform, seed=2).workload).prompt_tokens)
    assert a.prompt_tokens.min() >= 100 and a.prompt_tokens.max() <= 300
    assert a.prompt_tokens.mean() == pytest.approx(200, rel=0.01)
    logn = build_requests(served({"dist": "lognormal", "mean": 512, "std": 384}).workload).prompt_tokens
    assert logn.mean() == pytest.approx(512, rel=0.03) and logn.std() == pytest.approx(384, rel=0.1)
    # their own stream: the outputs are the same draws whatever the prompts do
    assert np.array_equal(a.output_tokens, build_requests(served(256).workload).output_tokens)
    assert not np.array_equal(a.prompt_tokens, a.output_tokens)
    assert np.array_equal(draw_prompts(served(256).workload, 3), [256, 256, 256])


def test_a_serving_run_with_drawn_prompts():
    res = run(serving(workload=workload(prompt_tokens={"dist": "normal", "mean": 300, "std": 100, "min": 16},
                                        arrivals={"kind": "poisson", "rate_per_s": 10.0, "requests": 100}),
                      policy=TIERED))
    req = res.requests
    drawn = build_requests(served({"dist": "normal", "mean": 300, "std": 100, "min": 16}, requests=100).workload)
    assert req["prompt_tokens"].tolist() == drawn.prompt_tokens.tolist()
    assert req["prompt_tokens"].nunique() > 50 and req["finish_s"].notna().all()
    assert res.summary.total_input_tokens == int(drawn.prompt_tokens.sum())
    assert res.timeline["prefill_tokens"].sum() >= res.summary.total_input_tokens


# ---- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, field", [
    (["scheduler.preemption=spill"], "scheduler.preemption"),
    (["scheduler.swap_space_bytes=1e9"], "scheduler: swap_space_bytes applies to preemption: swap"),
    (["scheduler.preemption=swap", "scheduler.swap_space_bytes=0"], "scheduler.swap_space_bytes"),
    (["hardware.pcie_switch.gpus_per_switch=0"], "hardware.pcie_switch.gpus_per_switch"),
    (["hardware.pcie_switch.uplink_bytes_per_s=-5"], "hardware.pcie_switch.uplink_bytes_per_s"),
    (["hardware.pcie_switch.lanes=16"], "hardware.pcie_switch.lanes: unknown key"),
    (["workload.prompt_tokens={dist: uniform, min: 10}"], "workload.prompt_tokens: uniform needs min and max"),
    (["workload.prompt_tokens={dist: lognormal, mean: 500}"], "workload.prompt_tokens: lognormal needs mean and std"),
    (["workload.prompt_tokens={dist: pareto, mean: 5, std: 1}"], "workload.prompt_tokens.dist"),
    (["workload.prompt_tokens={dist: uniform, min: 0, max: 9}"], "workload.prompt_tokens.min"),
    (["workload.prompt_tokens={dist: lognormal, mean: 4000000, std: 4000000}"], "give a max"),
    (["workload.prompt_tokens={dist: uniform, min: 10, max: 20}", "workload.arrivals={kind: trace, path: t.csv}"],
     "workload.prompt_tokens: the trace gives"),
])
def test_bad_swap_switch_and_prompt_inputs_are_one_line_naming_the_field(tmp_path, overrides, field):
    args = [a for o in overrides for a in ("--set", o)]
    res = run_cli("run", str(EXAMPLE), "--out", str(tmp_path / "o"), *args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], lines
    assert not (tmp_path / "o").exists()


def test_a_closed_batch_refuses_a_prompt_distribution():
    res = run_cli("run", str(SCENARIOS / "cpu-tiny.yaml"), "--out", "/nonexistent/o",
                  "--set", "workload.prompt_tokens={dist: uniform, min: 10, max: 20}")
    assert res.returncode == 2 and "workload.prompt_tokens: a prompt-length distribution applies to a serving run" \
        in res.stderr


def test_scenario_from_dict_takes_a_prompt_distribution_as_data():
    sc = scenario_from_dict(serving(workload=workload(prompt_tokens={"dist": "uniform", "min": 5, "max": 9})), "t")
    assert sc.model_dump(mode="json")["workload"]["prompt_tokens"]["dist"] == "uniform"
