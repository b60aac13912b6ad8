"""`engine: {name: tensorrt-llm}` and each engine's own measured kernel tables (issue #20 item 4), by hand
against the rules as read in TensorRT-LLM's code (sim/device/engine_rules.py names the files):

- KV = (memory - the profiling run's peak: weights + activations + memory outside torch) x
  free_gpu_memory_fraction (0.9), `KvCacheCreator._cal_max_memory`;
- its scheduler defaults (max_batch_size 2048, max_num_tokens 8192, no chunked prefill) and its capacity
  policy GUARANTEED_NO_EVICT (scheduler.admission no_evict: a request runs only with its whole length
  reserved, so none is ever preempted);
- CUDA graphs only for the captured batch sizes (`CudaGraphConfig._generate_cuda_graph_batch_sizes`);
- the measured kernel tables each engine's own (AIConfigurator measured vLLM, SGLang and TensorRT-LLM)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.device.engine_rules import DECODE, decode_rows, host_launch_s, launch_rule, trtllm_graph_batch_sizes
from sim.device.memory import profile_run_activation_bytes, trtllm_engine_memory
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import load_tables, tables_available
from sim.inputs.scenario import EngineCfg, load_scenario, scenario_to_yaml
from sim.inputs.serving_config import SchedulerCfg
from sim.serving.kv_memory import kv_memory
from sim.serving.run import simulate_serving

from .conftest import SCENARIOS, run_cli
from .promise import assert_error_line

SERVING = SCENARIOS / "serving-h100-70b-tp4.yaml"  # 70B bf16, 4 x H100, scheduler 256 seqs / 8192 tokens
NEEDS_TABLES = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (the .[measured] extra) not installed")


def test_trtllm_kv_fraction_by_hand():
    # memory 100, outside torch 1, weights 30, activations 9: peak 40, KV 0.9 x 60 = 54
    usable, reserve, held = trtllm_engine_memory(100.0, 0.9, 1.0, 9.0, 30.0)
    assert (reserve, held) == (1.0, 9.0)
    assert usable - 30.0 - held - reserve == pytest.approx(54.0)  # kvtier's KV budget: usable - weights - act - reserve
    assert trtllm_engine_memory(30.0, 0.9, 1.0, 9.0, 30.0)[0] == 40.0  # nothing left: no KV, never negative


def test_trtllm_kv_budget_70b_tp4_h100():
    sc = load_scenario(SERVING, ["engine.name=tensorrt-llm", "engine.free_gpu_memory_fraction=0.8"])
    ctx, plain = build_context(sc), build_context(load_scenario(SERVING))
    s = sc.scheduler
    act = profile_run_activation_bytes(ctx.model, s.max_num_batched_tokens, s.max_num_seqs)
    m = kv_memory(ctx, s.max_num_batched_tokens, s.max_num_seqs)
    total = plain.hw.memory_bytes  # the catalog's nvidia-smi memory.total
    assert m.kv_budget_bytes == pytest.approx(0.8 * (total - 1e9 - ctx.weights_bytes - act))
    assert "KvCacheCreator._cal_max_memory" in ctx.hw.sources["memory_bytes"]
    default = kv_memory(build_context(load_scenario(SERVING, ["engine.name=tensorrt-llm"])), s.max_num_batched_tokens,
                        s.max_num_seqs)
    assert default.kv_budget_bytes == pytest.approx(m.kv_budget_bytes * 0.9 / 0.8)  # free_gpu_memory_fraction 0.9


def test_trtllm_scheduler_defaults_only_where_unset():
    e = EngineCfg.model_validate({"name": "tensorrt-llm"}, strict=True)
    assert (e.free_gpu_memory_fraction, e.kernel_framework) == (0.9, "trtllm")
    s = e.scheduler_for(SchedulerCfg(), 80e9, 1)
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill, s.admission) == (2048, 8192, False, "no_evict")
    mine = SchedulerCfg(max_num_seqs=64, chunked_prefill=True, admission="on_demand")
    kept = e.scheduler_for(mine, 80e9, 1)
    assert (kept.max_num_seqs, kept.chunked_prefill, kept.admission, kept.max_num_batched_tokens) == (64, True, "on_demand", 8192)


def test_trtllm_graph_sizes_by_hand():
    assert trtllm_graph_batch_sizes(128) == list(range(1, 32)) + [32, 64, 128]
    assert trtllm_graph_batch_sizes(1000) == list(range(1, 32)) + [32, 64, 128, 256, 512, 1000]
    assert trtllm_graph_batch_sizes(512) == list(range(1, 32)) + [32, 64, 128, 256, 512]
    assert trtllm_graph_batch_sizes(20) == list(range(1, 21))
    e = EngineCfg.model_validate({"name": "tensorrt-llm"}, strict=True)
    rule, why = launch_rule(e, SchedulerCfg(), "h100-sxm", 80e9, 1, 3e-5, 1e-4)
    assert rule.graph_max_batch == 128 and "CudaGraphConfig" in why
    assert host_launch_s(rule, 32, DECODE) == host_launch_s(rule, 128, DECODE) == (0.0, 0.0)
    assert host_launch_s(rule, 40, DECODE) == host_launch_s(rule, 129, DECODE) == (3e-5, 1e-4)  # not captured: eager


def test_padded_graphs_by_hand():
    """enable_padding: the generated sizes step by 8 to 128; given batch_sizes, those up to min(max_batch_size,
    max_num_tokens) a rank and that cap (`_filter_cuda_graph_batch_sizes`); a decode batch's GEMMs run at the
    next captured size, the fullest rank's under attention data parallelism."""
    assert trtllm_graph_batch_sizes(128, padding=True) == [1, 2, 4] + [8 * i for i in range(1, 17)]
    assert trtllm_graph_batch_sizes(300, padding=True)[-3:] == [128, 256, 300]
    doc = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192]
    e = EngineCfg.model_validate({"name": "tensorrt-llm", "cuda_graph_batch_sizes": doc, "cuda_graph_padding": True},
                                 strict=True)
    rule, why = launch_rule(e, SchedulerCfg(max_num_seqs=768, max_num_batched_tokens=2048), "h200-sxm", 150e9, 2, 3e-5,
                            1e-4)
    assert sorted(rule.graph_sizes) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768] and "_filter_cuda_graph" in why
    assert [decode_rows(rule, b) for b in (1, 3, 300, 562, 768, 769)] == [1, 4, 384, 768, 768, 769]  # 769: eager
    assert host_launch_s(rule, 562, DECODE) == (0.0, 0.0) and host_launch_s(rule, 769, DECODE) == (3e-5, 1e-4)
    dp, _ = launch_rule(e, SchedulerCfg(max_num_seqs=1280, max_num_batched_tokens=16384), "h200-sxm", 150e9, 8, 3e-5,
                        1e-4, ranks=8)
    assert max(dp.graph_sizes) == 160 and decode_rows(dp, 1040) == 8 * 160  # 130 a rank, padded to 160 on each
    assert decode_rows(dp, 8 * 128) == 8 * 128
    unpadded = launch_rule(EngineCfg.model_validate({"name": "tensorrt-llm", "cuda_graph_batch_sizes": doc}, strict=True),
                           SchedulerCfg(max_num_seqs=768, max_num_batched_tokens=2048), "h200-sxm", 150e9, 2, 3e-5, 1e-4)[0]
    assert 768 not in unpadded.graph_sizes and decode_rows(unpadded, 562) == 562
    assert host_launch_s(unpadded, 562, DECODE) == (3e-5, 1e-4)  # not a captured size, no padding: eager


