"""`hwprobe info` and the NVML layer, against fake NVML modules (old, new, broken, absent)."""

from __future__ import annotations

import json
import sys
import types

import pytest
from typer.testing import CliRunner

from hwprobe.calibrate import env
from hwprobe.cli import app

runner = CliRunner()

H200 = {"name": b"NVIDIA H200", "uuid": "GPU-1111aaaa-0000-0000-0000-000000000001",
        "total": 150_150_000_000, "free": 149_000_000_000, "gen": (5, 5), "width": (16, 16)}
L40S = {"name": "NVIDIA L40S", "uuid": "GPU-2222bbbb-0000-0000-0000-000000000002",
        "total": 48_000_000_000, "free": 47_000_000_000, "gen": (1, 4), "width": (16, 16)}
SM_CLOCK_MHZ, MEM_CLOCK_MHZ = 1980, 3201


class FakeNvmlError(Exception):
    pass


def fake_nvml(gpus=(H200,), *, missing=(), unsupported=(), init_error=None, throttle_bits=0x4,
              cuda_driver=12040):
    """A pynvml stand-in: `missing` functions do not exist (an older binding), `unsupported` ones
    raise like NVML's NotSupported, `init_error` makes nvmlInit fail."""
    state = {"init": 0, "shutdown": 0}

    def init():
        if init_error:
            raise FakeNvmlError(init_error)
        state["init"] += 1

    def clock(h, kind):
        return SM_CLOCK_MHZ if kind == 1 else MEM_CLOCK_MHZ

    funcs = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: state.__setitem__("shutdown", state["shutdown"] + 1),
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: gpus[h]["name"],
        "nvmlDeviceGetUUID": lambda h: gpus[h]["uuid"],
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(total=gpus[h]["total"], free=gpus[h]["free"],
                                                                   used=gpus[h]["total"] - gpus[h]["free"]),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: gpus[h]["gen"][0],
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: gpus[h]["gen"][1],
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: gpus[h]["width"][0],
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: gpus[h]["width"][1],
        "nvmlDeviceGetClockInfo": clock,
        "nvmlDeviceGetMaxClockInfo": clock,
        "nvmlDeviceGetTemperature": lambda h, sensor: 41,
        "nvmlDeviceGetPowerUsage": lambda h: 123_000,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: throttle_bits,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: throttle_bits,
        "nvmlSystemGetDriverVersion": lambda: b"570.86.15",
        "nvmlSystemGetCudaDriverVersion": lambda: cuda_driver,
        "nvmlSystemGetNVMLVersion": lambda: "12.570.86.15",
    }

    def refuse(*args):
        raise FakeNvmlError("Not Supported")

    for name in unsupported:
        funcs[name] = refuse
    for name in missing:
        funcs.pop(name)
    module = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0, **funcs)
    module.state = state
    return module


@pytest.fixture
def use_nvml(monkeypatch):
    def install(module):
        monkeypatch.setattr(env, "load_nvml", lambda: module)
        return module
    return install


def info(*args):
    result = runner.invoke(app, ["info", *args])
    assert result.exit_code == 0, result.output
    return result


def test_info_shows_gpu_from_a_full_nvml(use_nvml):
    nvml = use_nvml(fake_nvml())
    out = info().stdout
    assert "GPU 0: NVIDIA H200" in out  # bytes from an older binding are decoded
    assert "150.2 GB total, 149.0 GB free" in out
    assert "PCIe:        gen 5 (max 5), width x16 (max 16)" in out
    assert f"SM clock:    {SM_CLOCK_MHZ} MHz (max {SM_CLOCK_MHZ} MHz)" in out
    assert "throttle:    sw_power_cap (0x4)" in out
    assert "driver: 570.86.15, CUDA driver API 12.4" in out
    assert "host:" in out and "CPU:" in out
    assert nvml.state == {"init": 1, "shutdown": 1}


