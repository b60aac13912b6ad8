"""Open-loop serving (issue #14 part 1): the mixed step's physics, the scheduler, the queue's
figures (Little's law, low-load limits, the closed batch reproduced), determinism, and one-line
errors for bad serving inputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.decode.simulate import simulate
from sim.device.physics import (
    ALLREDUCES_PER_LAYER,
    attention_flop,
    decode_step_cost,
    lm_head_s,
    mixed_step_cost,
    prefill_s,
    roofline_s,
    step_tail_s,
    weight_kernel_s,
)
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import scenario_from_dict
from sim.serving.metrics import weighted_percentile
from sim.serving.run import simulate_serving
from sim.serving.scheduler import StepPlan

from .conftest import SCENARIOS, run_cli


def serving(**changes) -> dict:
    """A small serving scenario (8B on one H100, step detail); `changes` replace top-level sections."""
    sc = {
        "name": "serving-small",
        "model": {"name": "llama-3.1-8b"},
        "hardware": {"gpu": "h100-sxm"},
        "workload": {"prompt_tokens": 256, "reasoning_tokens": {"dist": "lognormal", "mean": 128, "std": 64,
                                                                 "min": 8, "max": 1024},
                     "seed": 1, "arrivals": {"kind": "poisson", "rate_per_s": 20.0, "requests": 400}},
        "policy": {"kind": "full_hbm"},
        "sim": {"detail": "step"},
    }
    sc.update(changes)
    return sc


def workload(**changes) -> dict:
    return {**serving()["workload"], **changes}


def load(data: dict):
    return scenario_from_dict(data, "test.yaml")


def run(data: dict):
    return simulate_serving(load(data))


def cost_args(ctx):
    m = ctx.scenario.model
    return ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size


# ---- physics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["full_hbm", "tiered"])
def test_mixed_step_without_prefill_is_the_decode_step(kind):
    ctx = build_context(load(serving(policy={"kind": kind})))
    args = (*cost_args(ctx), "layerwise_async", 12, 4000, 1500, 300, ctx.kv_bytes_per_token_layer,
            ctx.t2_bytes_per_token_layer)
    assert mixed_step_cost(*args) == decode_step_cost(*args)


def test_a_prompt_alone_costs_prefill_plus_the_step_overhead():
    ctx = build_context(load(serving()))
    model, hw = ctx.model, ctx.hw
    p = 2048
    cost = mixed_step_cost(*cost_args(ctx), "layerwise_async", 0, 0, 0, 0, ctx.kv_bytes_per_token_layer,
                           ctx.t2_bytes_per_token_layer, prefill_tokens=p, prefill_position_sum=p * (p + 1) // 2,
                           prefill_kv_tokens=p, prefill_seqs=1)
    # prefill_s = L x (GEMMs + all-reduces + causal attention + overhead) + LM head; a step adds its
    # overhead (attention from the measured context table where the run has one, else causal FLOP /
    # attention FLOP/s: compute-bound, the roofline's larger side)
    expected = (prefill_s(*cost_args(ctx), 1, p, ctx.kv_bytes_per_token_layer) - lm_head_s(model, hw, 1)
                + step_tail_s(model, hw, 1))
    assert cost.compute_s == pytest.approx(expected, rel=1e-12)


def test_mixed_step_by_hand():
    """8 decodes at 3000 tokens of context each + a 1000-token chunk after a 3000-token prefix, TP 2."""
    sc = serving(model={"name": "llama-3.1-70b"}, parallel={"tp": 2})
    sc["hardware"] = {**sc.get("hardware", {}), "kernels": "datasheet"}  # the datasheet formulas, by hand
    ctx = build_context(load(sc))
    model, hw, wd, gs = cost_args(ctx)
    kv = ctx.kv_bytes_per_token_layer
    decodes, t0, a, c = 8, 8 * 3000, 3000, 1000
    pos = c * a + c * (c + 1) // 2
    cost = mixed_step_cost(model, hw, wd, gs, "layerwise_async", decodes, t0, 0, 0, kv, ctx.t2_bytes_per_token_layer,
                           prefill_tokens=c, prefill_position_sum=pos, prefill_kv_tokens=a + c, prefill_seqs=1)
    rows = decodes + c
    # the decodes: 8 x 4 KV heads (8 over TP 2) = 32 thread blocks, streaming at 32 / (32 + half_ctas) of the rate
    shape, blocks = hw.attention_shape, decodes * model.num_kv_heads
    decode_attn = max(attention_flop(model, t0) / hw.attention_flop_per_s, hw.attention_latency_s + max(
        (t0 + decodes) * kv / (hw.attention_hbm_bytes_per_s * blocks / (blocks + shape.half_ctas)), blocks * shape.per_cta_s))
    n = (math.sqrt(1 + 8 * pos) - 1) / 2  # the one chunk's equivalent prompt length: n (n + 1) / 2 = pos
    p = hw.prefill_attention_shape.bf16  # fitted on measured prefill attention (fitted_kernels.yaml)
    tiles = 1 * model.num_heads * math.ceil(c / 128)  # the chunk's 1,000 queries in 8 tiles of 128, per head
    rate = hw.attention_flop_per_s * n / (n + p.half_tokens) * tiles / (tiles + p.half_tiles)
    prefill_attn = (p.floor_s + roofline_s(4 * model.num_heads * model.head_dim * pos, (a + c) * kv, rate,
                                           hw.attention_hbm_bytes_per_s) + c * model.num_kv_heads * p.kv_write_s)
    assert p.floor_s > 0 and p.kv_write_s > 0
    assert cost.layer.gemm_s == weight_kernel_s(model, hw, wd, gs, rows)
    assert cost.layer.attention_s == pytest.approx(decode_attn + prefill_attn, rel=1e-12)
    assert cost.layer.allreduce_s == pytest.approx(ALLREDUCES_PER_LAYER * hw.allreduce_s(rows * model.hidden_size * 2))
    assert cost.layer.allreduce_s > 0
    assert cost.tail_s == step_tail_s(model, hw, decodes + 1)  # logits only where a sequence samples


def test_chunks_add_up_to_the_whole_prompts_causal_attention():
    plan = StepPlan()
    p, total = 20_000, 0
    for a, c in ((0, 8192), (8192, 8192), (16384, 3616)):
        plan.chunk_tokens, plan.chunk_prefix = np.array([c]), np.array([a])
        total += plan.prefill_position_sum()
    assert total == p * (p + 1) // 2


def test_weighted_percentile_is_numpys_on_the_repeated_values():
    rng = np.random.default_rng(0)
    v, w = rng.random(50), rng.integers(0, 7, 50)
    w[0] = 3
    for q in (0, 1, 50, 90, 99, 100):
        assert weighted_percentile(v, w, q) == pytest.approx(np.percentile(np.repeat(v, w), q), rel=1e-12)


# ---- the queue --------------------------------------------------------------------------------
def test_littles_law_on_a_poisson_run():
    """L (time-average of requests in the system, read off timeline.csv) = lambda W (arrival rate
    x mean time in the system, from requests.csv), over [0, last token]."""
    res = run(serving())
    s, req, tl = res.summary, res.requests, res.timeline
    assert s.fits and len(req) == 400 and req["finish_s"].notna().all()
    duration = s.duration_s
    until = np.append(tl["t_s"].to_numpy()[1:], duration)
    in_system = (tl["running"] + tl["waiting"]).to_numpy()
    L = float(np.sum(in_system * (until - tl["t_s"].to_numpy())) / duration)
    lam, W = len(req) / duration, float(req["e2e_s"].mean())
    assert L == pytest.approx(lam * W, rel=0.02)
    assert s.mean_concurrency == pytest.approx(lam * W, rel=1e-9)  # the engine's exact integral
    assert lam == pytest.approx(20.0, rel=0.15)  # the offered rate, over a finite run


def test_low_load_ttft_is_the_prefill_and_tpot_the_single_sequence_step():
    p, n = 512, 64
    res = run(serving(workload=workload(prompt_tokens=p, reasoning_tokens=n,
                                        arrivals={"kind": "poisson", "rate_per_s": 0.05, "requests": 4})))
    req = res.requests
    assert (req["queue_s"] == 0).all()  # nobody waits
    ctx = build_context(load(serving()))
    kv, t2 = ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer
    prefill_step = mixed_step_cost(*cost_args(ctx), "layerwise_async", 0, 0, 0, 0, kv, t2, prefill_tokens=p,
                                   prefill_position_sum=p * (p + 1) // 2, prefill_kv_tokens=p, prefill_seqs=1).compute_s
    assert req["ttft_s"].to_numpy() == pytest.approx(prefill_step, rel=1e-9)
    assert req["ttft_s"].to_numpy() == pytest.approx(prefill_s(*cost_args(ctx), 1, p, kv), rel=0.02)
    steps = [decode_step_cost(*cost_args(ctx), "layerwise_async", 1, p + s + 1, 0, 0, kv, t2).compute_s
             for s in range(n - 1)]
    assert req["tpot_s"].to_numpy() == pytest.approx(np.mean(steps), rel=1e-9)
    mid = decode_step_cost(*cost_args(ctx), "layerwise_async", 1, p + n // 2, 0, 0, kv, t2).compute_s
    assert req["tpot_s"].to_numpy() == pytest.approx(mid, rel=0.01)
    assert res.summary.itl_p50_s == pytest.approx(mid, rel=0.01)


@pytest.mark.parametrize("policy", [{"kind": "full_hbm"},
                                    {"kind": "tiered", "hbm_ratio": 0.5, "evict_ratio": 0.1, "retier_interval": 32,
                                     "recent_window": 32}])
def test_a_closed_batch_as_closed_loop_arrivals_reproduces_kvsim_runs_decode_throughput(policy):
    """B equal requests at t = 0, chunked prefill off: one prefill step, then B decodes in lockstep.
    Fair comparison: `kvsim run`'s throughput excludes prefill (decode_s starts after it), and its N
    steps attend prompt + 1 .. prompt + N tokens; a served request of N + 1 tokens samples its first
    token in the prefill step, then runs those same N decode steps. So the served decode throughput
    is B x N / (last token - first token)."""
    b, p, n = 16, 256, 128
    closed = simulate(load({**serving(policy=policy), "workload": {"batch_size": b, "prompt_tokens": p,
                                                                    "reasoning_tokens": n, "seed": 1}}),
                      with_max_batch=False).summary
    res = run(serving(policy=policy, scheduler={"chunked_prefill": False},
                      workload=workload(prompt_tokens=p, reasoning_tokens=n + 1,
                                        arrivals={"kind": "closed_loop", "concurrency": b, "requests": b})))
    req = res.requests
    assert req["first_token_s"].nunique() == 1 and req["finish_s"].nunique() == 1  # lockstep
    served = b * n / (req["finish_s"].max() - req["first_token_s"].min())
    assert served == pytest.approx(closed.throughput_tok_per_s, rel=0.01)
    if policy["kind"] == "full_hbm":
        assert served == pytest.approx(closed.throughput_tok_per_s, rel=1e-9)


def test_same_seed_same_csv_and_another_seed_another():
    def csvs(seed):
        res = run(serving(workload=workload(arrivals={"kind": "poisson", "rate_per_s": 20.0, "requests": 150,
                                                      "seed": seed})))
        return res.requests.to_csv(index=False), res.timeline.to_csv(index=False)

    assert csvs(7) == csvs(7)
    assert csvs(7)[0] != csvs(8)[0]


def test_preemption_when_kv_overflows_then_every_request_completes():
    """A KV budget of ~40 sequences' final length with 64 admitted: growth preempts the newest
    (recompute), and every request still gets all its tokens; HBM never exceeds capacity."""
    sc = serving(workload=workload(reasoning_tokens=512, arrivals={"kind": "closed_loop", "concurrency": 64,
                                                                   "requests": 160}))
    ctx = build_context(load(sc))
    from sim.serving.kv_memory import kv_memory

    mem = kv_memory(ctx, 8192, 256)
    reserve = mem.hbm_capacity_bytes - mem.weights_bytes - mem.activation_bytes - 40 * (256 + 512) * ctx.kv_bytes_per_token
    sc["hardware"] = {"gpu": "h100-sxm", "efficiency": {"runtime_reserve_bytes": reserve}}
    res = run(sc)
    s, req = res.summary, res.requests
    assert s.preemptions > 0 and s.preempted_requests > 0
    assert req["finish_s"].notna().all()
    assert (res.timeline["hbm_bytes"] <= s.hbm_capacity_bytes).all()
    assert s.hbm_peak_bytes <= s.hbm_capacity_bytes
    preempted = req[req["preemptions"] > 0]
    assert (preempted["e2e_s"] > req[req["preemptions"] == 0]["e2e_s"].median()).mean() > 0.5
    # the tiered policy holds only its T0 share in HBM: the same budget runs more at once
    tiered = run({**sc, "policy": {"kind": "tiered", "hbm_ratio": 0.25, "evict_ratio": 0.0, "retier_interval": 32,
                                   "recent_window": 32}})
    assert tiered.summary.mean_running > s.mean_running
    assert tiered.summary.preemptions < s.preemptions
    assert tiered.summary.host_peak_bytes > 0


def test_host_capacity_bounds_a_tiered_policy():
    """64 clients: with host memory for a quarter of their T1, growth preempts and fewer run at once."""
    policy = {"kind": "tiered", "hbm_ratio": 0.25, "evict_ratio": 0.0, "retier_interval": 32, "recent_window": 32}
    wl = workload(reasoning_tokens=512, arrivals={"kind": "closed_loop", "concurrency": 64, "requests": 128})
    free = run(serving(policy=policy, workload=wl))
    assert free.summary.preemptions == 0 and free.summary.mean_running > 60
    cap = free.summary.host_peak_bytes / 4
    tight = run(serving(policy=policy, workload=wl, hardware={"gpu": "h100-sxm", "host_memory_bytes": cap}))
    assert tight.summary.host_peak_bytes <= cap
    assert tight.summary.preemptions > 0
    assert tight.summary.mean_running < free.summary.mean_running / 1.5


def test_a_long_prompt_is_prefilled_in_chunks():
    p = 20_000
    wl = workload(prompt_tokens=p, reasoning_tokens=8, arrivals={"kind": "poisson", "rate_per_s": 1.0, "requests": 1})
    chunked = run(serving(workload=wl))
    tl = chunked.timeline
    assert tl.loc[tl["prefill_tokens"] > 0, "prefill_tokens"].tolist() == [8192, 8192, 3616]
    whole = run(serving(workload=wl, scheduler={"chunked_prefill": False, "max_num_batched_tokens": 32768}))
    assert whole.timeline.loc[whole.timeline["prefill_tokens"] > 0, "prefill_tokens"].tolist() == [p]
    # the same causal FLOP either way; chunking pays the weights three times and re-reads the prefix
    assert chunked.requests["ttft_s"][0] > whole.requests["ttft_s"][0]


def test_max_num_seqs_caps_the_running_set():
    res = run(serving(scheduler={"max_num_seqs": 8}, workload=workload(arrivals={"kind": "poisson", "rate_per_s": 20.0,
                                                                                 "requests": 100})))
    assert res.summary.max_running == 8
    assert (res.timeline["running"] <= 8).all()


def test_closed_loop_keeps_concurrency_clients():
    res = run(serving(workload=workload(arrivals={"kind": "closed_loop", "concurrency": 5, "requests": 40})))
    req = res.requests.sort_values("arrival_s")
    assert (req["arrival_s"].iloc[:5] == 0).all()
    finishes = set(req["finish_s"].round(12))
    assert all(round(t, 12) in finishes for t in req["arrival_s"].iloc[5:])  # each sent as one finished
    assert res.summary.mean_concurrency <= 5 + 1e-9


def test_gamma_arrivals_have_the_rate_and_cv():
    from sim.inputs.requests import build_requests

    w = load(serving(workload=workload(arrivals={"kind": "gamma", "rate_per_s": 4.0, "cv": 3.0,
                                                 "requests": 20_000}))).workload
    gaps = np.diff(build_requests(w).arrival_s)
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_a_trace_gives_arrivals_and_lengths(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,note\n0.5,100,20,b\n0.0,300,10,a\n0.5,50,1,c\n")
    path = tmp_path / "s.yaml"
    import yaml

    path.write_text(yaml.safe_dump(serving(workload=workload(arrivals={"kind": "trace", "path": "trace.csv"}))))
    from sim.inputs.scenario import load_scenario

    res = simulate_serving(load_scenario(path))
    req = res.requests
    assert req["id"].tolist() == [0, 1, 2]  # the trace's row order
    assert req["arrival_s"].tolist() == [0.5, 0.0, 0.5]
    assert req["prompt_tokens"].tolist() == [100, 300, 50] and req["output_tokens"].tolist() == [20, 10, 1]
    assert np.isnan(req["tpot_s"][2])  # one token: no TPOT
    assert res.summary.total_output_tokens == 31


def test_a_request_too_large_alone_does_not_fit():
    res = run(serving(workload=workload(prompt_tokens=600_000, reasoning_tokens=8)))
    assert not res.summary.fits
    assert "request 0" in res.summary.does_not_fit and res.summary.duration_s is None
    assert res.requests.empty


# ---- kvsim run --------------------------------------------------------------------------------
def test_kvsim_run_writes_a_serving_run_dir(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", str(SCENARIOS / "serving-h100-70b-tp4.yaml"), "--out", str(out),
                  "--set", "workload.arrivals.requests=200")
    assert res.returncode == 0, res.stderr
    for label in ("TTFT mean / p50 / p99", "TPOT mean / p50 / p99", "request / output throughput", "goodput"):
        assert label in res.stdout
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "scenario.resolved.yaml", "summary.json",
                                                      "timeline.csv"]
    s = json.loads((out / "summary.json").read_text())
    assert s["tp"] == 4 and s["requests"] == 200 and s["fits"] and s["ttft_p99_s"] > 0
    header = (out / "requests.csv").read_text().splitlines()[0]
    assert header == "id,arrival_s,first_token_s,finish_s,ttft_s,tpot_s,e2e_s,queue_s,preemptions,prompt_tokens,output_tokens"
    assert (out / "timeline.csv").read_text().startswith("t_s,running,waiting,hbm_bytes,host_bytes")


@pytest.mark.parametrize("overrides, field", [
    (["workload.arrivals.kind=bursty"], "workload.arrivals"),
    (["workload.arrivals={rate_per_s: 1}"], "workload.arrivals: missing key 'kind'"),
    (["workload.arrivals.rate_per_s=-1"], "workload.arrivals.rate_per_s"),
    (["workload.arrivals.requests=0"], "workload.arrivals.requests"),
    (["workload.arrivals.burst=2"], "workload.arrivals.burst: unknown key"),
    (["workload.arrivals={kind: gamma, rate_per_s: 1, requests: 5}"], "workload.arrivals.cv"),
    (["workload.arrivals={kind: closed_loop, requests: 5}"], "workload.arrivals.concurrency"),
    (["workload.arrivals={kind: trace, path: /nonexistent.csv}"], "workload.arrivals.path"),
    (["scheduler.max_num_seqs=0"], "scheduler.max_num_seqs"),
    (["scheduler.chunked_prefill=maybe"], "scheduler.chunked_prefill"),
    (["scheduler.chunked_prefill=false", "scheduler.max_num_batched_tokens=512"], "scheduler.max_num_batched_tokens"),
    (["slo={}"], "slo"),
    (["slo.ttft_ms=0"], "slo.ttft_ms"),
    (["workload.prompt_tokens=0"], "workload.prompt_tokens"),
])
def test_bad_serving_inputs_are_one_line_naming_the_field(tmp_path, overrides, field):
    args = [a for o in overrides for a in ("--set", o)]
    res = run_cli("run", str(SCENARIOS / "serving-h100-70b-tp4.yaml"), "--out", str(tmp_path / "o"), *args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], lines
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text, problem", [
    ("arrival_s,prompt_tokens\n0,5\n", "missing output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,x\n", "line 2: output_tokens: expected an integer"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,5,5\n", "line 2: arrival_s: expected a finite number >= 0"),
    ("arrival_s,prompt_tokens,output_tokens\n0,0,5\n", "line 2: prompt_tokens: expected 1 to"),
    ("arrival_s,prompt_tokens,output_tokens\n", "no requests"),
])
def test_a_bad_trace_is_one_line_naming_the_line_and_column(tmp_path, text, problem):
    (tmp_path / "t.csv").write_text(text)
    res = run_cli("run", str(SCENARIOS / "serving-h100-70b-tp4.yaml"), "--out", str(tmp_path / "o"),
                  "--set", f"workload.arrivals={{kind: trace, path: {tmp_path / 't.csv'}}}")
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "\n" not in line and "workload.arrivals.path" in line and problem in line, line


def test_serving_sections_need_arrivals_and_a_closed_batch_command_refuses_a_serving_scenario(tmp_path):
    res = run_cli("run", str(SCENARIOS / "cpu-tiny.yaml"), "--out", str(tmp_path / "o"), "--set", "slo.ttft_ms=100")
    assert res.returncode == 2 and "slo: applies to a serving run" in res.stderr
    from sim.inputs.errors import ConfigError
    from sim.inputs.scenario import load_scenario

    with pytest.raises(ConfigError, match="workload.arrivals"):  # `kvsim report` draws it (tests/test_report_serving_run.py)
        simulate(load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml"))
    # a closed batch dumps as before serving existed (resolved scenarios, golden files, sweep hashes)
    closed = load(serving(workload={"batch_size": 2})).model_dump(mode="json")
    assert "arrivals" not in closed["workload"] and "scheduler" not in closed and "slo" not in closed


def test_tiered_serving_reports_link_utilisation():
    """The serving summary carries each link direction's busy share, so the planner can name the link."""
    from sim.inputs.scenario import load_scenario
    from sim.serving.run import simulate_serving

    over = ["workload.arrivals.requests=40", "policy.kind=tiered", "policy.hbm_ratio=0.25", "parallel.tp=2",
            "model.name=deepseek-r1-distill-qwen-14b"]
    s = simulate_serving(load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml", over)).summary
    assert s.fits and 0.0 < s.h2d_utilization <= 1.0 and 0.0 <= s.d2h_utilization <= 1.0
    full = simulate_serving(load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml",
                                          [*over, "policy.kind=full_hbm"])).summary
    assert full.h2d_utilization == 0.0


