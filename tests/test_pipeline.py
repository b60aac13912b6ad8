"""Pipeline parallelism (issue #21, layouts): a stage's shapes and memory, the stage and send times
against hand arithmetic, the pipelined step loop's timing with batches in flight, the scenario's
refusals, and the planner's pipeline layouts (only where GPUs lack NVLink) with their launch flags."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.device.physics import LayerCost, StepCost, pipeline_send_s, pipeline_stage_s
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import load_scenario
from sim.plan.answer import launch_lines
from sim.plan.candidates import Candidate, PlanSpec, pipeline_layouts
from sim.plan.evaluate import CandidateTask, blank_row
from sim.plan.search import candidates, rank
from sim.serving import engine as serving_engine
from sim.serving.run import simulate_serving

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "serving-h100-70b-tp4.yaml"
L40S_FP8 = ["hardware.gpu=l40s", "model.weight_dtype=fp8"]


def test_a_stage_holds_its_share_of_layers_and_one_vocab_matrix():
    m = catalog.model("deepseek-r1-distill-llama-70b")  # 80 layers, vocab 128,256, untied
    s = m.stage(2)
    assert (s.num_layers, m.stage(3).num_layers, m.stage(1)) == (40, 27, m)
    per_layer = m.layer_weight_bytes("bf16", 128)
    assert s.weight_bytes("bf16", 128) == pytest.approx(40 * per_layer + (m.vocab_size * m.hidden_size + m.hidden_size) * 2)
    assert m.weight_bytes("bf16", 128) == pytest.approx(
        80 * per_layer + (2 * m.vocab_size * m.hidden_size + m.hidden_size) * 2)
    one = build_context(load_scenario(SCENARIO, ["parallel.tp=2"]))
    two = build_context(load_scenario(SCENARIO, ["parallel.tp=2", "parallel.pp=2"]))
    assert two.kv_bytes_per_token == one.kv_bytes_per_token / 2  # 40 of the 80 layers' K/V per GPU
    assert two.num_layers == 40


def test_stage_and_send_times_by_hand():
    # 4,096 rows x 8,192 hidden x 2 B at 20 GB/s + a 30 us floor
    assert pipeline_send_s(4096, 8192, 20e9, 30e-6) == pytest.approx(30e-6 + 4096 * 8192 * 2 / 20e9)
    cost = StepCost(LayerCost(gemm_s=1e-3, attention_s=0.5e-3, overhead_s=0.1e-3, allreduce_s=0.4e-3), 40, 5e-3, 0.0, 0)
    assert pipeline_stage_s(cost, 3, 0.2e-3) == pytest.approx([40 * 2e-3 + 0.2e-3, 40 * 2e-3 + 0.2e-3, 40 * 2e-3 + 5e-3])


def _trace(tmp_path: Path, rows: list[tuple[float, int, int]]) -> str:
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    return str(path)


def _fixed_cost(monkeypatch, layers_s: float, tail_s: float):
    """Every step of the run costs the same: `layers_s` over the stage's layers, then `tail_s`."""
    cost = StepCost(LayerCost(gemm_s=layers_s / 40, attention_s=0.0, overhead_s=0.0), 40, tail_s, 0.0, 0)
    monkeypatch.setattr(serving_engine.ServingSim, "step_cost", lambda self, plan: cost)


