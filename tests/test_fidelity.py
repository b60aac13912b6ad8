"""Datasheet-mode fidelity (issue #11): device-reported memory, weight-only kernels that dequantise,
fp8 weights on and off fp8 tensor cores, decode attention that grows into its bandwidth with
context. Expectations are computed by hand from the catalog's figures."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from sim.device.hardware import resolve_hardware
from sim.device.physics import attention_s, weight_kernel_s
from sim.inputs import catalog
from sim.inputs.catalog import EfficiencyDefaults
from sim.inputs.scenario import HardwareCfg

MiB = 2**20
SEVEN_B = "deepseek-r1-distill-qwen-7b"


def hw(gpu: str, weight_dtype: str = "bf16", **efficiency):
    """The datasheet model (hardware.kernels: auto would take the measured tables where they cover the GPU)."""
    return resolve_hardware(HardwareCfg(gpu=gpu, efficiency=efficiency, kernels="datasheet"), weight_dtype, pinned=True)


# ---- 1. memory: what the device reports, the reserve apart ---------------------------------------
@pytest.mark.parametrize("gpu, mib", [("h100-sxm", 81559), ("h200-sxm", 143771), ("a100-80gb-sxm", 81920),
                                      ("l40s", 46068), ("rtx-4090", 24564), ("rtx-5090", 32607),
                                      ("rtx-5080", 16303), ("b200", 183359)])
def test_capacity_is_the_device_reported_total(gpu, mib):
    spec = catalog.gpu(gpu)
    assert spec.memory_total_mib == mib
    assert spec.memory_bytes == mib * MiB
    assert "nvidia-smi" in spec.memory_source
    h = hw(gpu)
    assert h.memory_bytes == mib * MiB and h.sources["memory_bytes"].startswith(f"catalog {gpu}: nvidia-smi")
    assert h.runtime_reserve_bytes == 1.5e9  # a separate figure, not folded into the capacity


def test_h100_reports_85_5_gb_not_80():
    assert catalog.gpu("h100-sxm").memory_bytes == 85_520_809_984


def test_reserve_is_overridable_and_capacity_is_not_changed_by_it():
    h = hw("h100-sxm", runtime_reserve_bytes=3e9)
    assert (h.runtime_reserve_bytes, h.sources["runtime_reserve_bytes"]) == (3e9, "scenario override")
    assert h.memory_bytes == 81559 * MiB


def test_every_default_says_how_it_was_obtained():
    eff = catalog.efficiency_defaults()
    figures = [k for k in EfficiencyDefaults.model_fields if k not in ("source", "sources")]
    assert sorted(eff.sources) == sorted(figures)
    assert all(text.split(":")[0] in ("measured", "derived", "assumed") for text in eff.sources.values())
    data = eff.model_dump()
    data["sources"] = {k: v for k, v in data["sources"].items() if k != "attention_latency_s"}
    with pytest.raises(ValidationError, match="no entry in sources for attention_latency_s"):
        EfficiencyDefaults.model_validate(data)
    data["sources"] = {**eff.sources, "attention_latency_s": "a guess"}
    with pytest.raises(ValidationError, match="must start with one of measured, derived, assumed"):
        EfficiencyDefaults.model_validate(data)


# ---- 2. weight-only kernels: the slower of bytes and dequantisation + MMA ------------------------
def _gemm_constants(gpu: str, mma: str = "bf16") -> tuple[float, float]:
    """(GEMM floor, weight streaming efficiency): fitted on measured tables where they cover the GPU
    or its sibling (weight-only kernels run a bf16 MMA: the bf16 fit), the catalog's defaults elsewhere."""
    fit = catalog.fitted_kernels_for(gpu)
    if fit is None:
        eff = catalog.efficiency_defaults()
        return eff.gemm_floor_s, eff.weight_hbm_efficiency["bf16"]
    return fit.gemm[mma].floor_s, fit.gemm[mma].weight_hbm_efficiency


SUM_K = 3 * 3584 + 18944  # the 7B layer's GEMM inputs: qkv, o and gate_up read h = 3,584, down reads I = 18,944
SUM_N = (3584 + 2 * 512) + 3584 + 2 * 18944 + 3584  # its outputs: q + k + v, o, gate + up, down


