"""`kvsim report`: check every input first, compute with progress on stderr, write the page atomically.

Bad input raises ConfigError before anything is computed or written; the CLI turns it into one
line and exit status 2.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from sim.decode.simulate import simulate
from sim.inputs.accuracy_bands import load_bands
from sim.inputs.cost import check_serving_cost
from sim.inputs.errors import ConfigError
from sim.inputs.profile import Profile, load_profile
from sim.inputs.scenario import Scenario, load_scenario
from sim.outputs.atomic import write_files_atomic
from sim.outputs.csv_text import csv_text
from sim.outputs.run_folder import check_out_path
from sim.runner.options import Execution
from sim.runner.tasks import damaged_line
from sim.serving.run import simulate_serving
from sim.studies.access_strategies import access_study
from sim.studies.moe_projection import MoeGridSpec, check_moe_spec, moe_cells, placements_for, run_moe_grid
from sim.studies.paper_check import check_paper
from sim.studies.projection_grid import DEFAULT_GRID, GridSpec, cells_for, check_spec, gpu_columns, run_grid

from .document import ReportData, render
from .plan_input import load_plan
from .progress import ReportProgress
from .validation_table import load_validation

PAPER_STEPS = 1  # the paper check is one short computation (three small simulations)
ONLY_SECTIONS = ("plan",)  # --only: a page of that section alone, nothing else computed


@dataclass
class Inputs:
    scenarios: list[tuple[Scenario, Profile | None, str | None]]  # scenario, profile, profile path
    profiles: list[Profile]
    validation: object | None  # DataFrame
    plan: object | None = None  # sim.report.plan_input.PlanFiles


def load_inputs(scenario_paths: list[Path], profile_paths: list[Path], validation_path: Path | None, out: Path,
                overrides: list[str] | None = None, plan_path: Path | None = None, allow_large: bool = False) -> Inputs:
    """Everything the report reads, checked up front. A single --profile also applies to the runs
    (as `kvsim run --profile` does); otherwise each run uses its scenario's own hardware.profile. A
    serving scenario's cost is checked as `kvsim run` checks it (`allow_large`: --allow-large)."""
    if out.exists() and out.is_dir():
        raise ConfigError("is a directory; expected the path of the HTML file to write", source=str(out), field="--out")
    check_out_path(out, folder=False)
    profiles = [load_profile(p) for p in profile_paths]
    runs = []
    for path in scenario_paths:
        sc = load_scenario(path, overrides)
        if sc.workload.arrivals is not None:
            check_serving_cost(sc, allow=allow_large, source=str(path))
        prof_path = str(profile_paths[0]) if len(profile_paths) == 1 else sc.hardware.profile
        prof = profiles[0] if len(profile_paths) == 1 else (load_profile(prof_path) if prof_path else None)
        runs.append((sc, prof, prof_path))
    table = load_validation(validation_path) if validation_path else None
    return Inputs(runs, profiles, table, load_plan(plan_path) if plan_path is not None else None)


def profile_warnings(inputs: Inputs) -> list[str]:
    """A line for each run whose profile did not measure the run's GPU (sim.inputs.profile.device_mismatch)."""
    from sim.inputs import catalog
    from sim.inputs.profile import device_mismatch

    lines = []
    for sc, prof, prof_path in inputs.scenarios:
        mismatch = device_mismatch(prof, catalog.gpu(sc.hardware.gpu)) if prof is not None else None
        if mismatch:
            lines.append(f"{sc.name}: {prof_path}: {mismatch}")
    return sorted(set(lines))


def compute(inputs: Inputs, validation_source: str, *, grid_spec: GridSpec = DEFAULT_GRID,
            execution: Execution | None = None, progress: ReportProgress | None = None,
            only: str | None = None, moe_spec: MoeGridSpec | None = None) -> ReportData:
    """Projection, the paper check and the committed accuracy bands when no scenario is given
    (`moe_spec`: and the MoE section);
    per-run views otherwise (a serving scenario simulated as `kvsim run` does); `only="plan"`: the
    plan folder alone, nothing computed. The projection runs as `execution` says (local processes or
    Ray; with --cache, resumable)."""
    progress = progress or ReportProgress(enabled=False)
    data = ReportData(validation=inputs.validation, validation_source=validation_source, plan=inputs.plan)
    if only == "plan":
        return data
    if not inputs.scenarios:
        _projection(data, inputs, grid_spec, execution or Execution(), progress)
        if moe_spec is not None:
            _moe(data, moe_spec, execution or Execution(), progress)
        data.accuracy = load_bands()  # the committed bands: read, not recomputed
        return data
    advance = progress.step("simulating scenarios", len(inputs.scenarios))
    for sc, prof, prof_path in inputs.scenarios:
        if sc.workload.arrivals is not None:
            data.runs.append(simulate_serving(sc, prof, profile_path=prof_path))
        else:
            data.runs.append(simulate(sc, prof, profile_path=prof_path))
        advance()
    return data


def _projection(data: ReportData, inputs: Inputs, grid_spec: GridSpec, execution: Execution,
                progress: ReportProgress) -> None:
    """The projection on the workers; the access study and the paper check meanwhile, in this process."""
    check_spec(grid_spec)
    n_cells = len(cells_for(grid_spec, gpu_columns(grid_spec, inputs.profiles)))

    def studies() -> None:  # in this process while the workers compute the projection
        data.access = access_study()
        advance = progress.step("the paper, checked", PAPER_STEPS)
        data.paper = check_paper(grid_spec.models)
        advance()

    data.grid = run_grid(grid_spec, inputs.profiles, execution=execution, meanwhile=studies,
                         on_task_done=progress.step("projection (model x weights x GPU x length)", n_cells))


