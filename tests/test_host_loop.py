"""The engine's host loop a step (scheduling, input preparation, the sampler; `engine.host_s_per_sequence`,
sim/device/engine_rules.py): it overlaps the GPU's previous step, so a serving step lasts
max(the device's work, per request x the requests in the step on the busiest attention rank). TensorRT-LLM's
PyTorch executor takes its TorchSampler's measured 11.3 us a request (PR #11983); vLLM and SGLang have no
measured figure (0); TensorRT-LLM's older TensorRT-engine flow (the accuracy table's C++-executor rows) 0."""

from __future__ import annotations

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.device.engine_rules import (
    TRTLLM_SAMPLER_S_PER_SEQUENCE,
    LaunchRule,
    engine_host_s_per_sequence,
    host_loop_s,
)
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import EngineCfg, load_scenario, scenario_to_yaml
from sim.serving.run import simulate_serving
from sim.studies.accuracy import engine_for
from sim.studies.e2e_table import load_measurements

from .conftest import SCENARIOS
from .promise import assert_error_line

SERVING = SCENARIOS / "serving-h100-70b-tp4.yaml"
PROMPT = 600


def test_host_loop_by_hand():
    rule = LaunchRule(True, 128, 0.0, 0.0, host_s_per_sequence=11.3e-6)
    assert host_loop_s(rule, 1500) == pytest.approx(1500 * 11.3e-6)  # 16.95 ms
    assert host_loop_s(rule, 1501, ranks=2) == pytest.approx(751 * 11.3e-6)  # the busiest rank: ceil(1501 / 2)
    assert host_loop_s(rule, 0) == 0.0 and host_loop_s(None, 1500) == 0.0
    assert host_loop_s(LaunchRule(True, 128, 0.0, 0.0), 1500) == 0.0  # no figure: the step is the device's


def test_each_engines_figure_and_its_source():
    trt = EngineCfg.model_validate({"name": "tensorrt-llm"}, strict=True)
    per, said = engine_host_s_per_sequence(trt)
    assert per == TRTLLM_SAMPLER_S_PER_SEQUENCE == 11.3e-6 and "PR #11983" in said
    for name in ("vllm", "sglang"):
        per, said = engine_host_s_per_sequence(EngineCfg.model_validate({"name": name}, strict=True))
        assert per == 0.0 and "not measured" in said
    own = EngineCfg.model_validate({"name": "vllm", "host_s_per_sequence": 2e-5}, strict=True)
    said = "engine.host_s_per_sequence 20 us: a step lasts max(GPU, host loop)"
    assert engine_host_s_per_sequence(own) == (2e-5, said)


def test_the_run_says_where_its_host_loop_comes_from():
    trt = build_context(load_scenario(SERVING, ["engine.name=tensorrt-llm"]))
    assert trt.hw.launch.host_s_per_sequence == 11.3e-6 and "PR #11983" in trt.hw.sources["host_loop_s"]
    vllm = build_context(load_scenario(SERVING, ["engine.name=vllm"]))
    assert vllm.hw.launch.host_s_per_sequence == 0.0 and "not measured" in vllm.hw.sources["host_loop_s"]
    assert build_context(load_scenario(SERVING)).hw.launch is None  # no engine: no rule, no loop


def _offline(per_request_s: float):
    """48 requests of 600 + 200 tokens queued at once on one L40S, 8B bf16, TensorRT-LLM (no chunked prefill:
    a prompt is prefilled whole), the host loop at `per_request_s`. All arrive at t = 0 and none follows, so
    which requests run in each step does not depend on how long the steps take."""
    over = ["model.name=llama-3.1-8b", "hardware.gpu=l40s", "hardware.kernels=datasheet", "parallel.tp=1",
            "policy.kind=full_hbm", f"workload.prompt_tokens={PROMPT}", "workload.reasoning_tokens=200",
            "workload.arrivals={kind: closed_loop, concurrency: 48, requests: 48}", "engine.name=tensorrt-llm",
            "scheduler.max_num_seqs=48", f"engine.host_s_per_sequence={per_request_s}"]
    return simulate_serving(load_scenario(SERVING, over)).timeline


def test_a_step_lasts_the_longer_of_the_gpu_and_the_host_loop():
    device, loop = _offline(0.0), _offline(1e-3)  # 1 ms a request: 48 ms at 48, above a decode step's ~28
    device, loop = device[device.step_s > 0], loop[loop.step_s > 0]
    assert (device[["decodes", "prefill_tokens"]].to_numpy() == loop[["decodes", "prefill_tokens"]].to_numpy()).all()
    requests = device["decodes"].to_numpy() + device["prefill_tokens"].to_numpy() // PROMPT  # prefills run whole
    expected = np.maximum(device["step_s"].to_numpy(), 1e-3 * requests)
    assert loop["step_s"].to_numpy() == pytest.approx(expected, rel=1e-9)
    assert (loop["step_s"].to_numpy() > device["step_s"].to_numpy()).any()  # the loop binds somewhere ...
    assert (loop["step_s"].to_numpy() == device["step_s"].to_numpy()).any()  # ... and not everywhere


