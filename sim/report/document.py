"""What the report says, in which order: summary, contents (a page of more than one section),
projection, mixture-of-experts and hybrid models (with --moe), the paper checked, serving plan, runs
(closed batches and serving runs), validation, and in the default report kvtier's accuracy against public
measurements (the committed bands)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from sim import __version__
from sim.decode.simulate import SimResult
from sim.inputs import catalog
from sim.inputs.accuracy_bands import AccuracyBands
from sim.outputs.run_folder import serving_summary_rows, summary_rows
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.serving.run import ServingResult
from sim.studies.moe_projection import MoeResult
from sim.studies.paper_check import PaperCheck
from sim.studies.projection_grid import EVICT_RATIO, GridResult

from . import figures_moe
from . import html as h
from .accuracy_section import accuracy_section
from .figures_access import access_figure
from .figures_paper import paper_figures
from .figures_projection import dimensions, projection_figures
from .figures_run import run_figures, timeline_note
from .figures_serving import (
    TABLE_HEADERS,
    latency_figure,
    max_rate_figure,
    pareto_figure,
    plan_sentences,
    slo_text,
    table_rows,
)
from .figures_serving_run import serving_run_figures
from .figures_validation import validation_figure
from .plan_input import PlanFiles
from .summary_text import (
    access_sentences,
    moe_sentences,
    paper_sentences,
    projection_sentences,
    run_sentence,
    serving_run_sentence,
    validation_sentences,
)

TITLE = "kvtier report: tiered KV caches for reasoning LLMs"
Section = tuple[str, str, str]  # id, title, body (HTML)


@dataclass
class ReportData:
    grid: GridResult | None = None
    moe: MoeResult | None = None  # sim.studies.moe_projection (kvsim report --moe)
    access: pd.DataFrame | None = None  # sim.studies.access_strategies.access_study
    paper: PaperCheck | None = None
    runs: list[SimResult | ServingResult] = field(default_factory=list)  # a serving run: workload.arrivals
    validation: pd.DataFrame | None = None
    validation_source: str = ""
    plan: PlanFiles | None = None  # a `kvsim plan --out` folder (--plan)
    accuracy: AccuracyBands | None = None  # sim/catalog/accuracy_bands.yaml (the default report)


PLAN_EXAMPLE = ("kvsim plan scenarios/serving-h100-70b-tp4.yaml --rate 10 --ttft-p99-ms 2000 --tpot-p99-ms 50 "
                "--out runs/plan")


def _projection_section(grid: GridResult) -> Section:
    spec = grid.spec
    intro = (f"Every point is the simulator's fast projection (sim.decode.projection) of a decode of {spec.prompt_tokens} prompt tokens "
             f"plus the selected reasoning length per sequence, all sequences of the batch the same length; max batch is the "
             f"largest batch whose peak HBM fits. GPUs use datasheet figures times efficiencies fitted on measured kernel "
             f"tables where those cover the GPU (H100, H200, A100, L40S, B200; defaults elsewhere) unless marked measured. "
             f"Pick the model, weights, GPU and length above the figures; every figure follows.")
    for g in grid.gpus:
        if g.profile is not None:
            intro += (f" {g.label}: measured profile of {g.profile.machine} ({g.profile.created_utc[:10]}); what it does not "
                      f"contain comes from the {g.base_gpu} datasheet.")
    body = h.paragraph(intro) + h.controls_html(dimensions(grid))
    body += "".join(h.selectable_html(sf) for sf in projection_figures(grid))
    return "projection", "Projection: 7B-70B on one GPU", body


def _moe_intro(moe: MoeResult) -> str:
    spec = moe.spec
    lengths = " and ".join(f"{n:,}" for n in spec.lengths)
    policies = "; ".join(p.label for p in spec.policies)
    return (f"The catalog's mixture-of-experts and layer-kind models, each in one weight format (given per model "
            f"below) on the smallest tensor-parallel group of one GPU kind - of TP {', '.join(map(str, spec.tp_options))} "
            f"- that its shapes allow and that holds its weights plus one sequence of the longest chain without tiering. "
            f"{spec.prompt_tokens} prompt + {lengths} reasoning tokens per sequence, the same fast projection as above "
            f"(sim.decode.projection); memory is per GPU of the group, the batch is the group's. Policies: {policies}; "
            f"the fixed-ratio tiered policy evicts {EVICT_RATIO:.0%} of the unprotected tokens, tiered auto (hbm_ratio: "
            f"auto) moves to the host only what HBM cannot hold and evicts nothing. What binds: the host "
            f"link where H2D is busy at least {LINK_BOTTLENECK_UTILIZATION:.0%} of decode time, else the largest part "
            f"of the middle decode step. These are simulated figures on datasheet costs and AIConfigurator's measured "
            f"kernel tables where they cover the operator; nothing here was measured on these models.")


def _moe_model_html(moe: MoeResult, label: str) -> str:
    """A model's heading, its format and placement per GPU, and its table."""
    pls = [pl for pl in moe.placements if pl.model.label == label]
    m = pls[0].model
    spec = catalog.model(m.name)
    experts = f", {spec.num_experts} experts, {spec.experts_per_token} a token" if spec.is_moe else ""
    head = f"<h3>{h.esc(f'{label} ({m.name}): {spec.describe_kinds()}{experts}')}</h3>"
    groups = f" in groups of {m.weight_group_size}" if m.weight_dtype == "int4" else ""
    body = h.paragraph(f"Weights {m.formats()}{groups} ({m.why}). "
                       + " ".join(figures_moe.placement_text(pl) for pl in pls))
    rows = figures_moe.table_rows(moe, label)
    return head + body + (h.table_html(figures_moe.TABLE_HEADERS, rows) if rows else "")


