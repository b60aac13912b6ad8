"""Running many independent tasks: the task protocol and driver, local-process and Ray executors,
the result store keyed by (kind, inputs, simulator version) that verifies each entry it reads, and
the options that choose them.
Knows nothing of what a task computes. Imports `sim.model`, `sim.inputs`, `sim.outputs`."""
