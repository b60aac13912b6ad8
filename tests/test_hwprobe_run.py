"""`hwprobe run` on the CPU with tiny shapes: the simulator's summary keys, the per-step CSV,
layer subsets, the three prefetch modes, and one-line exit-2 errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from hwprobe.cli import app  # noqa: E402
from tests.conftest import REPO, run_cli, write_hf_scenario  # noqa: E402

runner = CliRunner()

SUMMARY_KEYS = ["throughput_tok_per_s", "tpot_p50_s", "tpot_p99_s", "hbm_peak_bytes", "host_peak_bytes",
                "h2d_bytes", "d2h_bytes", "h2d_utilization", "d2h_utilization", "transfer_share", "stall_share",
                "offloaded_tokens", "evicted_tokens", "device", "measured"]
STEP_COLUMNS = ["step", "t_s", "step_s", "compute_s", "stall_s", "h2d_bytes", "d2h_bytes", "tokens_t0",
                "tokens_t1", "tokens_t2", "tokens_t3", "hbm_bytes", "host_bytes"]
TINY_CONFIG = {"model_type": "qwen2", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 128}
PROMPT, STEPS, BATCH = 12, 24, 2
RETIER_INTERVAL = 6


@pytest.fixture(autouse=True, scope="module")
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def scenario(tmp_path):
    return write_hf_scenario(tmp_path, TINY_CONFIG, {
        "name": "tiny",
        "workload": {"batch_size": BATCH, "prompt_tokens": PROMPT, "reasoning_tokens": STEPS, "seed": 1},
        "policy": {"kind": "tiered", "hbm_ratio": 0.4, "evict_ratio": 0.1, "compressed_ratio": 0.3,
                   "compressed_group_size": 8, "retier_interval": RETIER_INTERVAL, "sink_tokens": 2, "recent_window": 4},
    })


def run(scenario, out, *extra):
    res = runner.invoke(app, ["run", str(scenario), "--device", "cpu", "--threads", "1", "--json",
                              "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), pd.read_csv(out / "steps.csv")


def test_run_writes_summary_keys_and_step_csv(scenario, tmp_path):
    summary, steps = run(scenario, tmp_path / "out")
    for key in SUMMARY_KEYS:
        assert key in summary
    assert summary["measured"] is True and summary["device"] == "cpu" and summary["timing"] == "cpu_wall_clock"
    assert "estimate" in summary["hbm_peak_source"]
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["throughput_tok_per_s"] == pytest.approx(summary["throughput_tok_per_s"])
    assert (tmp_path / "out" / "scenario.resolved.yaml").exists()
    assert list(steps.columns[: len(STEP_COLUMNS)]) == STEP_COLUMNS
    assert len(steps) == STEPS
    # token conservation, summed over the batch
    tokens = steps[["tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3"]].sum(axis=1)
    assert list(tokens) == [BATCH * (PROMPT + s + 1) for s in range(STEPS)]
    # throughput = batch * steps / decode time; compute + stall = step
    assert summary["throughput_tok_per_s"] == pytest.approx(BATCH * STEPS / summary["decode_s"])
    assert (steps["compute_s"] + steps["stall_s"]).to_numpy() == pytest.approx(steps["step_s"].to_numpy())
    assert summary["h2d_bytes"] == pytest.approx(steps["h2d_bytes"].sum())
    assert summary["h2d_bytes"] > 0 and summary["d2h_bytes"] > 0
    assert summary["offloaded_tokens"] > 0 and summary["evicted_tokens"] > 0
    assert steps["tokens_t2"].iloc[-1] > 0 and steps["tokens_t3"].iloc[-1] > 0
    assert 0 < summary["transfer_share"] <= 1 and 0 < summary["stall_share"] <= 1
    assert summary["host_peak_bytes"] == pytest.approx(steps["host_bytes"].max())


def test_full_hbm_moves_nothing(scenario, tmp_path):
    summary, steps = run(scenario, tmp_path / "full", "--set", "policy.kind=full_hbm")
    assert summary["h2d_bytes"] == 0 and summary["d2h_bytes"] == 0 and summary["host_peak_bytes"] == 0
    assert list(steps["tokens_t0"]) == [BATCH * (PROMPT + s + 1) for s in range(STEPS)]
    assert summary["transfer_share"] == 0


def test_sync_per_step_copies_every_layer_every_step(scenario, tmp_path):
    a, a_steps = run(scenario, tmp_path / "async")
    s, s_steps = run(scenario, tmp_path / "sync", "--set", "policy.prefetch=sync_per_step",
                     "--set", "policy.pinned=false")
    # same tiers, same bytes: only the schedule differs
    assert list(a_steps["tokens_t1"]) == list(s_steps["tokens_t1"])
    assert s["h2d_bytes"] == pytest.approx(a["h2d_bytes"])
    copied = s_steps["h2d_bytes"] > 0
    assert (s_steps.loc[copied, "stall_s"] > 0).all()


def _layer_staging_bytes(scenario_path) -> int:
    """One layer's T1 + T2 staging for the batch at the planned peaks (bf16 rows, int8 + fp16 scales)."""
    from hwprobe.cache.peaks import batch_peaks
    from sim.inputs.lengths import draw_lengths
    from sim.inputs.scenario import load_scenario
    from sim.tiering.tiers import TierPolicy

    sc = load_scenario(scenario_path)
    peaks = batch_peaks(TierPolicy.from_config(sc.policy), PROMPT, draw_lengths(sc.workload, BATCH))
    row = 2 * TINY_CONFIG["num_key_value_heads"] * TINY_CONFIG["head_dim"]
    groups = row // min(sc.policy.compressed_group_size, TINY_CONFIG["head_dim"])
    return BATCH * (peaks.t1 * row * 2 + peaks.t2 * (row + 2 * groups))