def _activations(gpu: str, mma: str, rows: int) -> tuple[float, float]:
    """(input bytes streamed with the weights, the output write + W8A8's quantisation in seconds) of the
    7B layer's four GEMMs: fitted where the tables cover the GPU or its sibling, none elsewhere."""
    fit = catalog.fitted_kernels_for(gpu)
    if fit is None:
        return 0.0, 0.0
    g, hbm = fit.gemm[mma], catalog.gpu(gpu).hbm_bytes_per_s
    out_s = rows * SUM_N / (hbm * g.output_hbm_efficiency)
    if mma == "fp8":  # quantised per call: a per-row cost four times, and a pass over every input element
        return rows * SUM_K * 1.0, out_s + 4 * rows * g.quant_row_s + rows * SUM_K / (hbm * g.quant_hbm_efficiency)
    return rows * SUM_K * 2.0, out_s


def _by_hand(gpu: str, dtype: str, rows: int, ops_per_weight: float) -> float:
    m, spec = catalog.model(SEVEN_B), catalog.gpu(gpu)
    h = hw(gpu, dtype)
    floor, w_eff = _gemm_constants(gpu)
    extra_bytes, extra_s = _activations(gpu, "bf16", rows)  # weight-only kernels: bf16 activations
    params = m.attention_linear_params_layer() + m.mlp_linear_params_layer()
    bytes_s = (m.layer_weight_bytes(dtype, 128) + extra_bytes) / (spec.hbm_bytes_per_s * w_eff)
    dequant_s = params * ops_per_weight / (spec.fp32_flop_per_s / 2)
    mma_s = 2 * params * rows / h.gemm_flop_per_s(rows)
    return 4 * floor + max(bytes_s, dequant_s + mma_s) + extra_s  # four GEMM calls a layer, each with its floor


@pytest.mark.parametrize("gpu", ["a100-80gb-sxm", "h200-sxm", "rtx-4090"])
@pytest.mark.parametrize("rows", [1, 16, 64])
def test_int4_kernel_time_by_hand(gpu, rows):
    h = hw(gpu, "int4")
    assert h.dequant_ops_per_weight == 2.0 and h.dequant_op_per_s == catalog.gpu(gpu).fp32_flop_per_s / 2
    assert "int4 weight-only (W4A16)" in h.weight_kernel
    assert weight_kernel_s(catalog.model(SEVEN_B), h, "int4", 128, rows) == pytest.approx(_by_hand(gpu, "int4", rows, 2.0))


def test_bf16_kernel_is_the_floors_plus_the_plain_roofline():
    m, h = catalog.model(SEVEN_B), hw("h200-sxm")
    floor, w_eff = _gemm_constants("h200-sxm")
    assert h.dequant_ops_per_weight == 0.0 and h.gemm_floor_s == floor
    for rows in (1, 64, 512):
        flop = 2 * (m.attention_linear_params_layer() + m.mlp_linear_params_layer()) * rows
        extra_bytes, extra_s = _activations("h200-sxm", "bf16", rows)
        expect = 4 * floor + max(flop / h.gemm_flop_per_s(rows), (m.layer_weight_bytes("bf16") + extra_bytes)
                                 / (4.8e12 * w_eff)) + extra_s
        assert weight_kernel_s(m, h, "bf16", 128, rows) == pytest.approx(expect, rel=1e-14)


def _effective_fraction(gpu: str, dtype: str, rows: int) -> float:
    """Weight bytes / kernel time as a fraction of the datasheet bandwidth."""
    m, h = catalog.model(SEVEN_B), hw(gpu, dtype)
    return m.layer_weight_bytes_read(dtype, rows, 128) / weight_kernel_s(m, h, dtype, 128, rows) / catalog.gpu(gpu).hbm_bytes_per_s


def _streaming_fraction(gpu: str, dtype: str, rows: int = 1) -> float:
    """The fraction a kernel set by its weight stream reaches: bytes / (floors + stream with the
    activations + their output write)."""
    m, spec = catalog.model(SEVEN_B), catalog.gpu(gpu)
    floor, w_eff = _gemm_constants(gpu)
    extra_bytes, extra_s = _activations(gpu, "bf16", rows)
    wb = m.layer_weight_bytes(dtype, 128)
    return wb / (4 * floor + (wb + extra_bytes) / (spec.hbm_bytes_per_s * w_eff) + extra_s) / spec.hbm_bytes_per_s