def test_a_lone_request_takes_every_stage_in_turn_and_two_batches_fill_the_pipeline(tmp_path, monkeypatch):
    _fixed_cost(monkeypatch, layers_s=0.1, tail_s=0.0)
    trace = _trace(tmp_path, [(0.0, 8, 5), (0.05, 8, 5)])
    sc = load_scenario(SCENARIO, ["parallel.tp=2", "parallel.pp=2", f"workload.arrivals={{kind: trace, path: {trace}}}"])
    fabric = catalog.interconnect(catalog.gpu("h100-sxm").interconnect)
    send = lambda rows: pipeline_send_s(rows, 8192, fabric.bus_bytes_per_s, fabric.alltoall_floor_s)  # noqa: E731
    r = simulate_serving(sc).requests.sort_values("id")
    first, second = r.iloc[0], r.iloc[1]
    # request 0 prefills alone at t = 0: stage 0 (0.1 s + its send of 8 rows), then stage 1 (0.1 s)
    assert first.first_token_s == pytest.approx(0.2 + send(8))
    # request 1 arrives while the first batch is in stage 0: its own batch waits for stage 0, then follows
    assert second.first_token_s == pytest.approx(2 * (0.1 + send(8)) + 0.1)
    # both batches then cycle through the two stages together, the slowest stage (the first: its layers
    # and its send) busy all the time: each request's token every 2 x (0.1 s + a send of 1 row)
    gap = (first.finish_s - first.first_token_s) / 4
    assert gap == pytest.approx(2 * (0.1 + send(1)))
    assert (second.finish_s - second.first_token_s) / 4 == pytest.approx(2 * (0.1 + send(1)))
    assert second.finish_s < first.finish_s + gap  # in flight together, not one after the other


def test_a_pipelined_run_conserves_tokens_and_never_schedules_a_request_twice(monkeypatch):
    sc = load_scenario(SCENARIO, L40S_FP8 + ["parallel.tp=1", "parallel.pp=4", "workload.arrivals.requests=120",
                                             "workload.arrivals.rate_per_s=2", "scheduler.max_num_seqs=32"])
    from sim.serving import scheduler as sched_mod

    seen = []
    original = sched_mod.Scheduler.dispatch

    def checked(self, plan, flying):
        rows = np.concatenate([plan.decodes, plan.chunks])
        assert len(np.unique(rows)) == len(rows)
        if flying:
            assert not self.in_flight[rows].any()  # a request is in one batch in flight at most
            seen.append(len(rows))
        original(self, plan, flying)

    monkeypatch.setattr(sched_mod.Scheduler, "dispatch", checked)
    out = simulate_serving(sc)
    r = out.requests
    assert len(r) == 120 and r["finish_s"].notna().all()
    assert (r["first_token_s"] >= r["arrival_s"]).all()
    assert out.summary.max_running <= 32
    assert max(seen) <= 32 and len(seen) > 0
    again = simulate_serving(sc).requests
    assert np.array_equal(again["finish_s"].to_numpy(), r["finish_s"].to_numpy())  # deterministic


def test_pipelining_beats_tensor_parallelism_over_pcie_at_a_relaxed_tpot():
    base = L40S_FP8 + ["workload.arrivals.requests=300", "workload.arrivals.rate_per_s=1.5"]
    tp4 = simulate_serving(load_scenario(SCENARIO, base + ["parallel.tp=4"])).summary
    pp2 = simulate_serving(load_scenario(SCENARIO, base + ["parallel.tp=2", "parallel.pp=2"])).summary
    # 4 x L40S (PCIe, no NVLink): TP4's NCCL all-reduces bind; two TP2 stages halve them per GPU
    # (1.29x since L40S's decode attention reads its KV cold: 1.34x on the tables' warm-L2 points)
    assert pp2.output_throughput_tok_per_s > 1.2 * tp4.output_throughput_tok_per_s
    assert pp2.tpot_p99_s < tp4.tpot_p99_s


@pytest.mark.parametrize("sets, field, words", [
    (["parallel.pp=2", "workload.arrivals=null"], "parallel.pp", "serving runs"),
    (["parallel.tp=4", "parallel.pp=4"], "parallel.pp", "more than one 8-GPU node"),
    (["parallel.pp=2", "policy.kind=tiered", "policy.hbm_ratio=0.5"], "parallel.pp", "host tiers"),
    (["parallel.pp=2", "scheduler.preemption=swap"], "parallel.pp", "swap preemption"),
    (["parallel.pp=2", "model.name=gpt-oss-120b", "parallel.tp=1"], "parallel.pp", "alike"),
    (["parallel.pp=9"], "parallel.pp", "less than or equal to 8"),
])
def test_bad_pipeline_input_is_one_line_naming_the_field(sets, field, words):
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIO, sets)
    assert err.value.field == field and words in err.value.line()