def test_a_request_holds_its_window_and_state_bytes_in_hbm():
    """Layer kinds in serving: each running request reserves its sliding-window KV (at most W tokens
    in every window layer) beside its tiered tokens; a dense model reserves nothing extra."""
    from sim.serving.kv_memory import kv_memory

    sc = serving(model={"name": "gpt-oss-20b"})
    ctx = build_context(scenario_from_dict(sc, "test"))
    mem = kv_memory(ctx, 8192, 256)
    assert mem.bounded_bytes_per_request == 12 * 128 * (2 * 8 * 64 * 2)  # 12 window layers x 128 tokens x K,V
    assert mem.hbm_kv_bytes(0, 0) == mem.bounded_bytes_per_request
    dense = kv_memory(build_context(scenario_from_dict(serving(), "test")), 8192, 256)
    assert dense.bounded_bytes_per_request == 0.0 and dense.hbm_kv_bytes(10, 0) == 10 * dense.kv_bytes_per_token


def test_without_chunked_prefill_the_longest_prefill_is_the_prompt_only_where_nothing_is_preempted():
    """On demand, a preempted request re-prefills its prompt and all but its last output token, so the
    budget must hold prompt + output - 1 (256 + 1024 - 1 = 1,279 here); under no_evict nothing is
    preempted and the prompt (256) is the longest prefill."""
    wl = workload(reasoning_tokens=1024)
    with pytest.raises(ConfigError, match="the longest request needs 1,279 tokens, more than 512"):
        load(serving(workload=wl, scheduler={"chunked_prefill": False, "max_num_batched_tokens": 512}))
    sc = load(serving(workload=wl, scheduler={"chunked_prefill": False, "max_num_batched_tokens": 512,
                                              "admission": "no_evict"}))
    assert sc.scheduler.max_num_batched_tokens == 512
    with pytest.raises(ConfigError, match="the longest request needs 256 tokens, more than 255"):
        load(serving(workload=wl, scheduler={"chunked_prefill": False, "max_num_batched_tokens": 255,
                                             "admission": "no_evict"}))


