"""`hwprobe validate`: relative-error arithmetic, the median and worst per metric (with injected
predictors), and the end-to-end CPU loop against the real simulator."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from hwprobe.validate_cmd import ALL_METRICS, CHECKS, COMPARED, METRICS, validate
from sim.inputs.scenario import scenario_from_dict
from sim.outputs.schema import relative_error
from tests.conftest import write_hf_scenario

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from hwprobe.cli import app  # noqa: E402

runner = CliRunner()
TINY_CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64}


def test_relative_error_is_predicted_minus_measured_over_measured():
    assert relative_error(110.0, 100.0) == pytest.approx(0.10)
    assert relative_error(90.0, 100.0) == pytest.approx(-0.10)
    assert relative_error(0.0, 0.0) == 0.0
    assert relative_error(1.0, 0.0) is None  # no finite relative error
    assert relative_error(None, 3.0) is None and relative_error(3.0, None) is None
    assert relative_error(float("nan"), 3.0) is None


def _scenario(name: str):
    return scenario_from_dict({"name": name, "model": {"name": "deepseek-r1-distill-qwen-7b"}}, "test")


def test_median_and_worst_error_with_injected_functions():
    measured = {"throughput_tok_per_s": 100.0, "tpot_p50_s": 0.01, "transfer_share": 0.0, "device_memory_peak_bytes": 1e9}
    predicted = {
        "a": {"throughput_tok_per_s": 110.0, "tpot_p50_s": 0.012, "transfer_share": 0.0, "device_memory_peak_bytes": 1.1e9},
        "b": {"throughput_tok_per_s": 70.0, "tpot_p50_s": 0.009, "transfer_share": 0.2, "device_memory_peak_bytes": 1.0e9},
        "c": {"throughput_tok_per_s": 105.0, "tpot_p50_s": 0.0105, "transfer_share": 0.0, "device_memory_peak_bytes": 0.8e9},
    }
    seen = []
    rows, stats = validate([_scenario(n) for n in "abc"], lambda sc: predicted[sc.name], lambda sc: measured,
                           progress=lambda so_far: seen.append(len(so_far)))
    assert len(rows) == 3 * len(COMPARED)
    assert seen == [len(COMPARED), 2 * len(COMPARED), 3 * len(COMPARED)]  # kept after every scenario
    by = stats.set_index("metric")
    # throughput errors +10 %, -30 %, +5 %: median |e| 10 %, worst -30 % (sign kept) in b
    assert by.loc["throughput_tok_per_s", "median_abs_rel_error"] == pytest.approx(0.10)
    assert by.loc["throughput_tok_per_s", "worst_rel_error"] == pytest.approx(-0.30)
    assert by.loc["throughput_tok_per_s", "worst_scenario"] == "b"
    # step time +20 %, -10 %, +5 %
    assert by.loc["tpot_p50_s", "median_abs_rel_error"] == pytest.approx(0.10)
    assert by.loc["tpot_p50_s", "worst_rel_error"] == pytest.approx(0.20)
    # transfer share: measured 0 -> b has no finite error and is left out
    assert by.loc["transfer_share", "n"] == 2
    assert by.loc["transfer_share", "median_abs_rel_error"] == 0.0
    # memory +10 %, 0 %, -20 %
    assert by.loc["device_memory_peak_bytes", "worst_rel_error"] == pytest.approx(-0.20)
    assert by.loc["device_memory_peak_bytes", "worst_scenario"] == "c"
    # over all 11 defined errors: worst is -30 %
    assert by.loc[ALL_METRICS, "n"] == 11
    assert by.loc[ALL_METRICS, "worst_rel_error"] == pytest.approx(-0.30)
    errs = rows[rows["metric"].isin([k for k, _ in METRICS])]["rel_error"].dropna().abs()
    assert by.loc[ALL_METRICS, "median_abs_rel_error"] == pytest.approx(errs.median())
    # the checks (absent from both dicts here) have no errors and stay out of "all"
    assert all(by.loc[k, "n"] == 0 for k, _ in CHECKS)


def test_ratios_against_the_full_hbm_baseline_of_the_same_workload():
    from hwprobe.ratios import ratio_rows

    def sc(name, kind, batch=1):
        return scenario_from_dict({"name": name, "model": {"name": "deepseek-r1-distill-qwen-7b"},
                                   "workload": {"batch_size": batch}, "policy": {"kind": kind}}, "test")

    scenarios = [sc("full-b1", "full_hbm"), sc("tier-b1", "tiered"), sc("tier-b8", "tiered", 8), sc("evict-b1", "evict_only")]
    tput = {"full-b1": (100.0, 80.0), "tier-b1": (90.0, 60.0), "tier-b8": (500.0, 400.0)}  # evict-b1 not measured yet
    rows = pd.DataFrame([{"scenario": n, "metric": m, "predicted": p if m == "throughput_tok_per_s" else 1.0,
                          "measured": q if m == "throughput_tok_per_s" else 1.0}
                         for n, (p, q) in tput.items() for m in ("throughput_tok_per_s", "tpot_p50_s")])
    r = ratio_rows(scenarios, rows).set_index("scenario")
    # tier-b8 has no batch-8 baseline; evict-b1 has no measurement: neither gets a ratio
    assert list(r.index) == ["tier-b1"] and r.at["tier-b1", "baseline"] == "full-b1"
    assert r.at["tier-b1", "predicted_ratio"] == pytest.approx(0.90)
    assert r.at["tier-b1", "measured_ratio"] == pytest.approx(0.75)
    assert r.at["tier-b1", "rel_error"] == pytest.approx((0.90 - 0.75) / 0.75)


@pytest.fixture
def scenario_file(tmp_path):
    return write_hf_scenario(tmp_path, TINY_CONFIG, {
        "name": "tiny-validate",
        "workload": {"batch_size": 2, "prompt_tokens": 8, "reasoning_tokens": 16},
        "policy": {"hbm_ratio": 0.5, "evict_ratio": 0.1, "retier_interval": 4, "sink_tokens": 1, "recent_window": 4},
    })


def validate_on_cpu(*args: str):
    """`hwprobe validate --device cpu --threads 1 ARGS`, torch's thread count restored after."""
    before = torch.get_num_threads()
    res = runner.invoke(app, ["validate", "--device", "cpu", "--threads", "1", *args])
    torch.set_num_threads(before)
    return res


