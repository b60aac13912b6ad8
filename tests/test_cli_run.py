"""`kvsim run`: outputs, overrides, profiles, and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from .conftest import SCENARIOS, run_cli

SUMMARY_KEYS = {
    "throughput_tok_per_s", "tpot_p50_s", "tpot_p99_s", "hbm_peak_bytes", "hbm_saved_bytes", "host_peak_bytes",
    "h2d_bytes", "d2h_bytes", "h2d_utilization", "d2h_utilization", "transfer_share", "stall_share",
    "offloaded_tokens", "evicted_tokens", "fits", "max_batch",
}
CSV_COLUMNS = ["step", "t_s", "step_s", "compute_s", "stall_s", "h2d_bytes", "d2h_bytes", "tokens_t0", "tokens_t1",
               "tokens_t2", "tokens_t3", "hbm_bytes", "host_bytes"]


def test_paper_scenario_prints_summary_and_writes_run_dir(tmp_path):
    out = tmp_path / "run"
    # the one test that runs the installed `kvsim` console script; the others call its app in process
    res = run_cli("run", str(SCENARIOS / "paper-rtx5080-7b.yaml"), "--out", str(out), subprocess_=True)
    assert res.returncode == 0, res.stderr
    for label in ("decode throughput", "TPOT p50 / p99", "HBM saved vs full_hbm", "max batch that fits"):
        assert label in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    header = (out / "steps.csv").read_text().splitlines()[0].split(",")
    assert header[: len(CSV_COLUMNS)] == CSV_COLUMNS
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text())
    assert resolved["policy"]["semantics"] == "paper_prototype"


def test_json_and_set_overrides(tmp_path):
    res = run_cli("run", str(SCENARIOS / "paper-rtx5080-7b.yaml"), "--out", str(tmp_path / "r"), "--json",
                  "--set", "policy.hbm_ratio=0.3", "--set", "workload.reasoning_tokens=256")
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert SUMMARY_KEYS <= set(s)
    assert s["resolved_scenario"]["policy"]["hbm_ratio"] == 0.3
    assert s["generated_tokens"] == 256


def test_not_fitting_is_exit_zero(tmp_path):
    res = run_cli("run", str(SCENARIOS / "paper-rtx5080-7b.yaml"), "--out", str(tmp_path / "r"),
                  "--set", "workload.batch_size=512", "--set", "policy.kind=full_hbm", "--json")
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["fits"] is False and s["hbm_shortfall_bytes"] > 0


def test_profile_replaces_datasheet_link(tmp_path):
    from sim.inputs.profile import CopyCurve, CopyPoint, LinkProfile, Profile, profile_to_yaml

    pts = [CopyPoint(size_bytes=s, time_s=2e-6 + s / 10e9, bytes_per_s=s / (2e-6 + s / 10e9)) for s in (4096, 2**20, 2**26)]
    curves = [CopyCurve(direction=d, memory="pinned", points=pts, fit_per_copy_latency_s=2e-6, fit_bytes_per_s=10e9)
              for d in ("h2d", "d2h")]
    prof = Profile(device="cpu", device_name="test cpu", machine="t", created_utc="2026-11-30T00:00:00Z",
                   link=LinkProfile(curves=curves))
    p = tmp_path / "p.yaml"
    p.write_text(profile_to_yaml(prof))
    base = json.loads(run_cli("run", str(SCENARIOS / "h200-7b-batch.yaml"), "--out", str(tmp_path / "a"), "--json",
                              "--set", "workload.reasoning_tokens=256").stdout)
    res = run_cli("run", str(SCENARIOS / "h200-7b-batch.yaml"), "--out", str(tmp_path / "b"), "--json",
                  "--set", "workload.reasoning_tokens=256", "--profile", str(p))
    assert res.returncode == 0, res.stderr
    measured = json.loads(res.stdout)
    assert measured["sources"]["h2d"].startswith("profile: test cpu")
    assert base["sources"]["h2d"].startswith("datasheet")
    assert measured["throughput_tok_per_s"] < base["throughput_tok_per_s"]  # a 10 GB/s link is slower


BAD = {
    "unknown_key": ("model: {name: llama-3.1-8b}\nworkload: {batch_size: 1, bogus: 2}\n", "workload.bogus: unknown key"),
    "wrong_type": ("model: {name: llama-3.1-8b}\nworkload: {batch_size: many}\n", "workload.batch_size"),
    "ratio_range": ("model: {name: llama-3.1-8b}\npolicy: {hbm_ratio: 1.5}\n", "policy.hbm_ratio"),
    "ratio_sum": ("model: {name: llama-3.1-8b}\npolicy: {hbm_ratio: 0.8, evict_ratio: 0.3}\n", "expected at most 1"),
    "unknown_model": ("model: {name: gpt-9}\n", "unknown model 'gpt-9'"),
    "unknown_gpu": ("model: {name: llama-3.1-8b}\nhardware: {gpu: voodoo2}\n", "unknown GPU 'voodoo2'"),
    "invalid_yaml": ("model: {name: llama-3.1-8b\n  policy: [\n", "invalid YAML"),
    "not_mapping": ("- just\n- a list\n", "expected a mapping"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenarios_one_line_exit_2_nothing_written(tmp_path, case):
    text, expected = BAD[case]
    f = tmp_path / f"{case}.yaml"
    f.write_text(text)
    out = tmp_path / "out"
    res = run_cli("run", str(f), "--out", str(out))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert str(f) in lines[0] and expected in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert not out.exists()


def test_missing_and_unreadable_files(tmp_path):
    res = run_cli("run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "nope.yaml: file not found" in res.stderr
    res = run_cli("run", str(tmp_path), "--out", str(tmp_path / "o"))  # a directory cannot be read as a file
    assert res.returncode == 2 and "cannot read file" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_bad_set_override(tmp_path):
    res = run_cli("run", str(SCENARIOS / "paper-rtx5080-7b.yaml"), "--out", str(tmp_path / "o"), "--set", "policy.hbm_ratio")
    assert res.returncode == 2 and "--set expects key.path=value" in res.stderr
    res = run_cli("run", str(SCENARIOS / "paper-rtx5080-7b.yaml"), "--out", str(tmp_path / "o"), "--set", "policy.kind=magic")
    assert res.returncode == 2 and "policy.kind" in res.stderr


def test_bad_profile_file(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("schema_version: 99\n")
    res = run_cli("run", str(SCENARIOS / "paper-rtx5080-7b.yaml"), "--out", str(tmp_path / "o"), "--profile", str(p))
    assert res.returncode == 2 and "schema_version" in res.stderr and not (tmp_path / "o").exists()


def test_atomic_write_leaves_a_normally_readable_file(tmp_path):
    import os

    from sim.outputs.atomic import write_text_atomic

    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a" / "f.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "f.txt").stat().st_mode & 0o044 == 0o044  # group/other readable (umask 022)
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["f.txt"]
