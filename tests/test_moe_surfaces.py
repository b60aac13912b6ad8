"""End-to-end checks of the mixture-of-experts surfaces as a user drives them: `kvsim run` (closed batch and
serving) for each new catalog model under tensor, expert and attention-data parallelism, `kvsim plan`
searching TP / TP+EP / DPA+EP, `kvsim report --plan --only plan`, and bad layouts as one line.

Each test runs the CLI (in process, `run_cli`) at the fast level or with a few requests: seconds each.
Four tests here pinned bugs QA found (EP replicas launched as one vLLM server, a max batch at the
search limit printed as exact, a confusing ep-without-tp message, a sweep table losing ep values);
they are fixed and the tests now guard them.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from .conftest import SCENARIOS, run_cli

BATCH = SCENARIOS / "h200-7b-batch.yaml"
SERVE = SCENARIOS / "serving-h200-gpt-oss-120b.yaml"
H200_HBM_BYTES_PER_S = 4.8e12  # datasheet

# model -> (weight overrides, the smallest TP that holds it on one H200 each, whole-model KV B/token in bf16,
# the KV bytes/token one GPU holds under tensor parallelism at that TP). The KV figures are docs/models.md's, by hand:
# TP splits KV heads (replicated past their count; MLA's latent is replicated on every GPU), DPA splits sequences.
MODELS = {
    "deepseek-r1": (["model.weight_dtype=fp8"], 8, 70_272, 70_272),  # latent replicated under TP
    "gpt-oss-120b": (["model.weight_dtype=int4", "model.weight_group_size=32"], 2, 36_864, 18_432),
    "gpt-oss-20b": (["model.weight_dtype=int4", "model.weight_group_size=32"], 2, 24_576, 12_288),
    "qwen3-235b-a22b": (["model.weight_dtype=fp8"], 4, 192_512, 48_128),  # 4 KV heads / TP4
    "qwen3-30b-a3b": (["model.weight_dtype=bf16"], 2, 98_304, 49_152),
    "qwen3-next-80b-a3b": (["model.weight_dtype=bf16"], 2, 24_576, 12_288),  # 12 full layers, 2 KV heads / TP2
}


def _sets(*overrides: str) -> list[str]:
    out = []
    for o in overrides:
        out += ["--set", o]
    return out


def _run(tmp_path, scenario, *overrides: str, name: str = "run") -> tuple[str, dict]:
    """`kvsim run SCENARIO --set ... --out DIR`: (its stdout with runs of whitespace as one space, summary.json);
    exit 0 and no traceback asserted."""
    out = tmp_path / name
    res = run_cli("run", str(scenario), *_sets(*overrides), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    return " ".join(res.stdout.split()), json.loads((out / "summary.json").read_text())  # table cells unwrapped


def _layout(tp: int, ep: int = 1, dp: int = 1) -> list[str]:
    return [f"parallel.tp={tp}", f"parallel.ep={ep}", f"parallel.attention_dp={dp}"]


def _row(flat: str, label: str, until: str) -> str:
    """The summary table's text from `label` to the next row's label `until` (in `_run`'s flattened stdout)."""
    return flat[flat.index(label):flat.index(until)]


# ---- kvsim run, closed batch ------------------------------------------------------------------------------

def test_r1_on_8_h200_tp_ep_dpa_memory_and_speed_make_physical_sense(tmp_path):
    base = ["model.name=deepseek-r1", "model.weight_dtype=fp8", "policy.kind=full_hbm", "sim.detail=fast"]
    runs = {}
    for key, layout in (("tp", _layout(8)), ("ep", _layout(8, 8)), ("dpa", _layout(8, 8, 8))):
        runs[key] = _run(tmp_path, BATCH, *base, *layout, name=key)
    (tp_out, tp), (ep_out, ep), (dpa_out, dpa) = runs["tp"], runs["ep"], runs["dpa"]

    # the layout in words, memory per GPU
    assert "8 x h200-sxm (tensor parallel; memory figures per GPU)" in tp_out
    assert "(tensor parallel, experts EP8; memory figures per GPU)" in ep_out
    assert "(attention data-parallel x8, experts EP8; memory figures per GPU)" in dpa_out
    # the MLA latent: replicated on every GPU under TP and TP+EP, split over the 8 attention ranks under DPA
    assert tp["kv_bytes_per_token"] == ep["kv_bytes_per_token"] == 70_272
    assert dpa["kv_bytes_per_token"] == 70_272 / 8 == 8_784
    # experts split whole or by TP: the same bytes per GPU; DPA replicates attention weights, so a little more
    assert ep["weights_bytes"] == tp["weights_bytes"]
    assert 80e9 < tp["weights_bytes"] < 90e9  # 673 GB of fp8 weights / 8
    assert 1.0 < dpa["weights_bytes"] / tp["weights_bytes"] < 1.2
    # max batch grows with the KV freed: HBM left over / (KV per sequence per GPU)
    assert ep["max_batch"] == tp["max_batch"]
    left_tp = tp["hbm_capacity_bytes"] - tp["weights_bytes"] - tp["runtime_reserve_bytes"]
    left_dpa = dpa["hbm_capacity_bytes"] - dpa["weights_bytes"] - dpa["runtime_reserve_bytes"]
    expect = dpa["max_batch"] / tp["max_batch"]
    assert expect == pytest.approx(8 * left_dpa / left_tp, rel=0.02)  # ~6.8x
    # decode speed bounded by HBM: a step reads at least the experts a batch of 32 touches (top-8 of 256:
    # 1 - (1 - 8/256)^32 = 64% of them) plus the rest; at most 1/0.3 of datasheet bandwidth's time per byte
    for s in (tp, ep, dpa):
        assert s["fits"] is True
        floor_s = 0.5 * s["weights_bytes"] / H200_HBM_BYTES_PER_S
        assert floor_s < s["tpot_p50_s"] < 10 * floor_s
        assert s["throughput_tok_per_s"] == pytest.approx(32 / s["tpot_p50_s"], rel=0.1)


@pytest.mark.parametrize("model", list(MODELS))
def test_each_new_model_runs_tp_ep_and_dpa_closed_batch(tmp_path, model):
    weights, tp, kv_full, kv_tp = MODELS[model]
    base = [f"model.name={model}", *weights, "policy.kind=full_hbm", "sim.detail=fast"]
    _, s_tp = _run(tmp_path, BATCH, *base, *_layout(tp), name="tp")
    _, s_ep = _run(tmp_path, BATCH, *base, *_layout(tp, tp), name="ep")
    out, s_dpa = _run(tmp_path, BATCH, *base, *_layout(tp, tp, tp), name="dpa")
    for s in (s_tp, s_ep, s_dpa):
        assert s["fits"] is True and s["throughput_tok_per_s"] > 0 and s["hbm_peak_bytes"] <= s["hbm_capacity_bytes"]
    assert s_tp["kv_bytes_per_token"] == s_ep["kv_bytes_per_token"] == kv_tp
    assert s_dpa["kv_bytes_per_token"] == kv_full / tp  # every GPU its rank's sequences, all their heads
    assert s_ep["weights_bytes"] == s_tp["weights_bytes"]
    assert s_dpa["weights_bytes"] > s_tp["weights_bytes"]  # attention replicated over the ranks
    assert s_dpa["max_batch"] >= 0.9 * s_tp["max_batch"]
    assert f"attention data-parallel x{tp}, experts EP{tp}" in out


def test_qwen3_30b_batch_one_speed_is_within_hbm_bounds(tmp_path):
    """One sequence on one H200, bf16: a step reads at least the ~3.3 B active parameters (6.6 GB) and at
    most all 61 GB of weights."""
    _, s = _run(tmp_path, BATCH, "model.name=qwen3-30b-a3b", "policy.kind=full_hbm", "sim.detail=fast",
                "workload.batch_size=1")
    assert 6.6e9 / H200_HBM_BYTES_PER_S < s["tpot_p50_s"] < s["weights_bytes"] / H200_HBM_BYTES_PER_S


def test_tiered_and_host_attention_under_dpa_run_and_stage_less_than_tp(tmp_path):
    """R1 tiered (50% of unprotected tokens in HBM): under TP every GPU stages the whole replicated latent
    over its PCIe link; under DPA8 an eighth of it, so the H2D bytes per GPU drop about 8x."""
    base = ["model.name=deepseek-r1", "model.weight_dtype=fp8", "sim.detail=fast"]
    _, tp = _run(tmp_path, BATCH, *base, *_layout(8), name="tp")
    _, dpa = _run(tmp_path, BATCH, *base, *_layout(8, 8, 8), name="dpa")
    assert tp["h2d_bytes"] / dpa["h2d_bytes"] == pytest.approx(8, rel=0.05)
    assert dpa["max_batch"] > tp["max_batch"]
    _, host = _run(tmp_path, BATCH, *base, *_layout(8, 8, 8), "policy.access=host_attention", "sim.detail=step",
                   name="host")
    assert host["fits"] is True and host["throughput_tok_per_s"] > 0 and host["host_attention_share"] > 0


# ---- kvsim run, serving ----------------------------------------------------------------------------------

def test_gpt_oss_120b_serving_under_dpa2_ep2(tmp_path):
    out, s = _run(tmp_path, SERVE, "workload.arrivals.requests=60", *_layout(2, 2, 2))
    assert "on 2 x h200-sxm (attention data-parallel x2, experts EP2; memory figures per GPU)" in out
    assert s["fits"] is True and s["requests"] == 60 and s["preemptions"] == 0
    assert s["kv_bytes_per_token"] == 36_864 / 2
    assert s["hbm_peak_bytes"] <= s["hbm_capacity_bytes"]
    assert s["output_throughput_tok_per_s"] > 0 and 1e-3 < s["tpot_p99_s"] < 0.05
    resolved = yaml.safe_load((tmp_path / "run" / "scenario.resolved.yaml").read_text())
    assert resolved["parallel"] == {"tp": 2, "ep": 2, "attention_dp": 2}


@pytest.mark.parametrize("model", list(MODELS))
def test_each_new_model_serves_under_ep(tmp_path, model):
    weights, tp, _, kv_tp = MODELS[model]
    out, s = _run(tmp_path, SERVE, f"model.name={model}", *weights, *_layout(tp, tp), "workload.arrivals.requests=40")
    assert f"tensor parallel, experts EP{tp}" in out
    assert s["fits"] is True and s["requests"] == 40 and s["kv_bytes_per_token"] == kv_tp
    assert s["kv_budget_bytes"] > 0 and s["hbm_peak_bytes"] <= s["hbm_capacity_bytes"]
    assert 0 < s["tpot_p99_s"] < 0.2


# ---- bad layouts: one line, exit 2 -------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, field, says", [
    (["model.name=deepseek-r1", *_layout(8, 4)], "parallel.ep", "or 8 (the tp group), got 4"),
    (["model.name=deepseek-r1", *_layout(8, 8, 3)], "parallel.attention_dp", "attention_dp 3 must divide tp 8"),
    (["model.name=deepseek-r1", *_layout(8, 1, 8)], "parallel.attention_dp", "needs expert parallelism"),
    (_layout(4, 4), "parallel.ep", "needs a mixture-of-experts model"),  # the scenario's dense 7B
    (["model.name=qwen3-30b-a3b", *_layout(3, 3)], "parallel.ep", "128 experts are not divisible by ep 3"),
    (["model.name=qwen3-30b-a3b", "parallel.ep=two"], "parallel.ep", "valid integer"),
])
def test_a_bad_layout_is_one_line_and_exit_2(tmp_path, overrides, field, says):
    res = run_cli("run", str(BATCH), *_sets(*overrides), "--out", str(tmp_path / "r"))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith("kvsim: ") and f"{field}: " in lines[0] and says in lines[0]
    assert not (tmp_path / "r").exists()


