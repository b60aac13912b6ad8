"""The written summary at the top of the report: sentences computed from the data it shows."""

from __future__ import annotations

import pandas as pd

from sim.inputs import catalog
from sim.model.units import GB, PERCENT
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION, ServingSummary, SimRunSummary
from sim.studies import paper_claims as paper
from sim.studies.moe_projection import MoeResult
from sim.studies.paper_check import PaperCheck
from sim.studies.projection_grid import GridResult, length_label

from .validation_table import BANDS

REFERENCE_TIERED = "tiered_25"  # the policy the headline numbers quote (the one saving most HBM)
REFERENCE_BATCH = 8  # batch of the HBM-saved sentence (the paper's projection batch)


def _x(r: float) -> str:
    return f"{r:.1f}x"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _capacity(wide: pd.DataFrame, grid: GridResult, ref: str, label: dict) -> str:
    both = wide[wide.full_hbm > 0]
    tiered = [p.key for p in grid.spec.policies if p.tiered and p.key in wide]
    gains = ", ".join(f"{_x((both[k] / both.full_hbm).median())} ({label[k]})" for k in tiered)
    ref_gain = both[ref] / both.full_hbm
    msg = (f"Capacity: across {len(wide)} model x weights x GPU x length configurations, tiering multiplies the largest "
           f"batch that fits by a median {gains} over full_hbm; for {label[ref]} the gain ranges "
           f"{_x(ref_gain.min())}-{_x(ref_gain.max())}")
    if "evict_only" in wide:
        msg += f". {label['evict_only']} gains only {_x((both.evict_only / both.full_hbm).median())}"
    rescued = int(((wide.full_hbm == 0) & (wide[ref] > 0)).sum())
    none = int(((wide.full_hbm == 0) & (wide[ref] == 0)).sum())
    return msg + (f". In {_n(rescued, 'configuration')} not even one sequence fits without tiering but {label[ref]} fits at "
                  f"least one; in {none} nothing fits either way (the weights alone, or the weights plus one sequence's "
                  f"protected KV, exceed the GPU).")


def _throughput(pts: pd.DataFrame, grid: GridResult, label: dict) -> str | None:
    """Each policy at its own best batch (up to its wall) against full_hbm at its best."""
    keys = ["model", "weights", "gpu", "length"]
    peak = pts[pts.fits].groupby(keys + ["policy"]).throughput_tok_per_s.max().unstack("policy")
    tiered = [p.key for p in grid.spec.policies if p.tiered and p.key in peak]
    peak = peak.dropna(subset=["full_hbm", *tiered])
    if peak.empty:
        return None
    parts = ", ".join(f"{(peak[k] / peak.full_hbm).median():.0%} ({label[k]}, higher than full_hbm in "
                      f"{int((peak[k] > peak.full_hbm).sum())})" for k in tiered)
    return (f"Throughput: each policy run at its own largest batch reaches a median {parts} of full_hbm's peak decode "
            f"throughput, over {_n(len(peak), 'configuration')} where all of them fit: more sequences fit, but every step "
            f"streams the host-resident KV over the link, which is far slower than HBM.")


def _link(lim: pd.DataFrame, grid: GridResult, ref: str, label: dict) -> str | None:
    tiered = [p.key for p in grid.spec.policies if p.tiered]
    rows = lim[lim.policy.isin(tiered) & (lim.max_batch > 0)]
    if rows.empty:
        return None
    bound = rows[rows.link_bound_batch.notna()]
    msg = (f"Host link: the host-to-device link is the bottleneck (busy >= {LINK_BOTTLENECK_UTILIZATION:.0%} of decode time) "
           f"before the OOM wall in {len(bound)} of {_n(len(rows), 'tiered configuration')} that fit")
    ref_rows = bound[bound.policy == ref].copy()
    if len(ref_rows):
        gpu_base = {g.key: g.base_gpu for g in grid.gpus}
        ref_rows["link"] = ref_rows.gpu.map(lambda g: catalog.gpu(gpu_base[g]).link)
        per_link = ref_rows.groupby("link").link_bound_batch.median()
        msg += f"; for {label[ref]} the median link-bound batch is " + ", ".join(f"{v:g} on {k}" for k, v in per_link.items())
    return msg + "."


def _saved(pts: pd.DataFrame, grid: GridResult, ref: str, label: dict) -> str | None:
    longest = length_label(max(grid.spec.lengths))
    s = pts[(pts.policy == ref) & (pts.batch == REFERENCE_BATCH) & (pts.gpu == grid.gpus[0].key) & (pts.length == longest)]
    if s.empty:
        return None
    lo, hi = s.loc[s.hbm_saved_bytes.idxmin()], s.loc[s.hbm_saved_bytes.idxmax()]
    return (f"HBM saved at batch {REFERENCE_BATCH} x {longest} reasoning tokens by {label[ref]}: from "
            f"{lo.hbm_saved_bytes / GB:.1f} GB ({lo.model} {lo.weights}) to {hi.hbm_saved_bytes / GB:.1f} GB "
            f"({hi.model} {hi.weights}). GQA keeps the KV small, so tiering buys most for long reasoning at large batches.")


