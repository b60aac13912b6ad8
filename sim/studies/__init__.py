"""Studies built on the simulator: the 7B-70B projection sweep (`projection_grid`), which access
strategy wins (`access_strategies`) and the reference paper's claims checked (`paper_claims`,
`paper_check`). They compute; `sim.report` only presents. Imports `sim.decode`, `sim.runner` and below."""
