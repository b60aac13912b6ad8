"""`engine:` - the engines' rules for memory and launching (issue #20 item 4), each checked by hand
against the rule as read in the engine's code (sim/device/engine_rules.py names the files):

SGLang's KV pool (model_runner_kv_cache_mixin.py profile_max_num_token) = (memory - non_torch) x
mem_fraction_static - weights, its default fraction (server_args.py _handle_gpu_memory_settings), its
scheduler defaults where the scenario sets none, and the CUDA-graph rule of both engines (decode
batches up to the graph size replay a graph, host time 0; the rest launched eagerly)."""

from __future__ import annotations

import json

import pytest
import yaml

from sim.decode.context import build_context
from sim.device.engine_rules import (
    DECODE,
    MIXED,
    PREFILL,
    LaunchRule,
    decode_rows,
    host_launch_s,
    host_times,
    sglang_capture_sizes,
    sglang_fraction,
    sglang_max_running_requests,
    vllm_capture_sizes,
    vllm_graph_max_batch,
)
from sim.device.memory import sglang_mem_fraction_static, sglang_prefill_graph_sizes
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import EngineCfg, load_scenario, scenario_from_dict, scenario_to_yaml
from sim.inputs.serving_config import SchedulerCfg
from sim.model.units import GB, MiB
from sim.plan import launch as L
from sim.serving.kv_memory import kv_memory
from sim.serving.run import simulate_serving

from .conftest import SCENARIOS, run_cli
from .promise import assert_error_line, assert_refused

SERVING = SCENARIOS / "serving-h100-70b-tp4.yaml"  # 70B bf16, 4 x H100, scheduler 256 seqs / 8192 tokens
CLOSED = SCENARIOS / "h200-7b-batch.yaml"  # 7B bf16, one H200, batch 32
H100_MIB, H200_MIB, L40S_MIB, RTX4090_MIB, B200_MIB = 81559, 143771, 46068, 24564, 183359


def _llama70b_tp4_weight_bytes() -> float:
    """Llama-3.1-70B's bf16 weights on one GPU of four, by hand (config.json: 80 layers, hidden 8192,
    intermediate 28672, 64 heads and 8 KV heads of 128, vocabulary 128256, untied LM head): every
    linear layer and the vocab-parallel embedding and LM head split four ways; norms left out (0.01%)."""
    h, inter, kv, vocab = 8192, 28672, 8 * 128, 128256
    layer = 2 * h * h + 2 * h * kv + 3 * h * inter
    return 2 * (80 * layer + 2 * vocab * h) / 4


def test_sglang_kv_budget_70b_tp4_h100_by_hand():
    sc = load_scenario(SERVING, ["engine.name=sglang"])
    ctx = build_context(sc)
    assert ctx.weights_bytes == pytest.approx(_llama70b_tp4_weight_bytes(), rel=2e-4)  # 35.28 GB a GPU
    # reserved MiB = 512 + 8192 x 1.5 + 4 / 8 x 1024 + 512 x 2 (decode graphs to 512 at tp 4)
    #              + 8 x 58 (prefill graph sizes 4 .. 8192) = 14,800 > the 10 GiB floor of a > 60 GiB GPU
    assert len(sglang_prefill_graph_sizes(8192)) == 58
    fraction = round((H100_MIB - 14800) / H100_MIB, 3)
    assert fraction == 0.819
    s = sc.engine.scheduler_for(sc.scheduler, ctx.hw.memory_bytes, 4)
    pool = (H100_MIB * MiB - 1e9) * fraction - ctx.weights_bytes  # 33.94 GB a GPU
    assert kv_memory(ctx, s.max_num_batched_tokens, s.max_num_seqs).kv_budget_bytes == pytest.approx(pool, rel=1e-12)
    assert 33.9 * GB < pool < 34.0 * GB
    assert "mem_fraction_static 0.819" in ctx.hw.sources["memory_bytes"]
    assert sglang_fraction(sc.engine, s, H100_MIB * MiB, 4, False)[0] == fraction  # what a plan writes
    assert "profile_max_num_token" in ctx.hw.sources["memory_bytes"]
    # vLLM's rule on the same GPUs keeps more: 0.9 x memory - weights - activations - 1 GB
    vllm = build_context(load_scenario(SERVING, ["engine.name=vllm"]))
    assert kv_memory(vllm, 8192, 256).kv_budget_bytes > pool + 6 * GB


