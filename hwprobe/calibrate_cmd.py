"""`hwprobe calibrate`: measure this machine and write the profile `kvsim run --profile` consumes.

Fails early and plainly: a bad option or an unavailable GPU is one line on stderr and exit 2,
before anything is measured or written. A copy that delivers wrong data is exit 1, nothing written.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer

from sim.inputs.errors import EXIT_BAD_INPUT, ConfigError
from sim.inputs.profile import profile_to_yaml
from sim.outputs.atomic import write_text_atomic

PREFIX = "hwprobe calibrate: "
DEVICES = ("cuda", "cpu")
EXIT_MEASUREMENT_FAILED = 1


def _resolve_device(device: str | None) -> str:
    chosen = (device or "cuda").strip().lower()
    if chosen not in DEVICES:
        raise ConfigError(f"expected one of {', '.join(DEVICES)}, got {device!r}", field="--device")
    return chosen


def _check_out(out: Path) -> None:
    """The profile can be written there: not a directory, inside a writable directory."""
    if out.is_dir():
        raise ConfigError(f"{out} is a directory; expected a file path", field="--out")
    parent = out.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(f"cannot write under {parent}", field="--out")


def _device_unavailable(device: str) -> str | None:
    """One line saying why `device` cannot be calibrated here, or None."""
    from hwprobe.calibrate.env import cuda_unavailable_reason, import_torch

    torch = import_torch()
    if torch is None:
        return "torch is not installed (pip install 'kvtier[hwprobe]')"
    if device == "cuda":
        reason = cuda_unavailable_reason(torch)
        if reason is not None:
            return f"no CUDA GPU available ({reason}); use --device cpu to calibrate the CPU"
    return None


class _Progress:
    """A rich progress bar on stderr; `step(label)` closes the previous step and names the next."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("[bold]calibrate[/]"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.description}"), console=Console(stderr=True))
        self.task = self.bar.add_task("starting", total=total)
        self.started = False

    def step(self, label: str) -> None:
        self.bar.update(self.task, advance=1 if self.started else 0, description=label)
        self.started = True

    def finish(self) -> None:
        self.bar.update(self.task, completed=self.bar.tasks[0].total, description="done")


def run_calibrate(out: Path, quick: bool = False, device: str | None = None, tiny: bool = False,
                  nvml: Any = None) -> int:
    """The command's body; returns the exit code."""
    try:
        chosen = _resolve_device(device)
        _check_out(out)
    except ConfigError as err:
        typer.echo(PREFIX + err.line(), err=True)
        return EXIT_BAD_INPUT
    reason = _device_unavailable(chosen)
    if reason is not None:
        typer.echo(PREFIX + reason, err=True)
        return EXIT_BAD_INPUT

    from hwprobe.calibrate.backend import BackendUnavailable, make_backend
    from hwprobe.calibrate.copies import CopyIntegrityError
    from hwprobe.calibrate.plan import make_plan
    from hwprobe.calibrate.runner import calibrate

    try:
        backend = make_backend(chosen)
    except BackendUnavailable as exc:
        typer.echo(PREFIX + f"cannot use {chosen}: {exc}", err=True)
        return EXIT_BAD_INPUT
    plan = make_plan(chosen, quick=quick, tiny=tiny)
    progress = _Progress(plan.total_steps(chosen))
    t0 = time.perf_counter()
    try:
        with progress.bar:
            profile = calibrate(backend, plan, quick=quick or tiny, nvml=nvml, on_step=progress.step)
            progress.finish()
    except CopyIntegrityError as exc:
        typer.echo(PREFIX + f"data integrity failure: {exc}; nothing written", err=True)
        return EXIT_MEASUREMENT_FAILED
    elapsed_s = time.perf_counter() - t0
    write_text_atomic(out, profile_to_yaml(profile))
    _print_summary(profile, out, elapsed_s)
    return 0


def _print_summary(profile: Any, out: Path, elapsed_s: float) -> None:
    from hwprobe.calibrate.summary import summary_rows

    rows = summary_rows(profile)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        typer.echo(f"  {label:<{width}}  {value}")
    for w in profile.warnings:
        typer.echo(f"warning: {w}")
    typer.echo(f"wrote {out} ({profile.device} profile, {len(profile.warnings)} warnings, {elapsed_s:.0f} s)")


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_command(
        out: Path = typer.Option(Path("profile.yaml"), "--out", "-o", help="Where to write the profile YAML."),
        quick: bool = typer.Option(False, "--quick", help="Shorter sweeps, fewer samples (about 2 min on an H200)."),
        device: str = typer.Option(None, "--device", metavar="cuda|cpu",
                                   help="What to measure (default: cuda). cpu measures the host honestly."),
        tiny: bool = typer.Option(False, "--tiny", hidden=True, help="Tests only: a sweep of seconds."),
    ) -> None:
        """Measure copies, GEMMs and attention on this machine and write a profile for kvsim."""
        raise typer.Exit(run_calibrate(out, quick=quick, device=device, tiny=tiny))
