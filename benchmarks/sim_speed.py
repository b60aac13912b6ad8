"""Simulator speed benchmark (not a test): simulated decode steps per wall second.

    .venv/bin/python benchmarks/sim_speed.py

Prints, for h200-70b-int4 at batch 32 and 4096 reasoning tokens, the wall seconds and steps per
second of the full simulation at both levels of detail, and of the fast projection.
"""

from __future__ import annotations

import time
from pathlib import Path

from sim.simulate import simulate
from sim.projection import project
from sim.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "h200-70b-int4.yaml"
OVERRIDES = ["workload.batch_size=32", "workload.reasoning_tokens=4096"]


def main() -> None:
    print(f"scenario: {SCENARIO.name} with {' '.join(OVERRIDES)}")
    for detail in ("step", "layer"):
        sc = load_scenario(SCENARIO, OVERRIDES + [f"sim.detail={detail}"])
        t0 = time.perf_counter()
        result = simulate(sc)
        wall_s = time.perf_counter() - t0
        steps = result.summary.steps
        print(f"simulate detail={detail:5s}: {wall_s:7.2f} s wall, {steps / wall_s:9.0f} simulated decode steps/s "
              f"({steps} steps x {sc.workload.batch_size} seqs x 80 layers; "
              f"predicted {result.summary.throughput_tok_per_s:.1f} tok/s)")
    sc = load_scenario(SCENARIO, OVERRIDES)
    t0 = time.perf_counter()
    p = project(sc)
    wall_s = time.perf_counter() - t0
    print(f"projection            : {wall_s:7.3f} s wall (incl. max-batch search), predicted {p.throughput_tok_per_s:.1f} tok/s")


if __name__ == "__main__":
    main()
