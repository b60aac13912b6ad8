"""`hwprobe calibrate`: the fit, the checks, data integrity, the unavailable path, a CPU run end to end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hwprobe.calibrate import checks
from hwprobe.calibrate.fit import fit_latency_bandwidth
from hwprobe.calibrate.plan import powers_of_two
from hwprobe.cli import app
from sim.inputs import catalog
from sim.inputs.profile import (
    AttentionPoint,
    ComputeProfile,
    CopyCurve,
    CopyPoint,
    GemmPoint,
    LinkProfile,
    Profile,
    load_profile,
    profile_to_yaml,
)
from sim.model.units import GB, TFLOP, GiB, KiB, MiB
from sim.outputs.atomic import write_text_atomic

torch = pytest.importorskip("torch")
runner = CliRunner()
SIZES = powers_of_two(4 * KiB, 1 * GiB)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ---- the fit ------------------------------------------------------------------------------------

def test_fit_recovers_exact_latency_and_bandwidth():
    latency_s, bandwidth = 5e-6, 50 * GB
    fit = fit_latency_bandwidth(SIZES, [latency_s + s / bandwidth for s in SIZES])
    assert fit.per_copy_latency_s == pytest.approx(latency_s, rel=1e-9)
    assert fit.bytes_per_s == pytest.approx(bandwidth, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(latency_s=st.floats(1e-7, 1e-3), bandwidth=st.floats(1e8, 1e12))
def test_fit_recovers_any_exact_line(latency_s, bandwidth):
    fit = fit_latency_bandwidth(SIZES, [latency_s + s / bandwidth for s in SIZES])
    assert fit.per_copy_latency_s == pytest.approx(latency_s, rel=1e-6)
    assert fit.bytes_per_s == pytest.approx(bandwidth, rel=1e-6)


def test_fit_weights_small_copies_so_latency_survives_noise_on_large_ones():
    latency_s, bandwidth = 10e-6, 25 * GB
    times = [(latency_s + s / bandwidth) * (1.02 if s >= 256 * MiB else 1.0) for s in SIZES]
    assert fit_latency_bandwidth(SIZES, times).per_copy_latency_s == pytest.approx(latency_s, rel=0.05)


def test_fit_with_negative_intercept_goes_through_the_origin():
    sizes = [1 * MiB, 2 * MiB, 4 * MiB]
    fit = fit_latency_bandwidth(sizes, [s / (10 * GB) - 20e-6 for s in sizes])
    assert fit.per_copy_latency_s == 0.0
    assert 10 * GB < fit.bytes_per_s < 12 * GB


def test_fit_of_one_size_is_size_over_time():
    fit = fit_latency_bandwidth([4 * MiB, 4 * MiB], [1e-3, 1e-3])
    assert fit == type(fit)(0.0, 4 * MiB / 1e-3)


@pytest.mark.parametrize("sizes, times", [([], []), ([1, 2], [1.0]), ([0, 2], [1.0, 2.0]), ([1, 2], [1.0, -1.0])])
def test_fit_rejects_bad_input(sizes, times):
    with pytest.raises(ValueError):
        fit_latency_bandwidth(sizes, times)


# ---- synthetic profiles -------------------------------------------------------------------------

def _curve(direction, memory, bytes_per_s, concurrent=False, spread=0.01):
    """Small copies slower and noisier than large ones, like real ones."""
    shape = [(64 * KiB, 0.5, 1.0), (1 * MiB, 0.8, 0.5), (64 * MiB, 1.0, 0.25)]
    points = [CopyPoint(size_bytes=s, time_s=s / (bytes_per_s * f), bytes_per_s=bytes_per_s * f, samples=5,
                        rel_spread=spread * g) for s, f, g in shape]
    return CopyCurve(direction=direction, memory=memory, concurrent=concurrent, points=points,
                     fit_per_copy_latency_s=0.0, fit_bytes_per_s=bytes_per_s)


def _profile(h2d_pinned=50 * GB, gemm_flop_per_s=700 * TFLOP, device_copy=4.3e12, spread=0.01, warnings=()):
    gemm = GemmPoint(m=8192, n=8192, k=8192, dtype="bf16", time_s=2 * 8192**3 / gemm_flop_per_s,
                     flop_per_s=gemm_flop_per_s, weight_bytes_per_s=1e9, samples=5, rel_spread=spread,
                     best_flop_per_s=gemm_flop_per_s * 1.01)
    attn = AttentionPoint(batch=1, context_tokens=4096, num_heads=28, num_kv_heads=4, head_dim=128, dtype="bf16",
                          time_s=2e-6, kv_bytes_per_s=3e12, backend="flash_attention (cuda)", samples=5,
                          rel_spread=spread)
    return Profile(
        device="cuda", device_name="NVIDIA H200", machine="test-host", created_utc="2026-01-01T00:00:00+00:00",
        versions={"torch": "2.13.0"}, environment={"host": {"cpu_model": "x"}, "plan": {"samples": 5}},
        device_memory_bytes=150e9, host_memory_bytes=2e12, copy_engines=3,
        link=LinkProfile(curves=[_curve("h2d", "pinned", h2d_pinned, spread=spread), _curve("d2h", "pinned", 50 * GB),
                                 _curve("h2d", "pinned", 40 * GB, concurrent=True)],
                         bidirectional_h2d_bytes_per_s=40 * GB, bidirectional_d2h_bytes_per_s=38 * GB),
        compute=ComputeProfile(device_copy_bytes_per_s=device_copy, weight_hbm_bytes_per_s={"bf16": 3.9e12},
                               attention_hbm_bytes_per_s=3e12, peak_flop_per_s={"bf16": gemm_flop_per_s},
                               gemm_flop_per_s_by_rows=[(1, 3e12), (256, 5e14)], layer_overhead_s=2e-5,
                               kernel_launch_s=2.5e-6, attention_backend="flash_attention (cuda)",
                               gemm_points=[gemm], attention_points=[attn]),
        warnings=list(warnings), quick=True,
    )


def test_profile_round_trip(tmp_path):
    profile = _profile(warnings=["implausible: nothing"])
    path = tmp_path / "p.yaml"
    write_text_atomic(path, profile_to_yaml(profile))
    loaded = load_profile(path)
    assert loaded == profile
    assert loaded.compute.gemm_points[0].best_flop_per_s == profile.compute.gemm_points[0].best_flop_per_s
    assert loaded.compute.gemm_flop_per_s_by_rows == [(1, 3e12), (256, 5e14)]


# ---- bound checks -------------------------------------------------------------------------------

H200 = catalog.gpu("h200-sxm")
GEN5 = checks.link_peak(H200, 5, 16)


def test_plausible_figures_raise_no_warning():
    assert checks.implausible(_profile(), H200, GEN5) == []


def test_copy_faster_than_the_link_is_implausible():
    found = checks.implausible(_profile(h2d_pinned=80 * GB), H200, GEN5)
    assert any(w.startswith("implausible: h2d pinned copy of 64 MiB measured 80.0 GB/s")
               and "pcie-gen5-x16 theoretical 63.0 GB/s" in w for w in found), found
    assert any("h2d pinned fitted bandwidth" in w for w in found)
    assert not any("d2h" in w for w in found)


def test_gemm_and_memory_faster_than_the_datasheet_are_implausible():
    found = checks.implausible(_profile(gemm_flop_per_s=1200 * TFLOP, device_copy=6e12), H200, GEN5)
    assert "implausible: GEMM 8192x8192x8192 bf16 measured 1200.00 TFLOP/s, above the h200-sxm datasheet bf16 989.00 TFLOP/s" in found
    assert "implausible: peak bf16 GEMM measured 1200.00 TFLOP/s, above the h200-sxm datasheet bf16 989.00 TFLOP/s" in found
    assert any(w.startswith("implausible: device-to-device copy (read + written) measured 6000.0 GB/s") for w in found)


def test_no_bounds_without_a_catalog_match():
    assert checks.implausible(_profile(gemm_flop_per_s=5000 * TFLOP, h2d_pinned=500 * GB), None, None) == []


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H200", "h200-sxm"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA GH200 480GB", "gh200-144gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"), ("Tesla T4", None),
])
def test_match_gpu(name, expected):
    spec = checks.match_gpu(name)
    assert (spec.name if spec else None) == expected


def test_link_peak_follows_nvml_generation_and_width():
    assert checks.link_peak(H200, 4, 16) == checks.LinkPeak("pcie-gen4-x16", 31.5 * GB)
    assert checks.link_peak(H200, 5, 8) == checks.LinkPeak("pcie-gen5-x8", 31.5 * GB)
    assert checks.link_peak(H200, None, None) == checks.LinkPeak("pcie-gen5-x16", 63 * GB)
    assert checks.link_peak(catalog.gpu("gh200"), 5, 16).name == "nvlink-c2c"
    assert checks.link_peak(None, None, None) is None


def test_variance_throttling_downtrain_and_drift_warnings():
    noisy = checks.high_variance(_profile(spread=0.5))
    assert "high variance: h2d pinned copies: 2 of 3 points spread more than 20% between samples (worst 50% at 64 KiB)" in noisy
    assert any(w.startswith("high variance: GEMMs: 1 of 1") for w in noisy)
    assert not any(w.startswith("high variance: d2h") for w in noisy)
    assert checks.high_variance(_profile()) == []
    cpu_like = _profile(spread=0.5)
    curve = cpu_like.link.curves[0]
    cpu_like = cpu_like.model_copy(update={"link": cpu_like.link.model_copy(
        update={"curves": [curve, curve.model_copy(update={"memory": "pageable"})]})})
    assert [w for w in checks.high_variance(cpu_like) if "copies" in w] == [
        "high variance: h2d pinned/pageable copies: 2 of 3 points spread more than 20% between samples (worst 50% at 64 KiB)"]
    assert checks.throttling(0x1 | 0x2) == []  # idle and application clocks are not throttling
    assert checks.throttling(0x4 | 0x40) == [
        "throttling seen during the run: sw_power_cap, hw_thermal_slowdown (clocks were held down; compute figures may be low)"]
    static = {"pcie_gen_max": 5, "pcie_width_max": 16}
    assert checks.downtrained(static, {"pcie_gen_current": 5, "pcie_width_current": 16}) == []
    assert "PCIe gen 4 x16 under load" in checks.downtrained(static, {"pcie_gen_current": 4, "pcie_width_current": 16})[0]
    assert "gen 5 x8 under load" in checks.downtrained(static, {"pcie_gen_current": 5, "pcie_width_current": 8})[0]
    assert checks.drift("x", 1.0, 1.09) is None
    assert "+15%" in checks.drift("h2d pinned copy of 64 MiB", 1.0, 1.15)
    assert "-20%" in checks.drift("GEMM", 1.0, 0.8)


# ---- data integrity -----------------------------------------------------------------------------

from hwprobe.calibrate import copies  # noqa: E402
from hwprobe.calibrate.backend import CpuBackend  # noqa: E402


class FlipsOneByte(CpuBackend):
    """A copy that corrupts one byte in the middle of the destination."""

    def copy(self, dst, src, non_blocking=False):
        dst.copy_(src)
        dst[dst.numel() // 2] ^= 0x10


class CopiesNothing(CpuBackend):
    def copy(self, dst, src, non_blocking=False):
        pass


QUICK = dict(samples=3, min_window_s=1e-4)


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_integrity_check_catches_a_flipped_byte(direction):
    backend = FlipsOneByte()
    bufs = copies.allocate(backend, 64 * KiB, ("pageable",))
    with pytest.raises(copies.CopyIntegrityError) as err:
        copies.measure_point(backend, bufs, direction, "pageable", 16 * KiB, **QUICK)
    assert str(err.value) == (f"{direction} pageable copy of 16 KiB (16384 bytes): "
                              "1 bytes differ from the source, first at byte 8192")
    assert err.value.direction == direction and err.value.size_bytes == 16 * KiB


def test_integrity_check_catches_a_copy_that_never_happened():
    backend = CopiesNothing()
    bufs = copies.allocate(backend, 4 * KiB, ("pageable",))
    with pytest.raises(copies.CopyIntegrityError, match=r"h2d pageable copy of 4 KiB .*: 4096 bytes differ.*byte 0"):
        copies.measure_point(backend, bufs, "h2d", "pageable", 4 * KiB, **QUICK)


def test_integrity_check_covers_concurrent_copies():
    backend = FlipsOneByte()
    bufs = copies.allocate(backend, 64 * KiB, ("pageable",))
    with pytest.raises(copies.CopyIntegrityError, match="pageable \\(concurrent\\) copy of 64 KiB"):
        copies.measure_concurrent_point(backend, bufs, "pageable", 64 * KiB, **QUICK)


def test_a_healthy_copy_is_verified_and_timed():
    backend = CpuBackend()
    bufs = copies.allocate(backend, 1 * MiB, ("pageable",))
    point = copies.measure_point(backend, bufs, "d2h", "pageable", 1 * MiB, **QUICK)
    assert point.verified and point.samples == 3 and point.size_bytes == 1 * MiB
    assert point.bytes_per_s == pytest.approx(point.size_bytes / point.time_s)
    assert torch.equal(bufs.host_dst["pageable"][: 1 * MiB], bufs.dev_src[: 1 * MiB])


def test_pattern_is_the_same_on_every_prefix_and_never_equals_its_complement():
    p = copies.pattern(torch, 10_000, "cpu")
    assert torch.equal(copies.pattern(torch, 600, "cpu"), p[:600])
    assert not torch.any(torch.bitwise_not(p) == p)
    assert len(torch.unique(p)) == copies.PATTERN_PERIOD_BYTES


# ---- the command --------------------------------------------------------------------------------

def test_no_gpu_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["calibrate", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("hwprobe calibrate: no CUDA GPU available (")
    assert lines[0].endswith("); use --device cpu to calibrate the CPU")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "hwprobe calibrate: --device: expected one of cuda, cpu, got 'tpu'"),
    (["--device", "cpu", "--out", "."], "hwprobe calibrate: --out: . is a directory; expected a file path"),
])
def test_bad_options_exit_2_with_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["calibrate", *args])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [message]
    assert list(tmp_path.iterdir()) == []


def test_corrupted_copy_exits_1_naming_size_and_direction_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(CpuBackend, "copy", FlipsOneByte.copy)
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--tiny", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "hwprobe calibrate: data integrity failure: h2d pageable copy of 4 KiB (4096 bytes): "
        "1 bytes differ from the source, first at byte 2048; nothing written")
    assert list(tmp_path.iterdir()) == []


def _assert_sane_profile(profile, device):
    assert profile.device == device
    link = profile.link
    one_way = [c for c in link.curves if not c.concurrent]
    both = [c for c in link.curves if c.concurrent]
    assert {(c.direction, c.memory) for c in one_way} == {(d, m) for d in ("h2d", "d2h") for m in ("pinned", "pageable")}
    assert {c.direction for c in both} == {"h2d", "d2h"}
    for c in link.curves:
        assert all(p.verified and p.samples == 3 for p in c.points)
        assert [p.size_bytes for p in c.points] == sorted(p.size_bytes for p in c.points)
        assert all(p.bytes_per_s == pytest.approx(p.size_bytes / p.time_s) for p in c.points)
        assert c.fit_bytes_per_s > 0 and c.fit_per_copy_latency_s >= 0
    assert [p.size_bytes for p in link.curve("h2d", "pinned").points] == [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB]
    assert link.bidirectional_h2d_bytes_per_s > 0 and link.bidirectional_d2h_bytes_per_s > 0
    pack = profile.environment["host_pack"]  # the prototype's host-side concatenation, timed
    assert link.host_pack_bytes_per_s == pack["bytes_per_s"] > 0 and pack["bytes"] > 0 and "contiguous" in pack["method"]
    c = profile.compute
    assert [m for m, _ in c.gemm_flop_per_s_by_rows] == [1, 8]
    bf16 = [p for p in c.gemm_points if p.dtype == "bf16"]
    decode = [p for p in bf16 if p.m in (1, 8)]
    assert {(p.n, p.k) for p in decode} == {(512, 3584)}  # the 7B model's k/v projection
    for p in c.gemm_points:
        assert p.flop_per_s == pytest.approx(2 * p.m * p.n * p.k / p.time_s)
        assert p.best_flop_per_s >= p.flop_per_s
    assert c.peak_flop_per_s["bf16"] == max(p.flop_per_s for p in bf16)
    assert c.weight_hbm_bytes_per_s["bf16"] > 0 and c.device_copy_bytes_per_s > 0
    # the int4 projections the synthetic model runs, their bytes counted as the simulator counts int4
    int4 = [p for p in c.gemm_points if p.dtype == "int4"]
    assert {(p.m, p.n, p.k) for p in int4} == {(1, 512, 3584), (8, 512, 3584)}
    sim_bytes = 512 * 3584 / 2 + 512 * 3584 / 128 * 2
    assert all(p.weight_bytes_per_s == pytest.approx(sim_bytes / p.time_s) for p in int4)
    assert c.weight_hbm_bytes_per_s["int4"] == max(p.weight_bytes_per_s for p in int4 if p.m == 1)
    assert c.attention_hbm_bytes_per_s > 0 and c.attention_backend
    assert {p.context_tokens for p in c.attention_points} == {64, 256, 1024}
    _assert_fidelity_figures(profile)
    assert all(p.num_heads == 28 and p.num_kv_heads == 4 for p in c.attention_points)
    # the per-layer cost is measured on a real layer (many kernels), not assumed from one launch
    lo = profile.environment["layer_overhead"]
    assert c.layer_overhead_s == lo["layer_overhead_s"] > c.kernel_launch_s > 0
    assert lo["kernel_launch_s"] == c.kernel_launch_s and lo["layers_timed"] >= 1
    assert "synthetic" in lo["method"] and lo["shapes"]["hidden"] == 64 and lo["shapes"]["batch"] == 1
    assert "kernels_per_layer_assumed" not in profile.environment["kernel_launch"]
    assert profile.quick and profile.versions["torch"] == torch.__version__
    assert profile.environment["plan"]["name"] == "tiny"
    assert set(profile.environment["drift"]) == {"copy", "gemm"}
    _assert_host_section(profile, device)


def _assert_host_section(profile, device):
    """The host CPU timed with the cache's own host-attention routine on a 7B-shaped layer, its fit
    over the raw points, a STREAM-like copy, and the host path's round trip on a GPU only."""
    from hwprobe.calibrate.env import cpu_model
    from hwprobe.calibrate.host_attention import host_figures

    h = profile.host
    assert h is not None and h.cpu_name == cpu_model() and h.threads >= 1
    assert "_attend" in h.attention_kernel and "partial_softmax_attention" in h.attention_kernel
    assert [p.tokens for p in h.attention_points] == [64, 256, 1024]
    for p in h.attention_points:  # bf16 K and V of batch x 4 KV heads x tokens x 128
        assert p.batch == 1 and p.kv_bytes == p.tokens * 2 * 4 * 128 * 2 and p.time_s > 0 and p.samples == 3
    assert (h.attention_bytes_per_s, h.attention_dispatch_s) == pytest.approx(host_figures(h.attention_points))
    assert h.attention_bytes_per_s > 0 and h.attention_dispatch_s >= 0 and h.dram_bytes_per_s > 0
    assert (h.round_trip_s is not None) == (device == "cuda")
    assert profile.environment["plan"]["host_attention_tokens"] == [64, 256, 1024]