def _moe(data: ReportData, spec: MoeGridSpec, execution: Execution, progress: ReportProgress) -> None:
    """The MoE grid on the same workers and store, after the dense projection."""
    placements = placements_for(spec)
    n_cells = len(moe_cells(spec, placements))
    data.moe = run_moe_grid(spec, execution=execution, placements=placements,
                            on_task_done=progress.step("MoE projection (model x GPU x length)", n_cells))


def check_only(only: str | None, scenario_paths: list[Path], profile_paths: list[Path], validation_path: Path | None,
               plan_path: Path | None, execution: Execution) -> None:
    """--only names a section of ONLY_SECTIONS, and every input given is one that section draws."""
    if only is None:
        return
    if only not in ONLY_SECTIONS:
        raise ConfigError(f"expected {' or '.join(ONLY_SECTIONS)}, got {only!r}", field="--only")
    if plan_path is None:
        raise ConfigError("plan draws the folder of --plan DIR (kvsim plan --out DIR); give --plan", field="--only")
    extra = [flag for flag, given in (("scenarios", scenario_paths), ("--profile", profile_paths),
                                      ("--validation", validation_path), ("--cache", execution.cache),
                                      ("--executor", execution.executor != "local")) if given]
    if extra:
        raise ConfigError(f"plan draws the serving plan alone; drop {', '.join(extra)} (or --only)", field="--only")


def build_report(scenario_paths: list[Path], profile_paths: list[Path], validation_path: Path | None, out: Path, *,
                 overrides: list[str] | None = None, command: str = "kvsim report", grid_spec: GridSpec = DEFAULT_GRID,
                 workers: int | None = None, show_progress: bool = True, plan_path: Path | None = None,
                 execution: Execution | None = None, only: str | None = None, allow_large: bool = False,
                 moe: bool = False, moe_spec: MoeGridSpec | None = None) -> Path:
    """Check the inputs, compute, write `out`; `overrides` (`--set key=value`) apply to every scenario;
    `plan_path`: a `kvsim plan --out` folder for the "Serving plan" section; `execution`: where the
    projection runs (default: local processes, `workers` of them, no store); `only`: one of
    ONLY_SECTIONS, a page of that section alone; `allow_large`: run serving scenarios past their cost limit;
    `moe` (--moe): add the "Mixture-of-experts and hybrid models" section, of `moe_spec` (default MoeGridSpec())."""
    if overrides and not scenario_paths:
        raise ConfigError("--set applies to scenarios; the projection takes none")
    moe_spec = check_moe(moe or moe_spec is not None, moe_spec, scenario_paths, only)
    execution = (execution or Execution(workers=workers)).check()
    check_only(only, scenario_paths, profile_paths, validation_path, plan_path, execution)
    if scenario_paths and (execution.cache is not None or execution.executor != "local"):
        raise ConfigError("applies to the projection; runs of scenarios take none",
                          field="--cache" if execution.cache is not None else "--executor")
    inputs = load_inputs(scenario_paths, profile_paths, validation_path, out, overrides, plan_path, allow_large)
    for line in profile_warnings(inputs):
        print(f"kvsim: warning: {line}", file=sys.stderr)
    progress = ReportProgress(enabled=show_progress)
    with progress.running():
        data = compute(inputs, str(validation_path or ""), grid_spec=grid_spec, execution=execution, progress=progress,
                       only=only, moe_spec=moe_spec)
        advance = progress.step("writing HTML", 1)
        text = render(data, command)
        files = {}
        if data.grid is not None:  # the numbers behind the projection, for spreadsheets and scripts
            points, limits = grid_csv_paths(out)
            files[points] = csv_text(data.grid.points)
            files[limits] = csv_text(data.grid.limits)
        if data.moe is not None:
            files[moe_csv_path(out)] = csv_text(data.moe.limits)
        files[out] = text
        write_files_atomic(files)  # all renamed together: an interrupt leaves all of them or none
        advance()
    if data.grid is not None and data.grid.damaged:
        print(f"kvsim: {damaged_line(data.grid.damaged)} in {execution.cache}", file=sys.stderr)
    if data.grid is not None and execution.cache is not None:
        print(f"kvsim: projection: {data.grid.computed} cells computed, {data.grid.stored} read from {execution.cache}",
              file=sys.stderr)
    _moe_lines(data, execution)
    return out


def _moe_lines(data: ReportData, execution: Execution) -> None:
    """What --cache kept of the MoE grid, as the projection's lines say it."""
    if data.moe is None or execution.cache is None:
        return
    if data.moe.damaged:
        print(f"kvsim: {damaged_line(data.moe.damaged)} in {execution.cache}", file=sys.stderr)
    print(f"kvsim: MoE projection: {data.moe.computed} cells computed, {data.moe.stored} read from {execution.cache}",
          file=sys.stderr)


def check_moe(wanted: bool, spec: MoeGridSpec | None, scenario_paths: list[Path],
              only: str | None) -> MoeGridSpec | None:
    """--moe belongs to the projection: refused beside scenarios or --only, in one line."""
    if not wanted:
        return None
    if scenario_paths or only is not None:
        raise ConfigError("adds a section to the projection; runs of scenarios and --only take none", field="--moe")
    spec = spec or MoeGridSpec()
    check_moe_spec(spec)
    return spec


def moe_csv_path(out: Path) -> Path:
    """Where the MoE section's table goes beside the HTML: one row per model, GPU, length and policy."""
    return out.with_suffix(".moe.csv")


def grid_csv_paths(out: Path) -> tuple[Path, Path]:
    """Where the projection's tables go beside the HTML: one row per point, one per policy limit."""
    return out.with_suffix(".points.csv"), out.with_suffix(".limits.csv")
