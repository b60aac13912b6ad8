"""Machine calibration: measure copies, GEMMs and attention, and write the profile `sim` consumes.

One concept per module: `env` (NVML, host, torch), `backend` (buffers, clocks, streams), `timing`
(windows and samples), `fit` (latency + bandwidth), `copies`, `gemm`, `weight_kernels` (each weight
dtype's decode kernel across rows), `attention`, `device_copy`, `plan` (what to sweep), `checks`
(warnings), `runner` (orchestration into a `Profile`).
torch is imported only inside functions that need it, so `hwprobe info` works without torch.
"""
