"""The model as the simulator sees it: units, weight and KV dtypes, and the model spec (shapes,
parameters, KV bytes per token, tensor-parallel shards). The bottom layer: imports nothing from sim."""
