"""The context an engine serves (issue #20 item 4): the model's context as vLLM derives it from
config.json (max_position_embeddings x rope_scaling), engine.max_model_len, the requests refused at
load, vLLM's refusal to start when its KV budget cannot hold one max_model_len request
(kv_cache_utils.py check_enough_kv_cache_memory) and its auto-fit, and the plan's --max-model-len."""

from __future__ import annotations

import json

import pytest

from sim.decode.context import build_context
from sim.device.engine_context import vllm_fitting_context, vllm_request_kv_bytes
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.hf_config import RopeScaling, context_tokens
from sim.inputs.scenario import EngineCfg, load_scenario
from sim.inputs.serving_config import SchedulerCfg
from sim.plan.answer import instance_scenarios, launch_lines, vllm_max_model_len

from .conftest import SCENARIOS, run_cli
from .promise import assert_refused

SERVING = SCENARIOS / "serving-h100-70b-tp4.yaml"
CLOSED = SCENARIOS / "h200-7b-batch.yaml"
# Qwen3-32B bf16 on one H100 under vLLM: its 40,960-token context does not fit what is left of the HBM
TIGHT = ["engine.name=vllm", "model.name=qwen3-32b", "parallel.tp=1", "workload.arrivals.requests=50"]


@pytest.mark.parametrize("name,tokens", [("llama-3.1-8b", 131072), ("deepseek-r1", 163840), ("qwen3-32b", 40960),
                                         ("gpt-oss-120b", 131072), ("qwen3-next-80b-a3b", 262144)])
def test_catalog_contexts(name, tokens):
    assert catalog.model(name).context_tokens == tokens


def test_context_as_vllm_derives_it():
    assert context_tokens(163840, RopeScaling(type="yarn", factor=40.0, original_max_position_embeddings=4096)) == 163840
    assert context_tokens(131072, RopeScaling(rope_type="llama3", factor=8.0)) == 131072  # already stretched
    assert context_tokens(4096, RopeScaling(type="linear", factor=4.0)) == 16384
    assert context_tokens(32768, None) == 32768
    assert context_tokens(None, RopeScaling(type="linear", factor=4.0)) is None


def test_a_config_json_gives_its_context(tmp_path):
    cfg = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 32768,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                            "mrope_section": [16, 24, 24]}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert catalog.model_from_hf_config(path).context_tokens == 131072
    del cfg["max_position_embeddings"]
    path.write_text(json.dumps(cfg))
    assert catalog.model_from_hf_config(path).context_tokens is None


def test_request_kv_bytes_by_hand():
    llama = catalog.model("llama-3.1-8b")
    assert vllm_request_kv_bytes(llama, "bf16", 131072, 8192) == 131072 * 32 * 2 * 8 * 128 * 2  # 16 GiB
    oss = catalog.model("gpt-oss-20b")  # 12 full + 12 window (128) layers, 8 KV heads of 64
    per_layer = 2 * 8 * 64 * 2
    assert vllm_request_kv_bytes(oss, "bf16", 100_000, 8192) == (12 * 100_000 + 12 * (128 - 1 + 8192)) * per_layer
    assert vllm_request_kv_bytes(oss, "bf16", 1000, 8192) == (12 * 1000 + 12 * 1000) * per_layer
    mav = catalog.model("llama-4-maverick")  # 12 full + 36 chunked (8,192) layers, 8 KV heads of 128
    per_layer = 2 * 8 * 128 * 2
    # ChunkedLocalAttentionSpec: a chunked layer counts min(tokens, C + max_num_batched_tokens) tokens
    assert vllm_request_kv_bytes(mav, "bf16", 100_000, 8192) == (12 * 100_000 + 36 * (8192 + 8192)) * per_layer
    assert vllm_request_kv_bytes(mav, "bf16", 5000, 8192) == (12 * 5000 + 36 * 5000) * per_layer


def test_fitting_context_is_the_longest_that_fits():
    def need(tokens):
        return 100.0 * tokens

    assert vllm_fitting_context(need, 1e6, 50_000) == 10_000
    assert vllm_fitting_context(need, 1e6 + 99, 50_000) == 10_000
    assert vllm_fitting_context(need, 1e6, 5_000) == 5_000
    assert vllm_fitting_context(need, 99.0, 50_000) == 0


