"""`kvsim`: simulate tiered KV caches, list catalog models and GPUs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from sim.inputs import catalog
from sim.inputs.errors import EXIT_BAD_INPUT, ConfigError
from sim.inputs.kernel_tables import system_for
from sim.model.layers import LINEAR
from sim.model.units import GB, TB, TFLOP
from sim.outputs.run_folder import to_json

from .accuracy import accuracy
from .guard import EXIT_INTERRUPTED, GuardedTyper
from .ops import ops

app = GuardedTyper("kvsim", add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(width=shutil.get_terminal_size((150, 40)).columns)


MODEL_WEIGHT_DTYPES = ("bf16", "fp8", "int8", "int4", "nvfp4", "mxfp4")  # `kvsim models --json`'s weight bytes
TABLE_WEIGHT_DTYPES = MODEL_WEIGHT_DTYPES[:-1]  # its table's columns (a sixth would not fit 80 columns)
ALLOW_LARGE_HELP = ("run work past its estimated-cost limit (sim/inputs/limits.py) instead of refusing it; "
                    "the estimate is said as a warning first")


def _fail(err: ConfigError, source: Path | None = None) -> None:
    """`err` as one line, naming `source` (the scenario file) where the error names no file: a rule
    that applies once the run resolves (e.g. vLLM's start check, `decode.context.with_context_rule`)."""
    if source is not None and err.source is None:
        err = ConfigError(err.message, source=str(source), field=err.field)
    print(f"kvsim: {err.line()}", file=sys.stderr)
    raise typer.Exit(EXIT_BAD_INPUT)


def _run_inputs(scenario: Path, profile: Path | None, out: Path | None, set_: list[str], allow_large: bool):
    """`kvsim run`'s inputs, its cost and its output path, all checked before anything is
    simulated or written: (scenario, profile path, profile, run folder)."""
    from sim.inputs.cost import check_serving_cost
    from sim.inputs.profile import device_mismatch, load_profile
    from sim.inputs.scenario import load_scenario
    from sim.outputs.run_folder import check_out_path, default_run_path

    try:
        if out is not None:
            check_out_path(out, folder=True)
        sc = load_scenario(scenario, set_)
        if sc.workload.arrivals is not None:  # a serving run's steps and tokens estimated first
            check_serving_cost(sc, allow=allow_large, source=str(scenario))
        prof_path = str(profile) if profile else sc.hardware.profile
        prof = load_profile(prof_path) if prof_path else None
        out_dir = out or default_run_path(sc.name)
        check_out_path(out_dir, folder=True)
    except ConfigError as err:
        _fail(err)
    mismatch = device_mismatch(prof, catalog.gpu(sc.hardware.gpu)) if prof is not None else None
    if mismatch:
        print(f"kvsim: warning: {prof_path}: {mismatch}", file=sys.stderr)
    return sc, prof_path, prof, out_dir


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="scenario YAML"),
    profile: Optional[Path] = typer.Option(None, "--profile", help="measured profile YAML (hwprobe calibrate)"),
    out: Optional[Path] = typer.Option(None, "--out", help="run directory (default runs/<name>-<UTC time>)"),
    set_: List[str] = typer.Option([], "--set", help="override, e.g. policy.hbm_ratio=0.3 (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary JSON on stdout"),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Simulate one scenario; write the resolved scenario, summary.json and steps.csv (with
    workload.arrivals: a serving run, requests.csv and timeline.csv)."""
    from sim.decode.simulate import simulate
    from sim.inputs.profile import measured_device
    from sim.outputs.run_folder import serving_summary_rows, summary_rows, write_run_dir

    sc, prof_path, prof, out_dir = _run_inputs(scenario, profile, out, set_, allow_large)
    serving = sc.workload.arrivals is not None
    try:
        if serving:
            from sim.serving.run import simulate_serving

            result = simulate_serving(sc, prof, profile_path=prof_path)
            files = {"requests.csv": result.requests, "timeline.csv": result.timeline}
            write_run_dir(out_dir, result.scenario, result.summary, tables=files)  # the scheduler it ran
        else:
            result = simulate(sc, prof, profile_path=prof_path)
            files = {"steps.csv": result.steps}
            write_run_dir(out_dir, sc, result.summary, result.steps)
    except ConfigError as err:
        _fail(err, scenario)
    except OSError as exc:
        _fail(ConfigError(f"cannot write {out_dir}: {exc.strerror or exc}", field="--out"))
    if as_json:
        print(to_json(result.summary))
        return
    table = Table(show_header=False, box=None)
    rows = (serving_summary_rows(result.summary) if serving
            else summary_rows(result.summary, measured_on=measured_device(prof) if prof else None))
    for label, value in rows:
        table.add_row(f"[bold]{label}[/bold]", value)
    console.print(table)
    console.print(f"[dim]wrote {out_dir}/ (scenario.resolved.yaml, summary.json, {', '.join(files)})[/dim]")


def _bounded_bytes_per_sequence(kv_by_kind: dict) -> float:
    """The most one sequence holds in its window and linear layers (`kv_by_kind`'s per-sequence bytes)."""
    return float(sum(r.get("max_bytes_per_sequence", 0.0) for r in kv_by_kind.values()))


def _model_rows(kv_dtype: str) -> list[dict]:
    rows = []
    for m in catalog.models().values():
        by_kind = m.kv_by_kind(kv_dtype)
        rows.append({
            "name": m.name, "layers": m.num_layers, "heads": m.num_heads, "kv_heads": m.num_kv_heads,
            "head_dim": m.head_dim, "params": m.params,
            "kv_bytes_per_token": m.kv_bytes_per_token("bf16"),
            f"kv_bytes_per_token_{kv_dtype}": m.kv_bytes_per_token(kv_dtype),
            "weight_bytes": m.weight_bytes("bf16"),
            "weight_bytes_by_dtype": {d: m.weight_bytes(d) for d in MODEL_WEIGHT_DTYPES},
            "layers_by_kind": m.describe_kinds(), "kv_by_kind": by_kind,
            "bounded_bytes_per_sequence": _bounded_bytes_per_sequence(m.kv_by_kind("bf16")),
            f"bounded_bytes_per_sequence_{kv_dtype}": _bounded_bytes_per_sequence(by_kind),
            "source": m.source,
        })
    return rows


@app.command()
def models(
    as_json: bool = typer.Option(False, "--json"),
    kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="also show KV bytes/token in this dtype"),
) -> None:
    """Catalog models with derived figures (KV bytes/token, parameters, weight bytes per dtype)."""
    if kv_dtype not in ("bf16", "fp16", "fp8", "int8"):
        _fail(ConfigError(f"--kv-dtype: expected one of bf16, fp16, fp8, int8, got {kv_dtype!r}"))
    rows = _model_rows(kv_dtype)
    if as_json:
        print(to_json(rows))
        return
    t = Table(title="models (weights: linear layers quantised, embeddings/LM head/norms bf16; KV by kind and "
                    f"bounded per sequence in {kv_dtype})")
    left = ("model", "layers by kind", "KV B/token by kind")
    for col in ("model", "layers by kind", "H", "Hkv", "d", "params", "KV B/token (bf16)", "KV B/token by kind",
                "bounded B/seq", *TABLE_WEIGHT_DTYPES):
        t.add_column(col, justify="left" if col in left else "right")
    for r in rows:
        w = r["weight_bytes_by_dtype"]
        bounded = r[f"bounded_bytes_per_sequence_{kv_dtype}"]
        t.add_row(r["name"], r["layers_by_kind"], str(r["heads"]), str(r["kv_heads"]), str(r["head_dim"]),
                  f"{r['params'] / 1e9:.2f} B", f"{r['kv_bytes_per_token']:,.0f}", _kv_by_kind_cell(r["kv_by_kind"]),
                  f"{bounded:,.0f}" if bounded else "-",
                  *(f"{w[d] / GB:.1f} GB" for d in TABLE_WEIGHT_DTYPES))
    console.print(t)