def test_an_explicit_mem_fraction_static_is_the_pool_rule_alone():
    ctx = build_context(load_scenario(CLOSED, ["engine.name=sglang", "engine.mem_fraction_static=0.7",
                                               "engine.non_torch_bytes=2e9", "policy.kind=full_hbm"]))
    budget = ctx.hw.memory_bytes - ctx.hw.runtime_reserve_bytes - ctx.hw.held_activation_bytes - ctx.weights_bytes
    assert budget == pytest.approx((H200_MIB * MiB - 2e9) * 0.7 - ctx.weights_bytes, rel=1e-12)
    assert "engine.mem_fraction_static" in ctx.hw.sources["memory_bytes"]


@pytest.mark.parametrize("gpu_mib,tp,expected_defaults,reserved_mib", [
    # H100 80 GB, one GPU: 8192, 256; 512 + 12288 + 128 + 512 + 464
    (H100_MIB, 1, (8192, 256), 13904),
    # H200: the same tier, 143,771 MiB
    (H200_MIB, 1, (8192, 256), 13904),
    # L40S 48 GB: 4096, 32; 512 + 6144 + 128 + 64 + 8 x 50 prefill sizes; no floor (< 60 GiB)
    (L40S_MIB, 1, (4096, 32), 7248),
    # RTX 4090 24 GB: 2048, 24; 512 + 3072 + 128 + 48 + 8 x 42
    (RTX4090_MIB, 1, (2048, 24), 4096),
    # B200 (> 160 GiB): 16384, 512; 512 + 24576 + 128 + 1024 + 8 x 74
    (B200_MIB, 1, (16384, 512), 26832),
])
def test_sglang_default_fraction_as_its_code_picks_it(gpu_mib, tp, expected_defaults, reserved_mib):
    e = EngineCfg.model_validate({"name": "sglang"}, strict=True)
    chunk, max_bs = e.sglang_gpu_defaults(gpu_mib * MiB, tp)
    assert (chunk, max_bs) == expected_defaults
    fraction = sglang_mem_fraction_static(gpu_mib, tp, chunk, True, max_bs, True, False)
    assert fraction == round((gpu_mib - reserved_mib) / gpu_mib, 3)


def test_sglang_fraction_on_two_gpus_and_its_knobs():
    assert sglang_mem_fraction_static(H100_MIB, 1, 8192, True, 256, True, False) == 0.830
    assert sglang_mem_fraction_static(H200_MIB, 1, 8192, True, 256, True, False) == 0.903
    # without CUDA graphs nothing is reserved for them: 512 + 12288 + 512 (tp 4) = 13,312 MiB
    assert sglang_mem_fraction_static(H100_MIB, 4, 8192, True, 512, False, False) == round(
        (H100_MIB - 13312) / H100_MIB, 3)
    # an MLA model's prefill graphs take 1.5 GiB whatever the sizes: 512 + 12288 + 1024 (tp 8) + 1024 + 1536
    assert sglang_mem_fraction_static(H100_MIB, 8, 8192, True, 512, True, True) == round(
        (H100_MIB - 16384) / H100_MIB, 3)
    # a small GPU below the 10 GiB floor: 512 + 3072 + 128 + 16 + 336
    assert sglang_mem_fraction_static(16303, 1, 2048, True, 8, True, False) == round((16303 - 4064) / 16303, 3)