def projection_sentences(grid: GridResult) -> list[str]:
    label = {p.key: p.label for p in grid.spec.policies}
    keys = ["model", "weights", "gpu", "length"]
    wide = grid.limits.pivot_table(index=keys, columns="policy", values="max_batch").reset_index()
    ref = REFERENCE_TIERED if REFERENCE_TIERED in wide else next((p.key for p in grid.spec.policies if p.tiered), None)
    out: list[str | None] = []
    if ref and "full_hbm" in wide:
        out += [_capacity(wide, grid, ref, label), _throughput(grid.points, grid, label)]
    if ref:
        out += [_link(grid.limits, grid, ref, label), _saved(grid.points, grid, ref, label)]
    return [o for o in out if o]


def _no_minus_zero(text: str, fmt: str) -> str:
    """'-0.0' (a small negative number, rounded) prints as '0.0'."""
    return text.lstrip("-") if text.lstrip("-") == format(0.0, fmt) else text


def _span(values: pd.Series, fmt: str, unit: str = "") -> str:
    """'1.4-1.9' (+ unit) over `values` ('-2 to 3' where it starts below zero), or one number where
    both ends print the same."""
    lo, hi = (_no_minus_zero(format(v, fmt), fmt) for v in (values.min(), values.max()))
    return (lo if lo == hi else f"{lo} to {hi}" if lo.startswith("-") else f"{lo}-{hi}") + unit


def _moe_capacity(moe: MoeResult, label: dict) -> str:
    lim = moe.limits
    keys = ["model", "gpu", "length"]
    wide = lim.pivot_table(index=keys, columns="policy", values="max_batch").reset_index()
    both = wide[wide.full_hbm > 0]
    tiered = [p.key for p in moe.spec.policies if p.tiered and p.key in wide]
    gains = " and ".join(f"{_span(both[k] / both.full_hbm, '.1f')}x ({label[k]})" for k in tiered)
    gpus = ", ".join(catalog.gpu(g).name for g in lim.gpu.unique())
    msg = (f"Mixture-of-experts and hybrid models ({_n(lim.model.nunique(), 'model')} on {gpus}; "
           f"{', '.join(lim.length.unique())} reasoning tokens): tiering fits {gains} the sequences full_hbm fits")
    full = lim[(lim.policy == "full_hbm") & (lim.max_batch > 0)].set_index(keys).at_max_throughput_tok_per_s
    same = []
    for key in tiered:
        rows = lim[lim.policy == key].dropna(subset=["at_full_max_hbm_saved_bytes"]).join(full.rename("full"), on=keys)
        if len(rows):
            speed = rows.at_full_max_throughput_tok_per_s / rows.full * PERCENT
            saved = _span(rows.at_full_max_hbm_saved_bytes / GB, ".1f", " GB")
            same.append(f"{label[key]} frees {saved} of HBM per GPU and decodes at {_span(speed, '.0f', '%')} of "
                        f"full_hbm's speed")
    return msg + (f"; at full_hbm's own max batch {', '.join(same)}." if same else ".")


def _moe_link(moe: MoeResult, label: dict) -> str:
    lim = moe.limits
    keys = ["model", "gpu", "length"]
    fit = lim[(lim.policy != "full_hbm") & (lim.max_batch > 0)]
    bound = fit[fit.link_bound_batch.notna()]
    spans = ", ".join(f"{label[k]} from batch {_span(b.link_bound_batch, ',.0f')}"
                      for k, b in bound.groupby("policy", sort=False))
    full = lim[(lim.policy == "full_hbm") & (lim.max_batch > 0)]
    slower = fit.join(full.set_index(keys).at_max_throughput_tok_per_s.rename("full"), on=keys)
    slower = int((slower.at_max_throughput_tok_per_s < slower.full).sum())
    words = [f"{w} in {c}" for w, c in full.binds.str.split(",").str[0].value_counts().items()]
    return (f"The host link binds: {len(bound)} of {_n(len(fit), 'tiered configuration')} reach "
            f"{LINK_BOTTLENECK_UTILIZATION:.0%} H2D busy before their max batch ({spans}), and {slower} of them decode "
            f"slower at their own max batch than full_hbm at its own. full_hbm at its max batch is bound by "
            f"{', '.join(words[:-1]) + ' and ' if len(words) > 1 else ''}{words[-1]} of {len(full)}.")


def moe_sentences(moe: MoeResult) -> list[str]:
    """The MoE section in two sentences: capacity and what tiering saves and costs at full_hbm's max
    batch; then where the host link binds, and what binds full_hbm."""
    if moe.limits.empty:
        return []
    label = {p.key: p.label for p in moe.spec.policies}
    return [_moe_capacity(moe, label), _moe_link(moe, label)]