def test_per_interval_copies_once_per_interval_and_keeps_every_layer_resident(scenario, tmp_path):
    a, a_steps = run(scenario, tmp_path / "async")
    r, r_steps = run(scenario, tmp_path / "resident", "--set", "policy.prefetch=per_interval")
    assert list(a_steps["tokens_t1"]) == list(r_steps["tokens_t1"])
    retier_steps = r_steps["step"] % RETIER_INTERVAL == RETIER_INTERVAL - 1
    assert (r_steps.loc[~retier_steps, "h2d_bytes"] == 0).all(), "no copy between re-tiers"
    assert (r_steps.loc[retier_steps & (r_steps["tokens_t1"] > 0), "h2d_bytes"] > 0).all()
    assert r["h2d_bytes"] < a["h2d_bytes"] and r["d2h_bytes"] == pytest.approx(a["d2h_bytes"])
    # the device holds every layer's T1/T2 instead of two layer buffers: it saves no HBM
    layers, buffers = TINY_CONFIG["num_hidden_layers"], 2
    assert r["hbm_peak_bytes"] - a["hbm_peak_bytes"] == (layers - buffers) * _layer_staging_bytes(scenario)


def test_summary_separates_attention_workspace_and_offloads_in_flight(scenario, tmp_path):
    s, _ = run(scenario, tmp_path / "ws")
    assert 0 < s["attention_workspace_bytes"] < s["hbm_peak_bytes"]
    assert s["offload_in_flight_peak_bytes"] > 0
    full, _ = run(scenario, tmp_path / "ws-full", "--set", "policy.kind=full_hbm")
    assert full["attention_workspace_bytes"] == 0 and full["offload_in_flight_peak_bytes"] == 0