def test_info_json_has_numbers(use_nvml):
    use_nvml(fake_nvml(gpus=(H200, L40S), throttle_bits=0x4 | 0x40))
    report = json.loads(info("--json").stdout)
    g0, g1 = report["nvml"]["gpus"]
    assert g0["memory_total_bytes"] == H200["total"]
    assert g0["pcie_gen_max"] == 5 and g0["pcie_width_current"] == 16
    assert g0["sm_clock_hz"] == SM_CLOCK_MHZ * 1e6
    assert g0["power_draw_w"] == 123.0 and g0["power_limit_w"] == 700.0
    assert g0["throttle_reasons"] == 0x44
    assert g0["throttle_reason_names"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert g1["name"] == "NVIDIA L40S" and g1["pcie_gen_current"] == 1
    assert report["nvml"]["cuda_driver_version"] == "12.4"
    assert report["host"]["logical_cores"] >= 1
    assert report["torch"]["installed"] is True


def test_info_tolerates_nvml_without_throttle_functions(use_nvml):
    use_nvml(fake_nvml(missing=("nvmlDeviceGetCurrentClocksEventReasons",
                                "nvmlDeviceGetCurrentClocksThrottleReasons",
                                "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetPowerUsage")))
    out = info().stdout
    assert "GPU 0: NVIDIA H200" in out
    assert "throttle:    not reported by this NVML" in out
    assert "CUDA driver API ?" in out
    g = json.loads(info("--json").stdout)["nvml"]["gpus"][0]
    assert "throttle_reasons" not in g and "power_draw_w" not in g
    assert g["pcie_gen_current"] == 5  # the rest is still there


def test_info_uses_the_deprecated_throttle_name_when_the_new_one_is_missing(use_nvml):
    use_nvml(fake_nvml(missing=("nvmlDeviceGetCurrentClocksEventReasons",), throttle_bits=0x8))
    g = json.loads(info("--json").stdout)["nvml"]["gpus"][0]
    assert g["throttle_reasons"] == 0x8 and g["throttle_reason_names"] == ["hw_slowdown"]


def test_info_treats_not_supported_as_absent(use_nvml):
    use_nvml(fake_nvml(unsupported=("nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetTemperature")))
    g = json.loads(info("--json").stdout)["nvml"]["gpus"][0]
    assert "pcie_gen_max" not in g and "temperature_c" not in g
    assert "PCIe:        gen 5, width x16 (max 16)" in info().stdout


@pytest.mark.parametrize("module, reason", [
    (fake_nvml(init_error="NVML Shared Library Not Found"),
     "no NVIDIA GPU: NVML could not be initialised (NVML Shared Library Not Found)"),
    (fake_nvml(gpus=()), "no NVIDIA GPU: NVML reports no GPUs"),
])
def test_info_without_gpu_says_why_and_shows_host(use_nvml, module, reason):
    use_nvml(module)
    lines = info().stdout.splitlines()
    assert reason in lines
    assert lines[0].startswith("host:")
    assert not any(line.startswith("GPU ") for line in lines)


def test_info_without_pynvml_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert "no NVIDIA GPU: nvidia-ml-py (pynvml) is not installed" in info().stdout.splitlines()


def test_info_without_torch(monkeypatch, use_nvml):
    use_nvml(fake_nvml())
    monkeypatch.setitem(sys.modules, "torch", None)
    out = info().stdout
    assert "torch:  not installed" in out
    assert "GPU 0: NVIDIA H200" in out
    assert json.loads(info("--json").stdout)["torch"] == {"installed": False}


def test_monitor_finds_torch_gpu_by_uuid_and_accumulates_throttle_bits():
    nvml = fake_nvml(gpus=(H200, L40S), throttle_bits=0x20)
    monitor = env.GpuMonitor.find(nvml, uuid="2222bbbb-0000-0000-0000-000000000002", name=None)
    assert monitor.index == 1 and monitor.static["name"] == "NVIDIA L40S"
    state = monitor.sample()
    assert state["pcie_gen_current"] == 1 and state["throttle_reason_names"] == ["sw_thermal_slowdown"]
    assert monitor.throttle_bits_seen == 0x20


def test_monitor_refuses_to_guess_between_gpus():
    nvml = fake_nvml(gpus=(H200, L40S))
    with pytest.raises(env.NvmlUnavailable, match="which of 2"):
        env.GpuMonitor.find(nvml, uuid="GPU-ffff", name="NVIDIA A100")