def _tflops(flop_per_s: float | None) -> str:
    return f"{flop_per_s / TFLOP:.0f} TFLOP/s" if flop_per_s else "-"


def _kv_by_kind_cell(kv_by_kind: dict) -> str:
    """'full 36,864 + window 36,864': each per-token kind's bytes per token over its layers (a linear
    layer holds none per token: its state is in the bounded column)."""
    return " + ".join(f"{k} {r['bytes_per_token']:,.0f}" for k, r in kv_by_kind.items() if k != LINEAR)


@app.command()
def gpus(as_json: bool = typer.Option(False, "--json")) -> None:
    """Catalog GPUs and host links (datasheet figures)."""
    rows = []
    for g in catalog.gpus().values():
        ln = catalog.link(g.link)
        rows.append({**g.model_dump(), "link_theoretical_bytes_per_s": ln.theoretical_bytes_per_s,
                     "link_pinned_h2d_bytes_per_s": ln.pinned_h2d_bytes_per_s,
                     "link_pinned_d2h_bytes_per_s": ln.pinned_d2h_bytes_per_s,
                     # which measured tables cost it (hardware.kernels: auto), whose fit its datasheet model takes
                     "kernel_tables": system_for(g.name),
                     "fitted_on": catalog.fit_source(g.name)})
    if as_json:
        print(to_json(rows))
        return
    t = Table(title="GPUs (datasheet, dense; memory as the device reports it; kernels: measured tables, or whose fit)")
    for col in ("gpu", "memory", "HBM BW", "BF16", "FP8", "FP4", "link", "pinned H2D/D2H", "copy engines", "kernels"):
        t.add_column(col, justify="left" if col in ("gpu", "link", "kernels") else "right")
    for r in rows:
        mib = f" ({r['memory_total_mib']:,} MiB)" if r["memory_total_mib"] else ""
        t.add_row(r["name"], f"{r['memory_bytes'] / GB:.1f} GB{mib}", f"{r['hbm_bytes_per_s'] / TB:.2f} TB/s",
                  f"{r['bf16_flop_per_s'] / TFLOP:.0f} TFLOP/s",
                  *(_tflops(r[f"{p}_flop_per_s"]) for p in ("fp8", "fp4")),
                  r["link"], f"{r['link_pinned_h2d_bytes_per_s'] / GB:.1f}/{r['link_pinned_d2h_bytes_per_s'] / GB:.1f} GB/s",
                  str(r["copy_engines"]), _kernels_said(r))
    console.print(t)
    lt = Table(title="host links (per direction)")
    for col in ("link", "theoretical", "pinned H2D/D2H", "pageable H2D/D2H", "both busy, each", "per copy"):
        lt.add_column(col, justify="left" if col == "link" else "right")
    for ln in catalog.links().values():
        lt.add_row(ln.name, f"{ln.theoretical_bytes_per_s / GB:.1f} GB/s",
                   f"{ln.pinned_h2d_bytes_per_s / GB:.1f}/{ln.pinned_d2h_bytes_per_s / GB:.1f} GB/s",
                   f"{ln.pageable_h2d_bytes_per_s / GB:.1f}/{ln.pageable_d2h_bytes_per_s / GB:.1f} GB/s",
                   f"{ln.bidirectional_bytes_per_s / GB:.1f} GB/s", f"{ln.per_copy_latency_s * 1e6:.1f} us")
    console.print(lt)


