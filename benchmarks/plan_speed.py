"""Planner speed benchmark (not a test), against issue #21's targets: the default 70B and 8B plans
give steady-state answers in at most 20 s on 2 cores, and a full Pareto sweep in at most 60 s.

    .venv/bin/python benchmarks/plan_speed.py            # every case, the Pareto sweep too (minutes)
    .venv/bin/python benchmarks/plan_speed.py --quick    # without the Pareto sweep
    .venv/bin/python benchmarks/plan_speed.py --workers 2

It measures three things, calling `sim.plan.search.search` in-process (what `kvsim plan` runs,
local processes, --workers default: all cores):

1. Wall seconds (time.monotonic) of each plan - the default 70B plan (scenarios/serving-h100-70b-tp4.yaml
   at 10 req/s, every catalog GPU, counts 1,2,4,8, default policies, top 5), the default 8B plan (the
   same scenario with deepseek-r1-distill-llama-8b at TP1, 20 req/s), the 70B long-output case
   (reasoning_tokens 2048, 4 req/s, H200 only) and the Pareto sweep (the 70B plan with --pareto: every
   candidate that may lie on its GPU count's front, GPUs limited to H100, H200 and B200) - with its
   candidates screened, simulated and passing, its probes and its answer sentence (and the sweep's front). CPU simulation time: no GPU runs; other processes' load stretches it.
2. The screen's accuracy: for every passing row whose max rate was bracketed (not capped), the
   screen's estimated max rate over the probed one, against the search's SCREEN_MARGIN.
3. Confirmation: each rank-1 row of the first three plans simulated again with 3x its verdict run's
   requests, at the rate asked and at its max rate.

The Pareto sweep runs last (after 2 and 3 have printed), with a progress line a minute, then its own
screen accuracy and, for the front search's user axis, the screen's p99 TPOT at the rate asked over
the simulated one on every passing row (`tpot_accuracy`, against sim.plan.front.USER_MARGIN).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import time
from pathlib import Path

from sim.inputs.scenario import load_scenario
from sim.plan.answer import answer_sentence, pareto
from sim.plan.candidates import (
    Candidate,
    PlanSpec,
    candidate_scenario,
    load_prices,
    parse_counts,
    parse_gpus,
    parse_policies,
)
from sim.plan.disagg import screen_disagg
from sim.plan.evaluate import probe_at
from sim.plan.front import USER_MARGIN
from sim.plan.screen import curve
from sim.plan.search import SCREEN_MARGIN, mean_output_tokens, row_candidate, search

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "serving-h100-70b-tp4.yaml"
MODEL_8B = ["model.name=deepseek-r1-distill-llama-8b", "parallel.tp=1"]
PARETO_GPUS = "h100-sxm,h200-sxm,b200"
# label: (--set overrides, --rate, --gpus (None: every catalog GPU), --top, target seconds or None, confirm rank 1,
#         --pareto)
PLANS = {
    "(a) default 70B plan": ([], 10.0, None, 5, 20.0, True, False),
    "(b) default 8B plan": (MODEL_8B, 20.0, None, 5, 20.0, True, False),
    "(c) 70B long output (reasoning_tokens=2048)": (["workload.reasoning_tokens=2048"], 4.0, "h200-sxm", 5, None, True, False),
    f"(d) Pareto sweep: plan (a) with --pareto, --gpus {PARETO_GPUS} only": ([], 10.0, PARETO_GPUS, 5, 60.0, False, True),
}
CONFIRM_FACTOR = 3  # the confirmation runs this many times the verdict run's requests


@dataclasses.dataclass
class Done:
    label: str
    overrides: list[str]
    base: object  # Scenario
    spec: PlanSpec
    result: object  # PlanResult
    wall_s: float
    confirm: bool


def plan_spec(base, rate: float, top: int) -> PlanSpec:
    """As `kvsim plan` builds it (`_plan_spec`): the SLO from the scenario, every other option at its default."""
    return PlanSpec(rate=rate, ttft_s=base.slo.ttft_s, tpot_s=base.slo.tpot_s, top=top)


def progress_printer(every_s: float = 60.0):
    """`search`'s progress callback: a line at most once a minute, so a long sweep shows how far it got."""
    t0, last = time.monotonic(), [time.monotonic()]

    def show(done: int, total: int) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            print(f"  ... {done}/{total} candidates simulated after {last[0] - t0:.0f} s", flush=True)

    return show


