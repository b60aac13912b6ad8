"""`kvsim sweep`: spec expansion and errors, stored points and resuming (after SIGKILL and SIGINT),
the table, and the Ray executor against the local one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.inputs.errors import ConfigError
from sim.runner.tasks import TEST_PAUSE
from sim.sweep.run import run_sweep
from sim.sweep.spec import load_spec
from tests.conftest import REPO, SCENARIOS, run_cli, small_scenario


def write_spec(tmp_path: Path, spec: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def small_spec(**extra) -> dict:
    """8 projection points of the small 7B scenario: 4 batches x 2 policies."""
    return {"base": small_scenario(), "level": "projection", "max_batch": False,
            "axes": [{"grid": {"workload.batch_size": {"range": [1, 9, 2]}}},
                     {"zip": {"policy.kind": ["full_hbm", "tiered"], "policy.hbm_ratio": [1.0, 0.5],
                              "policy.evict_ratio": [0.0, 0.1]}}], **extra}


def read_table(out: Path) -> tuple[str, pd.DataFrame]:
    return (out / "table.csv").read_text(), pd.read_parquet(out / "table.parquet")


# ---- the spec ---------------------------------------------------------------------------------

def test_axes_expand_in_spec_order(tmp_path):
    spec = {"base": small_scenario(), "level": "projection",
            "axes": [{"grid": {"hardware.gpu": ["h100-sxm", "h200-sxm"], "policy.hbm_ratio": {"range": [0.2, 0.5, 0.1]}}},
                     {"zip": {"workload.batch_size": [1, 2], "workload.seed": [5, 6]}},
                     {"points": [{"policy.kind": "evict_only"}, {"policy.kind": "tiered", "policy.evict_ratio": 0.2}]}]}
    plan = load_spec(write_spec(tmp_path, spec))
    assert len(plan.points) == 2 * 3 * 2 * 2
    assert plan.columns == ["hardware.gpu", "policy.hbm_ratio", "workload.batch_size", "workload.seed",
                            "policy.kind", "policy.evict_ratio"]
    assert plan.points[0].overrides == {"hardware.gpu": "h100-sxm", "policy.hbm_ratio": 0.2, "workload.batch_size": 1,
                                        "workload.seed": 5, "policy.kind": "evict_only"}
    assert [p.overrides["policy.hbm_ratio"] for p in plan.points[:12:4]] == [0.2, 0.3, 0.4]  # no 0.30000000000000004
    last = plan.points[-1]
    assert (last.scenario.hardware.gpu, last.scenario.workload.seed, last.scenario.policy.evict_ratio) == ("h200-sxm", 6, 0.2)
    assert len({p.key for p in plan.points}) == len(plan.points)
    assert plan.metrics[0] == "fits" and "throughput_tok_per_s" in plan.metrics


def test_base_file_relative_to_spec(tmp_path):
    spec = {"base": str(Path(os.path.relpath(SCENARIOS / "h200-7b-batch.yaml", tmp_path))), "level": "projection",
            "axes": [{"grid": {"workload.batch_size": [4]}}]}
    plan = load_spec(write_spec(tmp_path, spec))
    assert plan.points[0].scenario.name == "h200-7b-batch" and plan.points[0].scenario.workload.batch_size == 4


@pytest.mark.parametrize("change, field, words", [
    ({"levl": "full"}, "levl", "unknown key"),
    ({"level": "fastest"}, "level", "'full', 'fast' or 'projection'"),
    ({"axes": [{"grid": {"workload.batch_size": [1, 0]}}]}, "workload.batch_size", "point 1 (workload.batch_size=0)"),
    ({"axes": [{"grid": {"workload.batchsize": [1]}}]}, "workload.batchsize", "unknown key"),
    ({"axes": [{"zip": {"workload.batch_size": [1, 2], "workload.seed": [1]}}]}, "axes.0.zip", "differ in length"),
    ({"axes": [{"grid": {"workload.batch_size": {"range": [8, 1, 1]}}}]}, "axes.0.grid.workload.batch_size.range", "empty range"),
    ({"axes": [{"grid": {"workload.batch_size": 4}}]}, "axes.0.grid.workload.batch_size", "expected a list"),
    ({"axes": [{"grid": {"workload.seed": [1]}, "zip": {"workload.seed": [1]}}]}, "axes.0", "exactly one of"),
    ({"axes": [{"grid": {"workload.seed": [1]}}, {"points": [{"workload.seed": 2}]}]}, "axes.1", "swept by axes.0"),
    ({"keep": ["fits", "speed"]}, "keep.1", "unknown metric 'speed'"),
    ({"base": "missing.yaml"}, "base", "file not found"),
    ({"profile": "missing.yaml"}, "profile", "file not found"),
])
def test_bad_spec_is_one_line_naming_file_and_field(tmp_path, change, field, words):
    spec = write_spec(tmp_path, {**small_spec(), **change})
    with pytest.raises(ConfigError) as exc:
        load_spec(spec)
    line = str(exc.value)
    assert "\n" not in line and line.startswith(f"{spec}: ") and words in line, line
    assert exc.value.field == field or f": {field}: " in line, line


def test_bad_spec_writes_nothing(tmp_path):
    spec = write_spec(tmp_path, {**small_spec(), "axes": [{"grid": {"workload.batch_size": [1, -1]}}]})
    res = run_cli("sweep", str(spec), "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and res.stderr.startswith(f"kvsim: {spec}: workload.batch_size: point 1"), res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()


# ---- the hash ---------------------------------------------------------------------------------

def test_hash_follows_scenario_profile_version_and_level(tmp_path, monkeypatch):
    import sim.runner.store as store
    import sim.sweep.points as pts
    from sim.inputs.scenario import scenario_from_dict

    sc = scenario_from_dict(small_scenario(), "x")
    level = pts.Level("projection", False)
    key = pts.point_key(sc, None, {}, level)
    assert key == pts.point_key(scenario_from_dict(small_scenario(), "y"), None, {}, level)  # the source is no input
    others = [pts.point_key(sc.model_copy(update={"name": "other"}), None, {}, level),
              pts.point_key(sc, "ab" * 32, {}, level),
              pts.point_key(sc, None, {"model.hf_config": "cd" * 32}, level),
              pts.point_key(sc, None, {}, pts.Level("projection", True)),
              pts.point_key(sc, None, {}, pts.Level("full", False))]
    monkeypatch.setattr(store, "__version__", "9.9.9")
    others.append(pts.point_key(sc, None, {}, level))
    assert len({key, *others}) == 1 + len(others)


# ---- running ----------------------------------------------------------------------------------

def test_sweep_writes_table_and_reruns_compute_nothing(tmp_path):
    spec = write_spec(tmp_path, {**small_spec(keep=["fits", "throughput_tok_per_s", "tpot_p50_s"]),
                                 "axes": small_spec()["axes"] + [{"points": [{"workload.seed": 3}, {"workload.seed": 3}]}]})
    out = tmp_path / "out"
    res = run_cli("sweep", str(spec), "--out", str(out), "--workers", "2")
    assert res.returncode == 0, res.stderr
    assert "16 points (8 computed, 0 stored already, 8 repeated)" in res.stderr
    csv, df = read_table(out)
    assert list(df.columns) == ["workload.batch_size", "policy.kind", "policy.hbm_ratio", "policy.evict_ratio",
                                "workload.seed", "fits",
                                "throughput_tok_per_s", "tpot_p50_s", "point_hash"]
    assert df["workload.batch_size"].tolist() == [b for b in (1, 3, 5, 7) for _ in range(4)]
    assert df["policy.kind"].tolist()[:4] == ["full_hbm", "full_hbm", "tiered", "tiered"]
    assert df["fits"].all() and (df["throughput_tok_per_s"] > 0).all()
    assert csv.count("\n") == 17 and csv.startswith("workload.batch_size,policy.kind,")
    assert len(list((out / "points").glob("*/*.json"))) == 8
    res = run_cli("sweep", str(spec), "--out", str(out), "--workers", "1")
    assert res.returncode == 0 and "(0 computed, 8 stored already, 8 repeated)" in res.stderr, res.stderr
    assert read_table(out)[0] == csv


def test_point_that_does_not_fit_is_a_result(tmp_path):
    spec = write_spec(tmp_path, {**small_spec(), "axes": [{"grid": {"model.name": ["llama-3.1-70b"],
                                                                    "workload.batch_size": [1, 4000]}}]})
    run_sweep(spec, tmp_path / "out", workers=1, progress=False)
    df = pd.read_parquet(tmp_path / "out" / "table.parquet")
    assert df["fits"].tolist() == [True, False]
    assert df.loc[1, "hbm_shortfall_bytes"] > 0
    assert df.loc[1, ["decode_s", "throughput_tok_per_s", "tpot_p50_s"]].isna().all()


def test_full_level_and_mixed_kinds_of_value(tmp_path):
    lengths = [200, {"dist": "uniform", "min": 100, "max": 200}]
    spec = write_spec(tmp_path, {**small_spec(), "level": "full",
                                 "axes": [{"grid": {"workload.reasoning_tokens": lengths}}]})
    out = run_sweep(spec, tmp_path / "out", workers=1, progress=False)
    assert out.computed == 2
    df = pd.read_parquet(tmp_path / "out" / "table.parquet")
    assert df["workload.reasoning_tokens"].tolist() == ["200", '{"dist": "uniform", "max": 200, "mean": null, "min": 100, "std": null}']
    assert {"tpot_p99_s", "prefill_s", "link_bottleneck"} <= set(df.columns) and df["fits"].all()


def test_fast_level_is_the_full_level_at_detail_fast(tmp_path):
    axes = [{"grid": {"workload.batch_size": [2, 6]}}]
    fast = write_spec(tmp_path, {**small_spec(), "level": "fast", "axes": axes}, "fast.yaml")
    base = {**small_scenario(), "sim": {"detail": "fast"}}
    full = write_spec(tmp_path, {**small_spec(), "base": base, "level": "full", "axes": axes}, "full.yaml")
    run_sweep(fast, tmp_path / "fast", workers=1, progress=False)
    run_sweep(full, tmp_path / "full", workers=1, progress=False)
    a, b = (pd.read_parquet(tmp_path / d / "table.parquet") for d in ("fast", "full"))
    metrics = [c for c in a.columns if c != "point_hash"]
    assert a[metrics].equals(b[metrics]) and a["fits"].all()
    assert not a["point_hash"].equals(b["point_hash"])  # the level is part of a point's name


# ---- interrupted sweeps -----------------------------------------------------------------------

SWEEP = """
import sys
from pathlib import Path
from sim.sweep.command import sweep_command

