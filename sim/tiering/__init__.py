"""Where each token lives: the tier rule (T0 HBM, T1 host, T2 compressed host, T3 evicted), token-level
plans per sequence and per batch, tier counts from the ratios, the memory trace they imply and
pressure-driven `hbm_ratio: auto`. Imports `sim.model`, `sim.inputs`, `sim.device`."""
