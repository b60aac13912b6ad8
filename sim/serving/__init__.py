"""Open-loop serving: requests arrive, a continuous-batching scheduler admits them by memory and forms
mixed prefill + decode steps, each costed by `sim.device.physics.mixed_step_cost`.

One concept per module: `tier_counts` / `row_counts` (a request's tier counts, fixed or under memory
pressure), `kv_memory` (the KV budget admission checks against), `scheduler` (the step plan: decodes,
chunked prefills, admission, preemption), `swap` (swap preemption's bytes and host ledger), `engine`
(SimPy: arrivals, the step loop and its swaps), `metrics` (per-request table, timeline, summary
figures), `run` (`simulate_serving`). The requests themselves and the serving sections of the
scenario are inputs (`sim.inputs.requests`, `sim.inputs.serving_config`). Imports `sim.decode` and below.
"""