def paper_sentences(check: PaperCheck) -> list[str]:
    n = check.numbers
    out = [(f"The paper, checked: its KV sizing counts query heads, {n['kv_ratio_7b']:.0f}x too much for the 7B "
           f"({n['gqa_7b']:,.0f} B/token, not {paper.KV_BYTES_PER_TOKEN_7B:,}). With GQA the HBM saved at batch "
           f"{paper.PROJECTION_BATCH} x {paper.PROJECTION_CONTEXT_TOKENS:,} tokens is "
           f"{n['saved_min'] / GB:.1f}-{n['saved_max'] / GB:.1f} GB for {n['models_span']}, not "
           f"{paper.SAVINGS_BYTES[0] / GB:.0f}-{paper.SAVINGS_BYTES[1] / GB:.0f} GB.")]
    if "sim_cost" in n:
        ours = n["ours_cost"]
        ours_text = (f"{ours:.2%} with layerwise prefetch from pinned memory" if ours >= 0 else
                     f"no cost with layerwise prefetch from pinned memory ({-ours:.2%} faster than the full cache: "
                     f"the copies hide behind compute and the evicted tokens are no longer read)")
        out.append(f"The prototype's tiering cost: the paper measured {n['paper_cost']:.1%}, the simulator predicts "
                   f"{n['sim_cost']:.1%} for the prototype's own policy and {ours_text}.")
    return out


def run_sentence(s: SimRunSummary) -> str:
    head = f"{s.scenario}: {s.model} on {s.gpu}, batch {s.batch_size}, {s.policy}"
    if not s.fits:
        return (f"{head} does not fit: needs {s.hbm_peak_bytes / GB:.1f} GB HBM, has {s.hbm_capacity_bytes / GB:.0f} GB "
                f"(max batch {s.max_batch}).")
    txt = (f"{head}: {s.throughput_tok_per_s:,.1f} tok/s, HBM peak {s.hbm_peak_bytes / GB:.1f} of "
           f"{s.hbm_capacity_bytes / GB:.0f} GB (saves {s.hbm_saved_bytes / GB:.2f} GB), H2D busy "
           f"{s.h2d_utilization:.0%}, stalls {s.stall_share:.1%} of decode time, max batch {s.max_batch}")
    return txt + (" - the host link is the bottleneck." if s.link_bottleneck else ".")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:,.1f} ms"


def serving_run_sentence(s: ServingSummary) -> str:
    """A serving run in one sentence: its load and length, throughput, p50/p99 TTFT and TPOT, preemptions."""
    where = s.gpu if s.tp == 1 else f"{s.tp} x {s.gpu}"
    head = f"{s.scenario}: {s.model} on {where}, {s.policy}, {s.requests:,} requests"
    if s.offered_rate_per_s is not None:
        head += f" at {s.offered_rate_per_s:g} req/s"
    if not s.fits:
        return f"{head} does not fit: {s.does_not_fit}."
    txt = (f"{head}: the run takes {s.duration_s:,.1f} s, {s.request_throughput_per_s:,.2f} req/s and "
           f"{s.output_throughput_tok_per_s:,.0f} output tok/s; TTFT p50 {_ms(s.ttft_p50_s)}, p99 {_ms(s.ttft_p99_s)}; "
           f"TPOT p50 {_ms(s.tpot_p50_s)}, p99 {_ms(s.tpot_p99_s)}; {s.preemptions:,} preemption"
           f"{'' if s.preemptions == 1 else 's'}")
    if s.goodput_req_per_s is not None:
        txt += f"; goodput {s.goodput_req_per_s:,.2f} req/s within the SLO"
    return txt + "."


def validation_sentences(table: pd.DataFrame) -> list[str]:
    d = table.dropna(subset=["rel_error"])
    if d.empty:
        return ["Validation: no row has a defined relative error."]
    parts = []
    for metric, g in d.groupby("metric", sort=False):
        err = g.rel_error.abs()
        within = ", ".join(f"{(err <= b).mean():.0%} within +-{b:.0%}" for b in BANDS)
        parts.append(f"{metric}: median |error| {err.median():.1%} over {len(g)} scenario(s), {within}")
    return ["Validation (predicted against measured): " + "; ".join(parts) + "."]


def access_sentences(table) -> list[str]:
    """Which access strategy wins, in one sentence per model, from the access study's table."""
    out = []
    for model, t in table.groupby("model", sort=False):
        fits = t.dropna(subset=["vs_full_hbm"])
        if fits.empty:
            continue
        best = fits.loc[fits.groupby("gpu", sort=False)["vs_full_hbm"].idxmax()]
        wins = ", ".join(f"{r.gpu} {r.access} {r.vs_full_hbm:.2f}x (prefetch "
                         f"{fits[(fits.gpu == r.gpu) & (fits.access == 'prefetch')].vs_full_hbm.iloc[0]:.2f}x)"
                         for r in best.itertuples())
        host_bound = int((fits.binds.str.contains("host CPU")).sum())
        prefetch = fits[fits.access == "prefetch"]
        link_bound = int(prefetch.binds.str.contains("host link").sum())
        out.append(f"Access strategies, {model} (25%-HBM tiered at max batch over full_hbm at its own): {wins}. "
                   f"The host CPU binds in {host_bound} of {len(fits)} strategy x GPU cases; prefetch is host-link-bound "
                   f"on {link_bound} of {len(prefetch)} GPUs.")
    return out