def _kernels_said(row: dict) -> str:
    """'tables' (measured ones cover it), or 'l40s fit' for a GPU no table measures (its sibling's fit)."""
    if row["kernel_tables"]:
        return "tables"
    return f"{row['fitted_on']} fit" if row["fitted_on"] else "defaults"


EXECUTOR_HELP = "local (processes on this machine) or ray"
ADDRESS_HELP = "Ray cluster to join: auto, HOST:PORT or ray://HOST:PORT (default: start a local Ray instance)"
WORKERS_HELP = "local processes, or CPUs of a local Ray instance (default: all cores)"
CACHE_HELP = "result store: a rerun computes only what it does not hold, an interrupted run resumes (default: none)"


def _interrupted(err, cache: Path) -> None:
    """Ctrl-C with a result store: what finished is kept (sim.runner.tasks.Interrupted). One line, exit 130."""
    print(f"kvsim: {err} ({cache})", file=sys.stderr)
    _said_interrupted()


def _said_interrupted() -> None:
    app._interrupt_reported = True  # the command said it: no second "interrupted" line from the guard
    raise typer.Exit(EXIT_INTERRUPTED)


@app.command()
def report(
    scenarios: Optional[List[Path]] = typer.Argument(None, help="scenario YAMLs for per-run views; none: the 7B-70B projection and the paper checked"),
    profile: List[Path] = typer.Option([], "--profile", help="measured profile (hwprobe calibrate): an extra GPU column; one profile also applies to the runs (repeatable)"),
    validation: Optional[Path] = typer.Option(None, "--validation", help="CSV written by hwprobe validate: predicted against measured"),
    plan_dir: Optional[Path] = typer.Option(None, "--plan", help="folder written by kvsim plan --out: the \"Serving plan\" section"),
    out: Path = typer.Option(Path("reports/report.html"), "--out", help="the HTML file to write (self-contained, opens offline)"),
    set_: List[str] = typer.Option([], "--set", help="override applied to every scenario, e.g. sim.detail=layer (repeatable)"),
    executor: str = typer.Option("local", "--executor", help=f"where the projection runs: {EXECUTOR_HELP}"),
    address: Optional[str] = typer.Option(None, "--address", help=ADDRESS_HELP),
    workers: Optional[int] = typer.Option(None, "--workers", help=WORKERS_HELP),
    cache: Optional[Path] = typer.Option(None, "--cache", help=f"the projection's {CACHE_HELP}"),
    only: Optional[str] = typer.Option(None, "--only", help="plan: a page of the \"Serving plan\" section alone (with --plan; "
                                       "the projection is not computed)"),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
    moe: bool = typer.Option(False, "--moe", help="add the \"Mixture-of-experts and hybrid models\" section to the "
                             "projection (H200 and B200; about 30 s more on 2 cores)"),
) -> None:
    """One interactive HTML report: the projection (default) or per-run views (closed batches and serving
    runs), validation and a serving plan."""
    from sim.model.units import MB
    from sim.report.command import build_report
    from sim.runner.options import Execution
    from sim.runner.tasks import Interrupted

    try:
        written = build_report(list(scenarios or []), list(profile), validation, out, overrides=set_,
                               command="kvsim report " + " ".join(sys.argv[2:]), plan_path=plan_dir,
                               execution=Execution(executor, address, workers, cache), only=only,
                               allow_large=allow_large, moe=moe)
    except ConfigError as err:
        _fail(err)
    except Interrupted as err:
        _interrupted(err, cache)
    print(f"wrote {written} ({written.stat().st_size / MB:.1f} MB)", file=sys.stderr)


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="sweep spec YAML (scenarios/sweeps/)"),
    out: Optional[Path] = typer.Option(None, "--out", help="sweep directory (default runs/sweep-<spec name>); a rerun into it resumes"),
    executor: str = typer.Option("local", "--executor", help=EXECUTOR_HELP),
    address: Optional[str] = typer.Option(None, "--address", help=ADDRESS_HELP),
    workers: Optional[int] = typer.Option(None, "--workers", help=WORKERS_HELP),
    batch: Optional[int] = typer.Option(None, "--batch", help="points per task (default: 32 on Ray, chosen by level locally)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar with ETA on stderr"),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Evaluate a grid of scenarios; write DIR/table.csv and DIR/table.parquet, one row per point."""
    from sim.sweep.command import sweep_command

    try:
        code = sweep_command(spec, out, executor=executor, address=address, workers=workers, batch=batch,
                             progress=progress, allow_large=allow_large)
    except ConfigError as err:
        _fail(err)
    if code == EXIT_INTERRUPTED:  # it said so, with what it kept
        _said_interrupted()
    if code:
        raise typer.Exit(code)


@app.command()
def plan(
    scenario: Path = typer.Argument(..., help="scenario YAML: the model, prompt and output lengths, scheduler, policy fields"),
    rate: float = typer.Option(..., "--rate", help="offered load, requests per second (Poisson arrivals)"),
    ttft_p99_ms: Optional[float] = typer.Option(None, "--ttft-p99-ms", help="p99 time-to-first-token target (default: the scenario's slo.ttft_ms)"),
    tpot_p99_ms: Optional[float] = typer.Option(None, "--tpot-p99-ms", help="p99 time-per-output-token target (default: the scenario's slo.tpot_ms)"),
    gpus_: Optional[str] = typer.Option(None, "--gpus", help="GPU kinds, comma-separated (default: every catalog GPU)"),
    counts: Optional[str] = typer.Option(None, "--counts", help="GPU counts, each tried as every TP x DP layout, TP x PP x DP without "
                                                                      "NVLink (default 1,2,4,8)"),
    policies: Optional[str] = typer.Option(None, "--policies", help="full_hbm, evict_only, tiered, tiered:RATIO, tiered:auto, a tiered one "
                                           "also as tiered:X/ACCESS (default: full_hbm,evict_only,tiered:0.25,tiered:0.5,tiered:auto; tiered: 0.25,0.5,0.75,auto)"),
    access: Optional[str] = typer.Option(None, "--access", help="access strategies every tiered policy is tried with: prefetch, "
                                         "host_attention, split, sparse_fetch, comma-separated (default: prefetch; a sparse-attention "
                                         "model also sparse_fetch)"),
    price: List[str] = typer.Option([], "--price", help="override a $/GPU-hour, GPU=DOLLARS (repeatable)"),
    requests: Optional[int] = typer.Option(None, "--requests", help="requests per simulation (default: steady-state "
                                           "probes size their own run from the mean latency)"),
    max_factor: float = typer.Option(4.0, "--max-factor", help="the max-rate search stops at this multiple of --rate"),
    top: int = typer.Option(5, "--top", help="stop once this many exact configurations pass, cheapest first; 0 searches "
                            "every one the screen keeps"),
    pareto: bool = typer.Option(False, "--pareto", help="also search every configuration that may lie on its GPU count's "
                                "Pareto front (tokens/s per GPU vs per user); the rest are skipped where a simulated one "
                                "beats their screen estimates by the margins or its estimates are within 1% of theirs "
                                "(docs/planning.md)"),
    all_rows: bool = typer.Option(False, "--all", help="list every row, failing, screened and pruned ones too"),
    executor: str = typer.Option("local", "--executor", help=f"where the candidates run: {EXECUTOR_HELP}"),
    address: Optional[str] = typer.Option(None, "--address", help=ADDRESS_HELP),
    workers: Optional[int] = typer.Option(None, "--workers", help=WORKERS_HELP),
    cache: Optional[Path] = typer.Option(None, "--cache", help=f"searched candidates' {CACHE_HELP}; prices are not part of it"),
    set_: List[str] = typer.Option([], "--set", help="override applied to the scenario first (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON on stdout"),
    out: Optional[Path] = typer.Option(None, "--out", help="folder to write plan.csv, probes.csv (every simulation) and "
                                       "plan.json (the search asked) into; `kvsim report --plan DIR` draws them"),
    replicas: bool = typer.Option(True, "--replicas/--no-replicas", help="every TP x DP (and TP x PP x DP without NVLink) layout of each count (default), "
                                  "or one TP group of all the GPUs"),
    max_num_seqs: Optional[str] = typer.Option(None, "--max-num-seqs", help="caps on running sequences per instance "
                                               "to search, comma-separated (default: the scenario's scheduler)"),
    max_num_batched_tokens: Optional[str] = typer.Option(None, "--max-num-batched-tokens", help="token budgets per step "
                                                         "per instance to search, comma-separated (default: the scenario's)"),
    disagg: bool = typer.Option(True, "--disagg/--no-disagg", help="also every split into prefill and decode "
                                "instances, the K/V moved over the interconnect (default on)"),
    balancer: str = typer.Option("round-robin", "--balancer", help="how data-parallel replicas share the arrivals: "
                                 "round-robin (each replica simulated alone on every k-th arrival), least-outstanding "
                                 "(to the replica with the fewest requests in it) or vllm (vLLM's data-parallel "
                                 "balancer: the lowest 4 x waiting + running); the last two simulate the replicas together"),
    allow_large: bool = typer.Option(False, "--allow-large", help=ALLOW_LARGE_HELP),
) -> None:
    """Cheapest GPU kind x count x layout (TP x PP x replicas) x KV policy meeting a p99 TTFT/TPOT SLO at --rate in
    steady state, with each one's max sustainable rate; exit 1 when none does."""
    from sim.inputs.scenario import load_scenario
    from sim.outputs.run_folder import check_out_path
    from sim.runner.options import Execution

    if out is not None:
        check_out_path(out, folder=True)
    execution = Execution(executor, address, workers, cache).check()
    sc = load_scenario(scenario, set_)
    spec = _plan_spec(sc.slo, rate, ttft_p99_ms, tpot_p99_ms, requests, max_factor, top, balancer)
    asked = _plan_asked(sc, gpus_, counts, policies, access, price, max_num_seqs, max_num_batched_tokens)
    _plan_run(scenario, sc, spec, asked, (replicas, disagg, pareto), execution, allow_large, as_json, all_rows, out, cache)


