"""Result stores verify what they read (issue #23): an entry is used only when its recorded kind and
inputs hash to its key, its checksum matches its content and its result has its task's shape;
anything else - moved under another key, edited, of the wrong type, missing a field, a FIFO, a link to
an endless device, too large - is recomputed, overwritten and counted ("recomputed N damaged
entries"), and the output is what a fresh run writes. Sweep points, plan candidates and projection
cells alike."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest

from sim import __version__
from sim.runner.store import Entry, ResultStore, content_checksum, result_key
from sim.runner.tasks import run_tasks

from .conftest import run_cli
from .promise import dump_yaml, fifo, tiny_serving_scenario
from .test_sweep import small_spec, write_spec

# ---- the store itself --------------------------------------------------------------------------


@dataclass(frozen=True)
class Square:
    """A task whose result is {"square": n * n}."""

    kind: ClassVar[str] = "test square"
    n: int

    def inputs(self) -> dict[str, Any]:
        return {"n": self.n}

    @property
    def key(self) -> str:
        return result_key(self.kind, self.inputs())

    def run(self) -> dict:
        return {"square": self.n * self.n}

    def accepts(self, result: Any) -> bool:
        return isinstance(result, dict) and set(result) == {"square"} and type(result["square"]) is int


class Here:
    """An executor running every batch in this process."""

    def start(self, batches):
        return ((i, [t.run() for t in b]) for i, b in enumerate(batches))


def entry_text(key: str, kind: str, inputs: dict, result: Any, **changes) -> str:
    doc = {"key": key, "kind": kind, "simulator": __version__, "inputs": inputs, "result": result,
           "checksum": content_checksum(key, kind, __version__, inputs, result)}
    doc.update(changes)
    return json.dumps(doc)


def test_a_written_entry_is_found_verified(tmp_path):
    store = ResultStore(tmp_path)
    t = Square(3)
    assert store.lookup(t.key, t.kind, t.accepts) == (Entry.MISSING, None)
    store.write(t.key, t.kind, t.inputs(), t.run())
    assert store.lookup(t.key, t.kind, t.accepts) == (Entry.FOUND, {"square": 9})
    doc = json.loads(store.path(t.key).read_text())
    assert doc["checksum"] == content_checksum(t.key, t.kind, __version__, {"n": 3}, {"square": 9})


def _damage(store: ResultStore, t: Square) -> dict[str, Any]:
    """Ways an entry at t's key is damaged: name -> the bytes there (or a callable making the file)."""
    other = Square(4)
    good = entry_text(t.key, t.kind, t.inputs(), t.run())
    return {
        "not json": b"{not json",
        "a list": b"[]",
        "a string": b'"x"',
        "empty object": b"{}",
        "missing checksum": json.dumps({k: v for k, v in json.loads(good).items() if k != "checksum"}).encode(),
        "an extra key": entry_text(t.key, t.kind, t.inputs(), t.run(), extra=1).encode(),
        "checksum of a string type": entry_text(t.key, t.kind, t.inputs(), t.run(), checksum=7).encode(),
        "moved under another key": entry_text(other.key, other.kind, other.inputs(), other.run()).encode(),
        "renamed key, inputs of another": entry_text(t.key, t.kind, other.inputs(), other.run()).encode(),
        "another kind": entry_text(t.key, "other kind", t.inputs(), t.run()).encode(),
        "another simulator": entry_text(t.key, t.kind, t.inputs(), t.run(), simulator="0.0.0").encode(),
        "result edited": good.replace('{"square": 9}', '{"square": 10}').encode(),
        "result of the wrong shape, checksum right": entry_text(t.key, t.kind, t.inputs(), {"square": "9"}).encode(),
        "result missing a field, checksum right": entry_text(t.key, t.kind, t.inputs(), {}).encode(),
        "NaN in it": good.replace('"square": 9', '"square": NaN').encode(),
        "deeply nested": ("[" * 100_000 + "]" * 100_000).encode(),
        "not UTF-8": b"\xff\xfe{}",
    }


@pytest.mark.parametrize("how", list(_damage(ResultStore("."), Square(3))) + ["fifo", "link to /dev/zero",
                                                                          "too large", "a folder"])
