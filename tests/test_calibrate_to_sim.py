"""The calibrate -> simulate loop on the CPU: a measured profile drives `kvsim run`."""

from __future__ import annotations

import json

import pytest

from .conftest import SCENARIOS, run_cli

pytest.importorskip("torch")


def test_cpu_profile_feeds_kvsim_run(tmp_path, cpu_tiny_profile):
    res, prof = cpu_tiny_profile  # `hwprobe calibrate --device cpu --tiny`, shared with test_hwprobe_calibrate
    assert res.returncode == 0, res.stderr
    res = run_cli("run", str(SCENARIOS / "h200-7b-batch.yaml"), "--profile", str(prof), "--json",
                  "--out", str(tmp_path / "run"), "--set", "workload.batch_size=2", "--set", "workload.reasoning_tokens=128")
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["profile"] == str(prof)
    for figure in ("h2d", "d2h", "weight_hbm_bytes_per_s", "memory_bytes"):
        assert s["sources"][figure].startswith("profile:"), figure
    # the bf16 decode kernel timed across rows replaces the modelled weight kernel
    assert s["sources"]["weight_kernel_by_rows"].startswith("profile:")
    assert s["sources"]["weight_kernel_by_rows"].endswith("bf16 (cpu) measured by rows")
    assert "(cpu," in s["sources"]["memory_bytes"]  # labelled as a CPU measurement, not a GPU