sys.exit(sweep_command(Path(sys.argv[1]), Path(sys.argv[2]), executor="local", address=None, workers=2, batch=1,
                       progress=False))
"""
HANG_S = 120  # the waits below guard against a hang only: no signal races the run's own speed


@contextmanager
def sigint_as_at_a_terminal():
    """A child started in this block gets SIGINT as a terminal gives it, whoever started the tests: a shell
    without job control starts a background job (`cmd &`, nohup) with SIGINT ignored, a child inherits that
    across exec, and Python then installs no KeyboardInterrupt handler - a Ctrl-C test would wait out its
    run. A caught signal is reset to its default at exec, so catching it here for the Popen is enough."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_paused(args: list[str], marker: Path, after: int) -> subprocess.Popen:
    """`python ARGS` started with the task driver's test hook (sim.runner.tasks.TEST_PAUSE): returns
    once the run has stored `after` results and waits for a signal there (the marker file written),
    so a signal sent now lands mid-run with exactly `after` results stored, on any machine."""
    env = {**os.environ, TEST_PAUSE: f"{after}:{marker}"}
    with sigint_as_at_a_terminal():
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_S
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run never paused after {after} results (exit {proc.returncode}): {proc.communicate()}")
        time.sleep(0.02)
    return proc


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in state


