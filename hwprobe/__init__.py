"""kvtier hardware validator: calibrate a machine, run the real tiered KV cache, validate the simulator."""