def run_plan(label: str, case: tuple, workers: int | None) -> Done:
    overrides, rate, gpus, top, target, confirm, front = case
    base = load_scenario(SCENARIO, overrides)
    spec = plan_spec(base, rate, top)
    names, counts, policies = parse_gpus(gpus), parse_counts(None), parse_policies(None)
    print(f"\n{label}: running", flush=True)
    t0 = time.monotonic()
    result = search(base, spec, names, counts, policies, load_prices(), workers=workers, progress=progress_printer(),
                    front=front)
    wall_s = time.monotonic() - t0
    done = Done(label, overrides, base, spec, result, wall_s, confirm)
    print_plan(done, target)
    return done


def print_plan(d: Done, target: float | None) -> None:
    rows = d.result.rows
    by = lambda s: sum(r["status"] == s for r in rows)
    pruned, ruled_out = by("pruned"), by("screened")
    screened = len(rows) - pruned
    simulated = len({p["candidate"] for p in d.result.probes})
    verdict = "no target" if target is None else \
        ("within" if d.wall_s <= target else "OVER") + f" the {target:.0f} s target"
    sets = " ".join(f"--set {o}" for o in d.overrides)
    print(f"{d.label}: {d.wall_s:.1f} s wall ({verdict})")
    print(f"  asked: rate {d.spec.rate:g} req/s, p99 TTFT <= {d.spec.ttft_s * 1e3:.0f} ms, p99 TPOT <= "
          f"{d.spec.tpot_s * 1e3:.0f} ms, top {d.spec.top}{', ' + sets if sets else ''}")
    print(f"  candidates: {len(rows)} ({pruned} pruned: cannot hold the model); {screened} screened analytically, "
          f"{ruled_out} ruled out by the screen; {simulated} simulated ({by('pass')} pass, {by('fail')} fail); "
          f"{by('unsearched')} unsearched; {len(d.result.probes)} probes run")
    print(f"  answer: {answer_sentence(rows, d.spec.rate)}")
    if d.result.front:
        for n, points in pareto(rows, mean_output_tokens(d.base)).items():
            print(f"  Pareto, {n} GPUs: " + "; ".join(
                f"{p['gpu']} {p['layout']} {p['policy']} {p['tokens_per_s_per_gpu']:,.0f} tok/s/GPU "
                f"{p['tokens_per_s_per_user']:,.0f} tok/s/user" for p in points))


def accuracy_rows(plans: list[Done], start: int) -> list[tuple[str, dict]]:
    """Passing, bracketed rows of plans[start:], each configuration once: none already in an earlier
    plan (plan (d) repeats plan (a)'s searches)."""
    seen, out = set(), []
    for i, d in enumerate(plans):
        for r in d.result.rows:
            key = (tuple(d.overrides), d.spec.rate, r["gpu"], r["gpus"], r["layout"], r["max_num_seqs"], r["policy"])
            if r["status"] != "pass" or r["max_rate_capped"] or not r["screen_max_rate_per_s"] or key in seen:
                continue
            seen.add(key)
            if i >= start:
                out.append((d.label.split(" ")[0], r))
    return out


def screen_accuracy(plans: list[Done], start: int = 0) -> None:
    rows = accuracy_rows(plans, start)
    which = " ".join(d.label.split(" ")[0] for d in plans[start:])
    print(f"\nScreen accuracy, plans {which}: screen max rate / probed max rate (the highest passing probe; the true "
          f"max lies below next_rate, so screen / next_rate bounds the ratio from below), {len(rows)} passing, not "
          f"capped rows")
    if not rows:
        print("  no rows to compare")
        return
    ratios, lows = [], []
    for plan, r in rows:
        ratio = r["screen_max_rate_per_s"] / r["max_rate_per_s"]
        low = r["screen_max_rate_per_s"] / r["next_rate_per_s"] if r["next_rate_per_s"] else ratio
        ratios.append(ratio)
        lows.append(low)
        print(f"  {plan} {r['gpus']} x {r['gpu']:<12} {r['layout']:<17} {r['policy']:<14} "
              f"screen {r['screen_max_rate_per_s']:7.3g}  probed {r['max_rate_per_s']:7.3g} "
              f"(next {r['next_rate_per_s'] or float('nan'):7.3g})  ratio {ratio:.3f} (>= {low:.3f})")
    print(f"  ratio min {min(ratios):.3f} / median {statistics.median(ratios):.3f} / max {max(ratios):.3f}; "
          f"against next_rate: min {min(lows):.3f}")
    floor = 1.0 / SCREEN_MARGIN
    under = [x for x in lows if x < floor]
    print(f"  SCREEN_MARGIN = {SCREEN_MARGIN:g}: the screen rules out a configuration estimated under rate / "
          f"{SCREEN_MARGIN:g}, so it could wrongly rule one out only where screen / true max < 1 / {SCREEN_MARGIN:g} "
          f"= {floor:.3f}; rows below that (even against next_rate): {len(under)}"
          + (" - the screen COULD wrongly rule out a configuration" if under else ""))


