"""sim.plan.launch: the vLLM and SGLang launch commands of one plan configuration (exact strings),
fp8 flags, host offload sized in GiB / GB per rank, what has no engine equivalent said in a comment and
never as a flag, the model id quoted, and the Hugging Face repo of catalog models."""

from __future__ import annotations

import ast
import shlex
import sys
from pathlib import Path

import pytest

from sim.plan import launch as L

MODEL = "deepseek-ai/DeepSeek-R1-Distill-Llama-70B"
# model_id, tp, dp, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, chunked_prefill
LAYOUT = (MODEL, 4, 2, 256, 8192, 0.9, True)

VLLM_FULL_HBM = (f"vllm serve {MODEL} --tensor-parallel-size 4 --data-parallel-size 2 --max-num-seqs 256 "
                 "--max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --enable-chunked-prefill")
SGLANG_FULL_HBM = (f"python -m sglang.launch_server --model-path {MODEL} --tp-size 4 --dp-size 2 "
                   "--max-running-requests 256 --chunked-prefill-size 8192 --mem-fraction-static 0.9")

# Every flag these builders may write: each one verified in the engines' sources (module docstring).
VLLM_FLAGS = {"--tensor-parallel-size", "--data-parallel-size", "--max-num-seqs", "--max-num-batched-tokens",
              "--gpu-memory-utilization", "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--dtype",
              "--quantization", "--kv-cache-dtype", "--kv-offloading-backend", "--kv-offloading-size"}
SGLANG_FLAGS = {"--model-path", "--tp-size", "--dp-size", "--max-running-requests", "--chunked-prefill-size",
                "--max-prefill-tokens", "--mem-fraction-static", "--dtype", "--quantization", "--kv-cache-dtype",
                "--enable-hierarchical-cache", "--hicache-size", "--enable-mixed-chunk"}


def split(line: str) -> tuple[list[str], str]:
    """The command's words (as the shell reads them) and its trailing comment ('' when none)."""
    command, _, comment = line.partition("  # ")
    return shlex.split(command), comment


def flags(line: str) -> set[str]:
    return {word for word in split(line)[0] if word.startswith("--")}


def commands(policy="full_hbm", host_offload_bytes=None, weight_dtype="bf16", kv_dtype="bf16", layout=LAYOUT):
    return L.launch_commands(*layout, policy, host_offload_bytes, weight_dtype, kv_dtype)


def test_full_hbm_tp4_dp2_70b_exact():
    assert commands() == {"vllm": VLLM_FULL_HBM, "sglang": SGLANG_FULL_HBM}
    assert L.vllm_serve_command(*LAYOUT, "full_hbm", None, "bf16", "bf16") == VLLM_FULL_HBM
    assert L.sglang_launch_command(*LAYOUT, "full_hbm", None, "bf16", "bf16") == SGLANG_FULL_HBM


def test_host_bytes_ignored_without_a_tiered_policy():
    assert commands(host_offload_bytes=100e9) == {"vllm": VLLM_FULL_HBM, "sglang": SGLANG_FULL_HBM}


def test_chunked_prefill_off():
    out = commands(layout=(MODEL, 4, 2, 256, 8192, 0.9, False))
    assert out["vllm"] == VLLM_FULL_HBM.replace("--enable-chunked-prefill", "--no-enable-chunked-prefill")
    assert out["sglang"] == SGLANG_FULL_HBM.replace(
        "--chunked-prefill-size 8192", "--chunked-prefill-size -1 --max-prefill-tokens 8192")


