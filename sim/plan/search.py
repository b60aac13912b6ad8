"""`kvsim plan`: the cheapest serving configurations that meet a latency SLO at a request rate.

The search thinks before it simulates:

1. Candidates (`sim.plan.candidates`): GPU kind x count x every tensor-parallel layout that divides
   the count and holds the model (and, where the GPUs lack NVLink, every tp x pp pipeline layout:
   `pipeline_layouts`) x policy; a count that cannot hold the model is pruned.
2. The screen (`sim.plan.screen`): each candidate's steady-state curve from the step cost alone,
   a fraction of a second each. One whose estimated max rate is below rate / SCREEN_MARGIN is
   `screened`: not simulated, its row says what the screen found and what binds.
3. The survivors in order - exact before lossy, then $/hour, then the screen's rate - are simulated
   (`sim.plan.evaluate`: steady-state probes), each worker taking the next as it frees, until the
   prefix of the order up to the `spec.top`-th exact pass is in (`_passes_prefix`); the rest are
   `unsearched` (spec.top 0 searches every survivor).

Passing rows rank by output (exact first), $/hour, then max rate. Prices are applied after the
simulations, so a result store (--cache) serves a rerun with another --price entirely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sim.inputs.cost import over_budget, serving_steps
from sim.inputs.errors import ConfigError
from sim.inputs.limits import MAX_PLAN_STEPS
from sim.inputs.requests import build_requests
from sim.inputs.scenario import Scenario
from sim.inputs.serving_config import PoissonArrivals
from sim.runner.options import Execution
from sim.runner.tasks import Interrupted, run_tasks
from sim.serving.steady import MIN_MEASURED

from .candidates import (
    Candidate,
    PlanSpec,
    candidate_scenario,
    check_spec,
    expert_layouts,
    feasible_splits,
    lossy,
    pipeline_layouts,
)
from .disagg import screen_disagg, splits
from .evaluate import CandidateTask, blank_row
from .files import PLAN_COLUMNS, parse_prefill_label
from .front import FRONT_MARGIN, NEAR_TIE, OFF_FRONT, USER_MARGIN, beaten_by, estimate, measured, screen_front
from .screen import Curve, curve

SCREEN_MARGIN = 1.5  # the screen overstates; one this far below the rate cannot pass (benchmarks/plan_speed.py)
IN_HBM = ("full_hbm", "evict_only")  # the policies that hold no K/V on the host
STATUS_ORDER = {"pass": 0, "fail": 1, "unsearched": 2, "screened": 3, "pruned": 4}


@dataclass
class PlanResult:
    rows: list[dict]  # PLAN_COLUMNS, ranked
    probes: list[dict]  # sim.plan.files.PROBE_COLUMNS: every probe, candidate by candidate
    computed: int = 0  # candidates searched by this run
    stored: int = 0  # candidates found in the result store
    damaged: int = 0  # entries the store held but could not verify: searched again
    screened: int = 0  # candidates the screen ruled out
    front: bool = False  # every candidate that may lie on a GPU count's Pareto front was searched


def _blank(cand: Candidate, status: str, reason: str | None) -> dict:
    """The row of a candidate that was not simulated."""
    return {**blank_row(cand), "status": status, "reason": reason, "probes": []}


def candidates(base: Scenario, gpus: list[str], counts: list[int], policies: list[str],
               layouts: bool = True, disagg: bool = True, seqs: list[int | None] | None = None,
               budgets: list[int | None] | None = None) -> tuple[list[Candidate], list[dict]]:
    """Every candidate to screen, and a pruned row for each (count, policy) that cannot hold the
    model. `layouts`: every TP x DP split of each count, and TP x PP x DP ones where the GPUs lack
    NVLink (policies that keep K/V in HBM; else tp = count only); `disagg`: also every
    split into prefill and decode instances (`sim.plan.disagg.splits`); `seqs`: the max_num_seqs
    values to try (default: the scenario's); `budgets`: the max_num_batched_tokens values (default:
    the scenario's, the candidates' token_budget None)."""
    todo, pruned = [], []
    caps = [s or base.scheduler.max_num_seqs for s in (seqs or [None])]
    settings = [(m, b) for m in caps for b in (budgets or [None])]
    for g in gpus:
        moe: dict[int, list[str | None]] = {}  # tp -> the experts' layouts it holds (`expert_layouts`)
        for n in counts:
            tps = feasible_splits(base, g, n)
            stages = pipeline_layouts(base, g, n) if layouts else []
            for p in policies:
                if p in IN_HBM:  # a pipeline's stages keep their K/V in HBM (sim.serving.pipeline)
                    todo += [Candidate(g, n, p, tp, max_num_seqs=m, token_budget=b, pp=pp) for tp, pp in stages
                             for m, b in settings]
                if isinstance(tps, str):
                    pruned.append(_blank(Candidate(g, n, p, max_num_seqs=caps[0], token_budget=settings[0][1]), "pruned", tps))
                    continue
                held = [tp for tp in tps if tp < n]  # a TP that holds the model with room for the other pool
                for m, b in settings:
                    todo += [Candidate(g, n, p, tp, max_num_seqs=m, token_budget=b, experts=e) for tp in (tps if layouts else [n])
                             for e in moe.setdefault(tp, expert_layouts(base, g, tp))]
                    if disagg:
                        todo += [Candidate(g, n, p, s.tp_d, (s.prefill, s.tp_p), m, token_budget=b) for s in splits(held, n)]
    return todo, pruned


def _screen_one(base: Scenario, c: Candidate, spec: PlanSpec, curves: dict) -> tuple[Curve, float, str] | str:
    """(curve for the probes' hints, estimated max rate, what binds) of one candidate, or why it is invalid."""
    try:
        if c.prefill:
            return screen_disagg(base, c, spec, curves)
        key = (c.gpu, c.tp_size, c.policy, c.max_num_seqs, c.token_budget, c.experts, c.pp)
        if key not in curves:
            curves[key] = curve(candidate_scenario(base, c, spec.rate / c.replicas, spec))
    except ConfigError as err:  # e.g. the scenario's other policy ratios and this hbm_ratio exceed 1
        return f"invalid: {err.line()}"
    cv = curves[key]
    per, binds = cv.max_rate(spec.ttft_s, spec.tpot_s)
    return cv, c.replicas * per, binds


def screen_all(base: Scenario, cands: list[Candidate], spec: PlanSpec) -> tuple[dict, list[dict]]:
    """{candidate: (curve, estimated max rate)} for the survivors, and rows for the rest."""
    curves: dict[tuple, object] = {}
    kept, rows = {}, []
    for c in cands:
        got = _screen_one(base, c, spec, curves)
        if isinstance(got, str):
            rows.append(_blank(c, "fail", got))
            continue
        cv, est, binds = got
        if est < spec.rate / SCREEN_MARGIN:
            why = (f"sustains about {est:.3g} req/s, under {spec.rate:g} / {SCREEN_MARGIN:g}" if est > 0 or c.prefill else
                   f"misses the targets even at batch 1 (TPOT ~{cv.tpot_p99_s[0] * 1e3:,.1f} ms, TTFT ~{cv.ttft_s[0] * 1e3:,.0f} ms)")
            row = _blank(c, "screened", f"screen: {why}; not simulated")
            rows.append({**row, "binding": binds, "screen_max_rate_per_s": float(est)})
        else:
            kept[c] = (cv, float(est))
    return kept, rows


def check_plan_cost(base: Scenario, count: int, spec: PlanSpec, *, allow: bool) -> None:
    """The simulations together within MAX_PLAN_STEPS (or allowed): each candidate that may be
    searched runs one probe at least, of at least `sim.inputs.cost.serving_steps` steps."""
    if not count:
        return
    n = spec.requests or MIN_MEASURED
    seed = getattr(base.workload.arrivals, "seed", None)
    arrivals = PoissonArrivals(kind="poisson", rate_per_s=spec.rate, requests=n, seed=seed)
    requests = build_requests(base.workload.model_copy(update={"arrivals": arrivals}))
    per_run = serving_steps(requests, base.scheduler.max_num_seqs, base.scheduler.max_num_batched_tokens)
    least = count * per_run
    if least > MAX_PLAN_STEPS:
        over_budget(f"{count:,} candidates x at least {per_run:,} simulated steps each = at least {least:,} steps, "
                    f"more than the {MAX_PLAN_STEPS:,} a plan may take", allow=allow, field="--requests")


def _order(base: Scenario, kept: dict, prices: dict) -> list[Candidate]:
    """Exact first, then $/hour, aggregated before disaggregated, then the screen's rate."""
    return sorted(kept, key=lambda c: (lossy(c.policy, base), c.count * prices[c.gpu][0], c.prefill is not None,
                                       -kept[c][1], c.gpu, c.tp_size, c.pp, c.prefill or (0, 0), c.max_num_seqs or 0,
                                       c.token_budget or 0, c.experts or ""))


def _passes_prefix(order: list[Candidate], base: Scenario, top: int) -> Callable[[list], int | None]:
    """The length of the shortest prefix of `order` whose results are all in and hold `top` exact
    passes, or None while there is none (top 0: every candidate). The search keeps that prefix
    whatever finished first, so its rows do not depend on the workers' timing."""
    exact = [not lossy(c.policy, base) for c in order]

    def prefix(results: list) -> int | None:
        passed = 0
        for n, r in enumerate(results, start=1):
            if r is None:
                return None
            passed += r["status"] == "pass" and exact[n - 1]
            if top and passed >= top:
                return n
        return len(results)

    return prefix


def _run_in_order(base: Scenario, spec: PlanSpec, order: list[Candidate], kept: dict, execution: Execution,
                  progress: Callable[[int, int], None] | None, before: int = 0,
                  top: int | None = None) -> tuple[list[dict], list[Candidate], tuple[int, int, int], dict]:
    """Simulate `order`, each worker (or Ray CPU) taking the next candidate as it frees, until the
    candidates up to spec.top exact passes are all in (`_passes_prefix`); the rows of that prefix, the
    candidates after it (unsearched, though some may have been simulated: their results are stored,
    not shown), (computed, stored, damaged), and the rows of those after it that were simulated or
    read all the same ({candidate: row}: the front search uses them rather than simulate them again).
    `before`: candidates simulated by earlier rounds, for the progress count; `top`: in place of
    spec.top (which stays part of each result's key)."""
    prefix = _passes_prefix(order, base, spec.top if top is None else top)
    finished = [before]

    def advance(n: int) -> None:
        finished[0] += n
        if progress:
            progress(finished[0], before + len(order))

    try:
        done = run_tasks([CandidateTask(base, c, spec, *kept[c]) for c in order], execution.runner(),
                         store=execution.store(), advance=advance, enough=lambda rs: prefix(rs) is not None)
    except Interrupted as err:
        raise Interrupted(err.stored, len(order)) from None
    n = prefix(done.results) if order else 0
    rows = [r and {**r, "screen_max_rate_per_s": kept[c][1]} for c, r in zip(order, done.results)]
    spare = {c: r for c, r in zip(order[n:], rows[n:]) if r is not None}
    return rows[:n], order[n:], (done.computed, done.stored_before, done.damaged), spare


def _front_rounds(base: Scenario, spec: PlanSpec, left: list[Candidate], kept: dict, simulated: list[dict],
                  execution: Execution, progress, spare: dict) -> tuple[list[dict], set[Candidate], tuple[int, int, int]]:
    """After the cheapest prefix (`simulated`), the candidates `left` that may lie on their GPU count's
    Pareto front (`sim.plan.front`), simulated in rounds: each round the ones no other remaining
    candidate beats on the screen's estimates, until every one left is simulated, beaten (by the margins)
    by a simulated pass of its count, or tied with one (`sim.plan.front.beaten_by`). (Their rows,
    simulated or not; the candidates they are; (computed, stored, damaged).)"""
    est = {c: estimate(kept[c][0], kept[c][1], spec.rate, c.replicas, not lossy(c.policy, base)) for c in kept}
    points: dict[int, list] = {}
    rows, off, done, tally = [], [], set(), (0, 0, 0)

    def add(got: list[dict]) -> None:
        for r in got:
            c = row_candidate(r)
            if (p := measured(r, not lossy(r["policy"], base))) is not None:
                points.setdefault(r["gpus"], []).append((c, p, est.get(c)))

    add(simulated)
    todo = list(left)
    while todo:
        open_ = []
        for c in todo:
            if (why := beaten_by(est[c], points.get(c.count, []), spec.max_factor * spec.rate)) is None:
                open_.append(c)
                continue
            done.add(c)
            off.append({**_blank(c, "unsearched", off_front_reason(c, est[c], *why)),
                        "screen_max_rate_per_s": kept[c][1]})
        nxt = {c for n in {c.count for c in open_}
               for c in screen_front({c: est[c] for c in open_ if c.count == n}, spec.max_factor * spec.rate)}
        order = [c for c in open_ if c in nxt]  # cheapest first, as the prefix
        if not order:
            break
        fresh = [c for c in order if c not in spare]  # (the rest were simulated after the prefix)
        got, _, counts, _ = _run_in_order(base, spec, fresh, kept, execution, progress,
                                          before=len(simulated) + len(rows), top=0)
        got += [spare[c] for c in order if c in spare]
        rows += got
        tally = tuple(a + b for a, b in zip(tally, counts))
        add(got)
        done |= nxt
        todo = [c for c in open_ if c not in nxt]
    return rows + off, done, tally


def off_front_reason(c: Candidate, e, why: str, q: Candidate, p) -> str:
    """Why a candidate was not simulated for the front (`sim.plan.front.beaten_by`)."""
    them = (f"{q.gpu} {q.layout} {q.policy} (passes with max {p.rate_per_s:.3g} req/s and "
            f"{p.tokens_per_s_per_user:,.0f} tokens/s per user)")
    mine = f"({e.rate_per_s:.3g} req/s, {e.tokens_per_s_per_user:,.0f} tokens/s per user)"
    head = f"not simulated {OFF_FRONT} of {c.count} GPUs"
    if why == "ties":
        return f"{head}: ties with {them} - the screen's estimates of both are within {NEAR_TIE:.0%} {mine}"
    return (f"{head}: off it - {them} is over {FRONT_MARGIN:g} x this one's screen estimate in max rate and "
            f"{USER_MARGIN:g} x in tokens/s per user {mine}")


def search(base: Scenario, spec: PlanSpec, gpus: list[str], counts: list[int], policies: list[str],
           prices: dict[str, tuple[float, str]], workers: int | None = None, replicas: bool = True,
           execution: Execution | None = None, allow_large: bool = False,
           progress: Callable[[int, int], None] | None = None, disagg: bool = True,
           seqs: list[int | None] | None = None, front: bool = False,
           budgets: list[int | None] | None = None) -> PlanResult:
    """Every candidate's row (PLAN_COLUMNS), ranked, and the probes behind them (module docstring).
    `replicas`: every TP x DP layout (else one TP group of each count); `disagg`: prefill/decode splits too;
    `seqs`: max_num_seqs values to search; `budgets`: max_num_batched_tokens values; `front`: after the
    cheapest prefix, every candidate that may lie on its GPU count's Pareto front (`_front_rounds`). `progress(done, total)`
    after each candidate simulated. A search past MAX_PLAN_STEPS is refused before any simulation
    unless `allow_large` (check_plan_cost)."""
    check_spec(spec)
    for g in gpus:
        if g not in prices:
            raise ConfigError(f"no price for {g} in sim/catalog/prices.yaml; give --price {g}=DOLLARS_PER_HOUR", field="--price")
    cands, rows = candidates(base, gpus, counts, policies, replicas, disagg, seqs, budgets)
    kept, screened = screen_all(base, cands, spec)
    rows += screened
    order = _order(base, kept, prices)
    check_plan_cost(base, len(order) if spec.top == 0 else min(len(order), spec.top), spec, allow=allow_large)
    execution = execution or Execution(workers=workers)
    simulated, left, (computed, stored, damaged), spare = _run_in_order(base, spec, order, kept, execution, progress)
    if front and left:
        more, done, (c2, s2, d2) = _front_rounds(base, spec, left, kept, simulated, execution, progress, spare)
        simulated, computed, stored, damaged = simulated + more, computed + c2, stored + s2, damaged + d2
        left = [c for c in left if c not in done]
    rows += simulated
    for c in left:
        rows.append({**_blank(c, "unsearched", f"not simulated: {spec.top} cheaper exact configurations pass "
                                               f"(--top 0 searches every one)"), "screen_max_rate_per_s": kept[c][1]})
    probes = [p for r in rows for p in r.pop("probes", [])]
    return PlanResult(rank(rows, base, spec, prices), probes, computed, stored, damaged, len(screened),
                      front or spec.top == 0)


def rank(rows: list[dict], base: Scenario, spec: PlanSpec, prices: dict) -> list[dict]:
    """Rows with price, layout and output filled in, ranked: passing (exact first) by $/hour then
    max rate as 1, 2, ...; then failing, unsearched, screened and pruned (rank None)."""
    tokens_per_hour = spec.rate * 3600.0 * mean_output_tokens(base)
    for r in rows:
        usd, source = prices[r["gpu"]]
        r.update(usd_per_hour=r["gpus"] * usd, price_source=source,
                 usd_per_million_tokens=r["gpus"] * usd / tokens_per_hour * 1e6 if tokens_per_hour > 0 else None,
                 layout=row_candidate(r).layout,
                 output="lossy" if lossy(r["policy"], base) else "exact")
        r.setdefault("screen_max_rate_per_s", None)
        r.setdefault("pp", 1)  # a result stored before pipeline layouts
        r.setdefault("max_num_batched_tokens", None)  # ... or before token budgets were searched
    rows.sort(key=lambda r: (STATUS_ORDER[r["status"]], r["output"] != "exact", r["usd_per_hour"], r["prefill"] is not None,
                             -(r["max_rate_per_s"] or r["screen_max_rate_per_s"] or 0.0), r["gpu"], r["gpus"], r["tp"], r["pp"],
                             r["prefill"] or "", r["max_num_seqs"] or 0, r.get("max_num_batched_tokens") or 0,
                             r["experts"] or ""))
    n = 0
    for r in rows:
        n += r["status"] == "pass"
        r["rank"] = n if r["status"] == "pass" else None
    return [{c: r[c] for c in PLAN_COLUMNS} for r in rows]


def row_candidate(r: dict) -> Candidate:
    """The candidate a plan row describes."""
    return Candidate(r["gpu"], r["gpus"], r["policy"], r["tp"], parse_prefill_label(r.get("prefill")), r.get("max_num_seqs"),
                     r.get("experts") or None, int(r.get("pp") or 1), r.get("max_num_batched_tokens") or None)


def mean_output_tokens(base: Scenario) -> float:
    out = build_requests(base.workload).output_tokens
    return float(out.mean()) if len(out) else 0.0
