"""The paper's claims beside the same scenarios computed correctly.

Sizing claims are recomputed two ways from the catalog: with the paper's rule (query heads in
place of KV heads, which reproduces its 401,408 B/token) and with GQA (KV heads). The prototype's
throughput cost is simulated with `scenarios/paper-rtx5080-7b.yaml` as the authors' code runs it,
and again with this project's design (global semantics, layerwise prefetch, pinned memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sim.decode.projection import project
from sim.decode.simulate import simulate
from sim.inputs import catalog
from sim.inputs.scenario import load_scenario, scenario_from_dict
from sim.model.spec import ModelSpec
from sim.model.units import GB, MB

from . import paper_claims as paper
from .projection_grid import DEFAULT_GRID, EVICT_RATIO

PAPER_SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "paper-rtx5080-7b.yaml"
PAPER_HBM_RATIO = 0.5  # the prototype's tiered configuration: 50% of candidates kept in HBM
SAVINGS_GPU = "h200-sxm"  # HBM saved does not depend on the GPU; one with room for every model's KV
PROJECTION_PROMPT_TOKENS = DEFAULT_GRID.prompt_tokens

# (label, scenario overrides) of the three prototype runs
PROTOTYPE_RUNS = (
    ("full_hbm (no tiering)", ["policy.kind=full_hbm"]),
    ("paper prototype: paper_prototype + sync_per_step, pageable", []),
    ("this project: global + layerwise_async, pinned", ["policy.semantics=global", "policy.prefetch=layerwise_async", "policy.pinned=true"]),
)


def paper_rule_kv_bytes_per_token(m: ModelSpec, kv_dtype: str) -> float:
    """The paper's sizing: 2 * L * H * d * bytes, counting query heads H where KV heads belong."""
    return m.kv_bytes_per_token(kv_dtype) * m.num_heads / m.num_kv_heads


@dataclass
class ClaimRow:
    claim: str
    printed: str
    paper_rule: str  # the paper's arithmetic redone from the catalog (query heads)
    corrected: str  # GQA sizing / simulator
    note: str = ""


@dataclass
class PrototypeRun:
    label: str
    throughput_tok_per_s: float | None
    transfer_share: float | None
    stall_share: float | None
    hbm_saved_bytes: float


@dataclass
class PaperCheck:
    rows: list[ClaimRow]
    kv_table: pd.DataFrame  # model, paper_rule_bytes, gqa_bytes, saved_bytes, paper_rule_saved_bytes
    prototype: list[PrototypeRun] = field(default_factory=list)
    prototype_note: str = ""
    numbers: dict = field(default_factory=dict)  # headline figures for the written summary


def _savings_bytes(model: str, kv_dtype: str) -> float:
    """HBM saved by the paper's tiered configuration at batch 8 x 4K tokens (simulator, GQA)."""
    sc = scenario_from_dict({
        "name": f"paper-savings-{model}", "model": {"name": model, "kv_dtype": kv_dtype}, "hardware": {"gpu": SAVINGS_GPU},
        "workload": {"batch_size": paper.PROJECTION_BATCH, "prompt_tokens": PROJECTION_PROMPT_TOKENS,
                     "reasoning_tokens": paper.PROJECTION_CONTEXT_TOKENS - PROJECTION_PROMPT_TOKENS},
        "policy": {"kind": "tiered", "hbm_ratio": PAPER_HBM_RATIO, "evict_ratio": EVICT_RATIO},
    }, "paper check")
    return project(sc, with_max_batch=False).hbm_saved_bytes


def kv_table(models: tuple[tuple[str, str], ...]) -> pd.DataFrame:
    rows = []
    tokens = paper.PROJECTION_BATCH * paper.PROJECTION_CONTEXT_TOKENS
    for label, name in models:
        m = catalog.model(name)
        rule, gqa = paper_rule_kv_bytes_per_token(m, paper.KV_DTYPE), m.kv_bytes_per_token(paper.KV_DTYPE)
        saved = _savings_bytes(name, paper.KV_DTYPE)
        rows.append({"model": label, "catalog": m.name, "paper_rule_bytes": rule * tokens, "gqa_bytes": gqa * tokens,
                     "saved_bytes": saved, "paper_rule_saved_bytes": saved * rule / gqa})
    return pd.DataFrame(rows)


