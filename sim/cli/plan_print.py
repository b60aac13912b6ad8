"""What `kvsim plan` prints: the answer sentence, the launch commands, the accuracy bands of its TPOT
and TTFT (sim/catalog/accuracy_bands.yaml), the top rows (every row with --all), the Pareto front
per GPU count, and what the search assumed; plus plan.json's document."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

TOP_ROWS = 5
# how the replicas of a data-parallel layout share the rate (`PlanSpec.balancer`, sim/serving/fleet.py)
SHARE = {"round-robin": "evenly (round-robin: each replica simulated alone on every k-th arrival)",
         "least-outstanding": "least-outstanding (each arrival to the replica with the fewest in it; the replicas "
                              "simulated together)",
         "vllm": "as vLLM's data-parallel balancer (each arrival to the replica with the lowest 4 x waiting + running; "
                 "the replicas simulated together)"}


def _ms(v, end: str | None = None, target_ms: float | None = None) -> str:
    if v is None:
        return f"> {target_ms:,.0f} ms" if end and target_ms else "-"
    return f"{v:,.0f} ms"


def _rate(r: dict) -> str:
    if r["max_rate_per_s"] is None:
        est = r.get("screen_max_rate_per_s")
        return f"~{est:.3g}/s (screen)" if est is not None else "-"
    return (">=" if r["max_rate_capped"] else "") + f"{r['max_rate_per_s']:.3g}/s"


def _latency(r: dict, metric: str, spec) -> str:
    """A failing row whose probe stopped at its verdict has no p99: it is past the target (or the run)."""
    v = r[f"{metric}_p99_ms"]
    if v is not None or r["status"] != "fail":
        return _ms(v)
    target = (spec.ttft_s if metric == "ttft" else spec.tpot_s)
    reason = r["reason"] or ""
    if "overloaded" in reason:
        return "> run"
    if f"p99 {metric.upper()} >" in reason and target:
        return f"> {target * 1e3:,.0f} ms"
    return "-"


def plan_table(rows: list[dict], spec, title: str, reasons: bool) -> Table:
    """The rows as a table; `reasons`: with the "why not" column (failing rows are shown)."""
    t = Table(title=title)
    budgets = any(r.get("max_num_batched_tokens") for r in rows)  # a column only where budgets were searched
    cols = ["#", "GPUs", "layout", "seqs"] + (["tokens"] if budgets else []) + [
        "policy", "output", "$/h", "$/M tok", "TTFT p99", "TPOT p99", "max rate", "binding"]
    for col in cols + (["why not"] if reasons else []):
        t.add_column(col, justify="left" if col in ("GPUs", "layout", "policy", "output", "binding", "why not") else "right")
    for r in rows:
        per_m = "-" if r["usd_per_million_tokens"] is None else f"{r['usd_per_million_tokens']:.2f}"
        cells = [str(r["rank"] or ""), f"{r['gpus']} x {r['gpu']}", r["layout"], str(r["max_num_seqs"] or "")] + (
                 [str(r.get("max_num_batched_tokens") or "")] if budgets else []) + [r["policy"], r["output"],
                 f"{r['usd_per_hour']:.2f}", per_m, _latency(r, "ttft", spec), _latency(r, "tpot", spec), _rate(r),
                 r["binding"] or ""]
        t.add_row(*cells, *([r["reason"] or ""] if reasons else []), style=None if r["status"] == "pass" else "dim")
    return t


def band_lines(rows: list[dict], sc) -> list[str]:
    """Under the answer (after its launch commands): the public measurements' band of its TPOT
    (served-itl) and TTFT (served-ttft), for the answer's row (the best, else the cheapest tried) in the
    mode its GPU runs in, with the band of the workload's shape (docs/accuracy.md)."""
    from sim.inputs.accuracy_bands import SERVED_ITL, SERVED_TTFT, band_phrase, planned_mode, workload_shape
    from sim.plan.screen import moments

    row = next((r for r in rows if r["rank"] == 1), None)
    if row is None:
        row = min((r for r in rows if r["status"] == "fail"), key=lambda r: r["usd_per_hour"], default=None)
    if row is None:
        return []
    mode = planned_mode(sc.hardware.kernels, row["gpu"])
    m = moments(sc)
    shape = workload_shape(m.prompt_tokens, m.output_tokens)
    return [f"  {what} {band_phrase(family, mode, row['gpu'], model=sc.model.name, shape=shape)}"
            for what, family in (("TPOT", SERVED_ITL), ("TTFT", SERVED_TTFT))]