def test_sglang_scheduler_defaults_only_where_unset():
    e = EngineCfg.model_validate({"name": "sglang"}, strict=True)
    plain = SchedulerCfg()
    on_h100 = e.scheduler_for(plain, H100_MIB * MiB, 1)
    # max_num_seqs: the ceiling of its max_running_requests rule, a rank's; the run cuts it to its pool's
    assert (on_h100.max_num_batched_tokens, on_h100.max_num_seqs) == (8192, 4096)
    assert e.scheduler_for(plain, H100_MIB * MiB, 8, attention_dp=8).max_num_seqs == 8 * 4096
    assert e.scheduler_for(plain, B200_MIB * MiB, 1).max_num_batched_tokens == 16384
    assert e.scheduler_for(plain, L40S_MIB * MiB, 1).max_num_batched_tokens == 4096
    assert e.scheduler_for(SchedulerCfg(chunked_prefill=False), H100_MIB * MiB, 1).max_num_batched_tokens == 16384
    assert not on_h100.mixed_prefill  # enable_mixed_chunk False: a prefill step runs alone
    assert on_h100.admission == "reserve_ratio"  # PrefillAdder's new_token_ratio estimate
    mine = SchedulerCfg(max_num_seqs=64, max_num_batched_tokens=1024, mixed_prefill=True, admission="on_demand")
    assert e.scheduler_for(mine, B200_MIB * MiB, 1) == mine
    assert e.scheduler_for(SchedulerCfg(max_num_seqs=64), H100_MIB * MiB, 1).max_num_batched_tokens == 8192



def test_sglang_max_running_requests_by_hand():
    """_resolve_max_num_reqs: clamp(int(pool / context_len x 512), 2048, 4096), no more than the
    requested (kvtier's unset: 4096) nor half the pool, per attention rank."""
    assert sglang_max_running_requests(4096, 1_000_000, 131072) == 3906  # 1e6 / 131072 x 512 = 3906.25
    assert sglang_max_running_requests(4096, 1_000_000, 40960) == 4096  # 12,500 clamped
    assert sglang_max_running_requests(4096, 200_000, 131072) == 2048  # 781 raised to the floor
    assert sglang_max_running_requests(4096, 3_000, 131072) == 1500  # half the pool
    assert sglang_max_running_requests(256, 1_000_000, 131072) == 256  # a set cap below the rule stays
    assert sglang_max_running_requests(4096, 1_000_000, None) == 4096  # no context: SGLang's 2048
    assert sglang_max_running_requests(2 * 4096, 2_000_000, 131072, ranks=2) == 2 * 3906  # each rank its pool
    assert sglang_max_running_requests(1000, 2_000_000, 131072, ranks=2) == 1000  # --max-running-requests // dp
    assert sglang_max_running_requests(3, 2_000_000, 131072, ranks=8) == 3  # never above what was asked


def test_a_sglang_run_caps_its_running_requests_by_its_pool():
    """Llama-3.1-8B on one H200 under SGLang, max_num_seqs unset: the run's cap is the rule's of its own KV
    pool (pool tokens / 131,072 x 512, between the floor and the ceiling here), which the summary and the
    resolved scenario state; a smaller set max_num_seqs is kept."""
    data = yaml.safe_load(SERVING.read_text())
    del data["scheduler"]["max_num_seqs"]
    data.update(engine={"name": "sglang"}, parallel={"tp": 1}, hardware={"gpu": "h200-sxm"})
    data["model"]["name"] = "llama-3.1-8b"
    data["workload"]["arrivals"]["requests"] = 40
    s = simulate_serving(scenario_from_dict(data, "test")).summary
    pool = s.kv_budget_bytes / s.kv_bytes_per_token
    assert 2048 < int(pool / 131072 * 512) < 4096
    assert s.max_num_seqs == int(pool / 131072 * 512)
    assert s.resolved_scenario["scheduler"]["max_num_seqs"] == s.max_num_seqs
    data["scheduler"]["max_num_seqs"] = 300
    assert simulate_serving(scenario_from_dict(data, "test")).summary.max_num_seqs == 300