def _assert_fidelity_figures(profile):
    """What the simulator's fidelity models read: free device memory, each weight dtype's kernel
    across rows, and attention latency + bandwidth from a fit over the attention points."""
    from hwprobe.calibrate.attention import fit_kv_stream
    from hwprobe.calibrate.weight_kernels import INT8_CUDA_WARNING

    c, w, gpu = profile.compute, profile.warnings, profile.device == "cuda"
    if gpu:
        assert 0 < profile.device_memory_free_bytes <= profile.device_memory_bytes
    else:  # by design: host memory others use is no device tenant (runner._device_memory)
        assert profile.device_memory_free_bytes is None
    curves = c.weight_kernel_bytes_per_s_by_rows
    expected = {"bf16", "int4"} | ({"int8"} if hasattr(torch, "_weight_int8pack_mm") else set())
    fp8 = gpu and torch.cuda.get_device_capability() >= (8, 9)
    assert set(curves) == expected | ({"fp8"} if fp8 else set()), (set(curves), w)
    assert set(c.weight_kernels) == set(curves)
    for dtype, curve in curves.items():
        assert [m for m, _ in curve] == [1, 8] and all(rate > 0 for _, rate in curve), dtype
        points = {p.m: p for p in c.gemm_points if p.dtype == dtype and (p.n, p.k) == (512, 3584)}
        assert [(m, points[m].weight_bytes_per_s) for m in (1, 8)] == curve  # the raw points are kept
    int8_bytes = 512 * 3584 + 512 * 3584 / 128 * 2  # sim/model/dtypes.py: 1 byte + a 2-byte scale per 128
    assert all(p.weight_bytes_per_s == pytest.approx(int8_bytes / p.time_s) for p in c.gemm_points if p.dtype == "int8")
    assert "cuBLAS" in c.weight_kernels["bf16"] if gpu else "cpu" in c.weight_kernels["bf16"]
    assert (INT8_CUDA_WARNING in w) == (gpu and "int8" in curves)
    if not fp8:
        assert "fp8" not in curves and not any(p.dtype == "fp8" for p in c.gemm_points)
        assert any(x.startswith("fp8 unavailable: ") for x in w), w
    fit = fit_kv_stream(c.attention_points)
    assert profile.environment["attention_fit"]["unsound"] == fit.unsound
    if fit.unsound is None:  # the fit replaces the best point's rate
        assert c.attention_latency_s == pytest.approx(fit.latency_s) and c.attention_latency_s >= 0
        assert c.attention_hbm_bytes_per_s == pytest.approx(fit.bytes_per_s)
    else:  # a CPU's attention can be far from a line (thread wake-ups): then the best rate, no latency
        assert c.attention_latency_s is None
        assert c.attention_hbm_bytes_per_s == max(p.kv_bytes_per_s for p in c.attention_points)
        assert any(x.startswith(f"attention fit not used ({fit.unsound})") for x in w), w