def test_padding_raises_a_decode_steps_gemm_rows():
    base = ["engine.name=tensorrt-llm", "hardware.kernels=datasheet", "scheduler.max_num_seqs=768"]
    plain = build_context(load_scenario(SERVING, base))
    padded = build_context(load_scenario(SERVING, [*base, "engine.cuda_graph_padding=true",
                                                   "engine.cuda_graph_batch_sizes=[256, 512]"]))
    from sim.device.physics import decode_layer_cost, weight_kernel_s
    m = padded.scenario.model
    cost = decode_layer_cost(padded.model, padded.hw, m.weight_dtype, m.weight_group_size, 300, 300 * 1000,
                             padded.kv_bytes_per_token_layer)
    assert cost.gemm_s == weight_kernel_s(padded.model, padded.hw, m.weight_dtype, m.weight_group_size, 512)
    same = decode_layer_cost(plain.model, plain.hw, m.weight_dtype, m.weight_group_size, 300, 300 * 1000,
                             plain.kv_bytes_per_token_layer)
    assert cost.attention_s == same.attention_s and cost.gemm_s > same.gemm_s


@pytest.mark.parametrize(("overrides", "said"), [
    (["engine.name=vllm", "engine.cuda_graph_padding=true"], "cuda_graph_batch_sizes and cuda_graph_padding are TensorRT-LLM's"),
    (["engine.name=vllm", "engine.free_gpu_memory_fraction=0.8"], "free_gpu_memory_fraction is tensorrt-llm's; vllm's fraction is gpu_memory_utilization"),
    (["engine.name=tensorrt-llm", "engine.mem_fraction_static=0.8"], "mem_fraction_static is sglang's; tensorrt-llm's fraction is free_gpu_memory_fraction"),
    (["engine.name=tensorrt-llm", "engine.free_gpu_memory_fraction=1.5"], "engine.free_gpu_memory_fraction"),
    (["engine.name=vllm", "engine.kernel_tables=tensorrt"], "engine.kernel_tables"),
    (["scheduler.admission=reserve"], "scheduler.admission"),
])
def test_bad_trtllm_fields_are_one_line(overrides, said):
    with pytest.raises(ConfigError) as err:
        load_scenario(SERVING, overrides)
    assert_error_line(err.value)
    assert said in err.value.line()