def wait_gone(pids: list[int]) -> None:
    """The driver's workers stop once it is gone (interrupted: it stops them; killed: they notice)."""
    deadline = time.monotonic() + HANG_S
    while any(_alive(w) for w in pids):
        assert time.monotonic() < deadline, [w for w in pids if _alive(w)]
        time.sleep(0.05)


def _stored(out: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "points").glob("*/*.json")}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killed_sweep_loses_nothing_and_resumes(tmp_path, sig):
    spec = write_spec(tmp_path, {**small_spec(), "axes": small_spec()["axes"] + [{"grid": {"workload.seed": [1, 2]}}]})
    out = tmp_path / "out"
    proc = start_paused(["-c", SWEEP, str(spec), str(out)], tmp_path / "paused", after=3)
    workers = _children(proc.pid)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=HANG_S)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted: 3 of 16 " in stderr and "Traceback" not in stderr, stderr
    else:
        assert proc.returncode == -signal.SIGKILL
    wait_gone(workers)
    before = _stored(out)
    assert len(before) == 3  # what was stored when the signal came, and nothing after it

    resumed = run_sweep(spec, out, workers=1, progress=False)
    assert (resumed.stored_before, resumed.computed) == (3, 13)
    after = _stored(out)
    assert {p: after[p] for p in before} == before  # finished points were not computed again
    fresh = tmp_path / "fresh"
    run_sweep(spec, fresh, workers=1, progress=False)
    csv, df = read_table(out)
    fresh_csv, fresh_df = read_table(fresh)
    assert csv == fresh_csv
    pd.testing.assert_frame_equal(df, fresh_df)