def _gb(x: float) -> str:
    return f"{x / GB:,.1f} GB"


def claim_rows(table: pd.DataFrame) -> tuple[list[ClaimRow], dict]:
    m7 = catalog.model(paper.SHARE_CLAIMS[0][1])
    rule7, gqa7 = paper_rule_kv_bytes_per_token(m7, paper.KV_DTYPE), m7.kv_bytes_per_token(paper.KV_DTYPE)
    rows = [
        ClaimRow("KV bytes per token, 7B", f"{paper.KV_BYTES_PER_TOKEN_7B:,} B (\"~400 KB\")", f"{rule7:,.0f} B",
                 f"{gqa7:,.0f} B", f"{m7.num_heads} query heads counted; the model has {m7.num_kv_heads} KV heads "
                 f"({rule7 / gqa7:.0f}x too large)"),
        ClaimRow(f"{paper.EXAMPLE_TOKENS:,}-token chain, 7B", f"~{paper.EXAMPLE_BYTES / MB:,.0f} MB",
                 f"{paper.EXAMPLE_TOKENS * rule7 / MB:,.0f} MB", f"{paper.EXAMPLE_TOKENS * gqa7 / MB:,.0f} MB", ""),
    ]
    numbers = {"kv_ratio_7b": rule7 / gqa7, "gqa_7b": gqa7}
    tokens = paper.PROJECTION_BATCH * paper.PROJECTION_CONTEXT_TOKENS
    for label, name, wd, printed in paper.SHARE_CLAIMS:
        m = catalog.model(name)
        w = m.weight_bytes(wd)
        rule, gqa = paper_rule_kv_bytes_per_token(m, paper.KV_DTYPE) * tokens, m.kv_bytes_per_token(paper.KV_DTYPE) * tokens
        rows.append(ClaimRow(
            f"KV share at batch {paper.PROJECTION_BATCH} x {paper.PROJECTION_CONTEXT_TOKENS:,} tokens, {label} {wd}",
            f"{printed:.0%} \"of GPU memory\"", f"{rule / (rule + w):.0%} (KV {_gb(rule)})", f"{gqa / (gqa + w):.0%} (KV {_gb(gqa)})",
            f"share = KV / (weights {_gb(w)} + KV); the paper states neither its denominator nor its context "
            f"length, so this row checks a reading of the claim, not a quote"))
        numbers[f"kv_{label}"] = gqa
        numbers[f"kv_rule_{label}"] = rule
    lo, hi = paper.SAVINGS_BYTES
    span = table.model.iloc[0] if len(table) == 1 else f"{table.model.iloc[0]}-{table.model.iloc[-1]}"
    rows.append(ClaimRow(
        f"HBM saved, {span} at batch {paper.PROJECTION_BATCH} x {paper.PROJECTION_CONTEXT_TOKENS:,} tokens",
        f"{lo / GB:.0f}-{hi / GB:.0f} GB", f"{table.paper_rule_saved_bytes.min() / GB:.1f}-{table.paper_rule_saved_bytes.max() / GB:.1f} GB",
        f"{table.saved_bytes.min() / GB:.1f}-{table.saved_bytes.max() / GB:.1f} GB",
        f"simulator: tiered {PAPER_HBM_RATIO:.0%} HBM / {EVICT_RATIO:.0%} evicted, prompt {PROJECTION_PROMPT_TOKENS} tokens protected; "
        f"paper rule = the same saved fraction of a KV sized with query heads"))
    numbers.update(saved_min=table.saved_bytes.min(), saved_max=table.saved_bytes.max(), models_span=span)
    return rows, numbers


def prototype_runs(path: Path = PAPER_SCENARIO) -> list[PrototypeRun]:
    runs = []
    for label, overrides in PROTOTYPE_RUNS:
        s = simulate(load_scenario(path, overrides), with_max_batch=False).summary
        runs.append(PrototypeRun(label, s.throughput_tok_per_s, s.transfer_share, s.stall_share, s.hbm_saved_bytes))
    return runs


