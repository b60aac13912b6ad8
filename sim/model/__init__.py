"""The model as the simulator sees it: units, weight and KV dtypes, layer kinds (full attention, MLA,
sliding window, linear state) and the model spec (shapes, parameters, KV bytes per token and per
sequence, tensor-parallel shards). The bottom layer: imports nothing from sim."""
