"""Simulator speed benchmark (not a test): simulated decode steps per wall second.

    .venv/bin/python benchmarks/sim_speed.py

Prints, for h200-70b-int4 at batch 32 and 4096 reasoning tokens, the wall seconds and steps per
second of the simulation at each level of detail (layer: SimPy per layer, the reference; step:
SimPy per step; fast: numpy over steps), the token-level tier plan alone, and the analytic
projection; then the fast level and the tier plan at 16,384 steps. Run it on a quiet machine.
"""

from __future__ import annotations

import time
from pathlib import Path

from sim.decode.context import build_context
from sim.decode.projection import project
from sim.decode.simulate import simulate
from sim.inputs.scenario import load_scenario
from sim.tiering.tier_plan import plan_tiers

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "h200-70b-int4.yaml"
OVERRIDES = ["workload.batch_size=32", "workload.reasoning_tokens=4096"]


def main() -> None:
    print(f"scenario: {SCENARIO.name} with {' '.join(OVERRIDES)}")
    for detail in ("fast", "step", "layer"):
        sc = load_scenario(SCENARIO, OVERRIDES + [f"sim.detail={detail}"])
        simulate(sc, with_max_batch=False)  # warm: imports, catalog
        t0 = time.perf_counter()
        result = simulate(sc, with_max_batch=False)
        wall_s = time.perf_counter() - t0
        steps = result.summary.steps
        print(f"simulate detail={detail:5s}: {wall_s:7.2f} s wall, {steps / wall_s:9.0f} simulated decode steps/s "
              f"({steps} steps x {sc.workload.batch_size} seqs x 80 layers; "
              f"predicted {result.summary.throughput_tok_per_s:.1f} tok/s)")
    for steps in (4096, 16384):
        sc = load_scenario(SCENARIO, [OVERRIDES[0], f"workload.reasoning_tokens={steps}"])
        t0 = time.perf_counter()
        plan_tiers(build_context(sc))
        plan_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        simulate(sc.model_copy(update={"sim": sc.sim.model_copy(update={"detail": "fast"})}), with_max_batch=False)
        print(f"{steps:6d} steps: token-level tier plan {plan_s:6.2f} s; whole run at the fast level "
              f"{time.perf_counter() - t0:6.3f} s")
    sc = load_scenario(SCENARIO, OVERRIDES)
    t0 = time.perf_counter()
    p = project(sc)
    wall_s = time.perf_counter() - t0
    print(f"projection            : {wall_s:7.3f} s wall (incl. max-batch search), predicted {p.throughput_tok_per_s:.1f} tok/s")


if __name__ == "__main__":
    main()