def _budget(ctx) -> float:
    return ctx.hw.memory_bytes - ctx.weights_bytes - ctx.hw.held_activation_bytes - ctx.hw.runtime_reserve_bytes


def test_vllm_refuses_to_start_where_one_request_of_the_context_does_not_fit(tmp_path):
    with pytest.raises(ConfigError) as err:
        build_context(load_scenario(SERVING, TIGHT))
    assert err.value.field == "engine.max_model_len" and "40,960 tokens" in err.value.message
    res = run_cli("run", str(SERVING), *[a for o in TIGHT for a in ("--set", o)], "--out", str(tmp_path / "run"))
    assert_refused(res, str(SERVING), "engine.max_model_len")
    assert not (tmp_path / "run").exists()


def test_auto_fits_the_longest_context_the_budget_holds():
    ctx = build_context(load_scenario(SERVING, [*TIGHT, "engine.max_model_len=auto"]))
    n, sc = ctx.max_model_len, ctx.scenario.scheduler

    def need(tokens):
        return vllm_request_kv_bytes(ctx.model, "bf16", tokens, sc.max_num_batched_tokens)

    assert 4096 < n < 40960 and need(n) <= _budget(ctx) < need(n + 1)
    assert "auto-fit" in ctx.hw.sources["max_model_len"]
    # the same number stated is accepted; one more token is refused
    assert build_context(load_scenario(SERVING, [*TIGHT, f"engine.max_model_len={n}"])).max_model_len == n
    with pytest.raises(ConfigError, match=f"at most {n:,}"):
        build_context(load_scenario(SERVING, [*TIGHT, f"engine.max_model_len={n + 1}"]))


def test_the_other_engines_start_and_no_engine_has_no_context():
    sglang = build_context(load_scenario(SERVING, [*TIGHT[1:], "engine.name=sglang"]))
    assert sglang.max_model_len == 40960 and sglang.hw.sources["max_model_len"] == "40,960 tokens: qwen3-32b's context"
    assert build_context(load_scenario(SERVING, TIGHT[1:])).max_model_len is None


@pytest.mark.parametrize("path,overrides,field", [
    (CLOSED, ["engine.name=vllm", "model.name=qwen3-8b", "workload.reasoning_tokens=50000"], "workload.reasoning_tokens"),
    (SERVING, ["engine.name=sglang", "engine.max_model_len=4000", "workload.reasoning_tokens=4000",
               "workload.arrivals.requests=20"], "workload.reasoning_tokens"),
    (CLOSED, ["engine.name=vllm", "engine.max_model_len=200000"], "engine.max_model_len"),
    (CLOSED, ["engine.name=sglang", "engine.max_model_len=auto"], "engine"),
])
def test_requests_longer_than_the_context_are_refused_at_load(tmp_path, path, overrides, field):
    res = run_cli("run", str(path), *[a for o in overrides for a in ("--set", o)], "--out", str(tmp_path / "run"))
    assert_refused(res, str(path), field)


def test_without_an_engine_kvtier_serves_any_length():
    sc = load_scenario(CLOSED, ["model.name=qwen3-8b", "workload.reasoning_tokens=50000"])
    assert sc.workload.reasoning_tokens == 50000


def test_vllm_without_chunked_prefill_steps_a_whole_context():
    vllm, plain = EngineCfg(name="vllm"), SchedulerCfg(chunked_prefill=False)
    h100 = catalog.gpu("h100-sxm").memory_bytes
    assert vllm.scheduler_for(plain, h100, 1, "h100-sxm", 1, 40960).max_num_batched_tokens == 40960
    assert vllm.scheduler_for(plain, h100, 1, "h100-sxm", 1, 4096).max_num_batched_tokens == 8192  # max(len, 8192)
    short = EngineCfg(name="vllm", max_model_len=6000)  # the declared length, not the model's
    assert short.scheduler_for(plain, h100, 1, "h100-sxm", 1, 40960).max_num_batched_tokens == 8192
    assert vllm.scheduler_for(plain, h100, 1, "h100-sxm", 1, None).max_num_batched_tokens == plain.max_num_batched_tokens
    mine = SchedulerCfg(chunked_prefill=False, max_num_batched_tokens=50000)
    assert vllm.scheduler_for(mine, h100, 1, "h100-sxm", 1, 40960).max_num_batched_tokens == 50000


