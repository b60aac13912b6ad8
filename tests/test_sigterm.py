"""SIGTERM - what containers, schedulers and Ray send - is an interrupt exactly as SIGINT is, for every
command (issue #23): finished work kept, nothing half-written, worker processes ended, one line
("interrupted") and exit 130. Each run is stopped at a known point by the task driver's test hook
(tests/test_sweep.py start_paused), so no signal races the run's speed; no worker is alive once the
parent has exited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .promise import dump_yaml, files_under, tiny_serving_scenario
from .test_sweep import HANG_S, _alive, _children, small_spec, start_paused, wait_gone, write_spec

KVSIM = ["-m", "sim.cli.main"]


def _terminate(proc, workers: list[int]) -> str:
    """SIGTERM to the parent alone (as `docker stop` and a scheduler send it): its stderr, once it
    has exited and no worker of it is left."""
    assert workers, "the run should have worker processes"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=HANG_S)
    alive = [w for w in workers if _alive(w)]
    assert not alive, f"workers alive after the parent exited: {alive}"
    return stderr


def _plan_args(tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_serving_scenario()))
    return [*KVSIM, "plan", str(tmp_path / "s.yaml"), "--rate", "20", "--gpus", "h100-sxm,h200-sxm,l40s",
            "--counts", "1", "--policies", "full_hbm", "--requests", "12", "--workers", "2", *extra]


def test_sigterm_during_plan_keeps_what_finished_and_resumes(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "plan"
    args = _plan_args(tmp_path, "--cache", str(cache), "--out", str(out))
    proc = start_paused(args, tmp_path / "paused", after=1)
    stderr = _terminate(proc, _children(proc.pid))
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == [f"kvsim: interrupted: 1 of 3 results stored; run the same command to resume ({cache})"]
    assert len(list(cache.glob("*/*.json"))) == 1 and not out.exists()
    assert not [f for f in files_under(tmp_path) if f.endswith(".tmp")]

    from .conftest import run_cli

    resumed = run_cli(*args[2:])
    assert resumed.returncode == 0, resumed.stderr
    assert f"kvsim: plan: 2 candidates searched, 1 read from {cache}" in resumed.stderr
    assert {p.name for p in out.iterdir()} == {"plan.csv", "probes.csv", "plan.json"}


def test_sigterm_during_plan_without_a_store_writes_nothing(tmp_path):
    out = tmp_path / "plan"
    proc = start_paused(_plan_args(tmp_path, "--out", str(out), "--json"), tmp_path / "paused", after=1)
    stderr = _terminate(proc, _children(proc.pid))
    assert proc.returncode == 130 and stderr.splitlines() == ["kvsim: interrupted"], stderr
    assert not out.exists()


def test_sigterm_during_sweep_keeps_the_points_stored(tmp_path):
    spec = write_spec(tmp_path, {**small_spec(), "axes": small_spec()["axes"] + [{"grid": {"workload.seed": [1, 2]}}]})
    out = tmp_path / "out"
    proc = start_paused([*KVSIM, "sweep", str(spec), "--out", str(out), "--workers", "2", "--batch", "1",
                         "--no-progress"], tmp_path / "paused", after=3)
    stderr = _terminate(proc, _children(proc.pid))
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == [f"kvsim: interrupted: 3 of 16 points stored; run the same command to resume ({out})"]
    assert len(list((out / "points").glob("*/*.json"))) == 3 and not (out / "table.csv").exists()


def test_sigterm_during_report_writes_no_report(tmp_path):
    out = tmp_path / "report.html"
    proc = start_paused([*KVSIM, "report", "--out", str(out), "--workers", "2"], tmp_path / "paused", after=1)
    stderr = _terminate(proc, _children(proc.pid))
    assert proc.returncode == 130 and stderr.strip().splitlines()[-1] == "kvsim: interrupted", stderr
    assert "Traceback" not in stderr and not out.exists()


def test_sigterm_to_the_whole_group_is_one_interrupt(tmp_path):
    """Sent to the process group (a terminal, `kill -TERM -PGID`): the workers ignore it, the driver
    handles it once and ends them."""
    from sim.runner.tasks import TEST_PAUSE

    spec = write_spec(tmp_path, small_spec())
    marker = tmp_path / "paused"
    proc = subprocess.Popen([sys.executable, *KVSIM, "sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "2",
                             "--batch", "1", "--no-progress"], env={**os.environ, TEST_PAUSE: f"2:{marker}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_S
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        workers = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and stderr.splitlines()[-1].startswith("kvsim: interrupted: 2 of 8 points"), stderr
    wait_gone(workers)


def test_a_guarded_command_line_says_sigterm_as_its_interrupt(capsys):
    """Both command lines are GuardedTyper apps: while a command runs SIGTERM raises KeyboardInterrupt,
    said as one line with exit 130; afterwards the previous handler is back."""
    import hwprobe.cli
    import sim.cli.main
    from sim.cli.guard import GuardedTyper

    assert isinstance(sim.cli.main.app, GuardedTyper) and isinstance(hwprobe.cli.app, GuardedTyper)
    app = GuardedTyper("tool")

    @app.command()
    def work():
        signal.raise_signal(signal.SIGTERM)

    @app.command()
    def rest():
        pass

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as done:
        app(["work"], prog_name="tool")
    assert done.value.code == 130 and capsys.readouterr().err == "tool: interrupted\n"
    assert signal.getsignal(signal.SIGTERM) == before
