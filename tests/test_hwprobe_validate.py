"""`hwprobe validate`: relative-error arithmetic, the median and worst per metric (with injected
predictors), and the end-to-end CPU loop against the real simulator."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from hwprobe.validate_cmd import ALL_METRICS, CHECKS, COMPARED, METRICS, relative_error, validate
from sim.scenario import scenario_from_dict

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


@pytest.fixture
def scenario_file(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_CONFIG))
    path = tmp_path / "tiny-validate.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny-validate",
        "model": {"hf_config": str(cfg)},
        "workload": {"batch_size": 2, "prompt_tokens": 8, "reasoning_tokens": 16},
        "policy": {"hbm_ratio": 0.5, "evict_ratio": 0.1, "retier_interval": 4, "sink_tokens": 1, "recent_window": 4},
    }))
    return path


def test_validate_end_to_end_on_cpu(scenario_file, tmp_path):
    from sim.engine import simulate
    from sim.scenario import load_scenario

    before = torch.get_num_threads()
    out = tmp_path / "validate.csv"
    res = runner.invoke(app, ["validate", "--device", "cpu", "--threads", "1", "--out", str(out), "--json",
                              "--runs-dir", str(tmp_path / "runs"), str(scenario_file)])
    torch.set_num_threads(before)
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(out)
    assert list(rows.columns) == ["scenario", "metric", "predicted", "measured", "rel_error"]
    assert list(rows["metric"]) == [k for k, _ in COMPARED]
    predicted = simulate(load_scenario(scenario_file), None, with_max_batch=False).summary
    # device memory: allocated bytes, so the prediction leaves out the simulator's runtime reserve
    predicted["device_memory_peak_bytes"] = predicted["hbm_peak_bytes"] - predicted["runtime_reserve_bytes"]
    for r in rows.itertuples():
        assert r.predicted == pytest.approx(predicted[r.metric])
        assert r.measured == r.measured  # not NaN: every metric was measured
        if r.measured:
            assert r.rel_error == pytest.approx((r.predicted - r.measured) / r.measured)
    # the real cache replayed the simulator's re-tier decisions: identical traffic and host memory
    checks = rows.set_index("metric").loc[[k for k, _ in CHECKS]]
    assert (checks["predicted"] == checks["measured"]).all(), checks
    assert checks.loc["h2d_bytes", "measured"] > 0 and checks.loc["d2h_bytes", "measured"] > 0
    stats = pd.read_csv(out.with_suffix(".errors.csv"))
    assert ALL_METRICS in set(stats["metric"])
    assert json.loads(res.stdout)["rows"][0]["scenario"] == "tiny-validate"
    kept = json.loads((tmp_path / "runs" / "tiny-validate" / "summary.json").read_text())
    assert kept["measured"] is True
    assert rows.set_index("metric").loc["throughput_tok_per_s", "measured"] == pytest.approx(kept["throughput_tok_per_s"])


def test_validate_bad_scenario_one_line(scenario_file):
    res = runner.invoke(app, ["validate", "--device", "cpu", "--set", "workload.batch_size=0", str(scenario_file)])
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "workload.batch_size" in res.stderr
