"""Property-based tests of the surfaces added since the loaders were fuzzed (issue #23): trace rows,
`kvsim plan` flags, sweep specs and result-store entries. Hostile input ends in one line naming the
file or flag with exit 2 and nothing written, or in a valid result; a damaged store entry is
recomputed, never used and never an error. House style of tests/test_fuzz_inputs.py: the `ci`
profile runs a few hundred cases, derandomised; `--hypothesis-profile=thorough` runs more."""

from __future__ import annotations

import contextlib
import json
import math
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from sim.inputs.errors import ConfigError
from sim.inputs.limits import MAX_ARRIVAL_S, MAX_TOKENS

from .conftest import run_cli
from .promise import (
    HOSTILE_VALUES,
    assert_error_line,
    assert_refused,
    dump_yaml,
    files_under,
    leaf_paths,
    tiny_scenario,
    tiny_serving_scenario,
    with_value,
)
from .test_fuzz_inputs import budget, hostile, timed, trees, workdir
from .test_ranges import strict_json
from .test_store_trust import Here, Square, entry_text

# ---- trace rows ----------------------------------------------------------------------------------

cells = st.one_of(st.sampled_from(["", "0", "1", "-1", "0.5", "1e7", "1e20", "1e308", "inf", "nan", "-0", "4194304",
                                   "4194305", "1_000", " 3 ", "abc", '"', "1,2", "\x00", "1e999"]),
                  st.integers(-5, 10**8).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                  st.text(max_size=5))
headers = st.one_of(st.just("arrival_s,prompt_tokens,output_tokens"),
                    st.permutations(["arrival_s", "prompt_tokens", "output_tokens", "note"]).map(",".join),
                    st.sampled_from(["arrival_s,prompt_tokens,output_tokens,arrival_s", "arrival_s,prompt_tokens",
                                     "a,b,c", "", "arrival_s;prompt_tokens;output_tokens"]))


@budget(60)
@given(headers, st.lists(st.lists(cells, min_size=0, max_size=5), max_size=6))
def test_fuzz_trace_rows(header, rows):
    """read_trace: one ConfigError naming the trace, or requests whose every figure is in range."""
    from sim.inputs.requests import read_trace

    with workdir() as d:
        path = d / "t.csv"
        path.write_text(header + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
        try:
            reqs = timed(read_trace, path)
        except ConfigError as err:
            assert_error_line(err, str(path))
            return
        assert len(reqs) >= 1
        assert all(math.isfinite(a) and 0 <= a <= MAX_ARRIVAL_S for a in reqs.arrival_s)
        assert all(1 <= int(t) <= MAX_TOKENS for t in [*reqs.prompt_tokens, *reqs.output_tokens])
        assert list(reqs.arrival_s) == sorted(reqs.arrival_s)


@budget(15)
@given(st.lists(st.lists(cells, min_size=3, max_size=3), min_size=1, max_size=4))
def test_fuzz_kvsim_run_of_a_trace(rows):
    """kvsim run of a hostile trace: the run folder and the printed summary, or one line naming the
    trace's field, exit 2, nothing written. (The step budget is lowered to keep each case short:
    tests/test_cost_limits.py checks the real one.)"""
    import sim.inputs.cost as cost

    with workdir() as d, mock.patch.object(cost, "MAX_SERVING_STEPS", 20_000):
        (d / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(",".join(r) for r in rows))
        doc = tiny_serving_scenario()
        doc["workload"]["arrivals"] = {"kind": "trace", "path": "t.csv"}
        doc["scheduler"] = {"max_num_seqs": 8, "max_num_batched_tokens": 4096}
        (d / "s.yaml").write_text(dump_yaml(doc))
        before = files_under(d)
        res = timed(run_cli, "run", "s.yaml", "--out", "o", cwd=d)
        if res.returncode == 0:
            assert "TTFT mean / p50 / p99" in res.stdout and (d / "o" / "summary.json").exists()
            strict_json((d / "o" / "summary.json").read_text())
            return
        assert_refused(res, "s.yaml", "workload.arrivals")
        assert files_under(d) == before


# ---- kvsim plan flags ------------------------------------------------------------------------------

# values the flags' own types parse (an unparseable one, `--rate x`, is typer's usage error, exit 2)
flag_values = st.one_of(st.sampled_from(["0", "-1", "1", "20", "1e12", "1e-9", "1e308", "-1e308", "nan", "inf", "-inf",
                                         "5e-324", "1e6", "3600001", "300000"]),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr))
