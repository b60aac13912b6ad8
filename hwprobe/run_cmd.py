"""`hwprobe run`: measure one scenario on the real tiered KV cache; write the simulator's summary keys
(summary.json), a per-step CSV (steps.csv) and the resolved scenario, each written atomically."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import List, Optional

import typer

from sim.inputs.errors import EXIT_BAD_INPUT, ConfigError
from sim.outputs.schema import MeasuredSummary

DEVICES = ("cuda", "cpu")


class DeviceUnavailable(Exception):
    """The requested device is missing: one line, exit 2."""


_DEVICE_FORM = re.compile(r"(cuda|cpu)(?::(\d{1,4}))?")
MAX_THREADS = 4096


def resolve_device(device: str | None) -> str:
    """`cuda` unless told otherwise; never silently falls back to the CPU. `cuda:N` must name a
    device this machine has."""
    name = device or "cuda"
    form = _DEVICE_FORM.fullmatch(name)
    if form is None:
        raise DeviceUnavailable(f"--device: expected cuda, cuda:N or cpu, got {name!r}")
    if form.group(1) == "cpu" and form.group(2) not in (None, "0"):
        raise DeviceUnavailable(f"--device: the CPU is cpu (or cpu:0), got {name!r}")
    if form.group(1) == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise DeviceUnavailable("no CUDA device available; pass --device cpu to run on the CPU "
                                    "(timings are then labelled cpu)")
        if form.group(2) is not None and int(form.group(2)) >= torch.cuda.device_count():
            raise DeviceUnavailable(f"--device: {name} does not exist; this machine has "
                                    f"{torch.cuda.device_count()} CUDA device(s)")
    return name


def check_run_options(*, layers: int | None = None, threads: int | None = None, attention: str = "merged",
                      prefill: str = "random", dtype: str | None = None, scores: str = "attention") -> None:
    """Every option of `hwprobe run` / `validate` checked before any work: a ConfigError naming it."""
    from sim.inputs.limits import MAX_LAYERS

    from .decode import PREFILL_MODES, RUN_DTYPES, SCORE_SOURCES

    if layers is not None and not 1 <= layers <= MAX_LAYERS:
        raise ConfigError(f"expected 1 to {MAX_LAYERS}, got {layers}", field="--layers")
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"expected 1 to {MAX_THREADS}, got {threads}", field="--threads")
    for option, value, choices in (("--attention", attention, ("merged", "ordered")), ("--prefill", prefill, PREFILL_MODES),
                                   ("--scores", scores, SCORE_SOURCES)):
        if value not in choices:
            raise ConfigError(f"expected one of {', '.join(choices)}, got {value!r}", field=option)
    if dtype is not None and dtype not in RUN_DTYPES:
        raise ConfigError(f"expected one of {', '.join(RUN_DTYPES)}, got {dtype!r}", field="--dtype")


def with_source(err: ConfigError, path) -> ConfigError:
    """Errors raised after loading name the scenario file too."""
    return err if err.source else ConfigError(err.message, source=str(path), field=err.field)


def fail(command: str, message: str) -> None:
    print(f"hwprobe {command}: {message}", file=sys.stderr)
    raise typer.Exit(EXIT_BAD_INPUT)


def _fmt(v, unit: str = "", scale: float = 1.0, digits: int = 4) -> str:
    return "-" if v is None else f"{v / scale:.{digits}g}{unit}"


def print_summary(s: MeasuredSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    from sim.model.units import GB, MS

    t = Table(show_header=False, box=None)
    rows = [
        ("scenario", f"{s.scenario}: {s.model} on {s.device_name} ({s.device}, timing {s.timing}), "
                     f"batch {s.batch_size}, {s.policy} ({s.semantics}, {s.prefetch})"),
        ("layers", f"{s.layers_run} run of {s.layers_model}" + (" (scaled)" if s.layer_scale != 1 else "")),
        ("decode throughput", _fmt(s.throughput_tok_per_s, " tok/s")),
        ("TPOT p50 / p99", f"{_fmt(s.tpot_p50_s, ' ms', MS)} / {_fmt(s.tpot_p99_s, ' ms', MS)}"),
        ("device memory peak", _fmt(s.hbm_peak_bytes, " GB", GB) + f"  [{s.hbm_peak_source}]"),
        ("  of which", f"offloads in flight {_fmt(s.offload_in_flight_peak_bytes, ' GB', GB)} (peak); "
                       f"attention workspace {_fmt(s.attention_workspace_bytes, ' GB', GB)} (not in the simulator)"),
        ("host peak (T1+T2)", _fmt(s.host_peak_bytes, " GB", GB)),
        ("H2D / D2H bytes", f"{_fmt(s.h2d_bytes, ' GB', GB)} / {_fmt(s.d2h_bytes, ' GB', GB)}"),
        ("achieved H2D / D2H", f"{_fmt(s.h2d_achieved_bytes_per_s, ' GB/s', GB)} / "
                               f"{_fmt(s.d2h_achieved_bytes_per_s, ' GB/s', GB)}"),
        ("transfer share / stall share", f"{_fmt(s.transfer_share, '', 0.01, 3)} % / {_fmt(s.stall_share, '', 0.01, 3)} %"),
        ("offloaded / evicted tokens", f"{s.offloaded_tokens:,} / {s.evicted_tokens:,}"
                                       f"  [re-tier on {s.scores} scores]"),
    ]
    if s.access != "prefetch":
        rows.append(("host attention share", f"{_fmt(s.host_attention_share, '', 0.01, 3)} %  [access {s.access}]"))
    rows += [("note", n) for n in s.notes]
    for label, value in rows:
        t.add_row(f"[bold]{label}[/bold]", value)
    Console(width=shutil.get_terminal_size((150, 40)).columns).print(t)


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        scenario: Path = typer.Argument(..., help="scenario YAML"),
        device: Optional[str] = typer.Option(None, "--device", help="cuda (default) or cpu"),
        set_: List[str] = typer.Option([], "--set", help="override, e.g. workload.batch_size=1 (repeatable)"),
        as_json: bool = typer.Option(False, "--json", help="print the summary JSON on stdout"),
        out: Optional[Path] = typer.Option(None, "--out", help="run directory (default runs/hwprobe-<name>-<UTC time>)"),
        layers: Optional[int] = typer.Option(None, "--layers", help="run at most N layers; time and memory scaled to the model's depth"),
        attention: str = typer.Option("merged", "--attention", help="merged (T0 in place + staged) or ordered (one key set in token order)"),
        prefill: str = typer.Option("random", "--prefill", help="random (seeded prompt K/V) or model (real prefill forward)"),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16, fp16 or float32 (default: the scenario's kv_dtype)"),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (--device cpu; tiny shapes run fastest on 1)"),
        scores: str = typer.Option("attention", "--scores", help="attention (re-tier on this run's attention) or "
                                   "simulator (replay the simulator's seeded decisions: same tokens moved)"),
        host_fraction: Optional[float] = typer.Option(None, "--host-fraction", help="policy.access split: share of each "
                                                      "layer's host tokens attended on the host (default: the simulator's "
                                                      "choice per step)"),
    ) -> None:
        """Run the real tiered KV cache in a decode loop and measure it."""
        from sim.inputs.scenario import load_scenario
        from sim.outputs.run_folder import check_out_path, default_run_path, to_json, write_run_dir

        from .decode import RunOptions, check_access_options, measure_run

        try:  # every option, input and the output path checked before anything is measured
            check_run_options(layers=layers, threads=threads, attention=attention, prefill=prefill, dtype=dtype,
                              scores=scores)
            if out is not None:
                check_out_path(out, folder=True)
            dev = resolve_device(device)
            sc = load_scenario(scenario, set_)
            check_access_options(sc.policy, host_fraction, attention)
            out_dir = out or default_run_path(f"hwprobe-{sc.name}")
            check_out_path(out_dir, folder=True)
        except DeviceUnavailable as err:
            fail("run", str(err))
        except ConfigError as err:
            fail("run", err.line() if err.field and err.field.startswith("--") else with_source(err, scenario).line())
        try:
            result = measure_run(sc, RunOptions(device=dev, layers=layers, attention=attention, prefill=prefill,
                                                dtype=dtype, cpu_threads=threads, scores=scores,
                                                host_fraction=host_fraction))
            write_run_dir(out_dir, sc, result.summary, result.steps)
        except ConfigError as err:
            fail("run", with_source(err, scenario).line())
        except OSError as exc:
            fail("run", ConfigError(f"cannot write {out_dir}: {exc.strerror or exc}", field="--out").line())
        if as_json:
            print(to_json(result.summary))
            return
        print_summary(result.summary)
        print(f"wrote {out_dir}/ (scenario.resolved.yaml, summary.json, steps.csv)")
