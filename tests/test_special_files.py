"""Every path the tools read goes through the one input layer (sim/inputs/reader.py: regular files
only, size-capped before reading), so a FIFO, a device or a folder where a file is expected is one
line and exit 2 - for `kvsim run`, `plan`, `sweep` and `report` alike - and never blocks (issue #23).

Each FIFO here comes from `promise.fifo`: were it opened, a thread would feed it and the test would
fail on what was said, not hang; the Event it yields says whether anything opened it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from sim.inputs.errors import ConfigError
from sim.inputs.reader import read_bytes, read_text

from .conftest import run_cli
from .promise import assert_refused, dump_yaml, fifo, files_under, tiny_scenario, tiny_serving_scenario

FIFO_LINE = "cannot read file: not a regular file (a FIFO)"


def _write(d: Path, name: str, doc) -> Path:
    (d / name).write_text(dump_yaml(doc))
    return d / name


def _spec(base) -> dict:
    return {"base": base, "level": "projection", "max_batch": False,
            "axes": [{"grid": {"workload.batch_size": [1, 2]}}]}


# (what is a FIFO, how the command is set up around it, the command, fragments of the one line)
def _scenario(d):
    return ["run", "s.yaml", "--out", "o"], ["s.yaml"]


def _trace(d):
    doc = tiny_serving_scenario()
    doc["workload"]["arrivals"] = {"kind": "trace", "path": "t.csv"}
    _write(d, "serve.yaml", doc)
    return ["run", "serve.yaml", "--out", "o"], ["serve.yaml", "workload.arrivals.path", "t.csv"]


def _profile(d):
    _write(d, "ok.yaml", tiny_scenario())
    return ["run", "ok.yaml", "--profile", "p.yaml", "--out", "o"], ["p.yaml"]


def _hf_config(d):
    _write(d, "hf.yaml", tiny_scenario(d / "config.json"))
    return ["run", "hf.yaml", "--out", "o"], ["hf.yaml", "model.hf_config", "config.json"]


def _sweep_spec(d):
    return ["sweep", "spec.yaml", "--out", "o", "--no-progress"], ["spec.yaml"]


def _sweep_base(d):
    _write(d, "sw.yaml", _spec("base.yaml"))
    return ["sweep", "sw.yaml", "--out", "o", "--no-progress"], ["sw.yaml", "base", "base.yaml"]


def _sweep_profile(d):
    _write(d, "sw.yaml", {**_spec(tiny_scenario()), "profile": "prof.yaml"})
    return ["sweep", "sw.yaml", "--out", "o", "--no-progress"], ["sw.yaml", "profile", "prof.yaml"]


def _plan_scenario(d):
    return ["plan", "plan.yaml", "--rate", "1", "--ttft-p99-ms", "100"], ["plan.yaml"]


def _validation(d):
    _write(d, "ok.yaml", tiny_scenario())
    return ["report", "ok.yaml", "--validation", "v.csv", "--out", "r.html"], ["v.csv"]


def _validation_ratios(d):
    _write(d, "ok.yaml", tiny_scenario())
    (d / "v.csv").write_text("scenario,metric,predicted,measured,rel_error\nx,throughput_tok_per_s,1,2,\n")
    return ["report", "ok.yaml", "--validation", "v.csv", "--out", "r.html"], ["v.ratios.csv"]


CASES = {
    "scenario": ("s.yaml", _scenario), "trace": ("t.csv", _trace), "profile": ("p.yaml", _profile),
    "hf_config": ("config.json", _hf_config), "sweep spec": ("spec.yaml", _sweep_spec),
    "sweep base": ("base.yaml", _sweep_base), "sweep profile": ("prof.yaml", _sweep_profile),
    "plan scenario": ("plan.yaml", _plan_scenario), "validation csv": ("v.csv", _validation),
    "validation ratios": ("v.ratios.csv", _validation_ratios),
}


@pytest.mark.parametrize("case", CASES)
def test_a_fifo_where_a_file_is_read_is_one_line_and_never_opened(tmp_path, case):
    name, setup = CASES[case]
    args, fragments = setup(tmp_path)
    with fifo(tmp_path / name) as opened:
        before = files_under(tmp_path)
        res = run_cli(*args, cwd=tmp_path)
        assert not opened.is_set(), "the FIFO was opened"
        assert_refused(res, *fragments, FIFO_LINE)
        assert files_under(tmp_path) == before


@pytest.fixture(scope="module")
def plan_folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("plan")
    _write(d, "s.yaml", tiny_serving_scenario())
    res = run_cli("plan", "s.yaml", "--rate", "20", "--gpus", "h100-sxm", "--counts", "1", "--policies", "full_hbm",
                  "--requests", "12", "--workers", "1", "--out", "plan", cwd=d)
    assert res.returncode == 0, res.stderr
    return d / "plan"


@pytest.mark.parametrize("name", ["plan.json", "plan.csv", "probes.csv"])
def test_a_fifo_in_a_plan_folder_is_one_line(tmp_path, plan_folder, name):
    folder = tmp_path / "plan"
    shutil.copytree(plan_folder, folder)
    _write(tmp_path, "ok.yaml", tiny_scenario())
    (folder / name).unlink()
    with fifo(folder / name) as opened:
        res = run_cli("report", "ok.yaml", "--plan", "plan", "--out", "r.html", cwd=tmp_path)
        assert not opened.is_set()
        assert_refused(res, f"plan/{name}", FIFO_LINE)
        assert not (tmp_path / "r.html").exists()


def test_a_plan_folder_that_is_a_fifo_is_one_line(tmp_path):
    _write(tmp_path, "ok.yaml", tiny_scenario())
    with fifo(tmp_path / "plan") as opened:
        res = run_cli("report", "ok.yaml", "--plan", "plan", "--out", "r.html", cwd=tmp_path)
        assert not opened.is_set()
        assert_refused(res, "plan", "not a folder")


@pytest.mark.parametrize("target, kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device"),
                                          (".", "a folder")])
def test_a_link_to_a_device_or_a_folder_is_refused_before_reading(tmp_path, target, kind):
    (tmp_path / "s.yaml").symlink_to(target if target.startswith("/") else tmp_path)
    assert_refused(run_cli("run", "s.yaml", "--out", "o", cwd=tmp_path), "s.yaml", f"not a regular file ({kind})")
    assert not (tmp_path / "o").exists()


def test_a_link_to_a_regular_file_is_read(tmp_path):
    _write(tmp_path, "real.yaml", tiny_scenario())
    (tmp_path / "s.yaml").symlink_to(tmp_path / "real.yaml")
    res = run_cli("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert res.returncode == 0, res.stderr


def test_a_file_over_the_cap_is_refused_by_its_size(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:  # sparse: 2 MiB by its size, no data written
        fh.truncate(2 * 2**20)
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        read_text(big, 2**20)
    with pytest.raises(ConfigError, match="larger than 0.5 MiB"):
        read_bytes(big, 2**19)


def test_the_reader_refuses_by_type_before_it_opens(tmp_path, monkeypatch):
    """read_bytes stats first: on a FIFO or a device, os.open is never called."""
    import sim.inputs.reader as reader

    calls = []

    class Os:  # the reader's `os`, its open() recorded
        def __getattr__(self, name):
            return getattr(os, name)

        def open(self, *args, **kwargs):
            calls.append(args)
            return os.open(*args, **kwargs)

    monkeypatch.setattr(reader, "os", Os())
    with fifo(tmp_path / "f") as opened:
        for path in (tmp_path / "f", Path("/dev/zero")):
            with pytest.raises(ConfigError, match="not a regular file"):
                read_bytes(path)
        assert not opened.is_set()
    assert calls == []
    (tmp_path / "ok").write_text("fine")
    assert read_bytes(tmp_path / "ok") == b"fine" and len(calls) == 1


def test_a_sweep_base_through_a_link_is_read(tmp_path):
    """A sweep spec whose base is a symlink to a scenario runs (links are followed, then checked)."""
    _write(tmp_path, "real.yaml", tiny_scenario())
    (tmp_path / "base.yaml").symlink_to(tmp_path / "real.yaml")
    (tmp_path / "sw.yaml").write_text(yaml.safe_dump(_spec("base.yaml")))
    res = run_cli("sweep", "sw.yaml", "--out", "o", "--no-progress", "--workers", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "o" / "table.csv").exists()
