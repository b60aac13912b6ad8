"""Each weight dtype's decode kernel timed across rows on one layer-shaped weight matrix.

Where a profile has a dtype's curve, sim/device/physics.py `weight_kernel_s` costs a layer's projections as
weight bytes / rate(rows), dequantisation and MMA included. So the rate here is weight bytes / kernel
time with the bytes counted as the simulator counts them (sim/model/dtypes.py: payload + one 2-byte scale per
group of WEIGHT_GROUP), and the simulator's time for the measured shape is the measured time.

- bf16: F.linear (cuBLAS on a GPU), from the bf16 decode sweep (gemm.measure_decode), which times the shape;
- int4: torch's tinygemm (hwprobe/model/qlinear.py), gemm.measure_decode_int4 past its usual row cap;
- int8: torch._weight_int8pack_mm, per-output-channel scales. On CUDA that is a reference kernel (one
  thread per output, float32 math): recorded under its name, with a warning;
- fp8: torch._scaled_mm, float8_e4m3fn weights and activations with per-tensor scales, on CUDA GPUs of
  compute capability 8.9 or newer; anywhere else nothing is recorded and a warning says why.
The int8 and fp8 weights are random quantised values (made directly, not by quantising a float
weight), and each kernel's output is compared with x @ W^T once before it is timed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sim.inputs.profile import GemmPoint

from .gemm import sim_bytes_point
from .operands import budget_bytes, random, rotation_count
from .timing import MIN_WINDOW_S, time_window

WEIGHT_GROUP = 128  # the simulator's default weight_group_size; the group the bytes are counted with
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: the first fp8 tensor cores
# |y - x @ W^T| / |x @ W^T| a kernel may show and be timed: bf16 output rounding is ~0.3%, fp8 fast
# accumulation up to ~2%; a wrong layout or a kernel computing something else is ~100%
MAX_REL_ERROR = 0.05
INT8_CUDA_WARNING = (
    "int8 weight kernel: torch._weight_int8pack_mm on CUDA is a reference kernel (one thread per output, "
    "float32 math, no tensor cores); the int8 figures reflect that kernel, not a production int8 kernel")


def on_gpu(backend: Any) -> bool:
    return str(backend.tensor_device).startswith("cuda")


def kernel_names(backend: Any) -> dict[str, str]:
    """By weight dtype: the kernel its points time on this backend."""
    gpu = on_gpu(backend)
    return {
        "bf16": f"torch F.linear bf16 ({'cuBLAS' if gpu else 'cpu'})",
        "int4": f"torch._weight_int4pack_mm{'' if gpu else '_for_cpu'} (tinygemm int4, group {WEIGHT_GROUP})",
        "int8": f"torch._weight_int8pack_mm ({'CUDA reference kernel' if gpu else 'cpu'}, per-channel scales)",
        "fp8": "torch._scaled_mm (cuBLASLt fp8 e4m3 weights and activations, per-tensor scales)",
    }


@dataclass(frozen=True)
class _Kernel:
    """How one quantised dtype runs. weight(torch, shape, device) -> random quantised weight state;
    clone(state) -> the same weight in new memory; dequantised(state) -> W [N, K] float32;
    activation(x [M, K] bf16) -> the kernel's input (made outside the timed calls);
    call(x, state) -> y [M, N] bf16."""

    weight: Callable[[Any, tuple[int, int], Any], tuple]
    dequantised: Callable[[tuple], Any]
    activation: Callable[[Any, Any], Any]
    call: Callable[[Any, Any, tuple], Any]

    @staticmethod
    def clone(state: tuple) -> tuple:
        return tuple(t.clone() for t in state)


def _int8_weight(torch: Any, shape: tuple[int, int], device: Any) -> tuple[Any, Any]:
    """q int8 [N, K] in -127..127 and one scale per output row [N] (bf16): W = q * scale."""
    q = torch.randint(-127, 128, shape, dtype=torch.int8, device=device)
    return q, (torch.rand(shape[0], device=device) * 0.02 + 0.01).to(torch.bfloat16)


def _int8_call(torch: Any, x: Any, state: tuple[Any, Any]) -> Any:
    q, scale = state
    return torch._weight_int8pack_mm(x, q, scale)


def _fp8_weight(torch: Any, shape: tuple[int, int], device: Any) -> tuple[Any, Any, Any]:
    """q float8_e4m3fn [N, K], row-major (q.t() is the column-major [K, N] _scaled_mm takes), one
    float32 scale for the tensor (W = q * scale) and the activation's scale, 1."""
    q = torch.randn(shape, device=device).to(torch.float8_e4m3fn)
    return q, torch.full((), 0.02, device=device), torch.ones((), device=device)


def _fp8_call(torch: Any, x: Any, state: tuple[Any, Any, Any]) -> Any:
    q, scale, one = state
    return torch._scaled_mm(x, q.t(), scale_a=one, scale_b=scale, out_dtype=torch.bfloat16, use_fast_accum=True)


KERNELS: dict[str, _Kernel] = {
    "int8": _Kernel(_int8_weight, lambda s: s[0].float() * s[1].float()[:, None],
                    lambda torch, x: x, _int8_call),
    "fp8": _Kernel(_fp8_weight, lambda s: s[0].float() * s[1],
                   lambda torch, x: x.to(torch.float8_e4m3fn), _fp8_call),
}