def test_a_damaged_entry_is_recomputed_counted_and_overwritten(tmp_path, how):
    store = ResultStore(tmp_path)
    tasks = [Square(n) for n in range(1, 6)]
    t = tasks[2]
    path = store.path(t.key)
    path.parent.mkdir(parents=True)
    with fifo(path if how == "fifo" else tmp_path / "unused") as opened:
        if how == "fifo":
            pass
        elif how == "link to /dev/zero":
            path.symlink_to("/dev/zero")
        elif how == "too large":
            with open(path, "wb") as fh:
                fh.truncate(9 * 2**20)
        elif how == "a folder":
            path.mkdir()
        else:
            path.write_bytes(_damage(store, t)[how])
        if how != "a folder":
            assert store.lookup(t.key, t.kind, t.accepts) == (Entry.DAMAGED, None)
            done = run_tasks(tasks, Here(), store=store)
            assert (done.computed, done.stored_before, done.damaged) == (5, 0, 1)
            assert done.results == [s.run() for s in tasks]
            assert store.lookup(t.key, t.kind, t.accepts) == (Entry.FOUND, t.run())  # overwritten
        else:
            assert store.lookup(t.key, t.kind, t.accepts) == (Entry.DAMAGED, None)
        assert not opened.is_set()


# ---- sweep points -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A sweep of 8 projection points, run once: (spec, out folder, table.csv text)."""
    d = tmp_path_factory.mktemp("sweep")
    spec = write_spec(d, small_spec())
    res = run_cli("sweep", str(spec), "--out", str(d / "out"), "--workers", "1", "--no-progress")
    assert res.returncode == 0, res.stderr
    return spec, d / "out", (d / "out" / "table.csv").read_text()


def _copy_sweep(swept, tmp_path) -> tuple[Path, Path, pd.DataFrame]:
    spec, out, _ = swept
    shutil.copytree(out, tmp_path / "out")
    return spec, tmp_path / "out", pd.read_csv(tmp_path / "out" / "table.csv")


def _entry(out: Path, key: str) -> Path:
    return out / "points" / key[:2] / f"{key}.json"


def _rerun(spec: Path, out: Path):
    return run_cli("sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress")


def test_a_point_moved_under_another_key_is_recomputed_not_used(swept, tmp_path):
    """Batch 1's entry copied over batch 7's: its recorded inputs say batch 1, its name batch 7."""
    spec, out, table = _copy_sweep(swept, tmp_path)
    full = table[table["policy.kind"] == "full_hbm"].set_index("workload.batch_size")["point_hash"]
    shutil.copyfile(_entry(out, full[1]), _entry(out, full[7]))
    res = _rerun(spec, out)
    assert res.returncode == 0, res.stderr
    assert f"kvsim: recomputed 1 damaged entry in {out / 'points'}" in res.stderr.splitlines()
    assert "(1 computed, 7 stored already)" in res.stderr
    assert (out / "table.csv").read_text() == swept[2]


def test_an_edited_result_is_recomputed(swept, tmp_path):
    spec, out, table = _copy_sweep(swept, tmp_path)
    path = _entry(out, table["point_hash"][0])
    doc = json.loads(path.read_text())
    doc["result"]["throughput_tok_per_s"] = 1.0  # the checksum now disagrees
    path.write_text(json.dumps(doc))
    res = _rerun(spec, out)
    assert "recomputed 1 damaged entry" in res.stderr and (out / "table.csv").read_text() == swept[2]


@pytest.mark.parametrize("result", [[], "x", None, {"fits": True}], ids=["list", "string", "null", "missing fields"])
def test_a_point_of_the_wrong_type_or_missing_fields_is_recomputed(swept, tmp_path, result):
    """Checksum and key right, the result not a summary: the schema check alone catches it (no
    AttributeError, KeyError or ValueError while the table is built)."""
    spec, out, table = _copy_sweep(swept, tmp_path)
    key = table["point_hash"][3]
    doc = json.loads(_entry(out, key).read_text())
    _entry(out, key).write_text(entry_text(key, doc["kind"], doc["inputs"], result))
    res = _rerun(spec, out)
    assert res.returncode == 0, res.stderr
    assert "recomputed 1 damaged entry" in res.stderr and (out / "table.csv").read_text() == swept[2]


