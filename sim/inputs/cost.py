"""What a piece of work will cost, estimated before it starts, and the budget it must fit.

A serving simulation takes at least a known number of steps: one token a step for each request
(its longest request's prefill chunks and outputs, one after another), at most `max_num_seqs`
decodes and `max_num_batched_tokens` tokens a step. A plan runs one such simulation per candidate
at least; a sweep validates and keeps every point in memory before the first runs. Past a budget
(`limits.MAX_SERVING_STEPS`, `MAX_SERVING_TOKENS`, `MAX_PLAN_STEPS`, `MAX_SWEEP_POINTS`) the
command refuses, with the estimate and the limit in its one line; `--allow-large` (ALLOW_FLAG) runs
it anyway, with the estimate said as a warning first.
"""

from __future__ import annotations

import sys

import numpy as np

from .errors import ConfigError
from .limits import MAX_SERVING_STEPS, MAX_SERVING_TOKENS, MAX_SWEEP_POINTS
from .requests import RequestSet, build_requests

ALLOW_FLAG = "--allow-large"
SWEEP_POINT_BYTES = 20e3  # memory a sweep point takes before it runs (its validated scenario, task, key)
SWEEP_POINT_S = 1e-4  # time to expand and validate one point


def over_budget(message: str, *, allow: bool, field: str | None = None, source: str | None = None) -> None:
    """Refuse work past its budget (`message` says the estimate and the limit), or with `allow`
    say it on stderr and carry on."""
    if not allow:
        raise ConfigError(f"{message}; give {ALLOW_FLAG} to run it anyway", source=source, field=field)
    print(f"kvsim: warning: {message}; running it ({ALLOW_FLAG})", file=sys.stderr)


def serving_steps(requests: RequestSet, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Steps a serving run of `requests` takes at least (preemptions and idle arrivals only add)."""
    prompt = requests.prompt_tokens.astype(np.float64)
    output = requests.output_tokens.astype(np.float64)
    longest = float(np.max(np.ceil(prompt / max_num_batched_tokens) + output - 1.0))
    by_seqs = float(np.ceil(output.sum() / max_num_seqs))
    by_tokens = float(np.ceil((prompt.sum() + output.sum()) / max_num_batched_tokens))
    return int(max(1.0, longest, by_seqs, by_tokens))


def serving_tokens(requests: RequestSet) -> int:
    return int(requests.prompt_tokens.sum()) + int(requests.output_tokens.sum())


def check_serving_cost(scenario, *, allow: bool, source: str | None = None) -> None:
    """A serving scenario's simulation within MAX_SERVING_STEPS and MAX_SERVING_TOKENS (or allowed)."""
    requests = build_requests(scenario.workload)
    sched = scenario.scheduler
    steps = serving_steps(requests, sched.max_num_seqs, sched.max_num_batched_tokens)
    tokens = serving_tokens(requests)
    n = f"{len(requests):,} request{'' if len(requests) == 1 else 's'}"
    if steps > MAX_SERVING_STEPS:
        over_budget(f"{n} would take at least {steps:,} simulated steps, more than the "
                    f"{MAX_SERVING_STEPS:,} a run may take", allow=allow, source=source, field="workload.arrivals")
    elif tokens > MAX_SERVING_TOKENS:
        over_budget(f"{n} hold {tokens:,} prompt and output tokens, more than the "
                    f"{MAX_SERVING_TOKENS:,} a run may simulate", allow=allow, source=source, field="workload.arrivals")


def check_sweep_points(points: int, *, allow: bool, source: str | None = None) -> None:
    """A sweep of `points` within MAX_SWEEP_POINTS (or allowed): each is validated and kept first."""
    if points <= MAX_SWEEP_POINTS:
        return
    gb, minutes = points * SWEEP_POINT_BYTES / 1e9, points * SWEEP_POINT_S / 60.0
    over_budget(f"{points:,} points would take about {gb:,.1f} GB and {minutes:,.1f} min to validate before the first "
                f"one runs, more than the {MAX_SWEEP_POINTS:,} points a sweep may have", allow=allow, source=source,
                field="axes")