def test_mixed_steps_take_sglangs_mixed_chunk():
    """A plan whose steps mixed prefill chunks with the decodes (kvtier's and vLLM's way) runs SGLang with
    --enable-mixed-chunk (server_args.py: "mixing prefill and decode in a batch when using chunked
    prefill"); SGLang's own way (a prefill batch alone) is its default, no flag; without chunked prefill none."""
    mixed = L.launch_commands(*LAYOUT, "full_hbm", None, "bf16", "bf16", mixed_chunk=True)
    assert mixed["sglang"] == SGLANG_FULL_HBM.replace("--chunked-prefill-size 8192", "--chunked-prefill-size 8192 "
                                                      "--enable-mixed-chunk")
    assert mixed["vllm"] == VLLM_FULL_HBM
    whole = L.sglang_launch_command(MODEL, 4, 2, 256, 8192, 0.9, False, "full_hbm", None, "bf16", "bf16", mixed_chunk=True)
    assert "--enable-mixed-chunk" not in whole


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e4m3"])
def test_fp8_weights_and_kv(kv_dtype):
    out = commands(weight_dtype="fp8", kv_dtype=kv_dtype)
    assert out["vllm"] == VLLM_FULL_HBM + " --quantization fp8 --kv-cache-dtype fp8"
    # SGLang's --kv-cache-dtype has no bare "fp8" choice: fp8_e4m3 (= vLLM's fp8)
    assert out["sglang"] == SGLANG_FULL_HBM + " --quantization fp8 --kv-cache-dtype fp8_e4m3"


def test_fp8_kv_alone_and_fp16_weights():
    out = commands(weight_dtype="fp16", kv_dtype="fp8")
    assert out["vllm"] == VLLM_FULL_HBM + " --dtype float16 --kv-cache-dtype fp8"
    assert out["sglang"] == SGLANG_FULL_HBM + " --dtype float16 --kv-cache-dtype fp8_e4m3"


def test_int_formats_have_no_flag_but_a_comment():
    out = commands(weight_dtype="int4", kv_dtype="int8")
    for line, base in ((out["vllm"], VLLM_FULL_HBM), (out["sglang"], SGLANG_FULL_HBM)):
        assert line.startswith(base + "  # ")
        assert "weight_dtype int4" in split(line)[1] and "kv_dtype int8" in split(line)[1]


def test_tiered_offload_sized_in_gib_rounded_up():
    out = commands("tiered:0.5", host_offload_bytes=100e9)  # 100e9 B = 93.13 GiB -> 94
    words, comment = split(out["vllm"])
    assert " ".join(words) == VLLM_FULL_HBM + " --kv-offloading-backend native --kv-offloading-size 94"
    assert comment.startswith("tiered:0.5: vLLM keeps each running request's whole KV cache in HBM")
    assert "no vLLM flag" in comment
    # SGLang: decimal GB per TP rank, 100e9 / 4 = 25 exactly
    words, comment = split(out["sglang"])
    assert " ".join(words) == SGLANG_FULL_HBM + " --enable-hierarchical-cache --hicache-size 25"
    assert comment.startswith("tiered:0.5: SGLang keeps")


@pytest.mark.parametrize("host_bytes, gib, gb_per_rank", [(2**30, 1, 1), (2**30 + 1, 2, 1), (3 * 2**30, 3, 1),
                                                         (12e9, 12, 3), (12e9 + 1, 12, 4)])
def test_offload_rounding_at_exact_multiples(host_bytes, gib, gb_per_rank):
    out = commands("tiered:auto", host_offload_bytes=host_bytes, layout=(MODEL, 4, 1, 64, 4096, 0.9, True))
    assert split(out["vllm"])[0][-2:] == ["--kv-offloading-size", str(gib)]
    assert split(out["sglang"])[0][-2:] == ["--hicache-size", str(gb_per_rank)]


@pytest.mark.parametrize("host_bytes", [None, 0])
def test_tiered_without_host_bytes_adds_no_offload_flag(host_bytes):
    out = commands("tiered:auto", host_offload_bytes=host_bytes)
    assert split(out["vllm"])[0] == split(VLLM_FULL_HBM)[0]
    assert split(out["sglang"])[0] == split(SGLANG_FULL_HBM)[0]
    assert "host offload flags left out" in split(out["vllm"])[1]


def test_evict_only_is_the_full_command_plus_a_comment():
    out = commands("evict_only", host_offload_bytes=100e9)
    assert out["vllm"] == (VLLM_FULL_HBM + "  # evict_only: vLLM does not evict tokens (eviction is lossy and not "
                           "supported by the engine); this command keeps the whole KV cache in HBM")
    assert out["sglang"].startswith(SGLANG_FULL_HBM + "  # evict_only: SGLang does not evict tokens")