def test_layer_subset_is_scaled_and_stated(scenario, tmp_path):
    # replayed decisions: a 2-layer model attends differently from a 4-layer one, so on its own
    # scores it may promote other tokens (other T1/T2 mix); the same moves make bytes scale exactly
    full, _ = run(scenario, tmp_path / "all", "--scores", "simulator")
    half, _ = run(scenario, tmp_path / "half", "--layers", "2", "--scores", "simulator")
    assert half["layers_run"] == 2 and half["layers_model"] == 4 and half["layer_scale"] == 2
    assert any("ran 2 of 4 layers" in n for n in half["notes"])
    assert half["h2d_bytes"] == pytest.approx(full["h2d_bytes"])  # bytes scale exactly with depth
    assert half["host_peak_bytes"] == pytest.approx(full["host_peak_bytes"])


def test_variable_reasoning_lengths(scenario, tmp_path):
    summary, steps = run(scenario, tmp_path / "var", "--set", "workload.reasoning_tokens={dist: uniform, min: 10, max: 24}",
                         "--set", "workload.batch_size=3")
    assert summary["generated_tokens"] == steps["batch_active"].sum()
    assert steps["batch_active"].iloc[0] == 3 and steps["batch_active"].is_monotonic_decreasing


@pytest.mark.parametrize("overrides", [
    [],
    ["policy.prefetch=sync_per_step", "policy.pinned=false", "policy.semantics=paper_prototype"],
    ["policy.prefetch=per_interval", "policy.scoring=recent"],
], ids=["layerwise", "prototype", "per-interval-recent"])
def test_replayed_decisions_move_exactly_what_the_simulator_plans(scenario, tmp_path, overrides):
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import load_scenario

    sets = [x for o in overrides for x in ("--set", o)]
    hw, hw_steps = run(scenario, tmp_path / "replay", "--scores", "simulator", *sets)
    sim = simulate(load_scenario(scenario, overrides), None, with_max_batch=False)
    assert hw["scores"] == "simulator"
    for key in ("offloaded_tokens", "evicted_tokens", "final_tokens_per_tier", "h2d_bytes", "d2h_bytes",
                "host_peak_bytes", "generated_tokens"):
        assert hw[key] == getattr(sim.summary, key), key
    assert hw["offloaded_tokens"] > 0  # something moved
    for col in ("tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3", "h2d_bytes", "d2h_bytes", "batch_active"):
        assert list(hw_steps[col]) == list(sim.steps[col]), col  # step by step


def test_replay_with_unequal_lengths_copies_the_padded_block(scenario, tmp_path):
    """T1/T2 are stored [slot, row] per layer and prefetched as one block of high-water slots for
    every row, so rows with fewer staged tokens (or finished ones) are copied as padding: the
    cache's H2D exceeds the simulator's live-token figure, while every tier decision agrees."""
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import load_scenario

    overrides = ["workload.reasoning_tokens={dist: uniform, min: 10, max: 24}", "workload.batch_size=3"]
    hw, hw_steps = run(scenario, tmp_path / "var", "--scores", "simulator", *[x for o in overrides for x in ("--set", o)])
    sim = simulate(load_scenario(scenario, overrides), None, with_max_batch=False)
    for key in ("offloaded_tokens", "evicted_tokens", "final_tokens_per_tier", "d2h_bytes", "generated_tokens"):
        assert hw[key] == getattr(sim.summary, key), key
    assert list(hw_steps["tokens_t1"]) == list(sim.steps["tokens_t1"])
    assert hw["h2d_bytes"] > sim.summary.h2d_bytes


def test_own_attention_scores_decide_differently_from_the_simulator(scenario, tmp_path):
    own, _ = run(scenario, tmp_path / "own")
    replay, _ = run(scenario, tmp_path / "replay", "--scores", "simulator")
    assert own["scores"] == "attention"
    # the tier sizes follow from the ratios either way; which tokens move does not
    assert own["final_tokens_per_tier"] == replay["final_tokens_per_tier"]
    assert own["offloaded_tokens"] != replay["offloaded_tokens"]


