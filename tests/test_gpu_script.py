"""scripts/gpu/h200_validate.sh, dry-run on the CPU: the one-shot GPU script's plumbing (stages, deadline,
generated scenarios, files under $OUT) is checked here, before the scarce GPU machine runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu" / "h200_validate.sh"
TINY_MODEL = REPO / "scenarios" / "models" / "tiny-qwen2.json"
KNOBS = ("DEVICE", "PYTHON", "MODEL_YAML", "BATCHES", "CONTEXTS", "STEPS", "RETIER", "RECENT", "CALIBRATE",
         "EXACTNESS", "EXTRA_70B", "DEADLINE", "RESERVE", "KILL_AFTER", "MIN_CAP", "WORK", "OUT", "SITE", "WHEELS")

pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("bash", "timeout", "tar")),
                                reason="needs bash, coreutils timeout and tar")


class ScriptRun:
    """The script started from the repo root with the given knobs (none inherited), in the background;
    result() waits for it: (process, OUT). How long it took is read from its log (its own clock)."""

    def __init__(self, tmp_path: Path, **env: str):
        self.out = tmp_path / "out"
        base = {k: v for k, v in os.environ.items() if k not in KNOBS}
        knobs = {"DEVICE": "cpu", "PYTHON": sys.executable, "WORK": str(tmp_path / "work"), "OUT": str(self.out),
                 "WHEELS": str(tmp_path / "no-wheels"), **env}  # the device's py3.12 wheels (.whl) do not install here
        self.args = ["bash", str(SCRIPT)]
        self.proc = subprocess.Popen(self.args, cwd=REPO, env={**base, **knobs}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.waiter = threading.Thread(target=self._wait, daemon=True)  # drains its pipes while it runs
        self.waiter.start()

    def _wait(self) -> None:
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()

    def result(self) -> tuple[subprocess.CompletedProcess, Path]:
        self.waiter.join()
        return subprocess.CompletedProcess(self.args, self.proc.returncode, self.stdout, self.stderr), self.out


def run_script(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the script to the end (see ScriptRun): (process, OUT)."""
    return ScriptRun(tmp_path, **env).result()


def tiny(**env: str) -> dict:
    return {"MODEL_YAML": f"{{hf_config: {TINY_MODEL}, weight_dtype: bf16, kv_dtype: bf16}}", "STEPS": "24",
            "RETIER": "8", "RECENT": "8", "CALIBRATE": "0", "EXTRA_70B": "0", **env}


SHORT_DEADLINE = 9  # the grid gets 9 - 1 (reserve) - 1 (kill grace) = 7 s, less its start: several tiny scenarios
SHORT_BATCHES, SHORT_CONTEXTS = "1 2 4 8 16 32", "256 512 1024 4096"  # 72 scenarios: far more than fit


@pytest.fixture(scope="module")
def short_deadline_run(tmp_path_factory):
    """The short-deadline dry run, started in the background when first asked for: the whole dry run
    asks for it too, so that the two (mostly one thread each, the deadline one mostly waiting out
    its clock) overlap instead of taking turns."""
    pytest.importorskip("torch")
    run = ScriptRun(tmp_path_factory.mktemp("short-deadline"),
                    **tiny(BATCHES=SHORT_BATCHES, CONTEXTS=SHORT_CONTEXTS, STEPS="48", EXACTNESS="0",
                           DEADLINE=str(SHORT_DEADLINE), RESERVE="1", KILL_AFTER="1", MIN_CAP="3"))
    yield run
    if run.proc.poll() is None:  # never collected (its test deselected or failed first)
        run.proc.kill()
    run.waiter.join()


def expected_names(batches: str, contexts: str) -> list[str]:
    """Context by context, batch by batch, full / tier / paper in a row: what the script promises."""
    return [f"{kind}-b{b}-c{c}" for c in contexts.split() for b in batches.split() for kind in ("full", "tier", "paper")]


def metrics() -> list[str]:
    """The metric keys validate writes per scenario, in order (its accuracy metrics, then its checks)."""
    from hwprobe.validate_cmd import COMPARED

    return [key for key, _ in COMPARED]


def test_default_grid_is_the_gpu_grid_and_valid_and_a_spent_deadline_runs_nothing(tmp_path):
    from sim.inputs.scenario import load_scenario

    proc, out = run_script(tmp_path, DEADLINE="1")
    log = (out / "log.txt").read_text()
    assert proc.returncode == 1, log  # the grid did not run: not a success
    for name in ("exactness", "calibrate", "grid"):
        assert f"== {name} rc=no_time" in log
    assert "cuda_tests: skipped (DEVICE=cpu)" in log and "predictions fall back to the datasheet defaults" in log
    assert not (out / "validate.csv").exists() and not (out / "exactness.json").exists()
    assert (out / "work.tgz").is_file()

    names = expected_names("1 8 32", "2048 8192")
    extra = ["full-70b-int4-b8-c2048", "tier-70b-int4-b8-c2048"]  # last: only if time is left
    assert f"20 scenarios: {' '.join(names + extra)}" in log
    grid = tmp_path / "work" / "grid"
    assert sorted(p.stem for p in grid.glob("*.yaml")) == sorted(names + extra)
    for name in extra:
        sc = load_scenario(grid / f"{name}.yaml")
        assert (sc.model.name, sc.model.weight_dtype, sc.workload.batch_size, sc.policy.kind) == (
            "deepseek-r1-distill-llama-70b", "int4", 8, "full_hbm" if name.startswith("full") else "tiered")
    for name in names:
        sc = load_scenario(grid / f"{name}.yaml")  # pydantic strict: every field written still exists
        kind, b, c = name.split("-")
        assert sc.name == name and sc.model.name == "deepseek-r1-distill-qwen-7b" and sc.hardware.gpu == "h200-sxm"
        assert (sc.workload.batch_size, sc.workload.prompt_tokens, sc.workload.reasoning_tokens) == (
            int(b[1:]), int(c[1:]), 64)
        p = sc.policy
        assert (p.retier_interval, p.recent_window, p.protect_prompt, p.hbm_ratio) == (32, 128, False, 0.5)
        assert (p.kind, p.semantics, p.prefetch, p.pinned) == {
            "full": ("full_hbm", "global", "layerwise_async", True),
            "tier": ("tiered", "global", "layerwise_async", True),
            "paper": ("tiered", "paper_prototype", "sync_per_step", False)}[kind]