@pytest.mark.parametrize("access", ["host_attention", "split"])
def test_host_side_access_is_a_comment_never_a_flag(access):
    out = commands(f"tiered:0.25/{access}", host_offload_bytes=100e9)
    for line, engine, known in ((out["vllm"], "vLLM", VLLM_FLAGS), (out["sglang"], "SGLang", SGLANG_FLAGS)):
        words, comment = split(line)
        assert flags(line) <= known
        assert not any(access.replace("_", "-") in w or access in w for w in words)
        assert f"{access} access" in comment and f"has no {engine} equivalent; no flag added" in comment
        assert comment.startswith("tiered:0.25: ")  # the ratio's note, without the /ACCESS suffix
    assert "--kv-offloading-size" in flags(out["vllm"]) and "--hicache-size" in flags(out["sglang"])


def test_prefetch_access_is_plain_tiered():
    assert commands("tiered:0.25/prefetch", 100e9) == commands("tiered:0.25", 100e9)


def test_odd_model_id_is_quoted():
    odd = "my models/llama's 70b;rm -rf"
    layout = (odd, 1, 1, 8, 512, 0.92, True)
    for line in commands(layout=layout).values():
        words, comment = split(line)
        assert odd in words and comment == ""
        assert shlex.quote(odd) in line
    assert split(commands(layout=layout)["vllm"])[0][:3] == ["vllm", "serve", odd]


@pytest.mark.parametrize("policy", ["tiered", "tiered:0", "tiered:1.5", "tiered:0.5/bogus", "full_hbm/split",
                                    "swap", "tiered:auto/"])
def test_bad_policy_raises(policy):
    with pytest.raises(ValueError):
        commands(policy)


@pytest.mark.parametrize("layout, dtypes", [((MODEL, 0, 1, 8, 512, 0.9, True), ("bf16", "bf16")),
                                            ((MODEL, 1, 1, 8, 512, 1.5, True), ("bf16", "bf16")),
                                            ((MODEL, 1, 1, 8, 512, 0.9, True), ("nf4", "bf16")),
                                            ((MODEL, 1, 1, 8, 512, 0.9, True), ("bf16", "int4"))])
def test_bad_layout_or_dtype_raises(layout, dtypes):
    with pytest.raises(ValueError):
        commands(layout=layout, weight_dtype=dtypes[0], kv_dtype=dtypes[1])