def test_the_pause_hook_is_inert_unless_set(monkeypatch):
    from sim.runner import tasks

    monkeypatch.delenv(TEST_PAUSE, raising=False)
    assert tasks._test_pause() == (None, None)
    monkeypatch.setenv(TEST_PAUSE, "")
    assert tasks._test_pause() == (None, None)
    monkeypatch.setenv(TEST_PAUSE, "3:/tmp/a:b")
    assert tasks._test_pause() == (3, "/tmp/a:b")


# ---- Ray --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="Ray is not installed (the 'sweep' extra: pip install -e '.[sweep]')")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray
    ray.shutdown()


def test_ray_executor_writes_the_local_table(tmp_path, local_ray):
    spec = write_spec(tmp_path, small_spec())
    run_sweep(spec, tmp_path / "local", workers=2, progress=False)
    res = run_sweep(spec, tmp_path / "ray", executor="ray", batch=3, progress=False)  # 3 tasks for 8 points
    assert (res.computed, res.points) == (8, 8)
    assert local_ray.is_initialized()  # a Ray this process started is left running
    local_csv, local_df = read_table(tmp_path / "local")
    ray_csv, ray_df = read_table(tmp_path / "ray")
    assert ray_csv == local_csv
    pd.testing.assert_frame_equal(ray_df, local_df)
    for p in (tmp_path / "local" / "points").glob("*/*.json"):
        assert (tmp_path / "ray" / p.relative_to(tmp_path / "local")).read_bytes() == p.read_bytes()


def test_ray_runs_the_report_grid_as_locally(tmp_path, local_ray):
    from dataclasses import replace

    from sim.runner.options import Execution
    from sim.studies.projection_grid import run_grid
    from tests.test_report_cache import GRID

    grid = replace(GRID, lengths=(2048,))  # 4 cells: one Ray task of 4
    local = run_grid(grid, workers=2)
    ray = run_grid(grid, execution=Execution("ray", cache=tmp_path / "cache"))
    assert (ray.computed, ray.stored) == (4, 0) and local_ray.is_initialized()
    pd.testing.assert_frame_equal(ray.points, local.points)
    assert ray.points.to_csv() == local.points.to_csv() and ray.limits.to_csv() == local.limits.to_csv()


def test_ray_runs_the_plan_as_locally(local_ray):
    from sim.inputs.scenario import scenario_from_dict
    from sim.plan import search as P
    from sim.plan.candidates import load_prices
    from sim.runner.options import Execution
    from tests.test_plan import SCENARIO, SMALL_SPEC

    base = scenario_from_dict(SCENARIO, "plan")
    args = (base, SMALL_SPEC, ["h100-sxm"], [1], ["full_hbm", "tiered:0.5"], load_prices())
    local = P.search(*args, workers=1)
    ray = P.search(*args, execution=Execution("ray"))
    assert ray.rows == local.rows and ray.probes == local.probes and ray.computed == 2