def unavailable(backend: Any, dtype: str) -> str | None:
    """Why `dtype`'s kernel cannot be timed here, or None."""
    torch = backend.torch
    if dtype == "int8":
        return None if hasattr(torch, "_weight_int8pack_mm") else f"torch {torch.__version__} has no _weight_int8pack_mm"
    if not on_gpu(backend):
        return ("no fp8 kernel on the CPU (torch._scaled_mm with float8_e4m3fn is timed on CUDA GPUs of "
                "compute capability 8.9 or newer)")
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn / _scaled_mm"
    capability = tuple(torch.cuda.get_device_capability(backend.tensor_device))
    if capability < FP8_MIN_CAPABILITY:
        return (f"compute capability {capability[0]}.{capability[1]} has no fp8 tensor cores "
                f"({FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or newer needed)")
    return None


def _check_output(backend: Any, kernel: _Kernel, state: tuple, rows: int) -> str | None:
    """Why the kernel's output is not x @ W^T of its own (dequantised) operands, or None."""
    torch = backend.torch
    x = kernel.activation(torch, random(backend, (rows, state[0].shape[1]), "bf16"))
    y = kernel.call(torch, x, state).float()
    ref = x.float() @ kernel.dequantised(state).t()
    err = float((y - ref).norm() / ref.norm().clamp(min=1e-30))
    return None if err <= MAX_REL_ERROR else f"output differs from x @ W^T by {err:.1%} (more than {MAX_REL_ERROR:.0%})"


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _weights(backend: Any, kernel: _Kernel, shape: tuple[int, int], copies: int, rows: int) -> tuple[list, str | None]:
    """One random quantised weight, checked against x @ W^T at `rows`, and `copies` - 1 clones of it
    in their own memory (each call reads cold weights; the values do not change the kernel's time);
    ([], why) when the kernel fails or computes something else."""
    try:
        first = kernel.weight(backend.torch, shape, backend.tensor_device)
        why = _check_output(backend, kernel, first, rows)
        return ([], why) if why else ([first] + [kernel.clone(first) for _ in range(copies - 1)], None)
    except (RuntimeError, TypeError, AttributeError) as err:  # a build or device without the kernel
        return [], _first_line(err)


def measure(backend: Any, dtype: str, shape: tuple[int, int], rows: list[int], *, samples: int,
            min_window_s: float = MIN_WINDOW_S, on_point: Callable[[str], None] = lambda label: None,
            ) -> tuple[list[GemmPoint], list[str], list[str]]:
    """`dtype`'s kernel (int8 or fp8) on W [N, K] = `shape` at each M in `rows`, with random weights
    rotated past the last-level cache. Returns (points, skipped, warnings)."""
    from sim.model.dtypes import WEIGHT_DTYPES

    torch = backend.torch
    kernel = KERNELS[dtype]
    n, k = shape
    label = f"{dtype} weight kernel"
    sim_bytes = WEIGHT_DTYPES[dtype].bytes_for(n * k, WEIGHT_GROUP)
    why, skipped, warnings = unavailable(backend, dtype), [], []
    weights: list[tuple] = []
    if why is None and rows:
        # the float32 reference of the output check exists next to the first copy
        copies = rotation_count(int(sim_bytes), backend.cache_bytes, budget_bytes(backend) - 4 * n * k)
        if copies == 0:
            skipped.append(f"{label} N={n} K={k}: weights do not fit in free device memory")
        else:
            weights, why = _weights(backend, kernel, (n, k), copies, min(rows))
    if why is not None:
        warnings.append(f"{dtype} unavailable: {why}")
    if not weights:
        for m in rows:
            on_point(f"{label} {m}x{n}x{k} (not timed)")
        return [], skipped, warnings
    if dtype == "int8" and on_gpu(backend):
        warnings.append(INT8_CUDA_WARNING)
    points = []
    for m in rows:
        on_point(f"{label} {m}x{n}x{k}")
        x = kernel.activation(torch, random(backend, (m, k), "bf16"))
        try:
            timing = time_window(backend.window(lambda i: kernel.call(torch, x, weights[i % len(weights)]), events=True),
                                 samples=samples, min_window_s=min_window_s)
        except RuntimeError as err:
            skipped.append(f"{label} {m}x{n}x{k}: {_first_line(err)}")
            continue
        points.append(sim_bytes_point(m, n, k, dtype, sim_bytes, timing))
    return points, skipped, warnings


def curves(points: list[GemmPoint], shape: tuple[int, int], rows: list[int]) -> dict[str, list[tuple[int, float]]]:
    """By weight dtype: (M, weight bytes per second) of the points on `shape` at the swept rows,
    ascending M; a dtype with fewer than two rows has no curve (one point says nothing about rows)."""
    by_dtype: dict[str, dict[int, float]] = {}
    for p in points:
        if (p.n, p.k) == tuple(shape) and p.m in rows:
            by_dtype.setdefault(p.dtype, {})[p.m] = p.weight_bytes_per_s
    return {dtype: sorted(rates.items()) for dtype, rates in by_dtype.items() if len(rates) >= 2}