def test_effective_bandwidth_comes_out_per_gpu_dtype_and_batch():
    # at batch 1 the GPUs with fast CUDA cores against their memory stream int4 at the kernel's fraction
    for gpu in ("h100-sxm", "h200-sxm", "l40s", "rtx-4090"):
        assert _effective_fraction(gpu, "int4", 1) == pytest.approx(_streaming_fraction(gpu, "int4"))
    # the A100 (19.5 TFLOP/s FP32 against 2 TB/s): its dequantisation + MMA at batch 1 is about its
    # weight stream (at its fitted streaming fraction, 0.71), and far below the H100 (67 TFLOP/s against
    # 3.35 TB/s) at batch 16
    assert _effective_fraction("a100-80gb-sxm", "int4", 1) <= _streaming_fraction("a100-80gb-sxm", "int4")
    assert _effective_fraction("a100-80gb-sxm", "int4", 16) < 0.60
    assert _effective_fraction("h100-sxm", "int4", 16) == pytest.approx(_streaming_fraction("h100-sxm", "int4", 16))
    # growth with batch: the fraction only falls as rows are added
    fractions = [_effective_fraction("a100-80gb-sxm", "int4", b) for b in (1, 8, 16, 32, 64)]
    assert fractions == sorted(fractions, reverse=True)


# ---- 3. fp8 weights: W8A8 on fp8 tensor cores, weight-only where there are none ----------------
def test_fp8_runs_w8a8_at_fp8_peak_on_hopper():
    h = hw("h100-sxm", "fp8")
    assert h.peak_flop_per_s == 1979e12 and h.dequant_ops_per_weight == 0.0
    assert h.weight_kernel.startswith("fp8 W8A8 GEMM")
    m = catalog.model(SEVEN_B)
    rows = 256
    flop = 2 * (m.attention_linear_params_layer() + m.mlp_linear_params_layer()) * rows
    floor, w_eff = _gemm_constants("h100-sxm", "fp8")  # the fp8 GEMM fit
    _, extra_s = _activations("h100-sxm", "fp8", rows)  # fp8 inputs after their quantisation pass
    # the weight stream call by call: 256 rows are 2 row tiles (the second re-reads a share of the weights),
    # each call's grid of 2 x ceil(n / 128) output tiles streaming at tiles / (tiles + half) of the rate
    g = catalog.fitted_kernels()["h100-sxm"].gemm["fp8"]
    shapes = [(3584 + 2 * 512, 3584), (3584, 3584), (2 * 18944, 3584), (3584, 18944)]
    nk = sum(n * k for n, k in shapes)
    stream = 0.0
    for n, k in shapes:
        tiles = 2 * math.ceil(n / 128)
        stream += ((m.layer_weight_bytes("fp8") * n * k / nk * (1 + g.weight_reread) + rows * k)
                   / (3.35e12 * w_eff * tiles / (tiles + g.half_tiles)))
    expect = 4 * floor + max(flop / h.gemm_flop_per_s(rows), stream) + extra_s
    assert weight_kernel_s(m, h, "fp8", 128, rows) == pytest.approx(expect)


def test_fp8_on_a100_is_weight_only_and_says_so():
    h = hw("a100-80gb-sxm", "fp8")
    assert h.peak_flop_per_s == 312e12  # bf16 tensor cores
    assert h.dequant_ops_per_weight == 1.5
    assert "no fp8 tensor cores" in h.weight_kernel and "W8A16" in h.weight_kernel
    assert h.sources["weight_kernel"] == h.weight_kernel  # the summary names the path
    assert weight_kernel_s(catalog.model(SEVEN_B), h, "fp8", 128, 32) == pytest.approx(
        _by_hand("a100-80gb-sxm", "fp8", 32, 1.5))