def _moe_section(moe: MoeResult) -> Section:
    body = h.paragraph(_moe_intro(moe)) + "".join(h.paragraph(s) for s in moe_sentences(moe))
    body += h.controls_html(figures_moe.dimensions(moe)) + h.selectable_html(figures_moe.max_batch_figure(moe))
    body += "".join(_moe_model_html(moe, m.label) for m in moe.spec.models)
    return "moe", "Mixture-of-experts and hybrid models", body


def _access_section(table: pd.DataFrame) -> Section:
    body = h.paragraph(
        "How attention reaches the tokens in host memory decides what tiering costs. prefetch streams every T1/T2 token "
        "over the host link at every step; host_attention sends each layer's queries to the host, whose CPU attends the "
        "tokens where they live and returns a few kilobytes of partial outputs for the exact log-sum-exp merge; split "
        "prefetches the share that minimises the step - but its copies read the same host DRAM the attention streams "
        "from, so where the socket's DRAM binds it gains nothing over host_attention. Each bar: throughput of a 25%-HBM tiered cache at its own max "
        "batch over full_hbm at its max batch (fast projection, datasheet figures, default host CPU of each GPU's "
        "systems); the label names what binds. Nothing here is free: where the host CPU binds, a weaker socket (two "
        "DDR5 channels) or more concurrent sequences slow every step.")
    cols = ["model", "gpu", "access", "max_batch", "full_hbm_max_batch", "throughput_tok_per_s", "vs_full_hbm", "binds"]
    rows = [[r.model, r.gpu, r.access, r.max_batch, "-" if pd.isna(r.full_hbm_max_batch) else int(r.full_hbm_max_batch),
             "-" if pd.isna(r.throughput_tok_per_s) else f"{r.throughput_tok_per_s:,.0f}",
             "-" if pd.isna(r.vs_full_hbm) else f"{r.vs_full_hbm:.2f}x", r.binds] for r in table[cols].itertuples()]
    body += h.table_html(["model", "GPU", "access", "max batch", "full_hbm max batch", "tok/s", "vs full_hbm", "binds"], rows)
    body += "".join(h.figure_html(f"fig-access-{i}", access_figure(table, m)) for i, m in enumerate(table.model.unique()))
    return "access", "Which access strategy wins", body


def _paper_section(check: PaperCheck) -> Section:
    rows = [[r.claim, r.printed, r.paper_rule or "-", r.corrected, r.note] for r in check.rows]
    body = h.paragraph("The reference paper (arXiv 2605.09490) as printed, its arithmetic redone from this project's model "
                       "catalog with its own rule (query heads counted as KV heads), and the same scenarios computed correctly "
                       "(GQA: KV heads), with the simulator where a policy is involved.")
    body += h.table_html(["claim", "as printed", "paper's rule, recomputed", "correct (GQA / simulator)", "how"], rows)
    body += h.paragraph(check.prototype_note)
    body += "".join(h.figure_html(fid, fig) for fid, fig in paper_figures(check))
    return "paper", "The paper, checked", body


def _serving_section(pf: PlanFiles) -> Section:
    doc = pf.doc
    runs = f"{doc.requests} requests a simulation" if doc.requests else "steady-state probes"
    body = "".join(h.paragraph(t) for t in plan_sentences(pf)[:-1])  # the answer, and the fewest GPUs
    body += h.paragraph(
        f"From {pf.folder} (kvsim plan on {doc.scenario}: {doc.rate_per_s:g} req/s, {slo_text(pf)}, {runs}): every "
        f"configuration the analytic screen kept, cheapest first, was simulated at the target rate, then at the screen's "
        f"max-rate estimate and just under it, doubling or bisecting to within {doc.tolerance:.0%} (at most "
        f"{doc.max_factor:g} x the target). Circles meet the SLO, crosses miss it; latencies are one replica's (one pool's). "
        f"Costs are {doc.prices_source}" + (f", with {', '.join(doc.price_overrides)}" if doc.price_overrides else "") + ".")
    body += h.figure_html("fig-plan-pareto", pareto_figure(pf),
                          "Per GPU count: further up is cheaper per token, further right is faster per user; the dotted "
                          "line joins the configurations no other of that count beats on both.")
    body += h.figure_html("fig-plan-latency", latency_figure(pf),
                          "Pick a GPU configuration in the menu above the panels; click a legend entry to hide a trace.")
    body += h.figure_html("fig-plan-max-rate", max_rate_figure(pf),
                          "\"misses\": that configuration and policy misses the SLO already at the target rate (why: "
                          "the table). >= marks the search's cap.")
    body += h.table_html(TABLE_HEADERS, table_rows(pf))
    return "serving-plan", "Serving plan", body