def test_damaged_points_are_counted_once_in_the_output(swept, tmp_path):
    spec, out, table = _copy_sweep(swept, tmp_path)
    keys = list(table["point_hash"][:3])
    _entry(out, keys[0]).write_text("[]")
    _entry(out, keys[1]).unlink()
    _entry(out, keys[1]).symlink_to("/dev/zero")
    _entry(out, keys[2]).unlink()
    with fifo(_entry(out, keys[2])) as opened:
        res = _rerun(spec, out)
        assert not opened.is_set()
    assert res.returncode == 0, res.stderr
    assert [line for line in res.stderr.splitlines() if "recomputed" in line] == [
        f"kvsim: recomputed 3 damaged entries in {out / 'points'}"]
    assert (out / "table.csv").read_text() == swept[2]
    again = _rerun(spec, out)  # overwritten: nothing damaged any more
    assert "recomputed" not in again.stderr and "(0 computed, 8 stored already)" in again.stderr


# ---- plan candidates ----------------------------------------------------------------------------

PLAN = ["--rate", "20", "--gpus", "h100-sxm,l40s", "--counts", "1", "--policies", "full_hbm", "--requests", "12",
        "--workers", "1", "--json"]


def test_a_candidate_under_another_candidates_key_is_searched_again(tmp_path):
    """An L40S candidate's entry under the H100 key: the plan's rows are the fresh plan's."""
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_serving_scenario()))
    fresh = run_cli("plan", "s.yaml", *PLAN, cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    first = run_cli("plan", "s.yaml", *PLAN, "--cache", "cache", cwd=tmp_path)
    assert first.stdout == fresh.stdout
    entries = {json.loads(p.read_text())["inputs"]["candidate"]["gpu"]: p for p in (tmp_path / "cache").glob("*/*.json")}
    shutil.copyfile(entries["l40s"], entries["h100-sxm"])
    res = run_cli("plan", "s.yaml", *PLAN, "--cache", "cache", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "kvsim: recomputed 1 damaged entry in cache" in res.stderr.splitlines()
    assert "kvsim: plan: 1 candidates searched, 1 read from cache" in res.stderr.splitlines()
    assert res.stdout == fresh.stdout


def test_a_candidate_of_the_wrong_shape_is_searched_again(tmp_path):
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_serving_scenario()))
    first = run_cli("plan", "s.yaml", *PLAN, "--cache", "cache", cwd=tmp_path)
    for path in (tmp_path / "cache").glob("*/*.json"):
        doc = json.loads(path.read_text())
        result = {k: v for k, v in doc["result"].items() if k != "probes"}  # a field missing
        path.write_text(entry_text(doc["key"], doc["kind"], doc["inputs"], result))
    res = run_cli("plan", "s.yaml", *PLAN, "--cache", "cache", cwd=tmp_path)
    assert res.returncode == 0 and "recomputed 2 damaged entries" in res.stderr, res.stderr
    assert res.stdout == first.stdout


# ---- projection cells ---------------------------------------------------------------------------


def test_a_damaged_projection_cell_is_recomputed(tmp_path):
    from sim.runner.options import Execution
    from sim.studies.projection_grid import DEFAULT_GRID, run_grid

    grid = replace(DEFAULT_GRID, models=(("7B", "deepseek-r1-distill-qwen-7b"),), weight_dtypes=("bf16",),
                   gpus=("h100-sxm", "rtx-4090"), batches=(1, 4), lengths=(2048,))
    fresh = run_grid(grid, workers=1)
    cache = tmp_path / "cache"
    run_grid(grid, execution=Execution(workers=1, cache=cache))
    cells = {json.loads(p.read_text())["inputs"]["labels"]["gpu"]: p for p in cache.glob("*/*.json")}
    shutil.copyfile(cells["rtx-4090"], cells["h100-sxm"])  # another cell's rows under this key
    again = run_grid(grid, execution=Execution(workers=1, cache=cache))
    assert (again.computed, again.stored, again.damaged) == (1, 1, 1)
    assert again.points.to_csv(index=False) == fresh.points.to_csv(index=False)
    doc = json.loads(cells["h100-sxm"].read_text())
    doc["result"]["points"][0]["gpu"] = "rtx-4090"  # rows labelled as another cell, checksum made right
    cells["h100-sxm"].write_text(entry_text(doc["key"], doc["kind"], doc["inputs"], doc["result"]))
    third = run_grid(grid, execution=Execution(workers=1, cache=cache))
    assert third.damaged == 1 and third.limits.to_csv(index=False) == fresh.limits.to_csv(index=False)
