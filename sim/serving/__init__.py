"""Open-loop serving (issue #14): requests arrive, a continuous-batching scheduler admits them by
memory and forms mixed prefill + decode steps, each costed by `physics.mixed_step_cost`.

One concept per module: `config` (the scenario's arrivals, scheduler and SLO sections), `arrivals`
(request arrival times and lengths), `tier_counts` (a sequence's tier counts at its length),
`kv_memory` (the KV budget admission checks against), `scheduler` (the step plan: admit, chunk,
preempt), `swap` (swap preemption's bytes and host ledger), `engine` (SimPy: arrivals, the step loop
and its swaps), `metrics` (per-request table, timeline, summary figures), `run` (`simulate_serving`;
its summary is `sim/schema.py: ServingSummary`). Kept free of imports here so `sim.scenario` can import `config`.
"""
