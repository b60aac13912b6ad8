"""Shared test helpers."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"


CLI_APPS = {"kvsim": "sim.cli.main", "hwprobe": "hwprobe.cli"}


def run_cli(*args: str, cwd: Path | None = None, tool: str = "kvsim",
            subprocess_: bool = False) -> subprocess.CompletedProcess:
    """Run `tool ARGS` and return its exit code, stdout and stderr.

    By default in this process (typer's CliRunner on the tool's app, stdout and stderr kept apart,
    sys.argv and the working directory as the console script would see them): no interpreter start
    per call. An exception the app does not handle itself comes back as exit code 1 with its
    traceback on stderr, as the real process would print it, so `"Traceback" not in stderr` still
    means no traceback. subprocess_=True runs the installed console script of this venv as a user
    would (one test per tool keeps the entry points exercised)."""
    if subprocess_:
        exe = Path(sys.executable).with_name(tool)
        return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd or REPO,
                              env={**os.environ, "COLUMNS": "200"}, timeout=600)
    from typer.testing import CliRunner

    app = importlib.import_module(CLI_APPS[tool]).app
    torch = None
    if tool == "hwprobe":  # it may set torch's thread count for its run: restored after
        with contextlib.suppress(ImportError):
            import torch
    threads = torch.get_num_threads() if torch is not None else None
    argv = sys.argv
    sys.argv = [tool, *args]
    try:
        with contextlib.chdir(cwd or REPO):
            res = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"}, prog_name=tool)
    finally:
        sys.argv = argv
        if threads is not None:
            torch.set_num_threads(threads)
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*res.exc_info))
    return subprocess.CompletedProcess([tool, *args], res.exit_code, res.stdout, stderr)


def write_hf_scenario(tmp_path: Path, config: dict, scenario: dict) -> Path:
    """A Hugging Face config.json and a scenario YAML naming it (model.hf_config) in tmp_path;
    returns the scenario's path (<name>.yaml)."""
    import json

    import yaml

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    path = tmp_path / f"{scenario['name']}.yaml"
    path.write_text(yaml.safe_dump({**scenario, "model": {"hf_config": str(cfg), **scenario.get("model", {})}}))
    return path


@pytest.fixture(scope="session")
def cpu_tiny_profile(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`hwprobe calibrate --device cpu --tiny --out DIR/cpu.yaml`, run once for every test that checks it
    or feeds it on (several seconds each time): (the command's result, the profile's path, alone in DIR)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("cpu-profile") / "cpu.yaml"
    return run_cli("calibrate", "--device", "cpu", "--tiny", "--out", str(out), tool="hwprobe"), out


def small_scenario() -> dict:
    """A small 7B scenario, a fresh dict each call (module-scoped fixtures take it from here)."""
    return {
        "name": "small",
        "model": {"name": "deepseek-r1-distill-qwen-7b"},
        "hardware": {"gpu": "h200-sxm"},
        "workload": {"batch_size": 2, "prompt_tokens": 64, "reasoning_tokens": 300, "seed": 3},
        "policy": {"kind": "tiered", "hbm_ratio": 0.5, "evict_ratio": 0.1, "retier_interval": 32,
                   "recent_window": 32, "sink_tokens": 4},
    }


@pytest.fixture
def small_scenario_dict() -> dict:
    return small_scenario()


# ---- hypothesis: a quick deterministic `ci` profile by default, `--hypothesis-profile=thorough` for more
def _register_hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    # max_examples is the budget of the costliest fuzz test; cheaper ones scale it up (tests/fuzz_inputs.py)
    settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, database=None,
                              suppress_health_check=quiet)
    settings.register_profile("thorough", max_examples=500, deadline=None, database=None, suppress_health_check=quiet)
    settings.load_profile("ci")


_register_hypothesis_profiles()