PLAN_FLAGS = {
    "--rate": flag_values, "--ttft-p99-ms": flag_values, "--tpot-p99-ms": flag_values, "--max-factor": flag_values,
    "--requests": st.sampled_from(["0", "-1", "1", "12", "100001"]),
    "--price": st.one_of(flag_values.map(lambda v: f"h100-sxm={v}"),
                         st.sampled_from(["h100-sxm", "=1", "tpu=1", "h100-sxm=$2", "h100-sxm=", "h100-sxm=x"])),
    "--gpus": st.sampled_from(["h100-sxm", "", ",", "tpu-v9", "h100-sxm,,l40s", "H100-SXM"]),
    "--counts": st.sampled_from(["1", "0", "65", "1,x", "", "-1", "1.5"]),
    "--policies": st.sampled_from(["full_hbm", "tiered:0", "tiered:nan", "tiered:1e308", "tiered:auto/split", "x", ""]),
}
BASE_FLAGS = {"--rate": "20", "--gpus": "h100-sxm", "--counts": "1", "--policies": "full_hbm", "--requests": "12"}


@budget(25)
@given(st.fixed_dictionaries({}, optional=PLAN_FLAGS).filter(bool))
def test_fuzz_plan_flags(flags):
    """kvsim plan with hostile flags: rows as strict JSON (no NaN, no Infinity) and the folder the
    report reads back, or one line naming a flag, exit 2, nothing written."""
    with workdir() as d:
        (d / "s.yaml").write_text(dump_yaml(tiny_serving_scenario()))
        args = [x for k, v in {**BASE_FLAGS, **flags}.items() for x in (k, v)]
        before = files_under(d)
        res = timed(run_cli, "plan", "s.yaml", *args, "--workers", "1", "--json", "--out", "plan", cwd=d)
        if res.returncode in (0, 1):  # 1: the search ran and nothing passed
            rows = strict_json(res.stdout)
            assert rows and all(math.isfinite(r["usd_per_hour"]) for r in rows)
            assert (res.returncode == 1) == (not any(r["status"] == "pass" for r in rows))
            from sim.report.plan_input import load_plan

            load_plan(d / "plan")
            return
        line = assert_refused(res)
        assert any(flag in line for flag in PLAN_FLAGS), line
        assert files_under(d) == before


# ---- sweep specs -----------------------------------------------------------------------------------

def _spec() -> dict:
    return {"base": tiny_scenario(), "level": "projection", "max_batch": False, "keep": ["fits", "throughput_tok_per_s"],
            "axes": [{"grid": {"workload.batch_size": {"range": [1, 5, 2]}, "policy.hbm_ratio": [0.5, 1.0]}},
                     {"zip": {"workload.seed": [1, 2]}}]}


range_values = st.one_of(hostile, st.sampled_from([1e308, -1e308, 5e-324, 10**400, 2**53, 2**53 + 1, 1e-300]))


@budget(60)
@given(st.one_of(
    st.tuples(st.sampled_from(leaf_paths(_spec())), hostile, st.sampled_from([False] * 7 + [True])),
    st.tuples(st.sampled_from([("axes", 0, "grid", "workload.batch_size", "range", i) for i in range(3)]), range_values,
              st.just(False)),
    st.tuples(st.just(("axes",)), trees.map(lambda t: [{"grid": {"workload.batch_size": t}}]), st.just(False)),
))
def test_fuzz_sweep_specs(change):
    """load_spec of a spec with one hostile field: one ConfigError naming the spec, or a plan whose
    points run to a table with a row each."""
    from sim.sweep.run import run_sweep
    from sim.sweep.spec import load_spec

    path, value, delete = change
    with workdir() as d:
        p = d / "sweep.yaml"
        p.write_text(dump_yaml(with_value(_spec(), path, value, delete=delete)))
        try:
            plan = timed(load_spec, p)
        except ConfigError as err:
            assert_error_line(err, str(p))
            return
        if len(plan.points) <= 8 and all(pt.scenario.workload.batch_size <= 64 for pt in plan.points):
            res = timed(run_sweep, p, d / "out", workers=1, progress=False)
            assert len((d / "out" / "table.csv").read_text().splitlines()) == res.points + 1


