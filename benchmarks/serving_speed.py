"""Serving speed benchmark (not a test), against issue #14's targets: one hour of simulated traffic
at 10 requests/s for a 70B model at TP 4 in at most 30 s on a 2-core machine; the planner's default
search for one model in at most 2 minutes.

    .venv/bin/python benchmarks/serving_speed.py          # the hour, recompute and swap preemption
    .venv/bin/python benchmarks/serving_speed.py --plan   # and `kvsim plan`'s default search (minutes)

Each serving case is scenarios/serving-h100-70b-tp4.yaml with 36,000 Poisson requests (one hour at
10 req/s) and prints the wall and CPU seconds of `simulate_serving` (what `kvsim run` spends
between reading the scenario and writing the files), the simulated requests, steps and seconds,
simulated requests per wall second and the speed ratio (simulated seconds per wall second). At
10 req/s on TP4 nothing is preempted, so the swap run costs what recompute does; the last case
(TP2 at 4 req/s: about 10 GB of KV per GPU) preempts, so swaps and their link traffic are timed.
Wall seconds count what other processes on the machine take from this one; CPU seconds do not:
run it on a quiet machine and read both.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from sim.inputs.scenario import load_scenario
from sim.serving.run import simulate_serving

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "serving-h100-70b-tp4.yaml"
HOUR = ["workload.arrivals.requests=36000", "workload.arrivals.rate_per_s=10"]  # Poisson: one hour of arrivals
CASES = {
    "70B TP4 10 req/s, recompute": [*HOUR],
    "70B TP4 10 req/s, swap": [*HOUR, "scheduler.preemption=swap"],
    "70B TP2 4 req/s (pressured), swap": ["workload.arrivals.requests=14400", "workload.arrivals.rate_per_s=4",
                                          "parallel.tp=2", "scheduler.preemption=swap"],
}
RUN_TARGET_S = 30.0  # the whole run: an hour of arrivals and the tail that drains them
PLAN_TARGET_S = 120.0
PLAN_ARGS = ["--rate", "10", "--ttft-p99-ms", "2000", "--tpot-p99-ms", "50"]


def serving_case(label: str, overrides: list[str]) -> None:
    sc = load_scenario(SCENARIO, overrides)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    s = simulate_serving(sc).summary
    wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    swaps = f", {s.swaps:,} swaps ({s.swap_out_bytes / 1e9:,.1f} GB out)" if s.preemption == "swap" else ""
    verdict = "within" if wall_s <= RUN_TARGET_S else "OVER"
    print(f"{label}: {wall_s:.1f} s wall ({cpu_s:.1f} s CPU; {verdict} the {RUN_TARGET_S:.0f} s target) for "
          f"{s.requests:,} requests, {s.steps:,} steps, {s.duration_s:,.0f} s simulated: {s.requests / wall_s:,.0f} "
          f"requests/s simulated, speed ratio {s.duration_s / wall_s:,.0f}x; {s.preemptions:,} preemptions{swaps}")


def plan_case() -> None:
    """`kvsim plan` as a user runs it (its own process, --workers default: all cores)."""
    kvsim = Path(sys.executable).with_name("kvsim")
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([str(kvsim), "plan", str(SCENARIO), *PLAN_ARGS, "--json"], capture_output=True, text=True,
                         cwd=REPO)
    wall_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.returncode != 0:
        print(f"kvsim plan failed (exit {res.returncode}): {res.stderr.strip()[-500:]}")
        return
    verdict = "within" if wall_s <= PLAN_TARGET_S else "OVER"
    print(f"kvsim plan {' '.join(PLAN_ARGS)}: {wall_s:.1f} s wall ({cpu_s:.1f} s CPU over its processes; "
          f"{verdict} the {PLAN_TARGET_S:.0f} s target) on {os.cpu_count()} cores, 1-minute load average "
          f"{load_before:.1f} before and {os.getloadavg()[0]:.1f} after (other processes' load stretches the wall time)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="store_true", help="also time kvsim plan's default search (minutes)")
    args = ap.parse_args()
    print(f"scenario: {SCENARIO.name}")
    simulate_serving(load_scenario(SCENARIO, ["workload.arrivals.requests=20"]))  # warm: imports, catalog
    for label, overrides in CASES.items():
        serving_case(label, overrides)
    if args.plan:
        plan_case()


if __name__ == "__main__":
    main()
