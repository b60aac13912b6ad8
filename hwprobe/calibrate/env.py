"""The environment a measurement ran in: host CPU and memory, torch and CUDA, GPUs through NVML.

NVML differs between driver generations (functions appear, get renamed, or say "not supported"),
so every NVML call goes through `_call`, which turns a missing function or any NVML error into
None. A field that cannot be read is absent, never invented.
"""

from __future__ import annotations

import os
import platform
import socket
from contextlib import contextmanager
from typing import Any, Iterator

from sim.model.units import KiB

MHZ_TO_HZ = 1e6
MILLIWATTS_PER_WATT = 1e3

# Clock event ("throttle") reason bits, as NVML defines them (nvml.h, nvmlClocksEventReason*).
THROTTLE_REASON_BITS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
# The bits that mean the clocks were held below what the workload asked for.
THROTTLING_BITS = 0x004 | 0x008 | 0x020 | 0x040 | 0x080 | 0x200

# NVML enum values (nvml.h), used when the module does not export the names.
_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0


class NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why in a few words."""


def throttle_reason_names(bits: int | None) -> list[str]:
    if not bits:
        return []
    return [name for bit, name in THROTTLE_REASON_BITS.items() if bits & bit]


def _text(value: Any) -> Any:
    """NVML returns bytes in older bindings and str in newer ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _call(nvml: Any, fn_name: str, *args: Any) -> Any:
    """`nvml.fn_name(*args)`, or None when the binding lacks it or the driver refuses it."""
    fn = getattr(nvml, fn_name, None)
    if fn is None:
        return None
    try:
        return _text(fn(*args))
    except Exception:  # NVMLError_NotSupported, _NoPermission, _FunctionNotFound, ...
        return None


def _const(nvml: Any, name: str, default: int) -> int:
    return getattr(nvml, name, default)