def print_plan(console: Console, result, sc, spec, all_rows: bool, wall_s: float, out: Path | None) -> None:
    """The answer first, then the launch commands, the fewest GPUs, the accuracy bands, the table and the Pareto front."""
    from sim.plan.answer import answer_sentence, budget_label, engine_phrase, fewest_sentence, launch_lines, pareto
    from sim.plan.front import OFF_FRONT
    from sim.plan.search import mean_output_tokens

    rows = result.rows
    console.print(answer_sentence(rows, spec.rate, spec.requests, engine_phrase(sc.engine)), soft_wrap=True)
    best = next((r for r in rows if r["rank"] == 1), None)
    if best is not None:
        for engine, line in launch_lines(best, sc, best.get("host_peak_bytes"), spec.balancer).items():
            console.print(f"  {engine}: {line}", soft_wrap=True, markup=False, highlight=False)
    if (fewest := fewest_sentence(rows, spec.rate, result.front)) is not None:
        console.print(fewest, soft_wrap=True, highlight=False)
    for line in band_lines(rows, sc):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    slo = " and ".join(t for t in (f"p99 TTFT <= {spec.ttft_s * 1e3:g} ms" if spec.ttft_s else "",
                                   f"p99 TPOT <= {spec.tpot_s * 1e3:g} ms" if spec.tpot_s else "") if t)
    runs = f"{spec.requests} requests a run" if spec.requests else "steady-state probes"
    shown = rows if all_rows else [r for r in rows if r["status"] == "pass"][:TOP_ROWS]
    console.print(plan_table(shown, spec, f"{sc.model.name or 'model'}: {spec.rate:g} req/s, {slo} ({runs})", all_rows))
    front = pareto(rows, mean_output_tokens(sc))
    if front:
        whole = ("every configuration that may lie on it simulated" if result.front else
                 "over the configurations simulated: the cheapest; --pareto searches the whole front")
        console.print(f"Pareto per GPU count (output tokens/s per GPU at the max rate vs tokens/s per user at the rate; "
                      f"{whole}):", soft_wrap=True)
        for n, points in front.items():
            text = "; ".join(f"{p['layout']} {p['gpu']} {p['policy']}{budget_label(p)}: {p['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, "
                             f"{p['tokens_per_s_per_user']:,.0f} tok/s/user" for p in points)
            console.print(f"  {n} GPUs: {text}", soft_wrap=True, highlight=False)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("pass", "fail", "unsearched", "screened", "pruned")}
    off = sum(r["status"] == "unsearched" and OFF_FRONT in (r["reason"] or "") for r in rows)
    skipped = f"{counts['unsearched'] - off} not simulated (cheaper ones pass), " if counts["unsearched"] > off else ""
    skipped += f"{off} not simulated for the Pareto front (beaten by or tied with a simulated one), " if off else ""
    console.print(f"[dim]{counts['pass']} pass, {counts['fail']} fail, {skipped}"
                  f"{counts['screened']} ruled out by the screen, {counts['pruned']} cannot hold the model"
                  f"{'' if all_rows else ' (--all lists every row)'}; prices are assumptions (sim/catalog/prices.yaml, "
                  f"--price GPU=$/h); replicas share the rate {SHARE[spec.balancer]}; {wall_s:.0f} s[/dim]")
    if out is not None:
        console.print(f"[dim]wrote {out}/ (plan.csv, probes.csv: {len(result.probes)} probes, plan.json); "
                      f"kvsim report --plan {out} --only plan draws them[/dim]")


def plan_doc(path: Path, sc, spec, gpus: list[str], counts: list[int], policies: list[str], layouts: tuple[bool, bool, bool],
             price_overrides: list[str], seqs: list[int | None], budgets: list[int | None] = (None,)):
    """plan.json: what `kvsim plan` was asked (sim.plan.files.PlanDoc)."""
    from sim import __version__
    from sim.plan.answer import engine_phrase
    from sim.plan.files import PlanDoc

    ms = lambda s: None if s is None else s * 1e3  # noqa: E731
    return PlanDoc(scenario=sc.name, scenario_path=str(path), model=sc.model.name or str(sc.model.hf_config), rate_per_s=spec.rate,
                   ttft_p99_ms=ms(spec.ttft_s), tpot_p99_ms=ms(spec.tpot_s), requests=spec.requests,
                   max_factor=spec.max_factor, tolerance=spec.tolerance, top=spec.top, gpus=gpus, counts=counts,
                   policies=policies, replicas=layouts[0], disagg=layouts[1], pareto=layouts[2],
                   max_num_seqs=[s or sc.scheduler.max_num_seqs for s in seqs],
                   max_num_batched_tokens=[b for b in budgets if b],
                   prices_source="sim/catalog/prices.yaml (assumed on-demand list prices, not quotes)",
                   price_overrides=list(price_overrides), kvtier_version=__version__,
                   engine=engine_phrase(sc.engine))