def link_only_cost(path: Path = PAPER_SCENARIO) -> float:
    """The prototype's simulated cost with its host-side concatenation left out (link time only)."""
    free_pack = ["hardware.efficiency.host_pack_bytes_per_s=1e30"]  # packing takes no time
    full, proto = (simulate(load_scenario(path, o + free_pack), with_max_batch=False).summary.throughput_tok_per_s
                   for _, o in PROTOTYPE_RUNS[:2])
    return 1 - proto / full


def prototype_note(runs: list[PrototypeRun], link_cost: float) -> tuple[str, dict]:
    """Plain statement of where the simulator's tiering cost differs from the paper's."""
    full, proto, ours = runs
    pack = catalog.efficiency_defaults().host_pack_bytes_per_s  # the paper scenario has no profile
    paper_cost = 1 - paper.TIERED_TOK_PER_S / paper.FULL_TOK_PER_S
    sim_cost = 1 - proto.throughput_tok_per_s / full.throughput_tok_per_s
    ours_cost = 1 - ours.throughput_tok_per_s / full.throughput_tok_per_s
    lo, hi = paper.TRANSFER_SHARE
    text = (
        f"The paper measured {paper.FULL_TOK_PER_S} -> {paper.TIERED_TOK_PER_S} tok/s, a {paper_cost:.1%} throughput cost. "
        f"The simulator, running the prototype's own policy (compounding eviction, every CPU-resident token "
        f"concatenated on the host - at an assumed {pack / GB:.0f} GB/s - and copied synchronously from pageable "
        f"memory before each step), predicts {full.throughput_tok_per_s:.1f} -> "
        f"{proto.throughput_tok_per_s:.1f} tok/s: a {sim_cost:.1%} cost, with transfers {proto.transfer_share:.1%} of "
        f"decode time (the paper says {lo:.0%}-{hi:.0%}). {_ratio_text(paper_cost, sim_cost)} Link time alone "
        f"would cost {link_cost:.1%}: the rest of the simulated cost is the concatenation, and what is left of the "
        f"measured one would be host-side work the simulator does not model (synchronisation, attention-score "
        f"bookkeeping). A measured profile of the RTX 5080 (hwprobe calibrate measures the host packing rate and "
        f"the link) would settle both. "
        f"With this project's design (global ratios, layerwise prefetch "
        f"overlapping compute, pinned memory) the same workload costs {ours_cost:.2%}.")
    return text, {"paper_cost": paper_cost, "sim_cost": sim_cost, "ours_cost": ours_cost, "link_only_cost": link_cost}


def _ratio_text(paper_cost: float, sim_cost: float) -> str:
    if sim_cost <= 0:
        return "The simulator predicts no cost at all, unlike the measurement."
    ratio = paper_cost / sim_cost
    if ratio >= 1:
        return f"The simulator's predicted cost is {ratio:.1f}x smaller than the measured one."
    return f"The simulator's predicted cost is {1 / ratio:.1f}x larger than the measured one."


def check_paper(models: tuple[tuple[str, str], ...] = DEFAULT_GRID.models, scenario_path: Path = PAPER_SCENARIO) -> PaperCheck:
    table = kv_table(models)
    rows, numbers = claim_rows(table)
    if not scenario_path.exists():
        return PaperCheck(rows, table, [], f"{scenario_path} not found: the prototype comparison is left out.", numbers)
    runs = prototype_runs(scenario_path)
    note, more = prototype_note(runs, link_only_cost(scenario_path))
    numbers.update(more)
    full, proto, _ = runs
    rows.append(ClaimRow("Prototype throughput, full cache -> tiered", f"{paper.FULL_TOK_PER_S} -> {paper.TIERED_TOK_PER_S} tok/s",
                         "", f"{full.throughput_tok_per_s:.1f} -> {proto.throughput_tok_per_s:.1f} tok/s (simulated)",
                         f"full_hbm matches by construction (the scenario's weight efficiency is fitted to {paper.FULL_TOK_PER_S} tok/s)"))
    return PaperCheck(rows, table, runs, note, numbers)