# ---- 4. decode attention across context lengths -------------------------------------------------
def test_attention_grows_into_its_bandwidth_with_context():
    h = hw("h200-sxm")
    a = catalog.fitted_kernels()["h200-sxm"].attention  # floor and streaming fraction fitted on measured tables
    kv_token_layer = 2 * 4 * 128 * 2  # 7B: K and V, 4 KV heads, d=128, bf16
    fractions = []
    for tokens in (128, 1024, 8192, 65536):
        nbytes = tokens * kv_token_layer
        t = attention_s(0.0, nbytes, h)
        assert t == pytest.approx(a.floor_s + nbytes / (4.8e12 * a.hbm_efficiency))  # by hand
        fractions.append(nbytes / t / 4.8e12)
    assert fractions == sorted(fractions)
    assert fractions[0] < 0.02  # 128 tokens: the latency floor is almost all of it
    assert fractions[-1] > 0.65 * a.hbm_efficiency  # 64K tokens: most of the split-KV kernel's streaming fraction
    # a batch of 32 sequences of 1K tokens streams like one sequence of 32K: the work, not its shape
    assert attention_s(0.0, 32 * 1024 * kv_token_layer, h) == attention_s(0.0, 32768 * kv_token_layer, h)


# ---- a calibrated profile covers the four -------------------------------------------------------
def test_profile_measurements_replace_the_four_models():
    from sim.inputs.profile import ComputeProfile, Profile

    prof = Profile(device="cuda", device_name="NVIDIA H200", machine="t", created_utc="2026-12-01T00:00:00Z",
                   device_memory_bytes=150e9, device_memory_free_bytes=146e9,
                   compute=ComputeProfile(weight_kernel_bytes_per_s_by_rows={"int4": [(1, 3e12), (16, 2.5e12), (64, 1e12)]},
                                          weight_kernels={"int4": "tinygemm"}, attention_hbm_bytes_per_s=4e12,
                                          attention_latency_s=8e-6))
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "int4", pinned=True, profile=prof)
    label = "profile: NVIDIA H200 (cuda, 2026-12-01)"
    assert (h.memory_bytes, h.sources["memory_bytes"]) == (150e9, label)
    assert h.runtime_reserve_bytes == 4e9  # 4 GB in use at calibration > the 1.5 GB default
    assert h.sources["runtime_reserve_bytes"] == f"{label}, in use on the device at calibration"
    assert h.attention_latency_s == 8e-6 and attention_s(0.0, 4e6, h) == pytest.approx(8e-6 + 4e6 / 4e12)
    assert h.sources["weight_kernel_by_rows"] == f"{label}, tinygemm measured by rows"
    m = catalog.model(SEVEN_B)
    wb = m.layer_weight_bytes("int4", 128)
    assert weight_kernel_s(m, h, "int4", 128, 1) == pytest.approx(wb / 3e12)
    assert weight_kernel_s(m, h, "int4", 4, 4) == pytest.approx(m.layer_weight_bytes("int4", 4) / 2.75e12)  # log2 midpoint
    # little in use: the default reserve stands; another dtype keeps the model
    quiet = prof.model_copy(update={"device_memory_free_bytes": 149.5e9})
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "int8", pinned=True, profile=quiet)
    assert h.runtime_reserve_bytes == 1.5e9 and h.weight_kernel_bytes_per_s_by_rows is None


def test_an_fp8_runs_lm_head_stays_bf16():
    """Engines leave the LM head unquantised: in an fp8 W8A8 run it takes the bf16 GEMM's fit and peak."""
    from sim.device.physics import lm_head_s

    m, h = catalog.model("llama-3.1-8b"), hw("h100-sxm", "fp8")
    g = catalog.fitted_kernels()["h100-sxm"].gemm["bf16"]
    eff = catalog.efficiency_defaults()
    top = max(e for _, e in eff.gemm_flop_efficiency_by_rows)
    batch = 1024  # the default curve's plateau: the bf16 fit's FLOP efficiency at the bf16 peak
    flop = 2 * 128256 * 4096 * batch
    weights = 128256 * 4096 * 2
    expect = g.floor_s + max(flop / (989e12 * 0.80 * g.flop_efficiency / top), weights / (3.35e12 * g.weight_hbm_efficiency))
    assert lm_head_s(m, h, batch) == pytest.approx(expect)
    assert h.sources["lm_head"].startswith("bf16 (engines leave the LM head unquantised): fitted on measured bf16 GEMMs")
    assert hw("h100-sxm").lm_head_gemm is None and "lm_head" not in hw("h100-sxm").sources  # bf16 runs: the layers' GEMM
