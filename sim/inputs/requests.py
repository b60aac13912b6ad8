"""The requests of a serving run: when each is sent and its prompt and output lengths.

Lengths come from the workload unless a trace gives them: output = `reasoning_tokens`, prompt =
`prompt_tokens`, each an integer or a distribution drawn with `lengths.draw_lengths` (the closed
batch's own rule; outputs are the closed batch's own draws, prompts come from their own stream of
the seed, so giving the prompt a distribution does not change the outputs). Arrival times are drawn
from their own stream too, so changing the rate does not change the lengths.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .errors import ConfigError
from .lengths import draw_lengths
from .limits import MAX_ARRIVAL_S, MAX_REQUESTS, MAX_TOKENS
from .reader import check_csv_header, read_text
from .serving_config import ClosedLoopArrivals, GammaArrivals, PoissonArrivals, TraceArrivals

ARRIVAL_STREAM = 3  # seed stream of arrival times ([seed, 1]: lengths, [seed, 2]: token importance)
PROMPT_STREAM = 4  # seed stream of prompt lengths
TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class RequestSet:
    """Requests in the order they are sent. `arrival_s` is NaN for closed-loop requests (a client
    sends one when its previous one finishes); `concurrency` is the number of such clients."""

    ids: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    concurrency: int | None = None

    def __len__(self) -> int:
        return len(self.ids)


def interarrival_times(arrivals, seed: int) -> np.ndarray:
    """Arrival times of an open-loop process: the first request at t = 0, then i.i.d. gaps
    (vLLM's benchmark sends its first request at once): exponential with mean 1 / rate (Poisson),
    or gamma with shape k = 1 / cv^2 and scale 1 / (rate * k) (mean 1 / rate, CV cv)."""
    rng = np.random.default_rng([arrivals.seed if arrivals.seed is not None else seed, ARRIVAL_STREAM])
    n = arrivals.requests - 1
    if isinstance(arrivals, PoissonArrivals):
        gaps = rng.exponential(1.0 / arrivals.rate_per_s, size=n)
    else:
        shape = 1.0 / arrivals.cv**2
        gaps = rng.gamma(shape, 1.0 / (arrivals.rate_per_s * shape), size=n)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def draw_prompts(workload, n: int) -> np.ndarray:
    """Prompt length of each of `n` requests: `prompt_tokens` itself, or its distribution drawn by
    `draw_lengths`' rule from a seed derived from (workload seed, PROMPT_STREAM) - independent of the
    output lengths' [seed, 1] stream, the same draws for the same seed."""
    p = workload.prompt_tokens
    if isinstance(p, int):
        return np.full(n, p, dtype=np.int64)
    seed = int(np.random.SeedSequence([workload.seed, PROMPT_STREAM]).generate_state(1)[0])
    return draw_lengths(SimpleNamespace(reasoning_tokens=p, seed=seed), n)


def build_requests(workload) -> RequestSet:
    """The requests `workload.arrivals` describes (a trace is read from its path)."""
    a = workload.arrivals
    if isinstance(a, TraceArrivals):
        return read_trace(a.path)
    n = a.requests
    prompts = draw_prompts(workload, n)
    outputs = draw_lengths(workload, n)
    if isinstance(a, ClosedLoopArrivals):
        return RequestSet(np.arange(n), np.full(n, np.nan), prompts, outputs, concurrency=a.concurrency)
    assert isinstance(a, (PoissonArrivals, GammaArrivals))
    return RequestSet(np.arange(n), interarrival_times(a, workload.seed), prompts, outputs)


def _cell(row: dict, column: str, line: int, integer: bool) -> float:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"line {line}: {column}: expected {kind}, got {raw!r}") from None
    if integer and not 1 <= value <= MAX_TOKENS:
        raise ConfigError(f"line {line}: {column}: expected 1 to {MAX_TOKENS:,}, got {value}")
    if not integer and not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"line {line}: {column}: expected a finite number >= 0, got {raw!r}")
    if not integer and value > MAX_ARRIVAL_S:
        raise ConfigError(f"line {line}: {column}: expected at most {MAX_ARRIVAL_S:g} s (about "
                          f"{MAX_ARRIVAL_S / 86400:.0f} days, the horizon a run may span), got {raw!r}")
    return value


def read_trace(path: str | Path) -> RequestSet:
    """A request trace: CSV with a header naming arrival_s, prompt_tokens and output_tokens (other
    columns are ignored), one request a row, sorted by arrival (stable: ids are the row order).
    Any problem is a ConfigError naming the line and column, with the file as its source."""
    text = read_text(path)
    reader = csv.DictReader(io.StringIO(text))
    try:
        check_csv_header(reader.fieldnames, str(path))
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"header: expected the columns {', '.join(TRACE_COLUMNS)}; missing {', '.join(missing)}")
        arrival, prompt, output = [], [], []
        for row in reader:
            line = reader.line_num
            if len(arrival) >= MAX_REQUESTS:
                raise ConfigError(f"line {line}: more than {MAX_REQUESTS:,} requests")
            arrival.append(_cell(row, "arrival_s", line, integer=False))
            prompt.append(_cell(row, "prompt_tokens", line, integer=True))
            output.append(_cell(row, "output_tokens", line, integer=True))
        if not arrival:
            raise ConfigError("no requests (a header and at least one row expected)")
    except csv.Error as exc:
        raise ConfigError(f"line {reader.line_num}: invalid CSV: {exc}", source=str(path)) from None
    except ConfigError as err:
        raise ConfigError(err.message, source=str(path)) from None
    order = np.argsort(np.asarray(arrival), kind="stable")
    return RequestSet(order, np.asarray(arrival)[order], np.asarray(prompt, dtype=np.int64)[order],
                      np.asarray(output, dtype=np.int64)[order])