def _offline(admission: str):
    """64 requests of 600 + 400 tokens queued at once on one L40S, 8B bf16 (a KV budget that holds
    far fewer whole requests than a decoding batch would want)."""
    over = ["model.name=llama-3.1-8b", "hardware.gpu=l40s", "hardware.kernels=datasheet", "parallel.tp=1",
            "policy.kind=full_hbm", "workload.prompt_tokens=600", "workload.reasoning_tokens=400",
            "workload.arrivals={kind: closed_loop, concurrency: 64, requests: 64}",
            "scheduler.max_num_seqs=64", "hardware.efficiency.runtime_reserve_bytes=28e9", f"scheduler.admission={admission}"]
    sc = load_scenario(SERVING, over)
    return sc, simulate_serving(sc)


def test_no_evict_runs_only_whole_requests_that_fit_and_never_preempts():
    sc, res = _offline("no_evict")
    ctx = build_context(sc)
    m = kv_memory(ctx, sc.scheduler.max_num_batched_tokens, sc.scheduler.max_num_seqs)
    whole = 1000 * m.kv_bytes_per_token  # prompt + output tokens reserved at admission
    fits = math.floor(m.kv_budget_bytes / whole)
    assert 4 <= fits < 64  # the budget binds
    s = res.summary
    assert s.max_running == fits and s.preemptions == 0
    assert s.requests == 64 and np.isfinite(res.requests["finish_s"]).all()
    _, demand = _offline("on_demand")  # vLLM's way: admit what fits now, preempt as the running ones grow
    assert demand.summary.max_running > fits


def test_admission_dumps_only_when_set():
    plain = load_scenario(SERVING)
    assert "admission" not in scenario_to_yaml(plain)
    assert "admission: no_evict" in scenario_to_yaml(load_scenario(SERVING, ["scheduler.admission=no_evict"]))


@NEEDS_TABLES
def test_each_engine_runs_on_its_own_tables():
    for name, framework in (("vllm", "vllm"), ("sglang", "sglang"), ("tensorrt-llm", "trtllm")):
        ctx = build_context(load_scenario(SERVING, [f"engine.name={name}", "hardware.kernels=measured"]))
        assert ctx.hw.kernels.tables.framework == framework
        assert f"h100_sxm (NVIDIA H100 80GB HBM3) {framework} " in ctx.hw.sources["kernels"]
    borrowed = build_context(load_scenario(SERVING, ["engine.name=tensorrt-llm", "engine.kernel_tables=vllm",
                                                     "hardware.kernels=measured"]))
    assert borrowed.hw.kernels.tables.framework == "vllm"
    assert build_context(load_scenario(SERVING, ["hardware.kernels=measured"])).hw.kernels.tables.framework == "vllm"


@NEEDS_TABLES
def test_the_tables_read_each_frameworks_files():
    t = load_tables("h200-sxm", "trtllm")
    assert (t.framework, t.framework_version) == ("trtllm", "1.3.0rc20")
    assert t.source("gemm fp8").endswith("h200_sxm (NVIDIA H200) trtllm 1.3.0rc20 gemm fp8")
    assert set(t.allreduce) == {"custom", "nccl"} and len(t.allreduce["custom"]) > 0
    # vLLM's L40S all-reduce was last measured at 0.22.0: the package's backward fill, and the source says so
    assert load_tables("l40s", "vllm").source("custom_allreduce").endswith("vllm 0.22.0 custom_allreduce")
    with pytest.raises(ConfigError, match="expected one of vllm, sglang, trtllm"):
        load_tables("h200-sxm", "tgi")


@NEEDS_TABLES
def test_kvsim_ops_tables_flag():
    args = ["ops", "attention", "--gpu", "h200-sxm", "--batch", "865", "--kv-tokens", "1500", "--heads", "32",
            "--kv-heads", "8", "--head-dim", "128", "--kv-dtype", "fp8", "--kernels", "measured"]
    vllm, trt = run_cli(*args), run_cli(*args, "--tables", "trtllm")
    assert vllm.returncode == trt.returncode == 0
    assert "vllm 0.24.0 generation_attention" in vllm.stdout and "trtllm 1.3.0rc20 generation_attention" in trt.stdout
    bad = run_cli(*args, "--tables", "tgi")
    assert bad.returncode != 0 and "--tables: expected one of vllm, sglang, trtllm; got 'tgi'" in bad.stderr