def test_a_sglang_runs_resolved_scenario_states_its_cap_and_runs_again_the_same(tmp_path):
    """kvsim run writes the cap the run applied into scenario.resolved.yaml; running that file again gives
    the same cap and the same figures (the rule cuts a set max_num_seqs to itself)."""
    data = yaml.safe_load(SERVING.read_text())
    del data["scheduler"]["max_num_seqs"]
    data.update(engine={"name": "sglang"}, parallel={"tp": 1}, hardware={"gpu": "h200-sxm"})
    data["model"]["name"] = "llama-3.1-8b"
    data["workload"]["arrivals"]["requests"] = 40
    (tmp_path / "sg.yaml").write_text(yaml.safe_dump(data))
    assert run_cli("run", str(tmp_path / "sg.yaml"), "--out", str(tmp_path / "a")).returncode == 0
    resolved = tmp_path / "a" / "scenario.resolved.yaml"
    cap = yaml.safe_load(resolved.read_text())["scheduler"]["max_num_seqs"]
    assert 2048 < cap < 4096
    assert run_cli("run", str(resolved), "--out", str(tmp_path / "b")).returncode == 0
    first, again = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("a", "b"))
    assert first["max_num_seqs"] == again["max_num_seqs"] == cap
    assert first["output_throughput_tok_per_s"] == again["output_throughput_tok_per_s"]


def test_vllm_serve_defaults_by_gpu():
    """vllm/engine/arg_utils.py `get_batch_defaults` (OPENAI_API_SERVER): >= 70 GiB and not an A100 8192
    tokens and 1024 sequences, else 2048 and 256; the sequences no more than the tokens; what the scenario
    set stays; without chunked prefill the budget stays kvtier's (vLLM's max_model_len is not in the catalog)."""
    vllm = EngineCfg.model_validate({"name": "vllm"}, strict=True)
    plain = SchedulerCfg()

    def limits(mib, name, sched=plain):
        s = vllm.scheduler_for(sched, mib * MiB, 1, name)
        return s.max_num_batched_tokens, s.max_num_seqs

    assert limits(B200_MIB, "b200") == limits(H100_MIB, "h100-sxm") == (8192, 1024)
    assert limits(81920, "a100-80gb-sxm") == (2048, 256)  # A100s keep the small defaults (PR #17885)
    assert limits(L40S_MIB, "l40s") == limits(RTX4090_MIB, "rtx-4090") == (2048, 256)
    assert limits(H100_MIB, "h100-sxm", SchedulerCfg(max_num_batched_tokens=512)) == (512, 512)
    assert limits(H100_MIB, "h100-sxm", SchedulerCfg(max_num_seqs=64)) == (8192, 64)
    assert limits(L40S_MIB, "l40s", SchedulerCfg(chunked_prefill=False)) == (8192, 256)
    served = load_scenario(SERVING, ["engine.name=vllm", "scheduler.max_num_seqs=300"])  # the file sets 256 / 8192
    assert (served.scheduler.max_num_seqs, served.scheduler.max_num_batched_tokens) == (300, 8192)


def test_cuda_graph_rule_by_hand():
    # vLLM: min(max_num_seqs x 2, 512; 1024 on SM100), no more than max_num_batched_tokens or max_num_seqs
    assert vllm_graph_max_batch(256, 8192, False) == 256
    assert vllm_graph_max_batch(1024, 8192, False) == 512
    assert vllm_graph_max_batch(1024, 8192, True) == 1024
    assert vllm_graph_max_batch(1024, 300, False) == 300
    assert vllm_graph_max_batch(1024, 8192, False, max_capture=64) == 64
    rule = LaunchRule(True, 256, 3e-5, 1e-4)
    assert host_launch_s(rule, 1, DECODE) == host_launch_s(rule, 256, DECODE) == (0.0, 0.0)
    assert host_launch_s(rule, 257, DECODE) == (3e-5, 1e-4)
    assert host_launch_s(rule, 8, MIXED) == host_launch_s(rule, 8, PREFILL) == (3e-5, 1e-4)
    assert host_launch_s(LaunchRule(False, 0, 3e-5, 1e-4), 1, DECODE) == (3e-5, 1e-4)
    with pytest.raises(ValueError, match="step_kind"):
        host_launch_s(rule, 1, "verify")