def test_module_level_imports_are_stdlib_only():
    tree = ast.parse(Path(L.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    roots = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}, roots


@pytest.mark.parametrize("name, repo", [
    ("llama-3.1-70b", "meta-llama/Llama-3.1-70B"),
    ("qwen3-32b", "Qwen/Qwen3-32B"),
    ("deepseek-r1-distill-qwen-14b", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B"),
    ("DeepSeek-R1-Distill-Qwen-7B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"),  # an alias = its repo's name
    ("gpt_oss_120b", "openai/gpt-oss-120b"),  # `_` and `-` alike, as the catalog compares names
    ("openai/gpt-oss-20b", "openai/gpt-oss-20b"),
    ("deepseek-r1", "deepseek-ai/DeepSeek-R1"),  # source folded over lines (yaml >-)
    # the catalog files these under a model of the same shapes whose source names another checkpoint
    ("deepseek-r1-distill-llama-70b", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B"),
    ("DeepSeek-R1-Distill-Llama-8B", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B"),
])
def test_hf_model_id(name, repo):
    assert L.hf_model_id(name) == repo


@pytest.mark.parametrize("name", ["no-such-model", "llama-3.1-405b", ""])
def test_hf_model_id_unknown_is_none(name):
    assert L.hf_model_id(name) is None


# ---- TensorRT-LLM (trtllm-serve), where the plan ran under `engine: tensorrt-llm` ----------------------

TRTLLM_FLAGS = {"--backend", "--tp_size", "--pp_size", "--ep_size", "--max_batch_size", "--max_num_tokens",
                "--kv_cache_free_gpu_memory_fraction", "--extra_llm_api_options"}
TRTLLM_BASE = (f"trtllm-serve {MODEL} --backend pytorch --tp_size 4 --pp_size 1 --max_batch_size 256 "
               "--max_num_tokens 8192 --kv_cache_free_gpu_memory_fraction 0.9")
EXTRA = "--extra_llm_api_options extra_llm_api_options.yaml  # extra_llm_api_options.yaml: "
TP4_X1 = (MODEL, 4, 1, 256, 8192, 0.9, True)
MOE = "deepseek-ai/DeepSeek-R1"


def trtllm(policy="full_hbm", host_offload_bytes=None, weight_dtype="bf16", kv_dtype="bf16", layout=TP4_X1):
    return L.trtllm_serve_command(*layout, policy, host_offload_bytes, weight_dtype, kv_dtype)


def test_trtllm_dense_tp4_fp8_kv_chunked_prefill_exact():
    # fp8 KV has no trtllm-serve flag: kv_cache_config in the YAML, which replaces the flag's kv_cache_config,
    # so the fraction is repeated there
    assert trtllm(kv_dtype="fp8") == (
        "trtllm-serve deepseek-ai/DeepSeek-R1-Distill-Llama-70B --backend pytorch --tp_size 4 --pp_size 1 "
        "--max_batch_size 256 --max_num_tokens 8192 --kv_cache_free_gpu_memory_fraction 0.9 "
        "--extra_llm_api_options extra_llm_api_options.yaml  # extra_llm_api_options.yaml: "
        "{enable_chunked_prefill: true, kv_cache_config: {free_gpu_memory_fraction: 0.9, dtype: fp8}}")
    assert flags(trtllm(kv_dtype="fp8")) <= TRTLLM_FLAGS
    assert trtllm(kv_dtype="fp8_e4m3") == trtllm(kv_dtype="fp8")


def test_trtllm_without_yaml_settings_has_no_extra_options_flag():
    assert trtllm(layout=(MODEL, 4, 1, 256, 8192, 0.9, False)) == TRTLLM_BASE  # chunked prefill off: the default


def test_trtllm_dp2_is_one_server_per_group():
    line = TRTLLM_BASE + " " + EXTRA + "{enable_chunked_prefill: true}; one server per 4-GPU group: run 2 behind the load balancer"
    assert trtllm(layout=LAYOUT) == line
    assert L.launch_commands(*LAYOUT, "full_hbm", None, "bf16", "bf16", trtllm_fraction=0.9)["trtllm"] == line
    # an MoE model's replicas: one server each, as for vLLM and SGLang
    assert L.launch_commands(*LAYOUT, "full_hbm", None, "bf16", "bf16", moe=True, trtllm_fraction=0.9)["trtllm"] == line


def test_trtllm_takes_the_fraction_the_plan_ran_with():
    line = L.launch_commands(*TP4_X1, "full_hbm", None, "bf16", "fp8", trtllm_fraction=0.85)["trtllm"]
    assert "--kv_cache_free_gpu_memory_fraction 0.85 " in line and "free_gpu_memory_fraction: 0.85, dtype: fp8" in line
    assert "--gpu-memory-utilization 0.9" in L.launch_commands(*TP4_X1, "full_hbm", None, "bf16", "fp8",
                                                               trtllm_fraction=0.85)["vllm"]


@pytest.mark.parametrize("host_bytes, per_rank", [(100e9, 25_000_000_000), (100e9 + 1, 25_000_000_001)])
def test_trtllm_tiered_host_cache_in_bytes_per_rank(host_bytes, per_rank):
    words, comment = split(trtllm("tiered:0.5", host_offload_bytes=host_bytes))
    assert " ".join(words) == TRTLLM_BASE + " --extra_llm_api_options extra_llm_api_options.yaml"
    assert comment.startswith("extra_llm_api_options.yaml: {enable_chunked_prefill: true, kv_cache_config: "
                              f"{{free_gpu_memory_fraction: 0.9, host_cache_size: {per_rank}}}}}; tiered:0.5: "
                              "TensorRT-LLM keeps each running request's whole KV cache in HBM")
    assert "no TensorRT-LLM flag" in comment


def test_trtllm_host_cache_only_for_a_tiered_policy_with_bytes():
    assert "host_cache_size" not in trtllm(host_offload_bytes=100e9)
    for host_bytes in (None, 0):
        line = trtllm("tiered:auto", host_offload_bytes=host_bytes)
        assert "host_cache_size" not in line and "host offload flags left out" in split(line)[1]


@pytest.mark.parametrize("access", ["host_attention", "split", "sparse_fetch"])
def test_trtllm_access_and_eviction_are_notes(access):
    comment = split(trtllm(f"tiered:0.25/{access}", host_offload_bytes=100e9))[1]
    assert flags(trtllm(f"tiered:0.25/{access}", 100e9)) <= TRTLLM_FLAGS
    assert f"{access} access" in comment and "has no TensorRT-LLM equivalent; no flag added" in comment
    assert trtllm("evict_only").startswith(TRTLLM_BASE + " " + EXTRA + "{enable_chunked_prefill: true}; evict_only: "
                                           "TensorRT-LLM does not evict tokens")


@pytest.mark.parametrize("weight_dtype", ["fp8", "int8", "int4"])
def test_trtllm_quantized_weights_are_a_checkpoint_not_a_flag(weight_dtype):
    line = trtllm(weight_dtype=weight_dtype, layout=(MODEL, 4, 1, 256, 8192, 0.9, False))
    words, comment = split(line)
    assert " ".join(words) == TRTLLM_BASE
    assert comment.startswith(f"weight_dtype {weight_dtype}: TensorRT-LLM's PyTorch backend has no online "
                              f"quantization; serve a checkpoint already quantized in {weight_dtype}")


def test_trtllm_fp16_weights_and_int8_kv_are_notes():
    words, comment = split(trtllm(weight_dtype="fp16", kv_dtype="int8", layout=(MODEL, 4, 1, 256, 8192, 0.9, False)))
    assert " ".join(words) == TRTLLM_BASE
    assert "weight_dtype fp16: no flag" in comment and "kv_dtype int8" in comment


def test_trtllm_expert_layouts():
    rest = (8192, 0.9, True, "full_hbm", None, "bf16", "bf16")
    head = f"trtllm-serve {MOE} --backend pytorch --tp_size 8 --pp_size 1 --ep_size 8"
    ep = L.launch_commands(MOE, 8, 1, 256, *rest, experts="ep", trtllm_fraction=0.9)
    assert ep["trtllm"] == (f"{head} --max_batch_size 256 --max_num_tokens 8192 --kv_cache_free_gpu_memory_fraction 0.9 "
                            f"{EXTRA}{{enable_chunked_prefill: true}}")
    # attention DP: max_batch_size per rank (250 / 8 rounded up), enable_attention_dp in the YAML
    dpa = L.launch_commands(MOE, 8, 1, 250, *rest, experts="ep+dpa", trtllm_fraction=0.9)
    assert dpa["trtllm"] == (f"{head} --max_batch_size 32 --max_num_tokens 8192 --kv_cache_free_gpu_memory_fraction 0.9 "
                             f"{EXTRA}{{enable_chunked_prefill: true, enable_attention_dp: true}}")
    two = L.launch_commands(MOE, 8, 2, 256, *rest, experts="ep", trtllm_fraction=0.9)["trtllm"]
    assert two == ep["trtllm"] + "; one server per 8-GPU group: run 2 behind the load balancer"
    # without experts, --ep_size is left out
    assert "--ep_size" not in L.launch_commands(MOE, 8, 1, 256, *rest, moe=True, trtllm_fraction=0.9)["trtllm"]


@pytest.mark.parametrize("fraction", [0, 1.5, -0.1])
def test_trtllm_bad_fraction_raises(fraction):
    with pytest.raises(ValueError, match=r"^free_gpu_memory_fraction must be in \(0, 1\], got "):
        L.trtllm_serve_command(*TP4_X1[:5], fraction, True, "full_hbm", None, "bf16", "bf16")
    with pytest.raises(ValueError, match="free_gpu_memory_fraction"):
        L.launch_commands(*TP4_X1, "full_hbm", None, "bf16", "bf16", trtllm_fraction=fraction)


def test_trtllm_bad_layout_or_policy_raises():
    with pytest.raises(ValueError, match="tp must be"):
        trtllm(layout=(MODEL, 0, 1, 256, 8192, 0.9, True))
    with pytest.raises(ValueError):
        trtllm("swap")


def test_without_trtllm_fraction_the_keys_are_todays():
    rest = (8192, 0.9, True, "full_hbm", None, "bf16", "bf16")
    for kwargs in ({}, {"moe": True}, {"experts": "ep"}, {"experts": "ep+dpa"}):
        assert set(L.launch_commands(MOE, 8, 2, 256, *rest, **kwargs)) == {"vllm", "sglang"}
        assert set(L.launch_commands(MOE, 8, 2, 256, *rest, **kwargs, trtllm_fraction=0.9)) == {"vllm", "sglang",
                                                                                                 "trtllm"}
        without = L.launch_commands(MOE, 8, 2, 256, *rest, **kwargs)
        with_trtllm = L.launch_commands(MOE, 8, 2, 256, *rest, **kwargs, trtllm_fraction=0.9)
        assert {k: with_trtllm[k] for k in without} == without  # vLLM's and SGLang's lines unchanged


def _plan_row(**kw):
    return {"tp": 4, "dp": 1, "policy": "full_hbm", "gpu": "h100-sxm", "max_num_seqs": None, "prefill": None,
            "experts": None, **kw}


def test_a_plan_under_tensorrt_llm_launches_trtllm_with_its_fraction():
    from sim.inputs.scenario import load_scenario
    from sim.plan.answer import launch_lines

    from .conftest import SCENARIOS

    trt = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml", ["engine.name=tensorrt-llm"])
    lines = launch_lines(_plan_row(), trt)
    assert set(lines) == {"vllm", "sglang", "trtllm"}
    assert "--kv_cache_free_gpu_memory_fraction 0.9" in lines["trtllm"]
    assert lines["trtllm"].startswith(f"trtllm-serve {MODEL} --backend pytorch --tp_size 4 ")
    other = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml",
                          ["engine.name=tensorrt-llm", "engine.free_gpu_memory_fraction=0.8"])
    assert "--kv_cache_free_gpu_memory_fraction 0.8" in launch_lines(_plan_row(), other)["trtllm"]
    vllm = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml")
    assert set(launch_lines(_plan_row(), vllm)) == {"vllm", "sglang"}


def test_sglang_mixes_prefill_only_where_the_plan_did():
    """A plan of kvtier's mixed steps (no engine, vLLM, TensorRT-LLM) gives SGLang --enable-mixed-chunk; one
    under engine: sglang ran SGLang's own order (a prefill batch alone) and needs no flag; a disaggregated
    instance runs one phase, so none."""
    from sim.inputs.scenario import load_scenario
    from sim.plan.answer import launch_lines

    from .conftest import SCENARIOS

    plain = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml")
    assert "--enable-mixed-chunk" in launch_lines(_plan_row(), plain)["sglang"]
    sglang = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml", ["engine.name=sglang"])
    assert not sglang.scheduler.mixed_prefill
    assert "--enable-mixed-chunk" not in launch_lines(_plan_row(), sglang)["sglang"]
    split_plan = launch_lines(_plan_row(tp=2, prefill="1xTP2"), plain)
    assert not any("--enable-mixed-chunk" in line for line in split_plan.values())


def test_a_disaggregated_plan_under_tensorrt_llm_says_where_the_instances_go():
    from sim.inputs.scenario import load_scenario
    from sim.plan.answer import DISAGG_NOTES, launch_lines

    from .conftest import SCENARIOS

    trt = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml", ["engine.name=tensorrt-llm"])
    lines = launch_lines(_plan_row(tp=2, prefill="1xTP2"), trt)
    assert set(lines) == {f"{e} {r}" for e in ("vllm", "sglang", "trtllm") for r in ("prefill", "decode")}
    for role in ("prefill", "decode"):
        words, comment = split(lines[f"trtllm {role}"])
        assert words[:8] == ["trtllm-serve", MODEL, "--backend", "pytorch", "--tp_size", "2", "--pp_size", "1"]
        assert flags(lines[f"trtllm {role}"]) <= TRTLLM_FLAGS  # no invented disaggregation flag
        assert comment.endswith(DISAGG_NOTES["trtllm"])
    assert "--disaggregation-mode prefill" in lines["sglang prefill"]