@NEEDS_TABLES
def test_weight_only_gemms_from_tensorrt_llms_tables_on_a100():
    """TensorRT-LLM 1.0.0's A100 tables time its weight-only int8/int4 kernels (WeightOnlyQuantMatmul): a
    run under that engine takes its int4 layer GEMMs from them; vLLM's tables time none (datasheet)."""
    from sim.device.physics import _measured_gemms_s, weight_kernel_s

    over = ["model.name=llama-3.1-8b", "model.weight_dtype=int4", "hardware.gpu=a100-80gb-sxm", "parallel.tp=1",
            "hardware.kernels=measured", "policy.kind=full_hbm"]
    trt = build_context(load_scenario(SERVING, over + ["engine.name=tensorrt-llm"]))
    assert {"bf16", "int8", "int4"} <= trt.hw.kernels.gemm_dtypes()
    assert "dense GEMMs (bf16, int8, int4)" in trt.hw.sources["kernels"]
    shapes = tuple(trt.model.layer_gemm_shapes())
    layer_s = weight_kernel_s(trt.model, trt.hw, "int4", 128, 1)
    assert layer_s == _measured_gemms_s(trt.hw.kernels, shapes, "int4", 1)
    by_hand = sum(float(trt.hw.kernels.gemm_s(1, n, k, "int4").seconds[0]) for n, k in shapes)
    assert layer_s == pytest.approx(by_hand, rel=1e-12)
    vllm = build_context(load_scenario(SERVING, over + ["engine.name=vllm"]))
    assert "int4" not in vllm.hw.kernels.gemm_dtypes()  # the datasheet weight-only model instead
    assert weight_kernel_s(vllm.model, vllm.hw, "int4", 128, 1) != layer_s
    res = run_cli("ops", "gemm", "--gpu", "a100-80gb-sxm", "--m", "1", "--n", "6144", "--k", "4096", "--dtype", "int4",
                  "--kernels", "measured", "--tables", "trtllm")
    assert res.returncode == 0 and "trtllm 1.0.0 gemm int4_wo" in res.stdout, res.stdout + res.stderr


def test_the_plan_names_the_engine_it_assumed():
    from sim.plan.answer import answer_sentence, engine_phrase

    trt = load_scenario(SERVING, ["engine.name=tensorrt-llm"]).engine
    assert engine_phrase(trt) == ("engine tensorrt-llm main@2026-12 (its KV memory rule, scheduler defaults, CUDA "
                                  "graphs; its own kernel tables)")
    borrowed = load_scenario(SERVING, ["engine.name=tensorrt-llm", "engine.kernel_tables=vllm"]).engine
    assert engine_phrase(borrowed).endswith("CUDA graphs; vllm's kernel tables)")
    assert engine_phrase(None).startswith("no engine: kvtier's flat HBM reserve")
    said = answer_sentence([], 4.0, engine=engine_phrase(trt))
    assert said.startswith("Nothing passes at 4 req/s") and said.endswith("Assumed: " + engine_phrase(trt) + ".")
    assert answer_sentence([], 4.0) == said.removesuffix(" Assumed: " + engine_phrase(trt) + ".")


def test_the_planners_screen_sizes_no_evict_by_whole_lengths():
    """The analytic screen's HBM cap: the mean running context per request on demand, the whole
    length E[n (p + n)] / E[n] reserved per request under no_evict (fixed lengths: p + n)."""
    from sim.plan.screen import curve, moments

    over = ["workload.prompt_tokens=1000", "workload.reasoning_tokens=1000", "policy.kind=full_hbm"]
    on_demand = load_scenario(SERVING, over)
    no_evict = load_scenario(SERVING, over + ["scheduler.admission=no_evict"])
    m = moments(no_evict)
    assert m.reserved_tokens == pytest.approx(2000) and m.running_context_tokens == pytest.approx(1500)
    ctx = build_context(no_evict)
    mem = kv_memory(ctx, no_evict.scheduler.max_num_batched_tokens, no_evict.scheduler.max_num_seqs)
    assert curve(no_evict).hbm_batch == pytest.approx(mem.kv_budget_bytes / (2000 * mem.kv_bytes_per_token))
    assert curve(on_demand).hbm_batch == pytest.approx(mem.kv_budget_bytes / (1500 * mem.kv_bytes_per_token))
