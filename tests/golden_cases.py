"""Golden outputs: the simulator's summary.json and steps.csv (and the fast projection's figures) for
every shipped scenario, the paper check's runs, and small cases that reach each engine path.

A refactor must leave them identical (`tests/test_golden.py`): every character, except that a number
may differ from its golden value in the last bits (relative 1e-12, `NUMBER_RTOL`) - numpy's vectorised
sums take another order on another CPU (AVX-512 or not), which moves a float by an ulp or two; any
change in the physics moves far more. A change that is *meant* to move a number regenerates them, and
the diff of `tests/golden/` is then part of the review:

    .venv/bin/python -m tests.golden_cases           # rewrite tests/golden/
    .venv/bin/python -m tests.golden_cases --check   # compare only (what the test does)
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
GOLDEN = Path(__file__).resolve().parent / "golden"
PAPER = "paper-rtx5080-7b.yaml"
FREE_PACK = "hardware.efficiency.host_pack_bytes_per_s=1e30"  # the paper check's link-only runs
SMALL = ["workload.batch_size=4", "workload.prompt_tokens=128", "workload.reasoning_tokens=320",
         "policy.retier_interval=32", "policy.recent_window=32"]
# keys that describe the machine the golden files were written on, not the simulation
MACHINE_KEYS = ("versions",)
NUMBER_RTOL = 1e-12  # a float's last bits: another summation order (module docstring)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Case:
    name: str
    scenario: str  # file under scenarios/
    overrides: tuple[str, ...] = ()
    serving: bool = False  # workload.arrivals: summary.json, requests.csv, timeline.csv of sim.serving


SERVING_SHORT = ("workload.arrivals.requests=100", "sim.record_every=10")  # golden: the first 100 requests, every 10th step


def _shipped(path: Path) -> Case:
    import yaml

    serving = "arrivals" in (yaml.safe_load(path.read_text()).get("workload") or {})
    return Case(path.stem, path.name, SERVING_SHORT if serving else (), serving)


CASES: tuple[Case, ...] = (
    *(_shipped(p) for p in sorted(SCENARIOS.glob("*.yaml"))),
    # the paper check (sim/studies/paper_check.py: PROTOTYPE_RUNS and link_only_cost)
    Case("paper-full-hbm", PAPER, ("policy.kind=full_hbm",)),
    Case("paper-ours", PAPER, ("policy.semantics=global", "policy.prefetch=layerwise_async", "policy.pinned=true")),
    Case("paper-full-hbm-free-pack", PAPER, ("policy.kind=full_hbm", FREE_PACK)),
    Case("paper-prototype-free-pack", PAPER, (FREE_PACK,)),
    # one small case per engine path
    Case("small-layerwise-step", "h200-7b-batch.yaml", (*SMALL, "sim.detail=step")),
    Case("small-layerwise-one-engine", "h200-7b-batch.yaml", (*SMALL, "hardware.copy_engines=1")),
    Case("small-layerwise-t2-stride", "h200-70b-int4.yaml", (*SMALL, "sim.step_stride=4", "sim.record_every=3")),
    Case("small-sync-pinned", "h200-7b-batch.yaml", (*SMALL, "policy.prefetch=sync_per_step")),
    Case("small-per-interval", "h200-7b-batch.yaml", (*SMALL, "policy.prefetch=per_interval", "policy.compressed_ratio=0.2")),
    Case("small-pageable-blocking", "h200-7b-batch.yaml", (*SMALL, "policy.pinned=false")),
    Case("small-paper-semantics", "h200-7b-batch.yaml", (*SMALL, "policy.semantics=paper_prototype")),
    Case("small-evict-only", "h200-7b-batch.yaml", (*SMALL, "policy.kind=evict_only")),
    Case("small-lengths-lognormal", "h200-7b-batch.yaml",
         (*SMALL, "workload.reasoning_tokens={dist: lognormal, mean: 250, std: 80, min: 40, max: 400}")),
    Case("small-does-not-fit", "h200-70b-int4.yaml", (*SMALL, "model.weight_dtype=bf16", "hardware.gpu=rtx-4090")),
)


def _normalised_json(summary) -> str:
    from sim.outputs.run_folder import to_json

    text = to_json(summary.model_dump(exclude=set(MACHINE_KEYS)))
    return text.replace(str(REPO), "<repo>") + "\n"


def outputs(case: Case) -> dict[str, str]:
    """File name -> text of the golden files of one case."""
    from sim.decode.projection import project
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import load_scenario

    sc = load_scenario(SCENARIOS / case.scenario, list(case.overrides))
    if case.serving:
        from sim.serving.run import simulate_serving

        served = simulate_serving(sc)
        return {"summary.json": _normalised_json(served.summary), "requests.csv": served.requests.to_csv(index=False),
                "timeline.csv": served.timeline.to_csv(index=False)}
    result = simulate(sc)
    projection = project(sc)
    return {
        "summary.json": _normalised_json(result.summary),
        "steps.csv": result.steps.to_csv(index=False),
        "projection.json": _normalised_json(projection),
    }


def same_line(expected: str, actual: str) -> bool:
    """Equal text between the numbers, and each number equal to NUMBER_RTOL (integers exactly)."""
    if expected == actual:
        return True
    a, b = NUMBER.split(expected), NUMBER.split(actual)
    x, y = NUMBER.findall(expected), NUMBER.findall(actual)
    if a != b or len(x) != len(y):
        return False
    for u, v in zip(x, y):
        if u != v and (not ("." in u or "e" in u.lower()) or not math.isclose(float(u), float(v), rel_tol=NUMBER_RTOL)):
            return False
    return True


def first_difference(expected: str, actual: str) -> str | None:
    """Where two files differ beyond a float's last bits (`same_line`), or None."""
    e, a = expected.splitlines(), actual.splitlines()
    for i, (x, y) in enumerate(zip(e, a)):
        if not same_line(x, y):
            return f"line {i + 1}: expected {x.strip()!r}, got {y.strip()!r}"
    return None if len(e) == len(a) else f"lengths differ: {len(e)} vs {len(a)} lines"


def check(case: Case) -> list[str]:
    """Differences between a case's outputs now and its golden files (empty when identical)."""
    problems = []
    for name, text in outputs(case).items():
        path = GOLDEN / case.name / name
        if not path.exists():
            problems.append(f"{case.name}/{name}: no golden file")
        elif (where := first_difference(path.read_text(), text)) is not None:
            problems.append(f"{case.name}/{name}: {where}")
    return problems


def write(case: Case) -> None:
    for name, text in outputs(case).items():
        path = GOLDEN / case.name / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def main(argv: list[str]) -> int:
    problems = []
    for case in CASES:
        if "--check" in argv:
            problems += check(case)
        else:
            write(case)
            print(f"wrote {GOLDEN.relative_to(REPO) / case.name}/", file=sys.stderr)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
