"""`hwprobe info`: what this machine is - GPUs through NVML, torch and CUDA, the host.

Works on any machine: without NVML or a GPU it says so in one line and still shows the host;
without torch it says torch is not installed. Always exits 0 - it reports, it does not judge.
"""

from __future__ import annotations

from typing import Any

import typer

from sim.model.units import GB


def collect(nvml: Any = None) -> dict:
    """Host, torch and NVML facts as one JSON-ready dict."""
    from hwprobe.calibrate.env import host_info, nvml_report, torch_info

    return {"host": host_info(), "torch": torch_info(), "nvml": nvml_report(nvml)}


def _gb(nbytes: float | None) -> str:
    return "?" if nbytes is None else f"{nbytes / GB:.1f} GB"


def _mhz(hz: float | None) -> str:
    return "?" if hz is None else f"{hz / 1e6:.0f} MHz"


def _pair(current: Any, maximum: Any, fmt: Any = str) -> str:
    cur = "?" if current is None else fmt(current)
    return cur if maximum is None else f"{cur} (max {fmt(maximum)})"


def _gpu_lines(g: dict) -> list[str]:
    if "error" in g:
        return [f"GPU {g['index']}: unreadable ({g['error']})"]
    lines = [
        f"GPU {g['index']}: {g.get('name', '?')}",
        f"  memory:      {_gb(g.get('memory_total_bytes'))} total, {_gb(g.get('memory_free_bytes'))} free",
        f"  PCIe:        gen {_pair(g.get('pcie_gen_current'), g.get('pcie_gen_max'))}, "
        f"width x{_pair(g.get('pcie_width_current'), g.get('pcie_width_max'))}",
        f"  SM clock:    {_pair(g.get('sm_clock_hz'), g.get('sm_clock_max_hz'), _mhz)}",
        f"  mem clock:   {_pair(g.get('memory_clock_hz'), g.get('memory_clock_max_hz'), _mhz)}",
    ]
    if "temperature_c" in g or "power_draw_w" in g:
        power = f"{g['power_draw_w']:.0f} W" if "power_draw_w" in g else "?"
        limit = f" of {g['power_limit_w']:.0f} W" if "power_limit_w" in g else ""
        lines.append(f"  temp/power:  {g.get('temperature_c', '?')} C, {power}{limit}")
    if "throttle_reasons" in g:
        names = ", ".join(g.get("throttle_reason_names") or []) or "none"
        lines.append(f"  throttle:    {names} (0x{g['throttle_reasons']:x})")
    else:
        lines.append("  throttle:    not reported by this NVML")
    return lines


def render(report: dict) -> list[str]:
    """Plain text lines, so the output greps and copies cleanly."""
    host, tor, nvml = report["host"], report["torch"], report["nvml"]
    lines = [
        f"host:   {host.get('hostname', '?')}",
        f"  CPU:         {host.get('cpu_model', '?')}, {host.get('logical_cores', '?')} logical cores"
        + (f" ({host['usable_cores']} usable)" if host.get("usable_cores") not in (None, host.get("logical_cores")) else ""),
        f"  memory:      {_gb(host.get('memory_total_bytes'))} total, {_gb(host.get('memory_available_bytes'))} available",
        f"  OS:          {host.get('os', '?')}, Python {host.get('python', '?')}",
    ]
    if not tor.get("installed"):
        lines.append("torch:  not installed (pip install 'kvtier[hwprobe]' to calibrate)")
    else:
        cuda = tor.get("cuda_version") or "none"
        seen = "sees CUDA" if tor.get("cuda_available") else f"no CUDA ({tor.get('cuda_unavailable_reason')})"
        lines.append(f"torch:  {tor['torch_version']}, built with CUDA {cuda}, {seen}")
    if not nvml.get("available"):
        lines.append(f"no NVIDIA GPU: {nvml.get('reason', 'unknown reason')}")
        return lines
    lines.append(f"driver: {nvml.get('driver_version', '?')}, CUDA driver API {nvml.get('cuda_driver_version', '?')}")
    for g in nvml["gpus"]:
        lines += _gpu_lines(g)
    return lines


def register(app: typer.Typer) -> None:
    @app.command("info")
    def info_command(
        as_json: bool = typer.Option(False, "--json", help="Print the facts as JSON."),
    ) -> None:
        """Show GPUs (through NVML), torch and CUDA versions, and the host."""
        report = collect()
        if as_json:
            from sim.outputs.run_folder import to_json

            typer.echo(to_json(report, sort_keys=True))
        else:
            for line in render(report):
                typer.echo(line)