def test_cpu_dry_run_of_the_whole_script(tmp_path, short_deadline_run):  # (runs alongside this one)
    pytest.importorskip("torch")
    proc, out = run_script(tmp_path, **tiny(BATCHES="1 2", CONTEXTS="64"))
    log = (out / "log.txt").read_text()
    assert proc.returncode == 0, log + proc.stderr
    assert proc.stdout == log  # everything the script says is in the log that comes back

    exact = json.loads((out / "exactness.json").read_text())
    assert exact["device"] == "cpu" and exact["t1_offload"]["exact"] is True

    rows = pd.read_csv(out / "validate.csv")
    names = expected_names("1 2", "64")
    keys = metrics()
    assert list(zip(rows["scenario"], rows["metric"])) == [(n, m) for n in names for m in keys]
    tput = rows[rows["metric"] == "throughput_tok_per_s"].set_index("scenario")["measured"]
    assert (tput > 0).all() and len(tput) == len(names)
    assert (out / "validate.errors.csv").is_file()
    assert not (out / "profile.yaml").exists()  # CALIBRATE=0
    for name in names:  # the run directories travel in the tarball
        assert (tmp_path / "work" / "runs" / name / "summary.json").is_file()
    listing = subprocess.run(["tar", "tzf", str(out / "work.tgz")], capture_output=True, text=True, check=True).stdout
    assert f"runs/{names[-1]}/summary.json" in listing and f"grid/{names[0]}.yaml" in listing
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["log.txt", "exactness.json", "validate.csv", "validate.errors.csv", "validate.ratios.csv", "work.tgz"])
    # (at most 8 files come back from the device)
    ratios = pd.read_csv(out / "validate.ratios.csv")
    assert list(ratios["scenario"]) == [n for n in names if not n.startswith("full")]
    assert list(ratios["baseline"]) == [f"full-{n.split('-', 1)[1]}" for n in ratios["scenario"]]

    assert re.search(r"== exactness rc=0 in \d+ s", log) and re.search(r"== grid rc=0 in \d+ s", log)
    assert "== calibrate: skipped (CALIBRATE=0)" in log and "== cuda_tests: skipped (DEVICE=cpu)" in log
    assert "== summary: exactness=0 calibrate=skipped grid=0 cuda_tests=skipped" in log
    assert f"no {tmp_path / 'no-wheels'}/*.whl: using" in log
    assert f"validate.csv: {len(names)} of {len(names)} scenarios measured ({len(rows)} rows)" in log


def test_a_short_deadline_cuts_the_grid_and_keeps_the_finished_rows(short_deadline_run):
    deadline, batches, contexts = SHORT_DEADLINE, SHORT_BATCHES, SHORT_CONTEXTS
    proc, out = short_deadline_run.result()
    log = (out / "log.txt").read_text()
    assert proc.returncode == 1, log
    # the grid got what the deadline left it (RESERVE=1, KILL_AFTER=1) and `timeout` stopped it at that cap:
    # read from the script's own log (whole seconds), so the machine's load does not enter
    started = re.search(r"== grid \(cap (\d+) s; at (\d+) s of \d+ s\)", log)
    stopped = re.search(r"== grid rc=(?:124|137) in (\d+) s \(TIMED OUT\)", log)
    assert started and stopped, log
    (cap, at), took = map(int, started.groups()), int(stopped.group(1))
    assert at + cap <= deadline - 1 - 1 + 1 and took <= cap + 1 + 1, log  # (+1: the second may tick in between)
    assert "== exactness: skipped (EXACTNESS=0)" in log and (out / "work.tgz").is_file()
    assert not (out / "validate.errors.csv").exists()  # validate writes it only when the grid is done
    if not (out / "validate.csv").exists():
        pytest.skip(f"machine too slow: no scenario finished inside the grid's cap\n{log}")
    rows = pd.read_csv(out / "validate.csv")
    keys = metrics()
    done = list(dict.fromkeys(rows["scenario"]))
    names = expected_names(batches, contexts)
    assert 1 <= len(done) < len(names) and done == names[: len(done)]
    assert list(zip(rows["scenario"], rows["metric"])) == [(n, m) for n in done for m in keys]
    assert f"validate.csv: {len(done)} of {len(names)} scenarios measured ({len(rows)} rows)" in log