def tpot_accuracy(d: Done) -> None:
    """The front search's user axis: the screen's p99 TPOT at the rate asked over the simulated p99, for
    every passing row (above 1 the screen overstates the p99, understating the user's speed: the
    direction sim.plan.front.USER_MARGIN must cover)."""
    ratios = []
    for r in d.result.rows:
        if r["status"] != "pass" or not r["tpot_p99_ms"]:
            continue
        cand = row_candidate(r)
        est = hint_curve(d.base, cand, d.spec).tpot_p99_at(d.spec.rate / cand.replicas)
        if est is not None:
            ratios.append(est * 1e3 / r["tpot_p99_ms"])
    if ratios:
        print(f"  screen p99 TPOT / simulated p99 TPOT at the rate, {len(ratios)} passing rows: min {min(ratios):.3f} / "
              f"median {statistics.median(ratios):.3f} / max {max(ratios):.3f} (USER_MARGIN = {USER_MARGIN:g})")


def hint_curve(base, cand: Candidate, spec: PlanSpec):
    """The screen's curve the search gave the candidate's probes (their E2E hint), as `search` makes it."""
    if cand.prefill:
        return screen_disagg(base, cand, spec, {})[0]
    return curve(candidate_scenario(base, cand, spec.rate / cand.replicas, spec))


def confirm_one(d: Done, row: dict, rate: float, label: str) -> None:
    cand = row_candidate(row)
    spec = dataclasses.replace(d.spec, requests=CONFIRM_FACTOR * row["verdict_requests"])
    cv = hint_curve(d.base, cand, d.spec)
    t0 = time.monotonic()
    p = probe_at(d.base, cand, spec, rate, cv)
    wall_s = time.monotonic() - t0
    ms = lambda k: (f"{p.stats[k].value_s * 1e3:,.1f} ms" if p.stats and p.stats[k].value_s is not None
                    else "- (stopped early)")
    verdict = "passes" if p.passed else "FAILS: " + "; ".join(t for _, t in p.misses)
    print(f"  {label} {rate:.3g} req/s: {verdict}; p99 TTFT {ms('ttft_p99')}, p99 TPOT {ms('tpot_p99')}; "
          f"{p.requests:,} requests per replica ({p.measured:,} measured), {p.duration_s:,.0f} s simulated, "
          f"end {p.end}; {wall_s:.1f} s wall")


def confirm(plans: list[Done]) -> None:
    print(f"\nConfirmation: each rank-1 row simulated again with {CONFIRM_FACTOR}x its verdict run's requests "
          f"(sim.plan.evaluate.probe_at, --requests fixed: one run)")
    for d in plans:
        if not d.confirm:
            continue
        best = next((r for r in d.result.rows if r["rank"] == 1), None)
        if best is None:
            print(f"{d.label}: nothing passed; nothing to confirm")
            continue
        seqs = f", max_num_seqs {best['max_num_seqs']}" if best["max_num_seqs"] else ""
        print(f"{d.label}: rank 1 = {best['gpus']} x {best['gpu']} {best['layout']} {best['policy']}{seqs} (verdict "
              f"run {best['verdict_requests']:,} requests per replica; max rate {best['max_rate_per_s']:.3g} req/s"
              f"{', capped' if best['max_rate_capped'] else ''})")
        confirm_one(d, best, d.spec.rate, "at the rate asked")
        confirm_one(d, best, best["max_rate_per_s"], "at its max rate")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux): VMs of one size differ by 2-3x in speed between kinds."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the full Pareto sweep (d)")
    ap.add_argument("--workers", type=int, default=None,
                    help="local worker processes (default: all cores, as kvsim plan)")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, {platform.platform()}, {cpu_model()}, "
          f"Python {platform.python_version()}; workers: {args.workers or os.cpu_count()}; 1-minute load average "
          f"{os.getloadavg()[0]:.1f}")
    print("These are CPU simulation times of the planner (kvsim plan's search, in-process), not GPU figures.")
    sweeps = {k: v for k, v in PLANS.items() if v[6]}
    plans = [run_plan(label, case, args.workers) for label, case in PLANS.items() if label not in sweeps]
    print(f"\n1-minute load average after the plans: {os.getloadavg()[0]:.1f}")
    screen_accuracy(plans)
    confirm(plans)
    for label, case in sweeps.items():  # last: the longest, and the figures above do not wait on it
        if args.quick:
            print(f"\n{label}: skipped (--quick)")
            continue
        plans.append(run_plan(label, case, args.workers))
        print(f"1-minute load average after it: {os.getloadavg()[0]:.1f}")
        screen_accuracy(plans, len(plans) - 1)
        tpot_accuracy(plans[-1])


if __name__ == "__main__":
    main()