def _serving_note(command: str) -> Section:
    """Where the section would be: how to add it, no figures."""
    steps = f"{PLAN_EXAMPLE}\n{command.strip()} --plan runs/plan"
    return "serving-plan", "Serving plan", (h.paragraph(
        "Not in this report: it draws the serving plan only from a folder that kvsim plan wrote (no simulation runs "
        "for it here). To add it, run these two commands (any scenario, rate and SLO):") + f"<pre>{h.esc(steps)}</pre>")


def _run_section(i: int, result: SimResult) -> Section:
    sid = f"run-{i}"
    body = h.table_html(["", ""], [list(r) for r in summary_rows(result.summary)])
    for name, fig in run_figures(result):
        caption = timeline_note(result) if name == "timeline" else ""
        body += h.figure_html(f"fig-{sid}-{name}", fig, caption)
    return sid, f"Run: {result.scenario.name}", body


def _validation_section(table: pd.DataFrame, source: str) -> Section:
    body = h.paragraph(f"From {source}: relative error = (predicted - measured) / measured. Shaded: within +-10 % and +-25 %.")
    body += h.figure_html("fig-validation", validation_figure(table))
    return "validation", "Validation: predicted against measured", body


def _serving_run_section(i: int, result: ServingResult) -> Section:
    sid = f"run-{i}"
    body = h.table_html(["", ""], [list(r) for r in serving_summary_rows(result.summary)])
    for name, fig in serving_run_figures(result):
        body += h.figure_html(f"fig-{sid}-{name}", fig, SERVING_RUN_CAPTIONS[name])
    return sid, f"Serving run: {result.scenario.name}", body


SERVING_RUN_CAPTIONS = {
    "latency": "One marker per request; TTFT includes queueing, TPOT = (E2E - TTFT) / (output tokens - 1), so one-token "
               "requests have none. Orange: requests preempted at least once. Dashed: the scenario's SLO targets.",
    "queue": "Requests the scheduler runs and those waiting to be scheduled (arrived, or preempted), after each step.",
    "memory": "Per GPU. HBM in use = weights, activations and runtime reserve (dotted) plus the K/V in HBM; the K/V of "
              "a request may use the rest up to the HBM capacity. Host: the T1/T2 tiers (and swapped K/V).",
}


def _run_sentence(result: SimResult | ServingResult) -> str:
    return serving_run_sentence(result.summary) if isinstance(result, ServingResult) else run_sentence(result.summary)


def summary_items(data: ReportData) -> list[str]:
    items: list[str] = []
    if data.grid is not None:
        items += projection_sentences(data.grid)
    if data.moe is not None:
        items += moe_sentences(data.moe)
    if data.access is not None:
        items += access_sentences(data.access)
    if data.paper is not None:
        items += paper_sentences(data.paper)
    if data.plan is not None:
        items += plan_sentences(data.plan)
    items += [_run_sentence(r) for r in data.runs]
    if data.validation is not None:
        items += validation_sentences(data.validation)
    return items


def sections(data: ReportData, command: str) -> list[Section]:
    """The page's sections in reading order."""
    out = []
    if data.grid is not None:
        out.append(_projection_section(data.grid))
    if data.moe is not None:
        out.append(_moe_section(data.moe))
    if data.access is not None:
        out.append(_access_section(data.access))
    if data.paper is not None:
        out.append(_paper_section(data.paper))
    if data.plan is not None:
        out.append(_serving_section(data.plan))
    elif data.grid is not None:
        out.append(_serving_note(command))
    for i, r in enumerate(data.runs):
        out.append(_serving_run_section(i, r) if isinstance(r, ServingResult) else _run_section(i, r))
    if data.validation is not None:
        out.append(_validation_section(data.validation, data.validation_source))
    if data.accuracy is not None:
        out.append(accuracy_section(data.accuracy))
    return out


def render(data: ReportData, command: str) -> str:
    """The summary, a table of contents when there is more than one section, then the sections."""
    parts = sections(data, command)
    body = h.summary_html(summary_items(data))
    if len(parts) > 1:
        body += h.toc_html([(sid, title) for sid, title, _ in parts])
    body += "".join(h.section(*part) for part in parts)
    return h.page(TITLE, f"kvtier {__version__} - {command}", body)