def test_the_planner_tries_pipeline_stages_only_where_gpus_lack_nvlink():
    base = load_scenario(SCENARIO, ["model.weight_dtype=fp8"])
    assert pipeline_layouts(base, "h100-sxm", 8) == []
    assert pipeline_layouts(base, "l40s", 4) == [(1, 2), (2, 2), (1, 4)]  # 70B fp8: a 48 GB GPU holds half of it
    # 8 x L40S: TP4 leaves 64% of each GPU to K/V (weights 17.5 of 48 GB): replicas of it, not stages
    assert (4, 2) not in pipeline_layouts(base, "l40s", 8) and (2, 4) in pipeline_layouts(base, "l40s", 8)
    small = load_scenario(SCENARIO, ["model.name=deepseek-r1-distill-llama-8b", "parallel.tp=1"])
    assert pipeline_layouts(small, "l40s", 4) == []  # 16 GB of weights on a 48 GB GPU
    assert pipeline_layouts(small, "rtx-4090", 4) == [(1, 2), (1, 4)]  # ... on a 24 GB one
    todo, _ = candidates(base, ["l40s"], [4], ["full_hbm", "tiered:0.5"])
    layouts = {(c.policy, c.layout) for c in todo if c.pp > 1}
    assert layouts == {("full_hbm", "TP1 PP2 x 2"), ("full_hbm", "TP2 PP2"), ("full_hbm", "TP1 PP4")}  # no host tiers
    spec = PlanSpec(rate=1.0, ttft_s=2.0, tpot_s=0.2)
    assert "pp" not in CandidateTask(base, Candidate("l40s", 4, "full_hbm", 4), spec).inputs()["candidate"]
    assert CandidateTask(base, Candidate("l40s", 4, "full_hbm", 2, pp=2), spec).inputs()["candidate"]["pp"] == 2


def test_a_pipelined_row_launches_with_each_engines_pipeline_flag():
    base = load_scenario(SCENARIO, L40S_FP8 + ["engine={name: tensorrt-llm, version: '1.0'}"])
    row = {**blank_row(Candidate("l40s", 4, "full_hbm", 2, max_num_seqs=256, pp=2)), "status": "pass", "max_rate_per_s": 2.0}
    row = rank([row], base, PlanSpec(1.0, 2.0, 0.2), {"l40s": (1.2, "test")})[0]
    assert row["layout"] == "TP2 PP2" and row["pp"] == 2
    lines = launch_lines(row, base)
    assert "--tensor-parallel-size 2" in lines["vllm"] and "--pipeline-parallel-size 2" in lines["vllm"]
    assert "--tp-size 2" in lines["sglang"] and "--pp-size 2" in lines["sglang"]
    assert "--tp_size 2 --pp_size 2" in lines["trtllm"]
    # vLLM's max_num_seqs holds for every batch in flight, TensorRT-LLM's --max_batch_size for each of its pp
    # micro-batches (its capacity: max_batch_size x pp), so 256 sequences in all are 128 a micro-batch
    assert "--max-num-seqs 256" in lines["vllm"] and "--max_batch_size 128 " in lines["trtllm"]
    assert math.isclose(row["usd_per_hour"], 4.8)


def test_a_pipelined_runs_summary_names_its_gpus_and_stages():
    from sim.outputs.run_folder import serving_summary_rows

    sc = load_scenario(SCENARIO, L40S_FP8 + ["parallel.tp=2", "parallel.pp=2", "workload.arrivals.requests=40"])
    where = dict(serving_summary_rows(simulate_serving(sc).summary))["scenario"]
    assert "on 4 x l40s (pipeline of 2 stages x TP2; memory figures per GPU)" in where


def test_pipelined_replicas_behind_a_load_balancer_finish_every_request():
    from sim.serving.fleet import simulate_fleet

    sc = load_scenario(SCENARIO, L40S_FP8 + ["parallel.tp=2", "parallel.pp=2", "workload.arrivals.requests=120",
                                             "workload.arrivals.rate_per_s=2"])
    r = simulate_fleet(sc, 2, "least-outstanding").requests
    assert len(r) == 120 and r["finish_s"].notna().all() and set(r["replica"]) == {0, 1}