def _plan_asked(sc, gpus: str | None, counts: str | None, policies: str | None, access: str | None, price: list[str],
                max_num_seqs: str | None, max_num_batched_tokens: str | None) -> tuple:
    """What the plan searches, parsed (one clear line for each bad flag): (GPUs, counts, policies, prices,
    the --price overrides, max_num_seqs values, token budgets)."""
    from sim.plan import candidates as c

    access = access if access is not None else c.default_access(sc)
    seqs = c.parse_seqs(max_num_seqs)
    return (c.parse_gpus(gpus), c.parse_counts(counts), c.parse_policies(policies, access), c.parse_prices(price), price,
            seqs, c.parse_budgets(max_num_batched_tokens, seqs, sc))


def _plan_run(path: Path, sc, spec, asked: tuple, layouts: tuple[bool, bool, bool], execution, allow_large: bool,
              as_json: bool, all_rows: bool, out: Path | None, cache: Path | None) -> None:
    """The search, its files and what it prints; exit 1 when nothing passes."""
    import time

    from sim.outputs.atomic import write_dir_atomic
    from sim.plan.files import plan_dir_files
    from sim.plan.search import search
    from sim.runner.tasks import Interrupted

    from .plan_print import plan_doc, print_plan

    names, ns, pols, prices, overrides, seqs, budgets = asked
    replicas, disagg, front = layouts
    t0 = time.monotonic()
    try:
        with _plan_progress(not as_json) as progress:
            result = search(sc, spec, names, ns, pols, prices, replicas=replicas, execution=execution,
                            allow_large=allow_large, progress=progress, disagg=disagg, seqs=seqs,
                            front=front, budgets=budgets)
    except Interrupted as err:
        _interrupted(err, cache)
    rows, wall = result.rows, time.monotonic() - t0
    _said_about_store(result, cache)
    if out is not None:  # the three files replaced together
        write_dir_atomic(out, plan_dir_files(rows, result.probes, plan_doc(path, sc, spec, names, ns, pols, layouts, overrides, seqs,
                                                                                   budgets)))
    if as_json:
        print(to_json(rows))
    else:
        print_plan(console, result, sc, spec, all_rows, wall, out)
    if not any(r["status"] == "pass" for r in rows):
        raise typer.Exit(1)


