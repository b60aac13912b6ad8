"""Load-time checks of a serving scenario that the schema alone cannot make: the trace file reads,
every request has a prompt (a trace's own, or drawn no longer than a run can hold), and without
chunked prefill every request's longest prefill fits one step's token budget (vLLM requires
max_num_batched_tokens >= max_model_len then; under no_evict admission nothing is preempted, so the
longest prefill is the longest prompt). The last request arrives within the horizon a run may
span (`limits.MAX_ARRIVAL_S`)."""

from __future__ import annotations

import numpy as np

from .errors import ConfigError
from .limits import MAX_ARRIVAL_S, MAX_TOKENS
from .requests import build_requests
from .serving_config import TraceArrivals


def check_serving(scenario, source: str) -> None:
    w = scenario.workload
    if w.arrivals is None:
        for section in ("scheduler", "slo"):
            if section in scenario.model_fields_set:
                raise ConfigError("applies to a serving run: give workload.arrivals too", source=source, field=section)
        return
    fixed = isinstance(w.prompt_tokens, int)
    if isinstance(w.arrivals, TraceArrivals) and not fixed:
        raise ConfigError("the trace gives each request's prompt length: drop the distribution", source=source,
                          field="workload.prompt_tokens")
    if not isinstance(w.arrivals, TraceArrivals) and fixed and w.prompt_tokens < 1:
        raise ConfigError("a served request needs a prompt: expected at least 1", source=source,
                          field="workload.prompt_tokens")
    try:
        reqs = build_requests(w)
    except ConfigError as err:
        where = ": ".join(p for p in (err.source, err.field) if p)
        raise ConfigError(f"{where}: {err.message}", source=source, field="workload.arrivals.path") from None
    last = float(np.nanmax(reqs.arrival_s)) if not np.isnan(reqs.arrival_s).all() else 0.0
    if last > MAX_ARRIVAL_S:  # a trace's rows are checked as they are read; this is a drawn process
        raise ConfigError(f"the last of {len(reqs):,} requests arrives at {last:.3g} s, beyond the {MAX_ARRIVAL_S:g} s "
                          f"(about {MAX_ARRIVAL_S / 86400:.0f} days) a run may span; expected a higher rate_per_s "
                          f"or fewer requests", source=source, field="workload.arrivals.rate_per_s")
    if not fixed and int(reqs.prompt_tokens.max()) > MAX_TOKENS:
        raise ConfigError(f"draws a prompt of {int(reqs.prompt_tokens.max()):,} tokens, more than {MAX_TOKENS:,}; "
                          f"give a max", source=source, field="workload.prompt_tokens")
    sc = scenario.scheduler
    if not sc.chunked_prefill:
        # a preempted request re-prefills all but its last token; under no_evict none is preempted
        prefills = reqs.prompt_tokens if sc.admission == "no_evict" else reqs.prompt_tokens + reqs.output_tokens - 1
        longest = int(prefills.max())
        if longest > sc.max_num_batched_tokens:
            raise ConfigError(f"without chunked prefill a step must hold a request's whole prefill: the longest "
                              f"request needs {longest:,} tokens, more than {sc.max_num_batched_tokens:,}",
                              source=source, field="scheduler.max_num_batched_tokens")