def test_ep_without_tp_says_what_to_do(tmp_path):
    res = run_cli("run", str(BATCH), *_sets("model.name=deepseek-r1", "parallel.ep=8"), "--out", str(tmp_path / "r"))
    assert res.returncode == 2
    assert "or 1 (the tp group)" not in res.stderr and "parallel.tp" in res.stderr


# ---- kvsim plan and its report -------------------------------------------------------------------------------

def test_plan_searches_tp_ep_and_dpa_for_qwen3_30b_and_the_report_draws_them(tmp_path):
    out = tmp_path / "plan"
    res = run_cli("plan", str(SERVE), *_sets("model.name=qwen3-30b-a3b", "model.weight_dtype=bf16"),
                  "--rate", "2", "--gpus", "h200-sxm", "--counts", "2", "--no-replicas", "--no-disagg",
                  "--policies", "full_hbm", "--requests", "40", "--top", "0", "--max-factor", "1", "--workers", "1",
                  "--json", "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(res.stdout)
    got = {r["layout"]: r for r in rows}
    assert set(got) == {"TP2", "TP2+EP2", "DPA2+EP2"}
    assert all(r["status"] == "pass" and r["tp"] == 2 and r["gpus"] == 2 for r in rows)
    assert (got["TP2"]["experts"], got["TP2+EP2"]["experts"], got["DPA2+EP2"]["experts"]) == (None, "ep", "ep+dpa")
    for r in rows:  # at 2 req/s a 2-GPU group of a 3B-active model is far inside the 50 ms target
        assert 0 < r["tpot_p99_ms"] < 50 and 0 < r["ttft_p99_ms"] < 2000
    plan = pd.read_csv(out / "plan.csv")
    assert sorted(plan["experts"].fillna("").tolist()) == ["", "ep", "ep+dpa"]

    html = tmp_path / "plan.html"
    rep = run_cli("report", "--plan", str(out), "--only", "plan", "--out", str(html))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    text = html.read_text()
    assert "DPA2+EP2" in text and "TP2+EP2" in text


def test_dpa_launch_commands_split_the_group_as_the_engines_do():
    from sim.plan import launch as L

    rest = (8192, 0.9, True, "full_hbm", None, "fp8", "bf16")
    cmd = L.launch_commands("deepseek-ai/DeepSeek-R1", 8, 1, 256, *rest, experts="ep+dpa")
    assert "--tensor-parallel-size 1 --data-parallel-size 8 --max-num-seqs 32" in cmd["vllm"]
    assert "--enable-expert-parallel" in cmd["vllm"] and "--quantization fp8" in cmd["vllm"]
    assert "--tp-size 8 --dp-size 8 --max-running-requests 256" in cmd["sglang"]
    assert "--enable-dp-attention --ep-size 8" in cmd["sglang"]


def test_vllm_ep_replicas_launch_as_separate_servers():
    from sim.plan import launch as L

    rest = (8192, 0.9, True, "full_hbm", None, "bf16", "bf16")
    cmd = L.launch_commands("Qwen/Qwen3-30B-A3B", 2, 2, 256, *rest, experts="ep")
    assert "--enable-expert-parallel" in cmd["vllm"]
    assert "--data-parallel-size 2" not in cmd["vllm"]
    assert "run 2 behind the load balancer" in cmd["vllm"]


# ---- pinned bugs in what a run reports -------------------------------------------------------------------

def test_a_max_batch_at_the_search_limit_is_marked(tmp_path):
    out, s = _run(tmp_path, BATCH, "model.name=qwen3-next-80b-a3b", *_layout(8, 8, 8), "policy.kind=full_hbm",
                  "sim.detail=fast")
    assert s["max_batch"] == s["resolved_scenario"]["sim"]["max_batch_limit"] == 4096
    line = _row(out, "max batch that fits", "hardware figures")
    assert "4096+" in line or "4,096+" in line or "limit" in line or "at least" in line


def test_a_sweep_over_ep_tabulates_the_values_swept(tmp_path):
    (tmp_path / "base.yaml").write_text(BATCH.read_text())
    spec = {"name": "moe-ep", "base": "base.yaml", "level": "projection",
            "axes": [{"grid": {"model.name": ["deepseek-r1"], "model.weight_dtype": ["fp8"], "parallel.tp": [8],
                               "policy.kind": ["full_hbm"]}},
                     {"zip": {"parallel.ep": [1, 8], "parallel.attention_dp": [1, 8]}}],
            "keep": ["fits", "max_batch"]}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    res = run_cli("sweep", str(tmp_path / "sweep.yaml"), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout + res.stderr
    table = pd.read_csv(tmp_path / "out" / "table.csv", dtype=str)
    assert table["max_batch"].astype(int).tolist()[1] > table["max_batch"].astype(int).tolist()[0]  # DPA fits more
    assert table["parallel.ep"].tolist() == ["1", "8"]
    assert table["parallel.attention_dp"].tolist() == ["1", "8"]


def test_models_table_lists_the_new_models_kv_per_token():
    res = run_cli("models")
    assert res.returncode == 0, res.stderr
    rows = {line.split("│")[1].strip(): line for line in res.stdout.splitlines() if line.startswith("│")}

    def row(model: str) -> str:
        if model in rows:
            return rows[model]
        return next(v for k, v in rows.items() if k.endswith("…") and model.startswith(k[:-1]))

    for model, (_, _, kv_full, _) in MODELS.items():
        assert f" {kv_full:,} " in row(model), model
    # Qwen3-Next's 36 Gated DeltaNet layers: 32 value heads x 128 x 128 state + 3 x conv channels, bf16
    assert 36 * 2 * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) == 39_518_208
    assert "39,518,208" in row("qwen3-next-80b-a3b")


# ---- fixed after QA: host pool per replica, groups within a node, per-rank budgets, words, the caveat ----

def test_launch_host_pool_is_the_instance_gpus_host_peak():
    from sim.inputs.scenario import load_scenario
    from sim.plan.answer import launch_lines

    base = load_scenario(SERVE)
    row = {"tp": 4, "dp": 1, "policy": "tiered:0.5", "max_num_seqs": None, "prefill": None, "experts": None}
    lines = launch_lines(row, base, 3.0e9)  # 3 GB of host KV per GPU (plan.csv host_peak_bytes)
    assert "--kv-offloading-size 12" in lines["vllm"]  # 4 GPUs x 3 GB = 12e9 B = 11.2 GiB -> 12
    assert "--hicache-size 3" in lines["sglang"]  # per rank: 3 GB


def test_groups_stay_within_one_node():
    from sim.inputs.scenario import load_scenario
    from sim.plan import candidates as C

    res = run_cli("run", str(BATCH), *_sets("model.name=deepseek-r1", "model.weight_dtype=fp8", "parallel.tp=16"))
    assert res.returncode == 2 and "parallel.tp: tp 16 spans more than one 8-GPU node" in res.stderr
    base = load_scenario(SERVE)
    assert C.feasible_splits(base, "h100-sxm", 16) == [1, 2, 4, 8]  # 16 GPUs: replicas of groups of at most 8
    assert "8-GPU node" in C.prune(base, "h100-sxm", 16)


def test_vllm_dpa_splits_the_token_budget_and_offload_per_rank():
    from sim.plan import launch as L

    cmd = L.launch_commands("deepseek-ai/DeepSeek-R1", 8, 1, 256, 8192, 0.9, True, "tiered:0.5", 80e9, "fp8", "bf16",
                            experts="ep+dpa")
    assert "--max-num-seqs 32 --max-num-batched-tokens 1024" in cmd["vllm"]
    assert "--kv-offloading-size 10" in cmd["vllm"]  # 80 GB / 8 ranks = 10e9 B = 9.3 GiB -> 10


def test_layout_words_name_the_attention_tp_of_each_rank(tmp_path):
    out, _ = _run(tmp_path, SERVE, "hardware.gpu=h200-sxm", "model.name=qwen3-30b-a3b", "parallel.tp=4",
                  "parallel.ep=4", "parallel.attention_dp=2", "workload.arrivals.requests=20")
    assert "attention data-parallel x2 (TP2 each), experts EP4" in out


def test_a_fixed_run_length_answer_says_it_is_no_steady_state():
    from sim.plan.answer import answer_sentence

    row = {"rank": 1, "status": "pass", "gpus": 8, "gpu": "h200-sxm", "layout": "TP8", "policy": "full_hbm",
           "output": "exact", "ttft_p99_ms": 500.0, "tpot_p99_ms": 30.0, "verdict_requests": 200,
           "verdict_duration_s": 50.0, "max_rate_capped": True, "max_rate_per_s": 16.0, "usd_per_hour": 30.4,
           "usd_per_million_tokens": 1.0, "binding": "HBM capacity"}
    assert "steady state" in answer_sentence([row], 4.0)
    fixed = answer_sentence([row], 4.0, 200)
    assert "not a steady-state verdict" in fixed and "steady state:" not in fixed
