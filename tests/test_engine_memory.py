"""`engine:` - an engine's memory rule for the KV budget (issue #20 item 4). vLLM
(vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory): KV cache = total x
gpu_memory_utilization - (weights + the profiling pass's activations + memory outside torch)."""

from __future__ import annotations

import pytest

from sim.decode.capacity import batch_memory_trace, max_batch
from sim.decode.context import build_context
from sim.device.memory import profile_run_activation_bytes
from sim.inputs.scenario import load_scenario, scenario_to_yaml
from sim.serving.kv_memory import kv_memory

from .conftest import SCENARIOS, run_cli
from .promise import assert_refused

SERVING = SCENARIOS / "serving-h100-70b-tp4.yaml"
CLOSED = SCENARIOS / "h200-7b-batch.yaml"


def test_vllm_kv_budget_by_hand():
    sc = load_scenario(SERVING, ["engine.name=vllm", "engine.gpu_memory_utilization=0.85", "engine.non_torch_bytes=2e9"])
    ctx, plain = build_context(sc), build_context(load_scenario(SERVING))
    s = sc.scheduler
    act = profile_run_activation_bytes(ctx.model, s.max_num_batched_tokens, s.max_num_seqs)
    m = kv_memory(ctx, s.max_num_batched_tokens, s.max_num_seqs)
    assert m.kv_budget_bytes == pytest.approx(0.85 * plain.hw.memory_bytes - ctx.weights_bytes - act - 2e9)
    assert "engine vllm" in ctx.hw.sources["memory_bytes"] and "determine_available_memory" in ctx.hw.sources["memory_bytes"]
    # the flat 1.5 GB reserve of no engine keeps ~20% more KV than vLLM's default rule would
    default = kv_memory(build_context(load_scenario(SERVING, ["engine.name=vllm"])), s.max_num_batched_tokens, s.max_num_seqs)
    flat = kv_memory(plain, s.max_num_batched_tokens, s.max_num_seqs)
    assert 1.15 < flat.kv_budget_bytes / default.kv_budget_bytes < 1.3


def test_a_closed_batch_holds_the_profiling_pass_activations():
    ctx = build_context(load_scenario(CLOSED, ["engine.name=vllm", "policy.kind=full_hbm"]))
    held = ctx.hw.held_activation_bytes
    # vLLM's serve defaults on an H200 (>= 70 GiB, not an A100): 8192 tokens, 1024 sequences sampled
    assert held == profile_run_activation_bytes(ctx.model, 8192, 1024) > profile_run_activation_bytes(ctx.model, 8192, 256)
    trace = batch_memory_trace(ctx, 1)
    assert trace.hbm_peak_bytes >= ctx.weights_bytes + held + ctx.hw.runtime_reserve_bytes
    assert max_batch(ctx) < max_batch(build_context(load_scenario(CLOSED, ["policy.kind=full_hbm"])))


def test_no_engine_leaves_the_resolved_scenario_as_it_was():
    assert "\nengine:" not in scenario_to_yaml(load_scenario(CLOSED))
    assert "\nengine:" in scenario_to_yaml(load_scenario(CLOSED, ["engine.name=vllm"]))
    assert build_context(load_scenario(CLOSED)).hw.held_activation_bytes == 0.0


@pytest.mark.parametrize("override,field", [("engine.name=trtllm", "engine.name"),
                                             ("engine.gpu_memory_utilization=1.5", "engine.gpu_memory_utilization")])
def test_bad_engine_is_one_line(tmp_path, override, field):
    res = run_cli("run", str(CLOSED), "--set", "engine.name=vllm", "--set", override, "--out", str(tmp_path / "run"))
    assert_refused(res, str(CLOSED), field)
    assert not (tmp_path / "run").exists()