def variant(scenario_file, tmp_path, name: str, **policy) -> str:
    """The tiny scenario under another name, its policy updated; the path of its YAML."""
    d = yaml.safe_load(scenario_file.read_text())
    d["name"] = name
    d["policy"].update(policy)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def test_validate_end_to_end_on_cpu(scenario_file, tmp_path):
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import load_scenario

    out = tmp_path / "validate.csv"
    res = validate_on_cpu("--out", str(out), "--json", "--runs-dir", str(tmp_path / "runs"), str(scenario_file))
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(out)
    assert list(rows.columns) == ["scenario", "metric", "predicted", "measured", "rel_error"]
    assert list(rows["metric"]) == [k for k, _ in COMPARED]
    summary = simulate(load_scenario(scenario_file), None, with_max_batch=False).summary
    # device memory: allocated bytes, so the prediction leaves out the simulator's runtime reserve
    predicted = {**summary.model_dump(), "device_memory_peak_bytes": summary.hbm_peak_bytes - summary.runtime_reserve_bytes}
    with_error = 0
    for r in rows.itertuples():
        assert r.predicted == pytest.approx(predicted[r.metric])
        assert r.measured == r.measured  # not NaN: every metric was measured
        if r.measured:
            assert r.rel_error == pytest.approx((r.predicted - r.measured) / r.measured)
            with_error += 1
    assert with_error, rows  # the relative error was checked on at least one row
    # the real cache replayed the simulator's re-tier decisions: identical traffic and host memory
    checks = rows.set_index("metric").loc[[k for k, _ in CHECKS]]
    assert (checks["predicted"] == checks["measured"]).all(), checks
    assert checks.loc["h2d_bytes", "measured"] > 0 and checks.loc["d2h_bytes", "measured"] > 0
    ratios = pd.read_csv(out.with_suffix(".ratios.csv"))
    assert list(ratios.columns) == ["scenario", "baseline", "predicted_ratio", "measured_ratio", "rel_error"]
    assert ratios.empty  # a validation of one tiered scenario has no full_hbm baseline to divide by
    stats = pd.read_csv(out.with_suffix(".errors.csv"))
    assert ALL_METRICS in set(stats["metric"])
    assert json.loads(res.stdout)["rows"][0]["scenario"] == "tiny-validate"
    kept = json.loads((tmp_path / "runs" / "tiny-validate" / "summary.json").read_text())
    assert kept["measured"] is True
    assert rows.set_index("metric").loc["throughput_tok_per_s", "measured"] == pytest.approx(kept["throughput_tok_per_s"])