def test_bad_scenario_is_one_line_exit_2(scenario):
    res = runner.invoke(app, ["run", str(scenario), "--device", "cpu", "--set", "policy.hbm_ratio=1.5"])
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0
    assert "policy.hbm_ratio" in res.stderr and "tiny.yaml" in res.stderr


def test_unsupported_t2_format_is_one_line_exit_2(scenario):
    res = runner.invoke(app, ["run", str(scenario), "--device", "cpu", "--set", "policy.compressed_dtype=fp8"])
    assert res.exit_code == 2 and "policy.compressed_dtype" in res.stderr and "tiny.yaml" in res.stderr
    assert res.stderr.strip().count("\n") == 0


def test_without_cuda_and_without_device_cpu_exit_2_no_traceback(scenario):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = run_cli("run", str(scenario), tool="hwprobe")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--device cpu" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_file_no_traceback(tmp_path):
    # the one test that runs the installed `hwprobe` console script; the others call its app in process
    proc = run_cli("run", str(tmp_path / "nope.yaml"), "--device", "cpu", tool="hwprobe", subprocess_=True)
    assert proc.returncode == 2 and "file not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.cuda
@pytest.mark.parametrize("prefetch, pinned", [("layerwise_async", "true"), ("sync_per_step", "false"),
                                              ("per_interval", "true")])
def test_run_on_cuda(scenario, tmp_path, prefetch, pinned):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    res = runner.invoke(app, ["run", str(scenario), "--json", "--out", str(tmp_path / "gpu"),
                              "--set", f"policy.prefetch={prefetch}", "--set", f"policy.pinned={pinned}"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["device"] == "cuda" and s["timing"] == "cuda_events" and s["h2d_bytes"] > 0 and s["d2h_bytes"] > 0
    steps = pd.read_csv(tmp_path / "gpu" / "steps.csv")
    assert (steps["compute_s"] + steps["stall_s"]).to_numpy() == pytest.approx(steps["step_s"].to_numpy())
    assert 0 < s["transfer_share"] <= 1 and s["attention_workspace_bytes"] > 0


def test_synthetic_model_sizes_match_its_tensors():
    from hwprobe.model.synthetic import ModelShapes, SyntheticTransformer
    from sim.inputs import catalog

    shapes = ModelShapes.from_spec(catalog.model_from_hf_config(REPO / "scenarios" / "models" / "tiny-qwen2.json"))
    model = SyntheticTransformer(shapes, "cpu", torch.float32, seed=0)
    tensors = model.tensors()
    assert len({t.data_ptr() for t in tensors}) == len(tensors)  # each counted once
    assert sum(t.numel() for t in tensors) == shapes.layers * shapes.layer_params() + shapes.non_layer_params()
    assert model.weight_bytes() == 4 * sum(t.numel() for t in tensors)


def test_auto_policy_replays_the_simulators_pressure_schedule(scenario, tmp_path):
    """hbm_ratio auto: the real cache applies the shares the simulator's memory pressure sets (here a
    runtime reserve leaves HBM for 60% of the batch's KV, over enough steps for the transit room), token for token."""
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import load_scenario
    from tests.test_pressure import reserve_for_kv

    overrides = ["policy.hbm_ratio=auto", "workload.reasoning_tokens=120"]
    overrides.append(reserve_for_kv(scenario, overrides, 0.6))
    sets = [x for o in overrides for x in ("--set", o)]
    hw, hw_steps = run(scenario, tmp_path / "auto", "--scores", "simulator", *sets)
    sim = simulate(load_scenario(scenario, overrides), None, with_max_batch=False)
    assert sim.summary.fits and hw["offloaded_tokens"] > 0
    for key in ("offloaded_tokens", "evicted_tokens", "final_tokens_per_tier", "h2d_bytes", "d2h_bytes"):
        assert hw[key] == getattr(sim.summary, key), key
    for col in ("tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3"):
        assert list(hw_steps[col]) == list(sim.steps[col]), col
