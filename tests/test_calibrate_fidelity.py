"""What `hwprobe calibrate` measures for the simulator's fidelity models, piece by piece: the attention
fit, the weight-kernel sweep and its honesty (no fp8 where there is none, wrong kernels not timed), the
checks and the printed summary. The end-to-end CPU run is checked in test_hwprobe_calibrate.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hwprobe.calibrate import checks, summary, weight_kernels
from hwprobe.calibrate.attention import fit_kv_stream, point_kv_bytes
from hwprobe.calibrate.backend import CpuBackend
from hwprobe.calibrate.plan import make_plan
from sim.inputs import catalog
from sim.inputs.profile import AttentionPoint, GemmPoint

from .test_hwprobe_calibrate import _profile

torch = pytest.importorskip("torch")
H200 = catalog.gpu("h200-sxm")


def _attention(context: int, batch: int = 1, time_s: float | None = None,
               line: tuple[float, float] = (5e-6, 1e12)) -> AttentionPoint:
    """A 7B-shaped decode attention point; by default exactly on time = latency + bytes / bandwidth."""
    p = AttentionPoint(batch=batch, context_tokens=context, num_heads=28, num_kv_heads=4, head_dim=128, dtype="bf16",
                       time_s=1.0, kv_bytes_per_s=1.0, backend="flash_attention (cuda)")
    t = time_s if time_s is not None else line[0] + point_kv_bytes(p) / line[1]
    return p.model_copy(update={"time_s": t, "kv_bytes_per_s": point_kv_bytes(p) / t})


# ---- the attention fit ---------------------------------------------------------------------------

def test_attention_fit_recovers_latency_and_bandwidth_of_points_on_a_line():
    points = [_attention(n, b) for b in (1, 8) for n in (256, 1024, 4096, 16384, 65536)]
    fit = fit_kv_stream(points)
    assert fit.latency_s == pytest.approx(5e-6, rel=1e-6) and fit.bytes_per_s == pytest.approx(1e12, rel=1e-6)
    assert fit.unsound is None and fit.points == 10 and fit.median_rel_residual < 1e-9


def test_attention_fit_clamps_a_negative_latency_at_zero():
    fit = fit_kv_stream([_attention(n, line=(-2e-6, 1e12)) for n in (4096, 16384, 65536)])
    assert fit.latency_s == 0.0 and fit.bytes_per_s > 0


@pytest.mark.parametrize("contexts, times, why", [
    ((1024, 4096), None, "2 distinct K/V sizes, fewer than 3"),
    ((1024, 1536, 2048), None, "K/V sizes span 2.0x, less than 4x"),
    ((64, 256, 1024), (1.5e-4, 8e-3, 8e-3), "the line misses the points by"),  # a loaded 2-core CPU's
])
def test_attention_fit_that_says_little_is_marked_unsound(contexts, times, why):
    points = [_attention(n, time_s=times[i] if times else None) for i, n in enumerate(contexts)]
    assert fit_kv_stream(points).unsound.startswith(why)
    assert fit_kv_stream([]) is None


# ---- the weight-kernel sweep ---------------------------------------------------------------------

def _gemm(m, dtype, rate, n=512, k=3584):
    return GemmPoint(m=m, n=n, k=k, dtype=dtype, time_s=1.0, flop_per_s=1.0, weight_bytes_per_s=rate)


def test_curves_take_the_swept_shape_and_rows_in_order():
    points = [_gemm(8, "bf16", 2.0), _gemm(1, "bf16", 1.0), _gemm(2, "bf16", 9.0), _gemm(1, "bf16", 5.0, n=1024),
              _gemm(1, "int8", 3.0)]  # a row outside the sweep, another shape, a dtype with one row
    assert weight_kernels.curves(points, (512, 3584), [1, 8]) == {"bf16": [(1, 1.0), (8, 2.0)]}


def test_plans_sweep_the_weight_kernels_on_a_shape_and_rows_the_gemm_sweep_has():
    quick = make_plan("cuda", quick=True)
    assert quick.weight_kernel_shape == (18944, 3584) and quick.weight_kernel_rows[:8] == (1, 2, 4, 8, 16, 32, 64, 128)
    assert quick.int4_kernel_rows == (16, 32, 64, 128, 256)
    assert len(make_plan("cuda", quick=True).attention_contexts) >= 3
    with pytest.raises(ValueError, match="weight-kernel shape and rows"):
        quick.__class__(**{**quick.__dict__, "weight_kernel_rows": (1, 3)})


def test_int8_kernel_on_the_cpu_counts_weight_bytes_as_the_simulator_does():
    steps = []
    points, skipped, warnings = weight_kernels.measure(CpuBackend(), "int8", (64, 256), [1, 4], samples=3,
                                                       min_window_s=1e-4, on_point=steps.append)
    assert [p.m for p in points] == [1, 4] and {p.dtype for p in points} == {"int8"}
    sim_bytes = 64 * 256 + 64 * 256 / 128 * 2
    assert all(p.weight_bytes_per_s == pytest.approx(sim_bytes / p.time_s) for p in points)
    assert skipped == [] and warnings == [] and len(steps) == 2


def test_fp8_is_never_timed_on_the_cpu_and_the_profile_says_why():
    steps = []
    points, _, warnings = weight_kernels.measure(CpuBackend(), "fp8", (64, 256), [1, 4], samples=3,
                                                 min_window_s=1e-4, on_point=steps.append)
    assert points == [] and len(steps) == 2  # one progress step per row all the same
    assert warnings == ["fp8 unavailable: no fp8 kernel on the CPU (torch._scaled_mm with float8_e4m3fn is timed "
                        "on CUDA GPUs of compute capability 8.9 or newer)"]


@pytest.mark.parametrize("capability, why", [
    ((8, 0), "compute capability 8.0 has no fp8 tensor cores (8.9 or newer needed)"),
    ((8, 9), None), ((9, 0), None),
])
def test_fp8_needs_compute_capability_8_9(capability, why):
    fake_torch = SimpleNamespace(__version__="2.x", float8_e4m3fn=object(), _scaled_mm=object(),
                                 cuda=SimpleNamespace(get_device_capability=lambda device: capability))
    backend = SimpleNamespace(torch=fake_torch, tensor_device="cuda:0")
    assert weight_kernels.unavailable(backend, "fp8") == why


def test_a_kernel_that_computes_something_else_is_not_timed(monkeypatch):
    real = weight_kernels.KERNELS["int8"]
    wrong = weight_kernels._Kernel(real.weight, lambda s: real.dequantised(s).flip(0), real.activation, real.call)
    monkeypatch.setitem(weight_kernels.KERNELS, "int8", wrong)
    points, _, warnings = weight_kernels.measure(CpuBackend(), "int8", (64, 256), [1, 4], samples=3, min_window_s=1e-4)
    assert points == [] and len(warnings) == 1
    assert warnings[0].startswith("int8 unavailable: output differs from x @ W^T by ")


def test_a_kernel_the_build_lacks_is_reported_not_raised(monkeypatch):
    def missing(torch, x, state):
        raise RuntimeError("Could not run 'aten::_weight_int8pack_mm' with arguments from the 'CUDA' backend.\nmore")

    real = weight_kernels.KERNELS["int8"]
    monkeypatch.setitem(weight_kernels.KERNELS, "int8", weight_kernels._Kernel(real.weight, real.dequantised,
                                                                               real.activation, missing))
    _, _, warnings = weight_kernels.measure(CpuBackend(), "int8", (64, 256), [1], samples=3, min_window_s=1e-4)
    assert warnings == ["int8 unavailable: Could not run 'aten::_weight_int8pack_mm' with arguments from the "
                        "'CUDA' backend."]


# ---- checks and the printed summary --------------------------------------------------------------

def _with_fidelity(profile, **compute):
    return profile.model_copy(update={"device_memory_free_bytes": 140e9,
                                      "compute": profile.compute.model_copy(update=compute)})


def test_fp8_gemms_are_bounded_by_the_fp8_peak_and_kernel_rates_by_memory_bandwidth():
    fp8 = GemmPoint(m=128, n=18944, k=3584, dtype="fp8", time_s=1.0, flop_per_s=1200e12, weight_bytes_per_s=1e12)
    base = _profile()
    fine = _with_fidelity(base, gemm_points=base.compute.gemm_points + [fp8],
                          weight_kernel_bytes_per_s_by_rows={"fp8": [(1, 4.0e12), (128, 3.5e12)]})
    assert checks.implausible(fine, H200, None) == []
    fast = _with_fidelity(base, gemm_points=[fp8.model_copy(update={"flop_per_s": 2500e12})],
                          weight_kernel_bytes_per_s_by_rows={"int4": [(1, 6e12), (8, 5e12)]})
    found = checks.implausible(fast, H200, None)
    assert any(w.startswith("implausible: GEMM 128x18944x3584 fp8 measured 2500.00 TFLOP/s, above the "
                            "h200-sxm datasheet fp8") for w in found), found
    assert any(w.startswith("implausible: weight kernel int4 (simulator bytes) measured 6000.0 GB/s") for w in found)


def test_summary_shows_free_memory_kernels_by_rows_and_attention_latency():
    profile = _with_fidelity(_profile(), attention_latency_s=6.5e-6,
                             weight_kernel_bytes_per_s_by_rows={"int8": [(1, 1.2e12), (128, 45e9)]},
                             weight_kernels={"int8": "torch._weight_int8pack_mm (CUDA reference kernel)"})
    rows = dict(summary.summary_rows(profile))
    assert rows["device memory"] == "139.698 GiB, 130.385 GiB free at the start"
    assert rows["weight kernel int8, GB/s by M"] == "M=1 1200, M=128 45 (torch._weight_int8pack_mm (CUDA reference kernel))"
    assert rows["attention K/V streaming"] == "3000.0 GB/s + 6.5 us per call (flash_attention (cuda))"
    cpu = dict(summary.summary_rows(profile.model_copy(update={"device_memory_free_bytes": None})))
    assert cpu["device memory"] == "139.698 GiB, free not recorded (host memory)"