def test_without_mixed_prefill_a_prefill_step_runs_alone():
    """mixed_prefill off (SGLang's default: a new prefill batch runs before, not with, the decodes): every
    step with prefill tokens decodes nothing, every token is still produced, the decodes wait out each
    prefill step (a higher ITL tail), and a prompt no longer shares its step with the decodes (no higher TTFT)."""
    wl = workload(arrivals={"kind": "poisson", "rate_per_s": 20.0, "requests": 200})
    mixed = run(serving(workload=wl))
    alone = run(serving(workload=wl, scheduler={"mixed_prefill": False}))
    tl = alone.timeline
    assert (tl.loc[tl["prefill_tokens"] > 0, "decodes"] == 0).all() and (tl["prefill_tokens"] > 0).sum() > 0
    assert ((mixed.timeline["prefill_tokens"] > 0) & (mixed.timeline["decodes"] > 0)).any()
    assert alone.summary.total_output_tokens == mixed.summary.total_output_tokens
    assert alone.requests["output_tokens"].sum() == mixed.requests["output_tokens"].sum()
    assert alone.summary.itl_p99_s > mixed.summary.itl_p99_s
    assert alone.summary.ttft_p50_s <= mixed.summary.ttft_p50_s
    sglang = load(serving(workload=wl, engine={"name": "sglang"}))
    assert not sglang.scheduler.mixed_prefill
    assert load(serving(workload=wl, engine={"name": "sglang"}, scheduler={"mixed_prefill": True})).scheduler.mixed_prefill


def test_a_decode_instance_runs_the_same_steps_with_or_without_mixed_prefill():
    """Requests that arrive prefilled (a disaggregated decode instance) are admitted decoding: with no chunk
    to run alone, the orders coincide and so do the figures - the running decodes never wait for an admission."""
    wl = workload(arrivals={"kind": "poisson", "rate_per_s": 20.0, "requests": 120})
    mixed = simulate_serving(load(serving(workload=wl)), prefilled=True).summary
    alone = simulate_serving(load(serving(workload=wl, scheduler={"mixed_prefill": False})), prefilled=True).summary
    assert (alone.steps, alone.itl_p99_s, alone.ttft_p50_s, alone.duration_s) == (
        mixed.steps, mixed.itl_p99_s, mixed.ttft_p50_s, mixed.duration_s)