def test_cpu_tiny_calibrate_end_to_end(cpu_tiny_profile):
    from hwprobe.calibrate.env import cpu_model

    result, out = cpu_tiny_profile  # `hwprobe calibrate --device cpu --tiny --out out`, run once per session
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"wrote {out} (cpu profile" in result.stdout
    profile = load_profile(out)
    _assert_sane_profile(profile, "cpu")
    assert profile.device_name == cpu_model() and "NVIDIA" not in profile.device_name
    assert profile.environment["nvml"]["available"] is False
    pinned, pageable = profile.link.curve("h2d", "pinned"), profile.link.curve("h2d", "pageable")
    assert pinned.points == pageable.points  # one memcpy measurement, stored under both names
    assert any(w.startswith("cpu mode: the 'link' is torch copy_") for w in profile.warnings)
    assert profile.copy_engines is None and profile.device_memory_bytes == profile.host_memory_bytes
    assert load_profile(out) == profile and profile_to_yaml(profile) == out.read_text()
    assert [p.name for p in out.parent.iterdir()] == ["cpu.yaml"]  # no temp files left behind


# per staging mode: (per step, per layer) seconds that a step of the virtual clock below costs
STEP_COSTS = {"none": (40e-6, 5e-6), "layerwise_async": (70e-6, 15e-6), "sync_per_step": (240e-6, 30e-6),
              "per_interval": (90e-6, 0.0)}


