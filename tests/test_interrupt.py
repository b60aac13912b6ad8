"""SIGINT at random moments during `kvsim run`, `kvsim report` and `hwprobe calibrate --device cpu`
(and SIGTERM, which the command lines take as the same interrupt, during `kvsim run`) leaves either
the complete output or none (no half-written run folder, no temporary files), and the interrupted
command says so in one line, without a traceback."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

from .promise import dump_yaml, files_under, tiny_scenario

RUN_FILES = {"scenario.resolved.yaml", "summary.json", "steps.csv"}

# The command runs in a child that first imports everything it will use and says "ready": the random
# moment is drawn from the command's own run time, not from the interpreter's start (an interrupt
# while Python itself starts ends in its KeyboardInterrupt report before any handler exists).
# Once the command is over, a late interrupt lands on nothing: unguarded, one that comes while the
# interpreter shuts down (threading's and atexit's clean-up) is "Exception ignored ... KeyboardInterrupt"
# with a traceback, after the command has finished and succeeded, and the test would fail by chance.
# Until then the handler is Python's own (KeyboardInterrupt); from then on it returns.
DRIVER = """
import sys
import importlib
import signal
for name in sys.argv[2].split(","):
    importlib.import_module(name)
app = importlib.import_module(sys.argv[1]).app
over = False
def interrupt(signum, frame):
    if not over:
        signal.default_int_handler(signum, frame)
signal.signal(signal.SIGINT, interrupt)
print("ready", flush=True)
sys.argv = [sys.argv[1]] + sys.argv[3:]
try:
    app()
finally:
    over = True  # set before any call: no interrupt is raised between the command's end and here
"""
HANG_S = 300  # the waits below guard against a hang only (four commands share the CPU with whatever else runs)
PRELOAD = {
    "sim.cli.main": "sim.decode.simulate,sim.outputs.run_folder,sim.inputs.profile,sim.inputs.scenario,sim.report.command",
    "hwprobe.cli": "torch,hwprobe.calibrate.runner,hwprobe.calibrate.backend,hwprobe.calibrate.plan,hwprobe.calibrate.summary",
}


def _interrupt_after_ready(proc: subprocess.Popen, delay_s: float, sig: int) -> None:
    if proc.stdout.readline().strip() != "ready":
        return
    time.sleep(delay_s)
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.stdout.read()


def test_sigint_at_random_moments_leaves_complete_output_or_none(tmp_path):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    (tmp_path / "s.yaml").write_text(dump_yaml(tiny_scenario()))
    jobs = []  # (CLI module, arguments, when to interrupt after ready (s), kind, output path, signal)
    # moments up to about each command's own run time (a later one finds it done: the complete output)
    for i in range(2):
        jobs.append(("sim.cli.main", ["run", "s.yaml", "--out", f"run{i}"], rng.uniform(0.0, 0.8), "run", tmp_path / f"run{i}",
                     signal.SIGINT))
    jobs.append(("sim.cli.main", ["run", "s.yaml", "--out", "run-term"], rng.uniform(0.0, 0.8), "run",
                 tmp_path / "run-term", signal.SIGTERM))
    jobs.append(("sim.cli.main", ["report", "s.yaml", "--out", "report.html"], rng.uniform(0.0, 1.2), "report",
                 tmp_path / "report.html", signal.SIGINT))
    if importlib.util.find_spec("torch") is not None:
        jobs.append(("hwprobe.cli", ["calibrate", "--device", "cpu", "--tiny", "--out", "cal.yaml"],
                     rng.uniform(0.0, 4.0), "profile", tmp_path / "cal.yaml", signal.SIGINT))
    running = []
    for module, args, delay_s, kind, out, sig in jobs:
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, module, PRELOAD[module], *args], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "COLUMNS": "200"})
        thread = threading.Thread(target=_interrupt_after_ready, args=(proc, delay_s, sig), daemon=True)
        thread.start()
        running.append((proc, thread, delay_s, kind, out, sig))
    for proc, thread, delay_s, kind, out, sig in running:
        thread.join(timeout=HANG_S)
        proc.wait(timeout=HANG_S)
        stderr = proc.stderr.read()
        context = (f"seed {seed}: {kind} sent {signal.Signals(sig).name} {delay_s:.2f} s after ready, exit "
                   f"{proc.returncode}: {stderr[-500:]}")
        assert "Traceback" not in stderr, context
        # -SIGINT: the signal came as the interpreter was shutting down, after the command had ended;
        # -SIGTERM: it came outside the command's run (before it began or after it ended), where
        # SIGTERM keeps its default action
        assert proc.returncode in (0, 130, -sig), context
        if proc.returncode == 130:
            assert stderr.rstrip().endswith(": interrupted"), context
        elif proc.returncode == 0:
            assert out.exists(), context
        if not out.exists():
            continue
        if kind == "run":
            assert {p.name for p in out.iterdir()} == RUN_FILES, context
            json.loads((out / "summary.json").read_text())
        elif kind == "report":
            assert out.read_text().rstrip().endswith("</html>"), context
        else:
            from sim.inputs.profile import load_profile

            load_profile(out)
    leftovers = [f for f in files_under(tmp_path) if f.endswith(".tmp") or "/." in f or f.startswith(".")]
    assert not leftovers, f"seed {seed}: {leftovers}"