# ---- result-store entries --------------------------------------------------------------------------

def _entries():
    t = Square(3)
    good = json.loads(entry_text(t.key, t.kind, t.inputs(), t.run()))
    leaves = leaf_paths(good)
    mutated = st.tuples(st.sampled_from(leaves), st.one_of(hostile, trees), st.booleans()).map(
        lambda c: json.dumps(with_value(good, c[0], c[1], delete=c[2]), allow_nan=True).encode())
    return st.one_of(st.binary(max_size=300), trees.map(lambda x: json.dumps(x, allow_nan=True).encode()), mutated,
                     st.sampled_from(HOSTILE_VALUES).map(lambda v: json.dumps(v, allow_nan=True).encode()))


@budget(100)
@given(_entries())
def test_fuzz_store_entries(data):
    """Whatever a store file holds, run_tasks returns each task's own result: a damaged entry is
    recomputed (and counted), never used, never an exception."""
    from sim.runner.store import Entry, ResultStore
    from sim.runner.tasks import run_tasks

    with workdir() as d:
        store = ResultStore(d)
        tasks = [Square(n) for n in (2, 3, 5)]
        path = store.path(tasks[1].key)
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        entry, _ = store.lookup(tasks[1].key, tasks[1].kind, tasks[1].accepts)
        done = timed(run_tasks, tasks, Here(), store=store)
        assert done.results == [t.run() for t in tasks]
        assert done.damaged == (entry is Entry.DAMAGED) and done.stored_before == (entry is Entry.FOUND)
        assert store.lookup(tasks[1].key, tasks[1].kind, tasks[1].accepts) == (Entry.FOUND, tasks[1].run())


@budget(20)
@given(st.sampled_from(["throughput_tok_per_s", "fits", "max_batch", "tpot_p50_s", "hbm_peak_bytes", "extra"]),
       st.one_of(hostile, trees), st.booleans(), st.booleans())
def test_fuzz_stored_sweep_points(field, value, delete, fix_checksum):
    """A real sweep point's entry with one result field changed: without a matching checksum, or
    with one but a result no summary has, the table a rerun writes is the fresh one. (One rewritten
    with its checksum on purpose, of the right shape, is used: the trust model, docs/sweeps.md.)"""
    from sim.runner.store import Entry, ResultStore
    from sim.sweep.points import KIND, accepts_summary
    from sim.sweep.run import run_sweep

    from .test_sweep import small_spec, write_spec

    with workdir() as d:
        spec = write_spec(d, small_spec(axes=[{"grid": {"workload.batch_size": [1, 2]}}]))
        run_sweep(spec, d / "out", workers=1, progress=False)
        fresh = (d / "out" / "table.csv").read_text()
        path = sorted((d / "out" / "points").glob("*/*.json"))[0]
        doc = json.loads(path.read_text())
        before = doc["result"]
        doc["result"] = with_value(before, (field,), value, delete=delete and field in before)
        text = json.dumps(doc, allow_nan=True)
        if fix_checksum:
            with contextlib.suppress(ValueError):  # NaN has no canonical JSON: left with the old checksum
                text = entry_text(doc["key"], doc["kind"], doc["inputs"], doc["result"])
        path.write_text(text)
        entry, _ = ResultStore(d / "out" / "points").lookup(doc["key"], KIND, lambda r: accepts_summary("projection", r))
        res = timed(run_sweep, spec, d / "out", workers=1, progress=False)
        assert res.damaged == (entry is Entry.DAMAGED)
        if entry is Entry.DAMAGED or doc["result"] == before:
            assert (d / "out" / "table.csv").read_text() == fresh
        else:
            assert fix_checksum  # rewritten with its checksum, of the right shape: used (the trust limit)