class StepClock:
    """A fake clock for the step-overhead timing: time moves only when a decode step runs."""

    def __init__(self):
        self.now = 0.0

    def mark(self) -> float:
        return self.now

    def elapsed_s(self, a: float, b: float) -> float:
        return b - a


def test_step_overheads_time_tiny_decode_loops_in_every_staging_mode(monkeypatch):
    """The real decode loops and timing windows on a clock that advances by a known cost per step:
    the fit gives back each mode's per-step and per-layer cost, whatever the machine's speed."""
    from hwprobe.calibrate.backend import CpuBackend
    from hwprobe.calibrate.step_overhead import DEPTHS, MODES, _Loop, measure_step_overheads

    clock, real_step, timed = StepClock(), _Loop.step, []

    def step(self):
        real_step(self)
        step_s, layer_s = STEP_COSTS[self.mode]
        clock.now += step_s + self.model.shapes.layers * layer_s
        timed.append((self.mode, self.model.shapes.layers))

    monkeypatch.setattr(_Loop, "step", step)
    result = measure_step_overheads(CpuBackend(), samples=3, min_window_s=1e-4, retier_interval=24, clock=clock)
    assert set(result["by_prefetch"]) == set(MODES) == set(STEP_COSTS)
    assert {(m, n) for m in MODES for n in DEPTHS} <= set(timed)  # every mode's loops ran, at both depths
    for mode, r in result["by_prefetch"].items():
        step_s, layer_s = STEP_COSTS[mode]
        assert r["step_s_at_depths"] == pytest.approx([step_s + n * layer_s for n in DEPTHS], rel=1e-9)
        assert r["layer_s"] == pytest.approx(layer_s, rel=1e-9, abs=1e-15)
        assert r["step_s"] == pytest.approx(step_s, rel=1e-9)
        assert r["rel_spread"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("t1, t2, expected", [
    (50e-6, 70e-6, (5e-6, 40e-6)),  # slope and intercept reproduce both depths
    (90e-6, 80e-6, (0.0, 90e-6)),  # the deeper model timed faster (noise): no per-layer cost
    (10e-6, 70e-6, (15e-6, 0.0)),  # the slope overshoots the shallow point: no per-step cost
])
def test_step_overhead_fit_is_the_line_through_both_depths_clipped_at_zero(t1, t2, expected):
    from hwprobe.calibrate.step_overhead import fit_depths

    assert fit_depths(2, t1, 6, t2) == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_step_overheads_run_in_every_staging_mode_on_the_wall_clock():
    """The real routine on the real clock: every mode runs and its figures are the fit of its own
    timings (nothing here depends on how fast the machine is)."""
    import math

    from hwprobe.cache import Runtime
    from hwprobe.calibrate.backend import CpuBackend
    from hwprobe.calibrate.step_overhead import DEPTHS, MODES, _Loop, fit_depths, measure_step_overheads

    loop = _Loop(Runtime("cpu"), "layerwise_async", 2, 8)
    assert loop.cache.t1_high_water > 0 and loop.cache.ring is not None  # the timed steps stage T1 tokens
    for _ in range(loop.last_timed - loop.cache.step):
        loop.step()
    with pytest.raises(RuntimeError, match="more timed steps"):
        loop.step()  # the next step would re-tier inside the timing
    result = measure_step_overheads(CpuBackend(), samples=3, min_window_s=1e-4, retier_interval=24)
    assert set(result["by_prefetch"]) == set(MODES) and result["depths"] == list(DEPTHS)
    for r in result["by_prefetch"].values():
        t1, t2 = r["step_s_at_depths"]
        assert all(t > 0 and math.isfinite(t) for t in (t1, t2)) and r["rel_spread"] >= 0
        assert (r["layer_s"], r["step_s"]) == fit_depths(DEPTHS[0], t1, DEPTHS[1], t2)


def test_layer_overhead_times_the_synthetic_models_layer(monkeypatch):
    """The timed call is hwprobe's own layer (through its KV cache) at tiny shapes, once per call."""
    from hwprobe.calibrate.backend import CpuBackend
    from hwprobe.calibrate.layer_overhead import LAYERS_TIMED, measure_layer_overhead
    from hwprobe.model.synthetic import SyntheticTransformer

    calls = []
    real_layer = SyntheticTransformer.layer

    def counted(self, index, x, cache):
        calls.append((index, tuple(x.shape), self.shapes.hidden, cache.geom.head_dim))
        return real_layer(self, index, x, cache)

    monkeypatch.setattr(SyntheticTransformer, "layer", counted)
    result = measure_layer_overhead(CpuBackend(), samples=3, min_window_s=1e-4)
    assert result["layer_overhead_s"] > 0 and result["layers_timed"] == LAYERS_TIMED
    assert {c[0] for c in calls} == set(range(LAYERS_TIMED))
    assert {c[1:] for c in calls} == {((1, 64), 64, 64)}
    # warm-up, the trial call, then samples x calls_per_sample timed calls
    assert len(calls) >= result["samples"] * result["calls_per_sample"]


def test_calibrate_modules_import_torch_only_when_measuring():
    import subprocess
    import sys

    modules = ["hwprobe.info_cmd", "hwprobe.calibrate_cmd"] + [
        f"hwprobe.calibrate.{m}" for m in ("env", "backend", "timing", "fit", "copies", "gemm", "attention",
                                           "device_copy", "layer_overhead", "operands", "plan", "checks", "runner",
                                           "weight_kernels", "host_attention",
                                           "summary")]
    code = f"import sys; [__import__(m) for m in {modules!r}]; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.cuda
@needs_cuda
def test_cuda_tiny_calibrate_end_to_end(tmp_path):
    out = tmp_path / "gpu.yaml"
    result = runner.invoke(app, ["calibrate", "--device", "cuda", "--tiny", "--out", str(out)])
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    _assert_sane_profile(profile, "cuda")
    assert profile.device_name == torch.cuda.get_device_name()
    assert profile.link.curve("h2d", "pinned").points != profile.link.curve("h2d", "pageable").points
    assert not any(w.startswith("implausible") for w in profile.warnings), profile.warnings


# ---- the GPU branch of the runner, with the CPU doing the work and a fake NVML watching ---------

class PretendGpu(CpuBackend):
    """Runs on the CPU but takes the runner's CUDA path: pinned and pageable curves, NVML, bounds."""

    device = "cuda"
    name = "NVIDIA H200"

    def __init__(self):
        super().__init__()
        self.name = PretendGpu.name
        self.props = type("Props", (), {"total_memory": 150_000_000_000})()
        # a small last-level cache: fewer weight copies to rotate through, so the int4 GEMMs quantise a
        # few weights on the CPU instead of dozens (the same code path, seconds less)
        self.cache_bytes = 1 * MiB

    def properties(self):
        return {"name": self.name, "uuid": "1111aaaa-0000-0000-0000-000000000001"}

    def copy_engines(self):
        return 3


def test_runner_gpu_path_records_nvml_state_and_checks_bounds():
    from hwprobe.calibrate.plan import make_plan
    from hwprobe.calibrate.runner import calibrate
    from tests.test_hwprobe_info import H200 as NVML_H200
    from tests.test_hwprobe_info import fake_nvml

    # A Gen3 x1 link that trained down to Gen2 under load, and a power cap: every warning path.
    nvml = fake_nvml(gpus=(dict(NVML_H200, gen=(2, 3), width=(1, 1)),), throttle_bits=0x4)
    steps = []
    profile = calibrate(PretendGpu(), make_plan("cuda", tiny=True), quick=True, nvml=nvml, on_step=steps.append)
    assert len(steps) == make_plan("cuda", tiny=True).total_steps("cuda")
    assert nvml.state == {"init": 1, "shutdown": 1}
    env = profile.environment
    assert env["gpu"]["name"] == "NVIDIA H200" and env["catalog_gpu"] == "h200-sxm"
    assert env["link_peak"] == {"name": "pcie-gen3-x1", "theoretical_bytes_per_s": 15.75e9 / 16}
    assert env["under_load"]["h2d_copy"]["pcie_gen_current"] == 2 and "sm_clock_hz" in env["under_load"]["gemm"]
    assert env["throttle_reasons_seen"] == ["sw_power_cap"]
    assert profile.versions["driver"] == "570.86.15" and profile.versions["cuda_driver"] == "12.4"
    assert profile.copy_engines == 3 and profile.device_memory_bytes == 150e9
    assert 0 < profile.device_memory_free_bytes <= 150e9  # free_device_bytes() before anything was allocated
    # the GPU path with CPU tensors: the CPU's kernels, named as such, and no fp8
    assert set(profile.compute.weight_kernel_bytes_per_s_by_rows) >= {"bf16", "int4"}
    assert "cpu" in profile.compute.weight_kernels["bf16"] and "fp8" not in profile.compute.weight_kernels
    assert {p.context_tokens for p in profile.compute.attention_points} == {64, 256, 1024}
    _assert_host_section(profile, "cuda")  # the round trip through the GPU path's copies and syncs
    assert {(c.memory, c.concurrent) for c in profile.link.curves} == {
        ("pinned", False), ("pageable", False), ("pinned", True)}
    w = profile.warnings
    assert any(x.startswith("downtrained link: PCIe gen 2 x1 under load") for x in w)
    assert any(x.startswith("throttling seen during the run: sw_power_cap") for x in w)
    assert not any(x.startswith("cpu mode") for x in w)
    assert any(x.startswith("fp8 unavailable: no fp8 kernel on the CPU") for x in w)
    assert not any(x.startswith("int8 weight kernel: ") for x in w)  # the reference-kernel caveat is CUDA's
    fastest = max(p.bytes_per_s for c in profile.link.curves for p in c.points)
    assert any(x.startswith("implausible: ") for x in w) == (fastest > 15.75e9 / 16)