def test_validate_with_a_baseline_writes_the_throughput_ratio(scenario_file, tmp_path):
    full_file = variant(scenario_file, tmp_path, "tiny-full", kind="full_hbm")
    out = tmp_path / "pair.csv"
    res = validate_on_cpu("--out", str(out), full_file, str(scenario_file))
    assert res.exit_code == 0, res.output
    assert "throughput relative to full_hbm" in res.stdout
    tput = pd.read_csv(out).query("metric == 'throughput_tok_per_s'").set_index("scenario")
    ratio = pd.read_csv(out.with_suffix(".ratios.csv")).set_index("scenario")
    assert list(ratio.index) == ["tiny-validate"] and ratio.at["tiny-validate", "baseline"] == "tiny-full"
    for side in ("predicted", "measured"):
        expected = tput.at["tiny-validate", side] / tput.at["tiny-full", side]
        assert ratio.at["tiny-validate", f"{side}_ratio"] == pytest.approx(expected)


def test_a_failing_scenario_is_one_line_and_the_grid_goes_on(scenario_file, tmp_path):
    # the simulator predicts fp8 T2; hwprobe has int8 T2 only
    bad_file = variant(scenario_file, tmp_path, "tiny-fp8-t2", compressed_ratio=0.2, compressed_dtype="fp8")
    out = tmp_path / "grid.csv"
    res = validate_on_cpu("--out", str(out), bad_file, str(scenario_file))
    assert res.exit_code == 1, res.output
    lines = [x for x in res.stderr.strip().splitlines() if not x.startswith("[")]  # less the progress lines
    assert [x[:4] for x in res.stderr.splitlines() if x.startswith("[")] == ["[1/2", "[2/2"]
    assert len(lines) == 2 and "tiny-fp8-t2: measure failed" in lines[0] and "compressed_dtype" in lines[0]
    assert "1 of 2 scenario(s) failed: tiny-fp8-t2" in lines[1]
    rows = pd.read_csv(out).set_index(["scenario", "metric"])
    assert rows.loc[("tiny-fp8-t2", "throughput_tok_per_s"), "predicted"] > 0
    assert pd.isna(rows.loc[("tiny-fp8-t2", "throughput_tok_per_s"), "measured"])
    assert rows.loc[("tiny-validate", "throughput_tok_per_s"), "measured"] > 0  # measured after the failure


def test_measured_runs_are_revalidated_without_a_device(scenario_file, tmp_path):
    out, again = tmp_path / "live.csv", tmp_path / "again.csv"
    res = validate_on_cpu("--out", str(out), "--runs-dir", str(tmp_path / "runs"), str(scenario_file))
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["validate", "--measured", str(tmp_path / "runs"), "--out", str(again), str(scenario_file)])
    assert res.exit_code == 0, res.output  # no --device: nothing runs (this machine has no GPU)
    pd.testing.assert_frame_equal(pd.read_csv(out), pd.read_csv(again))
    # with another model of the hardware the predictions change, the measurements do not
    res = runner.invoke(app, ["validate", "--measured", str(tmp_path / "runs"), "--out", str(again),
                              "--set", "hardware.efficiency.layer_overhead_s=0.01", str(scenario_file)])
    a, b = pd.read_csv(out), pd.read_csv(again)
    assert (a["measured"] == b["measured"]).all() and not (a["predicted"] == b["predicted"]).all()
    res = runner.invoke(app, ["validate", "--measured", str(tmp_path / "nothing"), str(scenario_file)])
    assert res.exit_code == 2 and "--measured" in res.stderr and res.stderr.strip().count("\n") == 0


def test_validate_bad_scenario_one_line(scenario_file):
    res = runner.invoke(app, ["validate", "--device", "cpu", "--set", "workload.batch_size=0", str(scenario_file)])
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "workload.batch_size" in res.stderr