def test_the_accuracy_tables_tensorrt_engine_rows_have_no_python_loop():
    rows = load_measurements()
    engine_flow = [m for m in rows if "TensorRT-LLM" in m.engine and "PyTorch" not in m.engine]  # 0.13's, NIM's
    assert len(engine_flow) >= 20 and all(engine_for(m)["host_s_per_sequence"] == 0.0 for m in engine_flow)
    pytorch = next(m for m in rows if "PyTorch backend" in m.engine)
    assert "host_s_per_sequence" not in engine_for(pytorch)  # the engine's measured 11.3 us


def test_host_loop_dumps_only_when_set_and_bad_values_are_one_line():
    assert "host_s_per_sequence" not in scenario_to_yaml(load_scenario(SERVING, ["engine.name=tensorrt-llm"]))
    said = scenario_to_yaml(load_scenario(SERVING, ["engine.name=tensorrt-llm", "engine.host_s_per_sequence=2e-05"]))
    assert "host_s_per_sequence: 2.0e-05" in said
    with pytest.raises(ConfigError) as err:
        load_scenario(SERVING, ["engine.name=tensorrt-llm", "engine.host_s_per_sequence=-1e-6"])
    assert_error_line(err.value)
    assert "engine.host_s_per_sequence" in err.value.line()


def test_the_planners_screen_waits_for_the_host_loop_as_the_served_run_does():
    from sim.plan.screen import curve

    over = ["model.name=llama-3.1-8b", "hardware.gpu=h100-sxm", "hardware.kernels=datasheet", "parallel.tp=1",
            "engine.name=tensorrt-llm"]
    fast = curve(load_scenario(SERVING, over))
    slow = curve(load_scenario(SERVING, [*over, "engine.host_s_per_sequence=1e-3"]))  # 1 ms a request
    assert fast.batch == slow.batch and "engine host loop" not in fast.step_binds
    for b, tpot, binds in zip(slow.batch, slow.step_s, slow.step_binds):  # every step: >= 1 ms x its requests
        assert tpot >= 1e-3 * round(b) * (1 - 1e-9)
        assert binds == "engine host loop" or tpot == pytest.approx(fast.step_s[slow.batch.index(b)])
    assert slow.step_binds[-1] == "engine host loop" and slow.step_s[-1] > fast.step_s[-1]


def _closed(detail: str, per_request_s: float, policy: str = "full_hbm"):
    """A closed batch of 32 on one H200 (7B bf16, 512-token prompts, 100-900 reasoning tokens: the batch
    thins as sequences finish), TensorRT-LLM's host loop at `per_request_s`, at one level of detail."""
    from sim.decode.simulate import simulate

    over = ["engine.name=tensorrt-llm", f"engine.host_s_per_sequence={per_request_s}", f"sim.detail={detail}",
            "workload.reasoning_tokens={dist: uniform, min: 100, max: 900}", f"policy.kind={policy}"]
    return simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", over), with_max_batch=False)


@pytest.mark.parametrize("detail", ["layer", "step", "fast"])
def test_a_closed_batch_step_lasts_the_longer_of_the_gpu_and_the_host_loop(detail):
    """0.5 ms a request: 16 ms over 32 sequences, above a decode step's ~8 ms, below it once few remain. Without
    tiering a step's device time does not depend on when it starts, so each step is max(device, loop) exactly,
    and a step that waits for the loop is busy, not stalled."""
    device, loop = _closed(detail, 0.0).steps, _closed(detail, 5e-4).steps
    active = device["batch_active"].to_numpy()
    expected = np.maximum(device["step_s"].to_numpy(), 5e-4 * active)
    assert loop["step_s"].to_numpy() == pytest.approx(expected, rel=1e-9)
    binds = 5e-4 * active > device["step_s"].to_numpy()
    assert binds.any() and not binds.all()
    assert loop["compute_s"].to_numpy()[binds] == pytest.approx(5e-4 * active[binds], rel=1e-12)
    assert (loop["stall_s"].to_numpy()[binds] == 0).all()


def test_a_tiered_closed_batchs_levels_agree_and_the_loop_hides_its_stalls():
    """The tiered batch (layerwise prefetch, re-tiers offloading): the three levels' decode times within 1% of
    each other (as tests/test_fast.py holds them without a loop), and no step that lasts its loop stalls."""
    runs = {d: _closed(d, 5e-4, "tiered") for d in ("layer", "step", "fast")}
    totals = {d: r.steps["step_s"].sum() for d, r in runs.items()}
    assert totals["fast"] == pytest.approx(totals["layer"], rel=0.01)
    assert totals["step"] == pytest.approx(totals["layer"], rel=0.01)
    for r in runs.values():
        s = r.steps
        at_loop = np.isclose(s["step_s"], 5e-4 * s["batch_active"], rtol=1e-12)
        assert at_loop.any() and (s["stall_s"][at_loop] == 0).all()
    device = _closed("layer", 0.0, "tiered").steps
    assert 0 < (runs["layer"].steps["stall_s"] > 0).sum() < (device["stall_s"] > 0).sum()  # stalls the loop hid
    assert "a closed batch's decode steps" in build_context(runs["layer"].scenario).hw.sources["host_loop_s"]