def load_nvml() -> Any:
    """The pynvml module (from nvidia-ml-py); raises NvmlUnavailable if it is not installed."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed") from None
    return pynvml


@contextmanager
def nvml_session(nvml: Any | None = None) -> Iterator[Any]:
    """Initialise NVML for the duration of the block; raises NvmlUnavailable with the reason."""
    nvml = nvml if nvml is not None else load_nvml()
    try:
        nvml.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(f"NVML could not be initialised ({_text(str(exc)) or type(exc).__name__})") from None
    try:
        yield nvml
    finally:
        _call(nvml, "nvmlShutdown")


def throttle_reasons(nvml: Any, handle: Any) -> int | None:
    """Current clock event reasons: the newer name first, then the deprecated one."""
    bits = _call(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if bits is None:
        bits = _call(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return None if bits is None else int(bits)


def _clock_hz(nvml: Any, fn_name: str, handle: Any, clock: int) -> float | None:
    mhz = _call(nvml, fn_name, handle, clock)
    return None if mhz is None else float(mhz) * MHZ_TO_HZ


def gpu_state(nvml: Any, handle: Any) -> dict[str, Any]:
    """What changes under load: PCIe link state, clocks, throttle reasons, temperature, power."""
    sm = _const(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)
    mem = _const(nvml, "NVML_CLOCK_MEM", _NVML_CLOCK_MEM)
    power_mw = _call(nvml, "nvmlDeviceGetPowerUsage", handle)
    bits = throttle_reasons(nvml, handle)
    state = {
        "pcie_gen_current": _call(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_width_current": _call(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        "sm_clock_hz": _clock_hz(nvml, "nvmlDeviceGetClockInfo", handle, sm),
        "memory_clock_hz": _clock_hz(nvml, "nvmlDeviceGetClockInfo", handle, mem),
        "temperature_c": _call(nvml, "nvmlDeviceGetTemperature", handle,
                               _const(nvml, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU)),
        "power_draw_w": None if power_mw is None else power_mw / MILLIWATTS_PER_WATT,
        "throttle_reasons": bits,
        "throttle_reason_names": throttle_reason_names(bits) if bits is not None else None,
    }
    return {k: v for k, v in state.items() if v is not None}


def gpu_info(nvml: Any, index: int) -> dict[str, Any]:
    """Static facts and current state of GPU `index`; unreadable fields are left out."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    sm = _const(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)
    mem_clock = _const(nvml, "NVML_CLOCK_MEM", _NVML_CLOCK_MEM)
    memory = _call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    limit_mw = _call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    info: dict[str, Any] = {
        "index": index,
        "name": _call(nvml, "nvmlDeviceGetName", handle),
        "uuid": _call(nvml, "nvmlDeviceGetUUID", handle),
        "memory_total_bytes": getattr(memory, "total", None),
        "memory_free_bytes": getattr(memory, "free", None),
        "pcie_gen_max": _call(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "pcie_width_max": _call(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        "sm_clock_max_hz": _clock_hz(nvml, "nvmlDeviceGetMaxClockInfo", handle, sm),
        "memory_clock_max_hz": _clock_hz(nvml, "nvmlDeviceGetMaxClockInfo", handle, mem_clock),
        "power_limit_w": None if limit_mw is None else limit_mw / MILLIWATTS_PER_WATT,
    }
    info = {k: v for k, v in info.items() if v is not None}
    info.update(gpu_state(nvml, handle))
    return info


def cuda_driver_version(nvml: Any) -> str | None:
    """NVML reports the CUDA driver API version as an int, e.g. 12040 -> "12.4"."""
    v = _call(nvml, "nvmlSystemGetCudaDriverVersion")
    if v is None:
        return None
    return f"{int(v) // 1000}.{int(v) % 1000 // 10}"


def nvml_report(nvml: Any | None = None) -> dict[str, Any]:
    """Everything NVML can say about this machine, or why it cannot say anything."""
    try:
        with nvml_session(nvml) as lib:
            count = _call(lib, "nvmlDeviceGetCount")
            if not count:
                return {"available": False, "reason": "NVML reports no GPUs"}
            gpus = []
            for i in range(int(count)):
                try:
                    gpus.append(gpu_info(lib, i))
                except Exception as exc:  # a GPU that fell off the bus must not hide the others
                    gpus.append({"index": i, "error": str(exc) or type(exc).__name__})
            report = {
                "available": True,
                "driver_version": _call(lib, "nvmlSystemGetDriverVersion"),
                "cuda_driver_version": cuda_driver_version(lib),
                "nvml_version": _call(lib, "nvmlSystemGetNVMLVersion"),
                "gpus": gpus,
            }
            return {k: v for k, v in report.items() if v is not None}
    except NvmlUnavailable as exc:
        return {"available": False, "reason": str(exc)}


def _proc_meminfo_bytes(key: str) -> int | None:
    """A /proc/meminfo line (values are in KiB despite the "kB" label)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * KiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def host_memory_total_bytes() -> int | None:
    total = _proc_meminfo_bytes("MemTotal")
    if total is None and hasattr(os, "sysconf"):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = None
    return total


def host_memory_available_bytes() -> int | None:
    return _proc_meminfo_bytes("MemAvailable") or host_memory_total_bytes()


def host_info() -> dict[str, Any]:
    """The host: name, CPU model, cores, memory, OS, Python."""
    info = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total_bytes": host_memory_total_bytes(),
        "memory_available_bytes": host_memory_available_bytes(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }
    return {k: v for k, v in info.items() if v is not None}


def import_torch() -> Any:
    """torch, imported on demand; None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_info() -> dict[str, Any]:
    """torch and CUDA versions and whether torch can see a GPU."""
    torch = import_torch()
    if torch is None:
        return {"installed": False}
    info: dict[str, Any] = {
        "installed": True,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
    }
    try:
        info["cudnn_version"] = torch.backends.cudnn.version()
    except Exception:
        pass
    if info["cuda_available"]:
        info["device_count"] = torch.cuda.device_count()
    else:
        info["cuda_unavailable_reason"] = cuda_unavailable_reason(torch)
    return {k: v for k, v in info.items() if v is not None}


def cuda_unavailable_reason(torch: Any) -> str | None:
    """Why torch cannot use a CUDA GPU here, in a few words; None when it can."""
    if torch is None:
        return "torch is not installed"
    if torch.cuda.is_available():
        return None
    if not torch.version.cuda:
        return f"torch {torch.__version__} was built without CUDA"
    return f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA {torch.version.cuda})"


def _uuid_key(uuid: str | None) -> str:
    return (uuid or "").lower().removeprefix("gpu-")


class GpuMonitor:
    """NVML's view of the one GPU being calibrated: static facts once, state samples on demand,
    and every throttle reason seen in any sample."""

    def __init__(self, nvml: Any, handle: Any, index: int) -> None:
        self.nvml, self.handle, self.index = nvml, handle, index
        self.static = gpu_info(nvml, index)
        self.throttle_bits_seen = 0
        self._note(self.static)

    def _note(self, state: dict) -> dict:
        self.throttle_bits_seen |= int(state.get("throttle_reasons") or 0)
        return state

    def sample(self) -> dict:
        return self._note(gpu_state(self.nvml, self.handle))

    @classmethod
    def find(cls, nvml: Any, uuid: str | None, name: str | None) -> "GpuMonitor":
        """The NVML device torch is using: by UUID, else the only GPU, else the only one of that
        name (CUDA_VISIBLE_DEVICES renumbers devices, so indices cannot be trusted)."""
        count = int(_call(nvml, "nvmlDeviceGetCount") or 0)
        handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        if uuid:
            for i, h in handles:
                if _uuid_key(_call(nvml, "nvmlDeviceGetUUID", h)) == _uuid_key(uuid):
                    return cls(nvml, h, i)
        if len(handles) == 1:
            return cls(nvml, handles[0][1], handles[0][0])
        named = [(i, h) for i, h in handles if name and _call(nvml, "nvmlDeviceGetName", h) == name]
        if len(named) == 1:
            return cls(nvml, named[0][1], named[0][0])
        raise NvmlUnavailable(f"cannot tell which of {count} NVML devices torch is using")


def driver_versions(nvml: Any) -> dict[str, str]:
    """The driver and the CUDA version it supports, as strings; absent when unreadable."""
    v = {"driver": _call(nvml, "nvmlSystemGetDriverVersion"), "cuda_driver": cuda_driver_version(nvml)}
    return {k: str(val) for k, val in v.items() if val is not None}