def _plan_progress(show: bool):
    """A progress bar with ETA over the plan's candidate simulations, on stderr; `progress(done, total)`."""
    import contextlib

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    @contextlib.contextmanager
    def bar():
        err = Console(stderr=True)
        if not show or not err.is_terminal:  # a bar is for a person at a terminal, not for a log
            yield None
            return
        with Progress(TextColumn("kvsim plan: simulating candidates, cheapest first"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), TimeRemainingColumn(),
                      console=err, transient=True) as p:
            task = p.add_task("plan", total=None)
            yield lambda done, total: p.update(task, completed=done, total=total)

    return bar()


app.command()(ops)
app.command()(accuracy)


def _said_about_store(result, cache: Path | None) -> None:
    """With --cache: what the plan searched and read, and any damaged entries it searched again."""
    from sim.runner.tasks import damaged_line

    if result.damaged:
        print(f"kvsim: {damaged_line(result.damaged)} in {cache}", file=sys.stderr)
    if cache is not None:
        print(f"kvsim: plan: {result.computed} candidates searched, {result.stored} read from {cache}", file=sys.stderr)


def _plan_spec(slo, rate: float, ttft_p99_ms: float | None, tpot_p99_ms: float | None, requests: int | None,
               max_factor: float, top: int, balancer: str = "round-robin"):
    """What the search asks: the rate, and each SLO target from its option or else the scenario's."""
    from sim.plan.candidates import PlanSpec

    if top < 0:
        raise ConfigError(f"expected 0 (search every configuration) or more, got {top}", field="--top")
    return PlanSpec(rate=rate,
                    ttft_s=ttft_p99_ms / 1e3 if ttft_p99_ms is not None else (slo.ttft_s if slo else None),
                    tpot_s=tpot_p99_ms / 1e3 if tpot_p99_ms is not None else (slo.tpot_s if slo else None),
                    requests=requests, max_factor=max_factor, top=top, balancer=balancer)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
