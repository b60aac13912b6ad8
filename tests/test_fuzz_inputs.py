"""Property-based tests of the input promise (issue #10): hostile input for every loader and CLI ends
in one line naming the file and the field with exit code 2 and nothing written, or in a valid result;
never a traceback, never a hang.

The default (`ci`) hypothesis profile runs a few hundred cases in all, derandomised; run more with
    pytest tests/test_fuzz_inputs.py --hypothesis-profile=thorough --hypothesis-show-statistics
`budget(n)` scales each test's share with the profile's max_examples (n at the ci profile's 20).
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.inputs.errors import ConfigError

from .conftest import run_cli
from .promise import (
    HOSTILE_VALUES,
    assert_error_line,
    assert_refused,
    dump_yaml,
    field_name,
    files_under,
    leaf_paths,
    tiny_hf_config,
    tiny_profile,
    tiny_scenario,
    with_value,
)

CI_EXAMPLES = 20
MAX_SECONDS_PER_CASE = 20.0  # CPU seconds: a case that takes longer is a hang for this test's purpose


def budget(n: int) -> settings:
    return settings(max_examples=max(1, n * settings().max_examples // CI_EXAMPLES))


@contextlib.contextmanager
def workdir():
    with tempfile.TemporaryDirectory(prefix="kvtier-fuzz-") as d:
        yield Path(d)


def timed(fn, *args, **kwargs):
    """fn(...), which must not spin: this process's CPU time, not the wall clock, so a loaded machine
    (other processes taking the CPU) cannot fail it."""
    t0 = time.process_time()
    out = fn(*args, **kwargs)
    assert time.process_time() - t0 < MAX_SECONDS_PER_CASE, "took too long"
    return out


# ---- strategies ------------------------------------------------------------------------------

hostile = st.one_of(st.sampled_from(HOSTILE_VALUES), st.integers(-1000, 1000),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
trees = st.recursive(json_leaves, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=24)
nested = st.integers(60, 1200).map(lambda n: "a: " + "[" * n + "]" * n + "\n")
raw_bytes = st.one_of(st.binary(max_size=600), st.text(max_size=600).map(lambda s: s.encode("utf-8", "surrogatepass")),
                      nested.map(str.encode),
                      st.sampled_from([b"\xff\xfe\x00", b"a: 1\na: 2\n", b"&a [*a]", b"- &x [1]\n- *x\n",
                                       b'{"a": NaN}', b"\x00", b"---\n...\n---\n", b"!!python/object:os.system {}"]))


def mutation(base: dict):
    """(path, value, delete): one field of `base` replaced by a hostile value, or deleted."""
    return st.tuples(st.sampled_from(leaf_paths(base)), hostile, st.sampled_from([False] * 7 + [True]))


def _top(path: tuple) -> str:
    return str(path[0])


# ---- loaders, in process ---------------------------------------------------------------------

def _check_scenario_load(path: Path, top: str | None = None):
    """load_scenario: a ConfigError naming the file (and the top-level key `top`), or a scenario
    that simulates without an exception."""
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import load_scenario

    try:
        sc = timed(load_scenario, path)
    except ConfigError as err:
        line = assert_error_line(err, str(path))
        if top is not None:  # the field broken, or one it is checked against, which then names it
            assert err.field and (err.field.split(".")[0] == top or top in err.message), line
        return None
    if sc.workload.batch_size * (sc.workload.prompt_tokens + 64) <= 4096 and sc.sim.max_batch_limit <= 64:
        timed(simulate, sc)
    return sc


@budget(40)
@given(raw_bytes)
def test_fuzz_scenario_bytes(data: bytes):
    with workdir() as d:
        p = d / "s.yaml"
        p.write_bytes(data)
        _check_scenario_load(p)


@budget(40)
@given(trees)
def test_fuzz_scenario_arbitrary_trees(tree):
    with workdir() as d:
        p = d / "s.yaml"
        p.write_text(dump_yaml(tree))
        _check_scenario_load(p)


@budget(60)
@given(mutation(tiny_scenario()))
def test_fuzz_scenario_every_field(change):
    path, value, delete = change
    with workdir() as d:
        p = d / "s.yaml"
        p.write_text(dump_yaml(with_value(tiny_scenario(), path, value, delete=delete)))
        _check_scenario_load(p, _top(path))


@budget(40)
@given(mutation(tiny_hf_config()), st.booleans())
def test_fuzz_hf_config_every_field(change, as_tree):
    path, value, delete = change
    with workdir() as d:
        cfg = d / "config.json"
        doc = with_value(tiny_hf_config(), path, value, delete=delete)
        cfg.write_text(json.dumps(doc, allow_nan=True))
        p = d / "s.yaml"
        p.write_text(dump_yaml(tiny_scenario(cfg)))
        from sim.inputs.scenario import load_scenario

        try:
            sc = timed(load_scenario, p)
        except ConfigError as err:
            assert_error_line(err, str(p), "model.hf_config", str(cfg))
            return
        from sim.decode.simulate import simulate

        timed(simulate, sc)


@budget(20)
@given(raw_bytes)
def test_fuzz_hf_config_bytes(data: bytes):
    from sim.inputs.catalog import model_from_hf_config

    with workdir() as d:
        cfg = d / "config.json"
        cfg.write_bytes(data)
        with contextlib.suppress(ConfigError):
            timed(model_from_hf_config, cfg)


def _check_profile_load(path: Path, top: str | None = None):
    from sim.decode.simulate import simulate
    from sim.inputs.profile import load_profile
    from sim.inputs.scenario import scenario_from_dict

    try:
        prof = timed(load_profile, path)
    except ConfigError as err:
        line = assert_error_line(err, str(path))
        if top is not None:  # the field broken, or one it is checked against, which then names it
            assert err.field and (err.field.split(".")[0] == top or top in err.message), line
        return
    timed(simulate, scenario_from_dict(tiny_scenario(), "tiny.yaml"), prof, profile_path=str(path))


@budget(60)
@given(mutation(tiny_profile()))
def test_fuzz_profile_every_field(change):
    path, value, delete = change
    with workdir() as d:
        p = d / "p.yaml"
        p.write_text(dump_yaml(with_value(tiny_profile(), path, value, delete=delete)))
        _check_profile_load(p, _top(path))


@budget(30)
@given(st.one_of(raw_bytes, trees.map(lambda t: dump_yaml(t).encode())))
def test_fuzz_profile_bytes_and_trees(data: bytes):
    with workdir() as d:
        p = d / "p.yaml"
        p.write_bytes(data)
        _check_profile_load(p)


csv_cells = st.one_of(st.sampled_from(["", "1", "-1", "0", "nan", "inf", "-inf", "1e308", "abc", '"', "1,2", "\x00",
                                       "1e999", "NaN", "None", "True"]), st.text(max_size=6))


@budget(40)
@given(st.one_of(
    st.binary(max_size=400),
    st.lists(st.lists(csv_cells, min_size=5, max_size=5), max_size=5).map(
        lambda rows: "scenario,metric,predicted,measured,rel_error\n" + "\n".join(",".join(r) for r in rows)).map(str.encode),
))
def test_fuzz_validation_csv(data: bytes):
    from sim.report.validation_table import load_validation

    with workdir() as d:
        p = d / "v.csv"
        p.write_bytes(data)
        try:
            frame = timed(load_validation, p)
        except ConfigError as err:
            assert_error_line(err, str(p))
            return
        finite = frame[["predicted", "measured"]].dropna().to_numpy()
        assert all(math.isfinite(x) for x in finite.ravel())


@budget(40)
@given(st.lists(st.tuples(st.sampled_from([field_name(p) for p in leaf_paths(tiny_scenario())] + ["x", "a..b", ".", "",
                                                                                                  "workload.batch_size.x"]),
                          hostile.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("..."))),
                min_size=1, max_size=3))
def test_fuzz_set_overrides(sets):
    from sim.inputs.scenario import scenario_from_dict

    overrides = [f"{k}={v.strip()}" for k, v in sets]
    try:
        timed(scenario_from_dict, tiny_scenario(), "tiny.yaml", overrides)
    except ConfigError as err:
        assert_error_line(err, "tiny.yaml")


# ---- the command lines, in process (typer's CliRunner) ---------------------------------------

OUT_CHOICES = [None, "out", "deep/new/out", "afile", "afile/below", "."]


@budget(20)
@given(mutation(tiny_scenario()), st.sampled_from(["file", "set"]), st.sampled_from(OUT_CHOICES),
       st.sampled_from([None, "valid", "bad"]))
def test_fuzz_kvsim_run(change, how, out, profile):
    """kvsim run with one hostile field (in the file or as --set), a hostile --out or profile: a
    complete run folder and exit 0, or one line and exit 2 with nothing written."""
    path, value, delete = change
    with workdir() as d:
        (d / "afile").write_text("not a folder\n")
        doc = tiny_scenario()
        args = []
        if how == "file" or delete:
            doc = with_value(doc, path, value, delete=delete)
        else:
            args += ["--set", f"{field_name(path)}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"]
        (d / "s.yaml").write_text(dump_yaml(doc))
        if profile:
            prof = tiny_profile() if profile == "valid" else with_value(tiny_profile(), ("compute", "peak_flop_per_s", "bf16"), value)
            (d / "p.yaml").write_text(dump_yaml(prof))
            args += ["--profile", "p.yaml"]
        if out:
            args += ["--out", out]
        before = files_under(d)
        res = timed(run_cli, "run", "s.yaml", *args, cwd=d)
        if res.returncode == 0:
            written = files_under(d) - before
            run_dir = d / out if out else next(d / w for w in written if w.startswith("runs/") and w.count("/") == 1)
            assert {"scenario.resolved.yaml", "summary.json", "steps.csv"} <= set(p.name for p in run_dir.iterdir())
            json.loads((run_dir / "summary.json").read_text())
            assert run_dir.resolve().is_relative_to(d.resolve())
            return
        assert_refused(res)
        assert files_under(d) == before, files_under(d) - before


bad_threads = st.sampled_from([-1, 0, 10**6])
bad_layers = st.sampled_from([0, -3, 10**6])
bad_devices = st.sampled_from(["cpu:abc", "gpu", "cuda:x", "cpu:1", "", "cuda:99999", "CPU"])
bad_words = st.text(max_size=6).filter(lambda s: s not in ("merged", "ordered", "random", "model", "attention",
                                                            "simulator", "bf16", "fp16", "float32"))


@budget(15)
@given(st.fixed_dictionaries({}, optional={"--threads": bad_threads, "--layers": bad_layers, "--device": bad_devices,
                                           "--attention": bad_words, "--prefill": bad_words, "--scores": bad_words,
                                           "--dtype": bad_words}).filter(bool))
def test_fuzz_hwprobe_run_options(options):
    """Any invalid option of hwprobe run: one line naming it, exit 2, before anything is measured or
    written (the device stays cpu unless --device is the option broken)."""
    pytest.importorskip("torch")
    with workdir() as d:
        (d / "s.yaml").write_text(dump_yaml(tiny_scenario()))
        args = ["run", "s.yaml"] + [x for k, v in options.items() for x in (k, str(v))]
        if "--device" not in options:
            args += ["--device", "cpu"]
        before = files_under(d)
        res = timed(run_cli, *args, cwd=d, tool="hwprobe")
        assert_refused(res)
        assert files_under(d) == before


@budget(10)
@given(st.lists(st.lists(csv_cells, min_size=5, max_size=5), max_size=4))
def test_fuzz_kvsim_report_validation(rows):
    """kvsim report with a hostile validation CSV: the report written whole, or one line naming the
    CSV with exit 2 and nothing written."""
    with workdir() as d:
        (d / "s.yaml").write_text(dump_yaml(tiny_scenario()))
        (d / "v.csv").write_text("scenario,metric,predicted,measured,rel_error\n" + "\n".join(",".join(r) for r in rows))
        before = files_under(d)
        res = timed(run_cli, "report", "s.yaml", "--validation", "v.csv", "--out", "rep/r.html", cwd=d)
        if res.returncode == 0:
            assert (d / "rep" / "r.html").read_text().rstrip().endswith("</html>")
            return
        assert_refused(res, "v.csv")
        assert files_under(d) == before
