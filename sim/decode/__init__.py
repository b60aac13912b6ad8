"""A closed batch decoding: the resolved run context, memory and capacity (fits, max batch), the
SimPy engine (step and layer levels), the fast numpy level, the sampled projection and `simulate`.
Imports the layers below it: `sim.tiering`, `sim.outputs`, `sim.device`, `sim.inputs`, `sim.model`."""
