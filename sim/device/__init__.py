"""The hardware a run resolves to and what it costs: GPU, host link, interconnect and host figures
(datasheet or measured), the operator and step costs (`physics`), host-side attention's pipeline,
host DRAM sharing, HBM accounting rules and busy-interval arithmetic. Imports `sim.model`, `sim.inputs`."""