def test_vllm_pads_a_decode_batch_to_its_next_captured_size():
    """vLLM's capture sizes 1, 2, 4, 8-248 by 8, 256 up by 16 (`_set_cudagraph_sizes`): a decode batch runs
    padded to the next (bs_to_padded_graph_size); above the largest, as it is (eager)."""
    sizes = vllm_capture_sizes(512)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-2:] == [496, 512] and 248 in sizes and 264 not in sizes
    ctx = build_context(load_scenario(SERVING, ["engine.name=vllm"]))  # max_num_seqs 256: FULL graphs up to 256
    rule = ctx.hw.launch
    assert rule.padding and rule.graph_max_batch == 256
    assert [decode_rows(rule, b) for b in (3, 130, 250, 256, 257)] == [4, 136, 256, 256, 257]
    assert decode_rows(None, 130) == 130  # no engine: the batch as it is


def test_sglang_pads_a_decode_batch_to_its_next_captured_size():
    """SGLang's ladder 1, 2, 4, 8, 12, 16-256 by 8, 272-496 by 16, 512 up by 32 (`_generate_cuda_graph_batch_sizes`,
    padding on by default) up to cuda_graph_max_bs, none above the request pool, whose size is captured instead."""
    sizes = sglang_capture_sizes(512, 2048)
    assert sizes[:6] == [1, 2, 4, 8, 12, 16] and 256 in sizes and 264 not in sizes and 272 in sizes
    assert sizes[-3:] == [480, 496, 512] and len(sizes) == 5 + 31 + 15 + 1
    assert sglang_capture_sizes(160, 2048)[-2:] == [152, 160]
    assert sglang_capture_sizes(256, 100) == [1, 2, 4, 8, 12, *range(16, 97, 8), 100]  # the pool caps the ladder
    ctx = build_context(load_scenario(CLOSED, ["engine.name=sglang"]))  # H200, tp 1: cuda_graph_max_bs 256
    rule = ctx.hw.launch
    assert rule.padding and rule.graph_max_batch == 256 and "padded up to the next captured size" in ctx.hw.sources["host_layer_s"]
    assert [decode_rows(rule, b) for b in (3, 9, 13, 130, 256, 257)] == [4, 12, 16, 136, 256, 257]


def test_a_run_replays_graphs_up_to_the_engines_size():
    host = ["hardware.efficiency.host_layer_s=5e-5", "hardware.efficiency.host_step_s=2e-4"]
    graphed = build_context(load_scenario(CLOSED, ["engine.name=sglang", *host]))  # batch 32 <= 256 (H200, tp 1)
    assert graphed.hw.launch.graph_max_batch == 256
    assert (graphed.hw.host_layer_s, graphed.hw.host_step_s) == (0.0, 0.0)
    assert host_times(graphed.hw, 300, DECODE) == (5e-5, 2e-4) and host_times(graphed.hw, 32, MIXED) == (5e-5, 2e-4)
    assert "graph replay" in graphed.hw.sources["host_layer_s"]
    eager = build_context(load_scenario(CLOSED, ["engine.name=vllm", "engine.cuda_graphs=false", *host]))
    assert (eager.hw.host_layer_s, eager.hw.host_step_s) == (5e-5, 2e-4)
    big = build_context(load_scenario(CLOSED, ["engine.name=sglang", "workload.batch_size=300", *host]))
    assert big.hw.host_layer_s == 5e-5 and "eager" in big.hw.sources["host_layer_s"]
    tp4 = build_context(load_scenario(SERVING, ["engine.name=sglang", "engine.cuda_graph_max_batch=64"]))
    assert tp4.hw.launch.graph_max_batch == 64
    unknown = build_context(load_scenario(CLOSED, ["engine.name=sglang", "engine.cuda_graphs=false"]))
    assert "0 assumed" in unknown.hw.sources["host_layer_s"]


