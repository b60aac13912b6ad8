"""resolve_hardware: scenario override beats profile beats datasheet, and each says so in `sources`."""

from sim.device.hardware import Sourced, resolve_hardware
from sim.inputs import catalog
from sim.inputs.profile import ComputeProfile, LinkProfile, Profile, StepOverhead
from sim.inputs.scenario import HardwareCfg

LABEL = "profile: test (cpu, 2026-11-30)"


def _profile(**compute) -> Profile:
    return Profile(device="cpu", device_name="test", machine="t", created_utc="2026-11-30T00:00:00Z",
                   device_memory_bytes=100e9, link=LinkProfile(curves=[], host_pack_bytes_per_s=3e9),
                   compute=ComputeProfile(**compute))


def test_a_scenario_override_pins_a_figure_against_measurements():
    datasheet = Sourced(2e-5, "default")
    assert datasheet.override(None) is datasheet
    assert datasheet.measure(None, "profile") is datasheet
    measured = datasheet.measure(1e-4, "profile")
    assert (measured.value, measured.source, measured.pinned) == (1e-4, "profile", False)
    pinned = measured.override(3e-5)
    assert (pinned.value, pinned.source, pinned.pinned) == (3e-5, "scenario override", True)
    assert pinned.measure(1e-4, "profile") is pinned  # a later measurement does not replace it


def test_override_beats_profile_beats_datasheet():
    prof = _profile(attention_hbm_bytes_per_s=3e12, step_overheads={"none": StepOverhead(layer_s=1e-4, step_s=5e-4)})
    base = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=True)
    measured = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=True, profile=prof)
    over = resolve_hardware(HardwareCfg(gpu="h200-sxm", efficiency={"attention_hbm_efficiency": 0.5, "step_overhead_s": 1e-3}),
                            "bf16", pinned=True, profile=prof)

    fitted = catalog.fitted_kernels()["h200-sxm"].attention
    assert base.attention_hbm_bytes_per_s == base.gpu.hbm_bytes_per_s * fitted.hbm_efficiency
    assert base.sources["attention_hbm_bytes_per_s"] == (f"datasheet h200-sxm x {fitted.hbm_efficiency:g} "
                                                         f"({fitted.says('decode attention')})")
    assert measured.attention_hbm_bytes_per_s == 3e12
    assert measured.sources["attention_hbm_bytes_per_s"] == LABEL
    assert over.attention_hbm_bytes_per_s == over.gpu.hbm_bytes_per_s * 0.5
    assert over.sources["attention_hbm_bytes_per_s"] == "datasheet h200-sxm x 0.5 (scenario override)"

    # a synchronous device: the decode loop's fixed costs are the device's
    assert (base.step_overhead_s, base.sources["step_overhead_s"]) == (2e-4, "default")
    assert (measured.step_overhead_s, measured.sources["step_overhead_s"]) == (
        5e-4, f"{LABEL}, tiny decode steps, staging none")
    assert (over.step_overhead_s, over.sources["step_overhead_s"]) == (1e-3, "scenario override")
    assert (over.layer_overhead_s, over.sources["layer_overhead_s"]) == (1e-4, f"{LABEL}, tiny decode steps, staging none")

    assert (measured.memory_bytes, measured.sources["memory_bytes"]) == (100e9, LABEL)
    assert (measured.host_pack_bytes_per_s, measured.sources["host_pack_bytes_per_s"]) == (3e9, LABEL)


def test_sources_keep_their_order():
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "bf16", pinned=True, profile=_profile())
    assert list(h.sources) == [
        "weight_hbm_efficiency", "weight_hbm_bytes_per_s", "attention_hbm_efficiency", "attention_hbm_bytes_per_s",
        "gemm_flop_per_s", "gemm_floor_s", "gemm_io", "attention_flop_efficiency", "attention_latency_s", "attention_shape",
        "mla_fit", "moe_fits", "moe_power_law_fits", "prefill_attention_shape", "dequant_ops_per_weight",
        "weight_kernel", "weight_kernel_by_rows", "layer_overhead_s", "host_layer_s", "host_step_s",
        "step_overhead_s", "host_pack_bytes_per_s", "runtime_reserve_bytes", "memory_bytes", "host_memory_bytes",
        "h2d", "d2h",
    ]


def test_a_measured_bf16_weight_rate_scales_to_other_dtypes_unless_overridden():
    prof = _profile(weight_hbm_bytes_per_s={"bf16": 4e12})
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm"), "int8", pinned=True, profile=prof)
    assert h.weight_hbm_bytes_per_s == 4e12 * (0.80 / 0.80)  # int8 streams as bf16 does; its dequantisation is apart
    assert h.sources["weight_hbm_bytes_per_s"] == f"{LABEL}, bf16 x default int8/bf16 ratio 1"
    h = resolve_hardware(HardwareCfg(gpu="h200-sxm", efficiency={"weight_hbm_efficiency": 0.6}), "int8",
                         pinned=True, profile=prof)
    assert h.weight_hbm_bytes_per_s == h.gpu.hbm_bytes_per_s * 0.6
    assert h.sources["weight_hbm_bytes_per_s"] == "datasheet h200-sxm x 0.6 (scenario override)"


def test_scenario_overrides_keep_their_source_against_measurements():
    """Three provenance cases that used to name the wrong source."""
    prof = _profile(weight_hbm_bytes_per_s={"int8": 1e12}, peak_flop_per_s={"bf16": 8e14}, layer_overhead_s=3e-5)
    cfg = HardwareCfg(gpu="h200-sxm", efficiency={"weight_hbm_efficiency": 0.6, "gemm_flop_efficiency": 0.5,
                                                  "host_layer_s": 1e-5})
    h = resolve_hardware(cfg, "int8", pinned=True, profile=prof)
    assert h.weight_hbm_bytes_per_s == h.gpu.hbm_bytes_per_s * 0.6  # the measured int8 rate does not replace it
    assert h.sources["weight_hbm_bytes_per_s"] == "datasheet h200-sxm x 0.6 (scenario override)"
    assert h.peak_flop_per_s == 8e14 and h.gemm_flop_per_s(1) == 8e14 * 0.5
    assert h.sources["gemm_flop_per_s"] == f"{LABEL}, peak x scenario override"
    cuda = prof.model_copy(update={"device": "cuda"})
    h = resolve_hardware(cfg, "int8", pinned=True, profile=cuda)
    assert (h.host_layer_s, h.sources["host_layer_s"]) == (1e-5, "scenario override")
    assert h.layer_overhead_s == resolve_hardware(cfg, "int8", pinned=True).layer_overhead_s  # not the host's time
