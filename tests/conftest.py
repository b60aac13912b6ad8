"""Shared test helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"


def run_cli(*args: str, cwd: Path | None = None, tool: str = "kvsim") -> subprocess.CompletedProcess:
    """Run a console script of this venv as a user would."""
    exe = Path(sys.executable).with_name(tool)
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd or REPO,
                          env={**os.environ, "COLUMNS": "200"}, timeout=600)


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


@pytest.fixture
def small_scenario_dict() -> dict:
    return {
        "name": "small",
        "model": {"name": "deepseek-r1-distill-qwen-7b"},
        "hardware": {"gpu": "h200-sxm"},
        "workload": {"batch_size": 2, "prompt_tokens": 64, "reasoning_tokens": 300, "seed": 3},
        "policy": {"kind": "tiered", "hbm_ratio": 0.5, "evict_ratio": 0.1, "retier_interval": 32,
                   "recent_window": 32, "sink_tokens": 4},
    }
