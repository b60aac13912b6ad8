"""`kvsim plan`: which GPUs, how many and which policy serve a rate within SLOs at the lowest cost -
the candidate search (`search`) and the files it writes (`files`). Imports `sim.serving`,
`sim.decode`, `sim.runner` and the layers below them."""
