"""One named test per class of issue #10: bad input is one line naming the file and the field, exit
code 2, no traceback, nothing written - checked before any work starts. The property-based tests of
the same promise are in tests/test_fuzz_inputs.py; interrupts in tests/test_interrupt.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sim.inputs.errors import ConfigError

from .conftest import SCENARIOS, run_cli
from .promise import assert_refused, dump_yaml, files_under, tiny_hf_config, tiny_profile, tiny_scenario, with_value


def _write(d: Path, scenario: dict | None = None, profile: dict | None = None, config: dict | None = None) -> Path:
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    doc = scenario or tiny_scenario(d / "config.json" if config is not None else tiny_scenario()["model"]["hf_config"])
    if profile is not None:
        (d / "p.yaml").write_text(dump_yaml(profile))
    (d / "s.yaml").write_text(dump_yaml(doc))
    return d / "s.yaml"


# ---- decoding --------------------------------------------------------------------------------

BAD_BYTES = {
    "not-utf8": (b"name: \xff\xfe\n", "not UTF-8"),
    "deep-yaml": (("a: " + "[" * 1200 + "]" * 1200 + "\n").encode(), "nested"),
    "deep-json": (("[" * 5000 + "]" * 5000).encode(), "nested"),
    "endless": (None, "not a regular file (a character device)"),  # /dev/zero: refused before it is opened
}


@pytest.mark.parametrize("kind", BAD_BYTES)
@pytest.mark.parametrize("reader", ["scenario", "profile", "hf_config", "validation"])
def test_decoding_errors_are_input_errors(tmp_path, reader, kind):
    data, expected = BAD_BYTES[kind]
    bad = Path("/dev/zero") if data is None else tmp_path / "bad"
    if data is not None:
        bad.write_bytes(data)
    if reader == "validation" and kind in ("deep-yaml", "deep-json"):
        pytest.skip("a CSV has no nesting")
    if reader == "validation":
        (tmp_path / "s.yaml").write_text(dump_yaml(tiny_scenario()))
        args = ["report", "s.yaml", "--validation", str(bad), "--out", "r.html"]
        expected = {"not-utf8": "not UTF-8", "endless": "not a regular file (a character device)"}[kind]
    elif reader == "hf_config":
        expected = "invalid JSON" if kind == "deep-yaml" else expected
        (tmp_path / "s.yaml").write_text(dump_yaml(tiny_scenario(bad)))
        args = ["run", "s.yaml", "--out", "o"]
    elif reader == "profile":
        (tmp_path / "s.yaml").write_text(dump_yaml(tiny_scenario()))
        args = ["run", "s.yaml", "--profile", str(bad), "--out", "o"]
    else:
        args = ["run", str(bad), "--out", "o"]
    before = files_under(tmp_path)
    line = assert_refused(run_cli(*args, cwd=tmp_path), str(bad), expected)
    if reader == "hf_config":
        assert "model.hf_config" in line
    assert files_under(tmp_path) == before


def test_yaml_duplicate_key_is_refused_and_exponents_are_numbers(tmp_path):
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_scenario()) + "name: again\n")
    assert_refused(run_cli("run", "s.yaml", cwd=tmp_path), "s.yaml", "duplicate key 'name'")
    from sim.inputs.reader import parse_yaml

    assert parse_yaml("a: 64e9\nb: 6.4e10\nc: '64e9'", "x") == {"a": 64e9, "b": 6.4e10, "c": "64e9"}


# ---- Hugging Face configs --------------------------------------------------------------------

HF_CASES = [
    ("num_attention_heads", 0, "greater than or equal to 1"),
    ("num_attention_heads", -8, "greater than or equal to 1"),
    ("num_attention_heads", True, "valid integer"),
    ("num_attention_heads", "8", "valid integer"),
    ("num_hidden_layers", 0, "greater than or equal to 1"),
    ("num_hidden_layers", 10**6, "less than or equal to 1024"),
    ("hidden_size", True, "valid integer"),
    ("hidden_size", -256, "greater than or equal to 1"),
    ("head_dim", 0, "greater than or equal to 1"),
    ("num_key_value_heads", 0, "greater than or equal to 1"),
    ("num_key_value_heads", 3, "not a multiple of num_key_value_heads 3"),
    ("num_experts", -1, "greater than or equal to 0"),
    ("num_experts", "many", "valid integer"),
    ("intermediate_size", 0, "greater than or equal to 1"),
    ("vocab_size", None, "Field required"),  # None: the field removed
]


@pytest.mark.parametrize("field,value,expected", HF_CASES, ids=[f"{f}={v!r}" for f, v, _ in HF_CASES])
def test_hf_config_fields_are_validated_strictly(tmp_path, field, value, expected):
    cfg = with_value(tiny_hf_config(), (field,), value, delete=value is None)
    _write(tmp_path, config=cfg)
    res = run_cli("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert_refused(res, f"s.yaml: model.hf_config: {tmp_path / 'config.json'}: {field}: ", expected)
    assert not (tmp_path / "o").exists()


def test_hf_config_moe_needs_experts_per_token(tmp_path):
    _write(tmp_path, config={**tiny_hf_config(), "num_experts": 4})
    assert_refused(run_cli("run", "s.yaml", cwd=tmp_path), "config.json: num_experts_per_tok")


# ---- numbers that pass their bounds but mean nothing ------------------------------------------

SET_CASES = [
    ("hardware.efficiency.layer_overhead_s=.inf", "hardware.efficiency.layer_overhead_s: expected a finite number"),
    ("hardware.efficiency.weight_hbm_efficiency=.inf", "hardware.efficiency.weight_hbm_efficiency: expected a finite"),
    ("hardware.efficiency.attention_latency_s=.nan", "hardware.efficiency.attention_latency_s: expected a finite"),
    ("workload.reasoning_tokens={dist: lognormal, mean: .inf, std: 1}", "workload.reasoning_tokens.mean: expected a finite"),
    ("workload.reasoning_tokens={dist: normal, mean: 100, std: 10, min: 50, max: 10}", "normal needs min <= max"),
    ("hardware.efficiency.gemm_flop_efficiency=5e-324", "gemm_flop_efficiency: Input should be greater than or equal to 0.001"),
    ("workload.seed=-1", "workload.seed: Input should be greater than or equal to 0"),
    ("workload.reasoning_tokens=0", "workload.reasoning_tokens: Input should be greater than or equal to 1"),
    ("workload.batch_size=true", "workload.batch_size: Input should be a valid integer"),
    ("policy.hbm_ratio='0.5'", "policy.hbm_ratio: expected a number from 0 to 1 or 'auto', got '0.5'"),
]


@pytest.mark.parametrize("override,expected", SET_CASES, ids=[o.split("=")[0] + "=" + o.split("=", 1)[1][:12] for o, _ in SET_CASES])
def test_meaningless_scenario_numbers_are_refused(tmp_path, override, expected):
    _write(tmp_path)
    assert_refused(run_cli("run", "s.yaml", "--set", override, "--out", "o", cwd=tmp_path), "s.yaml", expected)
    assert not (tmp_path / "o").exists()


PROFILE_CASES = [
    (("compute", "attention_hbm_bytes_per_s"), float("inf"), "expected a finite number"),
    (("compute", "attention_hbm_bytes_per_s"), 0, "greater than or equal to 1000"),
    (("compute", "peak_flop_per_s", "bf16"), -1e14, "greater than or equal to 1000000"),
    (("compute", "peak_flop_per_s", "bf16"), 5e-324, "greater than or equal to 1000000"),  # underflowed to 0 once scaled
    (("compute", "gemm_flop_per_s_by_rows", 0, 0), -8, "greater than 0"),
    (("compute", "gemm_flop_per_s_by_rows", 1, 0), 1, "a row count appears twice"),
    (("link", "curves", 0, "fit_bytes_per_s"), 0.0, "greater than or equal to 1000"),
    (("compute", "step_overheads", "none", "step_s"), float("nan"), "expected a finite number"),
    (("schema_version",), True, "schema_version"),
    (("copy_engines",), True, "valid integer"),
    (("device_memory_free_bytes",), 2e11, "more than device_memory_bytes"),
]


@pytest.mark.parametrize("path,value,expected", PROFILE_CASES, ids=[".".join(map(str, p)) + f"={v!r}" for p, v, _ in PROFILE_CASES])
def test_meaningless_profile_figures_are_refused(tmp_path, path, value, expected):
    _write(tmp_path, profile=with_value(tiny_profile(), path, value))
    line = assert_refused(run_cli("run", "s.yaml", "--profile", "p.yaml", "--out", "o", cwd=tmp_path), "p.yaml", expected)
    assert str(path[0]) in line
    assert not (tmp_path / "o").exists()


# ---- sizes no machine could hold ---------------------------------------------------------------

SIZE_CASES = [
    ("workload.batch_size=1000000000", "less than or equal to 65536"),
    ("workload.prompt_tokens=1000000000", "less than or equal to 4194304"),
    ("workload.reasoning_tokens=1000000000", "less than or equal to 4194304"),
    ("workload.batch_size=65536", "more than the 67,108,864 a run can hold"),  # with 4M reasoning below
    ("sim.step_stride=1", "more than 67,108,864; use sim.detail: step"),
]


@pytest.mark.parametrize("override,expected", SIZE_CASES)
def test_sizes_no_run_could_hold_are_refused_at_load(tmp_path, monkeypatch, override, expected):
    import sim.decode.simulate
    import sim.serving.run

    def refuse(*a, **k):
        raise AssertionError("simulated before the sizes were checked")

    monkeypatch.setattr(sim.decode.simulate, "simulate", refuse)  # the command imports it when it runs
    monkeypatch.setattr(sim.serving.run, "simulate_serving", refuse)
    sc = tiny_scenario()
    sc["workload"]["reasoning_tokens"] = 4_000_000 if "step_stride" in override or "65536" in override else 16
    sc["model"]["hf_config"] = str(tmp_path / "config.json")
    _write(tmp_path, scenario=sc, config={**tiny_hf_config(), "num_hidden_layers": 1024})
    assert_refused(run_cli("run", "s.yaml", "--set", override, "--out", "o", cwd=tmp_path), "s.yaml", expected)
    assert not (tmp_path / "o").exists()


def test_a_million_layers_is_refused_with_the_limit(tmp_path):
    _write(tmp_path, config={**tiny_hf_config(), "num_hidden_layers": 10**6})
    assert_refused(run_cli("run", "s.yaml", cwd=tmp_path), "num_hidden_layers: Input should be less than or equal to 1024")


# ---- output paths ------------------------------------------------------------------------------

def _no_simulation(monkeypatch):
    import sim.decode.simulate

    def refuse(*a, **k):
        raise AssertionError("simulated before the output path was checked")

    monkeypatch.setattr(sim.decode.simulate, "simulate", refuse)


@pytest.mark.parametrize("out,expected", [("afile", "exists and is not a folder"), ("afile/below", "is a file; cannot write")])
def test_out_paths_are_checked_before_any_work(tmp_path, monkeypatch, out, expected):
    _write(tmp_path)
    (tmp_path / "afile").write_text("x")
    _no_simulation(monkeypatch)
    assert_refused(run_cli("run", "s.yaml", "--out", out, cwd=tmp_path), "--out", expected)
    assert_refused(run_cli("report", "s.yaml", "--out", f"{out}/r.html" if out == "afile" else out + "/r.html", cwd=tmp_path),
                   "--out")
    pytest.importorskip("torch")
    assert_refused(run_cli("run", "s.yaml", "--device", "cpu", "--out", out, cwd=tmp_path, tool="hwprobe"), "--out")
    assert_refused(run_cli("validate", "s.yaml", "--device", "cpu", "--out", f"{out}/v.csv", cwd=tmp_path, tool="hwprobe"),
                   "--out")
    assert files_under(tmp_path) == {"s.yaml", "afile"}


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_out_folder_is_refused_first(tmp_path, monkeypatch):
    _write(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    _no_simulation(monkeypatch)
    try:
        assert_refused(run_cli("run", "s.yaml", "--out", "locked/o", cwd=tmp_path), "--out", "cannot write in")
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("name", ["../../escape", "a/b", "..", "/etc/passwd", "...", "x\ny"])
def test_scenario_name_cannot_put_the_run_outside_runs(tmp_path, name):
    sc = tiny_scenario()
    sc["name"] = name
    _write(tmp_path, scenario=sc)
    res = run_cli("run", "s.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.parent == tmp_path / "runs" and not run_dir.name.startswith(".")
    assert files_under(tmp_path) - {"s.yaml"} == {"runs", str(run_dir.relative_to(tmp_path))} | {
        str((run_dir / f).relative_to(tmp_path)) for f in ("scenario.resolved.yaml", "summary.json", "steps.csv")}


# ---- half-written run folders ------------------------------------------------------------------

@pytest.mark.parametrize("fail_at", [0, 1, 2, "rename"])
@pytest.mark.parametrize("existing", [False, True])
def test_run_folder_is_written_whole(tmp_path, monkeypatch, fail_at, existing):
    """An interrupt at any write leaves the complete folder or none (an existing folder: its old files)."""
    import os as os_module

    from sim.outputs import atomic

    out = tmp_path / "run"
    if existing:
        out.mkdir()
        (out / "summary.json").write_text("old")
    files = {"scenario.resolved.yaml": "a", "steps.csv": "b", "summary.json": "c"}
    calls = {"write": 0}
    real_write, real_fdopen = Path.write_text, os_module.fdopen

    def interrupt_nth(self, *a, **k):
        if calls["write"] == fail_at:
            raise KeyboardInterrupt
        calls["write"] += 1
        return real_write(self, *a, **k)

    def fdopen_nth(fd, *a, **k):
        if calls["write"] == fail_at:
            os_module.close(fd)
            raise KeyboardInterrupt
        calls["write"] += 1
        return real_fdopen(fd, *a, **k)

    monkeypatch.setattr(Path, "write_text", interrupt_nth)
    monkeypatch.setattr(atomic.os, "fdopen", fdopen_nth)
    if fail_at == "rename":
        monkeypatch.setattr(atomic.os, "rename", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
        monkeypatch.setattr(atomic.os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        atomic.write_dir_atomic(out, files)
    monkeypatch.undo()
    assert files_under(tmp_path) == ({"run", "run/summary.json"} if existing else set())
    if existing:
        assert (out / "summary.json").read_text() == "old"
    atomic.write_dir_atomic(out, files)
    assert {p.name: p.read_text() for p in out.iterdir()} == files


# ---- checks in the wrong order -----------------------------------------------------------------

def test_hwprobe_validate_checks_the_profile_before_measuring(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import hwprobe.decode

    def refuse(*a, **k):
        raise AssertionError("measured before the profile was checked")

    monkeypatch.setattr(hwprobe.decode, "measure_run", refuse)
    _write(tmp_path)
    (tmp_path / "p.yaml").write_bytes(b"\xff\xfe")
    res = run_cli("validate", "s.yaml", "--device", "cpu", "--profile", "p.yaml", "--out", "v.csv", cwd=tmp_path,
                  tool="hwprobe")
    assert_refused(res, "p.yaml", "not UTF-8")  # and `refuse` above never ran
    assert files_under(tmp_path) == {"s.yaml", "p.yaml"}


@pytest.mark.parametrize("args,expected", [
    (["--threads", "-1"], "--threads: expected 1 to"),
    (["--device", "cpu:abc"], "--device: expected cuda, cuda:N or cpu"),
    (["--layers", "0"], "--layers: expected 1 to"),
    (["--prefill", "x"], "--prefill: expected one of"),
])
def test_hwprobe_run_checks_every_option_first(tmp_path, args, expected):
    pytest.importorskip("torch")
    _write(tmp_path)
    device = [] if "--device" in args else ["--device", "cpu"]
    assert_refused(run_cli("run", "s.yaml", *device, *args, cwd=tmp_path, tool="hwprobe"), expected)
    assert files_under(tmp_path) == {"s.yaml"}


# ---- misleading output -------------------------------------------------------------------------

def test_a_cpu_profile_on_a_gpu_scenario_is_named_and_warned(tmp_path):
    _write(tmp_path, profile={**tiny_profile(), "device": "cpu", "device_name": "AMD EPYC 9654"})
    res = run_cli("run", "s.yaml", "--profile", "p.yaml", "--out", "o", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "kvsim: warning: p.yaml: the profile measured the cpu (AMD EPYC 9654), not a GPU" in res.stderr
    assert "on h200-sxm (measured figures from cpu (AMD EPYC 9654))" in res.stdout
    assert "measured on cpu (AMD EPYC 9654)" in res.stdout


def test_a_profile_of_another_gpu_is_warned_and_the_same_gpu_is_not(tmp_path):
    _write(tmp_path, profile={**tiny_profile(), "device_name": "NVIDIA H100 80GB HBM3"})
    res = run_cli("run", "s.yaml", "--profile", "p.yaml", "--out", "o", cwd=tmp_path)
    assert res.returncode == 0 and "measured NVIDIA H100 80GB HBM3, the scenario's GPU is h200-sxm" in res.stderr
    _write(tmp_path, profile=tiny_profile())
    res = run_cli("run", "s.yaml", "--profile", "p.yaml", "--out", "o2", cwd=tmp_path)
    assert res.returncode == 0 and "warning" not in res.stderr


def test_kvsim_report_warns_of_a_cpu_profile_applied_to_a_gpu_run(tmp_path):
    _write(tmp_path, profile={**tiny_profile(), "device": "cpu", "device_name": "AMD EPYC 9654"})
    res = run_cli("report", "s.yaml", "--profile", "p.yaml", "--out", "r.html", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "kvsim: warning: tiny: p.yaml: the profile measured the cpu (AMD EPYC 9654), not a GPU" in res.stderr


# ---- the last-resort handler -------------------------------------------------------------------

def test_an_internal_error_is_one_line_pointing_to_debug(tmp_path, monkeypatch):
    import sim.decode.simulate

    def broken(*a, **k):
        raise RuntimeError("a bug\nwith a second line")

    monkeypatch.setattr(sim.decode.simulate, "simulate", broken)
    _write(tmp_path)
    res = run_cli("run", "s.yaml", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == ["kvsim: internal error: RuntimeError: a bug (run with --debug for the traceback)"]
    res = run_cli("--debug", "run", "s.yaml", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" in res.stderr and "RuntimeError: a bug" in res.stderr


def test_an_error_line_stays_one_line_whatever_the_input_holds(tmp_path):
    _write(tmp_path)  # \x85 and \u2028 are line breaks to str.splitlines; \x1b starts a terminal escape
    for value in ("\x85", "a\u2028b", "\x1b[31mred"):
        line = assert_refused(run_cli("run", "s.yaml", "--set", f"model.hf_config={value}", cwd=tmp_path),
                              "s.yaml: model")
        assert line.isprintable()


def test_loaders_raise_only_config_errors_for_a_missing_file(tmp_path):
    from sim.inputs.catalog import model_from_hf_config
    from sim.inputs.profile import load_profile
    from sim.inputs.scenario import load_scenario
    from sim.report.validation_table import load_validation

    for load in (load_scenario, load_profile, model_from_hf_config, load_validation):
        with pytest.raises(ConfigError, match="file not found"):
            load(tmp_path / "missing")


def test_real_scenarios_still_load():
    from sim.inputs.scenario import load_scenario

    for path in sorted(SCENARIOS.glob("*.yaml")):
        load_scenario(path)