def test_no_engine_unchanged():
    plain = build_context(load_scenario(CLOSED, ["hardware.efficiency.host_layer_s=5e-5"]))
    assert plain.hw.launch is None and host_times(plain.hw, 1000, MIXED) == (5e-5, 0.0)
    assert "\nengine:" not in scenario_to_yaml(load_scenario(CLOSED))
    vllm = scenario_to_yaml(load_scenario(CLOSED, ["engine.name=vllm"]))
    engine = vllm[vllm.index("\nengine:"):]
    assert [line.split(":")[0].strip() for line in engine.strip().splitlines()[1:5]] == [
        "name", "version", "gpu_memory_utilization", "non_torch_bytes"]  # a vLLM engine dumps as before
    assert "cuda_graphs" not in engine and "mem_fraction_static" not in engine


@pytest.mark.parametrize("overrides,field", [
    (["engine.name=trtllm"], "engine.name"),
    (["engine.name=vllm", "engine.mem_fraction_static=0.8"], "engine.mem_fraction_static"),
    (["engine.name=sglang", "engine.gpu_memory_utilization=0.9"], "engine.gpu_memory_utilization"),
    (["engine.name=sglang", "engine.mem_fraction_static=1.0"], "engine.mem_fraction_static"),
    (["engine.name=vllm", "engine.gpu_memory_utilization=null"], "engine.gpu_memory_utilization"),
    (["engine.name=sglang", "engine.cuda_graph_max_batch=0"], "engine.cuda_graph_max_batch"),
    (["engine.name=sglang", "engine.cuda_graphs=1"], "engine.cuda_graphs"),
])
def test_bad_engine_fields_are_one_line(overrides, field):
    with pytest.raises(ConfigError) as err:
        load_scenario(CLOSED, overrides)
    assert_error_line(err.value, str(CLOSED), field)


def test_kvsim_run_says_which_engine_rules_applied(tmp_path):
    res = run_cli("run", str(CLOSED), "--set", "engine.name=sglang", "--set", "sim.detail=fast",
                  "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr[-2000:]
    sources = json.loads((tmp_path / "run" / "summary.json").read_text())["sources"]
    for key in ("memory_bytes", "runtime_reserve_bytes", "held_activation_bytes", "host_layer_s", "host_step_s"):
        assert sources[key].startswith("engine sglang main@001067ff"), (key, sources[key])
    assert "mem_fraction_static 0.903" in sources["memory_bytes"]
    refused = run_cli("run", str(CLOSED), "--set", "engine.name=sglang", "--set", "engine.gpu_memory_utilization=0.8",
                      "--out", str(tmp_path / "bad"))
    assert_refused(refused, str(CLOSED), "engine.gpu_memory_utilization")
    assert not (tmp_path / "bad").exists()


def test_sglang_command_writes_sglangs_own_fraction():
    layout = ("org/model", 4, 1, 256, 8192, 0.9, True, "full_hbm", None, "bf16", "bf16")
    assert "--mem-fraction-static 0.9 " in L.sglang_launch_command(*layout) + " "
    assert "--mem-fraction-static 0.819" in L.sglang_launch_command(*layout, mem_fraction_static=0.819)
    with pytest.raises(ValueError, match="mem_fraction_static"):
        L.sglang_launch_command(*layout, mem_fraction_static=1.2)


def test_a_plan_under_sglang_launches_with_the_fraction_it_ran_with():
    from sim.inputs.scenario import load_scenario
    from sim.plan.answer import launch_lines

    row = {"tp": 4, "dp": 1, "policy": "full_hbm", "gpu": "h100-sxm", "max_num_seqs": None, "prefill": None,
           "experts": None}
    sglang = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml", ["engine.name=sglang"])
    assert "--mem-fraction-static 0.819" in launch_lines(row, sglang)["sglang"]  # the default rule, 70B TP4 on H100
    vllm = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml")
    assert "--mem-fraction-static 0.9" in launch_lines(row, vllm)["sglang"]  # no engine: gpu_memory_utilization's 0.9