def test_the_plan_states_the_context_vllm_can_start_with():
    base = load_scenario(SERVING, TIGHT)
    row = {"gpu": "h100-sxm", "gpus": 1, "tp": 1, "policy": "full_hbm", "max_num_seqs": 256}
    fit = build_context(load_scenario(SERVING, [*TIGHT, "engine.max_model_len=auto"])).max_model_len
    assert vllm_max_model_len(instance_scenarios(base, row)()) == fit
    assert vllm_max_model_len(instance_scenarios(base, {**row, "gpus": 2, "tp": 2})()) is None  # TP2 holds it all
    declared = load_scenario(SERVING, [*TIGHT, "engine.max_model_len=8192"])
    assert vllm_max_model_len(instance_scenarios(declared, row)()) == 8192


def test_each_disaggregated_instance_states_its_own_context():
    """A prefill instance of one H100 cannot start vLLM at Qwen3-32B's context, the decode instance of two
    can: only the prefill line states the fitted --max-model-len; a declared context goes on every line."""
    base = load_scenario(SERVING, TIGHT)
    row = {"gpu": "h100-sxm", "gpus": 3, "tp": 2, "dp": 1, "policy": "full_hbm", "max_num_seqs": 256,
           "prefill": "1xTP1"}
    fit = build_context(load_scenario(SERVING, [*TIGHT, "engine.max_model_len=auto"])).max_model_len
    lines = launch_lines(row, base)
    assert f"--max-model-len {fit}" in lines["vllm prefill"] and "--max-model-len" not in lines["vllm decode"]
    assert "--context-length" not in lines["sglang prefill"]
    declared = launch_lines(row, load_scenario(SERVING, [*TIGHT, "engine.max_model_len=8192"]))
    assert all(f"{flag} 8192" in declared[f"{e} {role}"] for e, flag in (("vllm", "--max-model-len"),
                                                                       ("sglang", "--context-length"))
               for role in ("prefill", "decode"))


def test_a_bad_rope_scaling_is_one_line(tmp_path):
    cfg = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 512,
           "vocab_size": 1000, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": "4"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as err:
        catalog.model_from_hf_config(path)
    assert err.value.field == "rope_scaling.factor" and err.value.source == str(path)


def test_every_launch_line_states_a_declared_context():
    row = {"gpu": "h100-sxm", "gpus": 2, "tp": 2, "dp": 1, "policy": "full_hbm", "max_num_seqs": 256}
    declared = launch_lines(row, load_scenario(SERVING, [*TIGHT[1:], "engine.name=tensorrt-llm", "engine.max_model_len=8192"]))
    assert "--max-model-len 8192" in declared["vllm"] and "--context-length 8192" in declared["sglang"]
    assert "--max_seq_len 8192" in declared["trtllm"]
    fitted = launch_lines({**row, "gpus": 1, "tp": 1}, load_scenario(SERVING, TIGHT))
    assert "--max-model-len " in fitted["vllm"] and "--context-length" not in fitted["sglang"]
    whole = launch_lines(row, load_scenario(SERVING, TIGHT))  # TP2 holds the whole context: no flag
    assert "--max-model-len" not in whole["vllm"]


def test_sglangs_line_states_a_declared_swa_ratio():
    row = {"gpu": "h100-sxm", "gpus": 2, "tp": 2, "dp": 1, "policy": "full_hbm", "max_num_seqs": 256}
    lines = launch_lines(row, load_scenario(SERVING, ["engine.name=sglang", "engine.swa_full_tokens_ratio=0.5"]))
    assert lines["sglang"].split("  # ")[0].endswith("--swa-full-tokens-ratio 0.5")
    assert "--swa-full-tokens-ratio" not in launch_lines(row, load_scenario(SERVING, ["engine.name=sglang"]))["sglang"]
