"""The planner's analytic screen: what one replica sustains in steady state, from the step cost alone.

No simulation. In steady state at a rate of lambda requests/s per replica, Little's law ties the
decoding batch B to the step time t(B): B = lambda x N x t(B) (each request decodes for its N output
tokens, one a step), so a batch of B is what the rate lambda(B) = B / (N x t(B)) implies. The screen
evaluates t(B) on a grid of batches, each step as the scheduler forms it in the mean:

- B decodes, each at the mean context of a running request, E[n (p + n/2)] / E[n] tokens (a request
  seen at a random moment of its decode is length-biased), in tiers with the shares the policy gives
  a running request, weighted by step as the context is (`tier_shares`, `TierCounter`);
- the prefill that keeps pace, c = B x P / N prompt tokens a step, as whole chunks: a share c / chunk of
  the steps carries one chunk of min(P, max_num_batched_tokens - B) tokens (a mixed step costs more
  than the mean rows would: a GEMM is flat in rows below its ridge);
- without mixed prefill (SGLang's order) each chunk runs in a step of its own, min(P, max_num_batched_tokens)
  tokens, and stalls the decodes: t(B) is the decode step plus the chunk steps between two of them
  (`token_times`);
- t(B) is that mixture's mean `mixed_step_cost(...).closed_form_s` (the link to itself); the p99
  TPOT estimate is a short request's (10th percentile of outputs) whose share of mixed steps sits at
  its binomial 99th percentile (normal approximation).

The batch is capped by what holds it: HBM for B requests' K/V at the mean context (`KvMemory`; under
scheduler admission no_evict each holds its whole length, E[n (p + n)] / E[n] tokens, reserved), host
memory for their T1/T2 (under reserve_ratio, SGLang's, each also keeps its steady-state floor ratio
of its remaining output free), `max_num_seqs`, and `max_num_batched_tokens` (B + c tokens a step). The
estimates: TPOT ~ t(B) (the p99 as above), TTFT ~ the steps a prompt's chunks take, E2E = TTFT + N x TPOT. The max rate
is the highest lambda(B) whose estimates meet the targets; what stops it is the binding resource.
The screen ignores queueing and the spread of lengths, so it overstates what a probe finds; the
search uses it to order, bracket and prune (with a margin), never as a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np

from sim.decode.context import build_context
from sim.device.engine_rules import host_loop_s
from sim.device.physics import mixed_step_cost, pipeline_send_s, pipeline_stage_s, with_prefill
from sim.inputs import catalog
from sim.inputs.requests import build_requests
from sim.inputs.scenario import Scenario, WorkloadCfg
from sim.model.layers import chunk_attended
from sim.serving.kv_memory import engine_scheduler, kv_memory
from sim.serving.new_token_ratio import CLIP_NEW_TOKENS, NewTokenRatio
from sim.serving.tier_counts import TierCounter
from sim.tiering.tiers import T0, T1, T2

MOMENT_SAMPLES = 4096  # requests drawn for the mean prompt, output and running context
SHARE_SAMPLES = 64  # of them, those whose decode steps give the tier shares (`tier_shares`)
SHARE_STEPS = 128  # steps of each, evenly spaced (a long output would be millions of rows)
GRID = 28  # batches from 1 to the cap, log-spaced
Z99 = 2.326  # the standard normal's 99th percentile
ALLREDUCE_BINDS = 0.3  # all-reduces this share of a step: the interconnect binds


@dataclass(frozen=True)
class Curve:
    """One replica's steady states by batch: batch, rate (req/s), step (TPOT) and TTFT estimates."""

    batch: tuple[float, ...]
    rate_per_s: tuple[float, ...]
    step_s: tuple[float, ...]  # mean step: TPOT of the mean request
    tpot_p99_s: tuple[float, ...]  # a short request's TPOT when it meets more than its share of mixed steps
    ttft_s: tuple[float, ...]
    output_tokens: float  # mean
    cap: str  # what caps the batch: "HBM capacity", "host memory", "scheduler: max_num_seqs=256", ...
    hbm_batch: float  # the batch HBM holds at the mean context
    step_binds: tuple[str, ...]  # the resource a step at each batch spends most on

    def at(self, rate_per_s: float) -> tuple[float, float, float] | None:
        """(TTFT, TPOT, E2E) estimates at one replica's rate, None past the cap (overloaded)."""
        where = self._where(rate_per_s)
        if where is None:
            return None
        ttft, tpot = self._between(self.ttft_s, *where), self._between(self.step_s, *where)
        return ttft, tpot, ttft + self.output_tokens * tpot

    def tpot_p99_at(self, rate_per_s: float) -> float | None:
        """The p99 TPOT estimate at one replica's rate, None past the cap."""
        where = self._where(rate_per_s)
        return None if where is None else self._between(self.tpot_p99_s, *where)

    def _where(self, rate_per_s: float) -> tuple[int, float] | None:
        """(k, w): the rate lies w of the way from batch k - 1 to batch k (k = 0: at or below the
        first); None past the cap."""
        r = np.asarray(self.rate_per_s)
        if rate_per_s > r.max():
            return None
        k = int(np.argmax(r >= rate_per_s))
        if k == 0:
            return 0, 0.0
        return k, (rate_per_s - r[k - 1]) / (r[k] - r[k - 1]) if r[k] > r[k - 1] else 1.0

    @staticmethod
    def _between(values: tuple[float, ...], k: int, w: float) -> float:
        return values[0] if k == 0 else values[k - 1] + w * (values[k] - values[k - 1])

    def max_rate(self, ttft_s: float | None, tpot_s: float | None) -> tuple[float, str]:
        """The highest rate whose estimates meet the targets, and what stops it there."""
        ok = np.ones(len(self.batch), dtype=bool)
        if tpot_s is not None:
            ok &= np.asarray(self.tpot_p99_s) <= tpot_s
        if ttft_s is not None:
            ok &= np.asarray(self.ttft_s) <= ttft_s
        # the rate rises with the batch until the cap; the first batch past a target ends the range
        bad = np.flatnonzero(~ok)
        last = (bad[0] - 1) if len(bad) else len(self.batch) - 1
        if last < 0:
            return 0.0, self.step_binds[0]
        best = int(np.argmax(np.asarray(self.rate_per_s[: last + 1])))
        if best == len(self.batch) - 1 and not len(bad):
            return self.rate_per_s[best], self.cap
        return self.rate_per_s[best], self.step_binds[min(best + 1, len(self.batch) - 1)]


@dataclass(frozen=True)
class Moments:
    prompt_tokens: float  # means
    output_tokens: float
    running_context_tokens: float  # E[n (p + n/2)] / E[n]
    short_output_tokens: float  # the 10th percentile: the requests whose TPOT varies most
    reserved_tokens: float = 0.0  # E[n (p + n)] / E[n]: what no_evict admission holds per running request
    sample: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # SHARE_SAMPLES (prompt, output) draws for tier_shares


def moments(scenario: Scenario) -> Moments:
    """The lengths' moments over MOMENT_SAMPLES draws of the workload (a trace: its requests), whatever
    number of requests the scenario's arrivals ask for (a planner's candidate scenario asks for one).
    The lengths do not depend on the arrival rate (their own seed stream), so every candidate of a
    plan shares one computation."""
    work, a = scenario.workload, scenario.workload.arrivals
    if getattr(a, "requests", None) is not None and not getattr(a, "path", None):
        update = {"requests": MOMENT_SAMPLES} | ({"rate_per_s": 1.0} if hasattr(a, "rate_per_s") else {})
        work = work.model_copy(update={"arrivals": a.model_copy(update=update)})
    return _moments(work.model_dump_json())


@lru_cache(maxsize=64)
def _moments(workload_json: str) -> Moments:
    reqs = build_requests(WorkloadCfg.model_validate_json(workload_json))
    p, n = reqs.prompt_tokens.astype(float), np.maximum(reqs.output_tokens.astype(float), 1.0)
    sample = (tuple(int(x) for x in p[:SHARE_SAMPLES]), tuple(int(x) for x in n[:SHARE_SAMPLES]))
    return Moments(float(p.mean()), float(n.mean()), float(np.sum(n * (p + n / 2)) / np.sum(n)),
                   float(max(2.0, np.percentile(n, 10))), float(np.sum(n * (p + n)) / np.sum(n)), sample)


def tier_shares(policy, m: Moments) -> np.ndarray:
    """Shares of a running request's context in T0, T1, T2, as a step sees its batch: the tokens
    attended at the decode steps of the sampled requests (up to SHARE_STEPS a request, each weighted
    by the steps it stands for), summed, over all their tokens (T3's too). Weighting by step is what a steady-state batch does (a request is in it one step per output token, so long
    ones count for more), as `Moments.running_context_tokens` is; the host share grows faster than
    the context, so the mean request's shares understate it (a 70B tiered:0.25 on 8 B200s: T1 8.6%
    of the context by the mean request, 19.2% by step; the screen's link time had been hidden where
    the simulation's link bound)."""
    key = (repr(policy), m)  # every candidate of a plan with this policy asks the same
    if key not in _SHARES:
        if len(_SHARES) >= 256:  # a long-lived process's plans: keep it bounded
            _SHARES.clear()
        _SHARES[key] = _step_weighted_shares(policy, m)
    return _SHARES[key].copy()


_SHARES: dict = {}


def _sampled_steps(policy, m: Moments) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prompt, decode step, weight, tier counts attended) at up to SHARE_STEPS evenly spaced steps of each
    sampled request, each weighted by the steps it stands for (n / points)."""
    prompts, outputs = (np.asarray(x, dtype=np.int64) for x in m.sample)
    if not len(prompts):  # no sample: the mean request alone
        prompts = np.array([max(1, round(m.prompt_tokens))])
        outputs = np.array([max(1, round(m.output_tokens))])
    outputs = np.maximum(outputs, 1)
    steps = [np.unique(np.linspace(0, k - 1, min(int(k), SHARE_STEPS)).astype(np.int64)) for k in outputs]
    weights = np.concatenate([np.full(len(st), k / len(st)) for st, k in zip(steps, outputs)])
    at, step = np.repeat(prompts, [len(st) for st in steps]), np.concatenate(steps)
    return at, step, weights, TierCounter(policy, prompts, outputs).attended(at, step)


def _step_weighted_shares(policy, m: Moments) -> np.ndarray:
    _, _, weights, counts = _sampled_steps(policy, m)
    counts = counts * weights[:, None]
    return counts[:, [T0, T1, T2]].sum(axis=0) / max(float(counts.sum()), 1.0)  # of every token, deleted ones too


def chunked_step_figures(ctx, policy, m: Moments) -> tuple[tuple[float, float] | None, float | None]:
    """What a step's chunked layers take, over the same step-weighted sample as `tier_shares`: (the shares
    of its T1 and T2 the mean layer stages, `RunContext.staged_tokens`; the tokens a running request's
    chunked layers attend, its current chunk's ((n - 1) mod C) + 1, `layers.chunk_attended`). (None, None)
    without chunked layers."""
    if not ctx.model.chunked_tier_share:
        return None, None
    prompt, step, weights, counts = _sampled_steps(policy, m)
    tokens = prompt + step + 1
    h1, h2 = counts[:, T1] * weights, counts[:, T2] * weights
    s1, s2 = ctx.staged_tokens(h1, h2, tokens, prompt)
    kept = (float(s1.sum() / h1.sum()) if h1.sum() > 0 else 1.0, float(s2.sum() / h2.sum()) if h2.sum() > 0 else 1.0)
    return kept, float(np.sum(weights * chunk_attended(tokens, ctx.model.attention_chunk)) / np.sum(weights))


def step_binds(cost, closed_s: float, rows: float, ridge_rows: float, loop_s: float = 0.0) -> str:
    """The resource a step spends most on, in hardware words: the engine's host loop (`loop_s`) where the
    step waits for it, else the device's (`closed_s`: its closed form)."""
    if loop_s > closed_s:
        return "engine host loop"
    if closed_s > 1.1 * cost.compute_s:
        return "host link"
    layer = cost.layer
    if layer.allreduce_s > ALLREDUCE_BINDS * layer.device_s:
        return "interconnect"
    if layer.gemm_s >= layer.attention_s and rows >= ridge_rows:
        return "compute"
    return "HBM bandwidth"


def concurrency_caps(memory, sched, m, mem_share, pp: int) -> dict[str, float]:
    """The running requests each limit allows: HBM and host capacity at the mean running request's
    footprint (`mem_share`: its tier shares), and the scheduler's two settings, named with their values."""
    held = m.running_context_tokens  # its window or chunk layers hold the latest of them (`KvMemory.bounded_bytes`)
    per_request_hbm = memory.hbm_kv_bytes(held * mem_share[0], 0.0, held)
    if sched.admission == "no_evict":  # each running request holds its whole length's reservation
        per_request_hbm = memory.hbm_kv_bytes(m.reserved_tokens, 0.0, m.reserved_tokens)
    if sched.admission == "reserve_ratio":  # SGLang keeps the floor ratio of its remaining output free
        remaining = min(m.reserved_tokens - m.running_context_tokens, CLIP_NEW_TOKENS)  # E[n n/2] / E[n]
        per_request_hbm += remaining * NewTokenRatio().floor * memory.pool_bytes_per_token
    per_request_host = memory.host_bytes(held * mem_share[1], held * mem_share[2], round(held), round(m.prompt_tokens))
    return {"HBM capacity": memory.kv_budget_bytes / per_request_hbm if per_request_hbm > 0 else math.inf,
            "host memory": memory.host_capacity_bytes / per_request_host if per_request_host > 0 else math.inf,
            f"scheduler: max_num_seqs={sched.max_num_seqs}": float(sched.max_num_seqs),
            f"scheduler: max_num_batched_tokens={sched.max_num_batched_tokens}":
                pp * sched.max_num_batched_tokens / (1.0 + m.prompt_tokens / m.output_tokens)}


def curve(scenario: Scenario, decode_only: bool = False) -> Curve:
    """The steady states of one replica of `scenario` (its parallel.tp, policy and scheduler);
    `decode_only`: a decode instance behind prefill instances (no prefill mixed in its steps)."""
    ctx = build_context(scenario)
    sched, pol = scenario.scheduler, scenario.policy
    memory = kv_memory(ctx, sched.max_num_batched_tokens, sched.max_num_seqs)
    sched = engine_scheduler(ctx, memory)  # SGLang's max_running_requests of its pool
    m = moments(scenario)
    timing_policy = ctx.policy.at_fraction(1.0) if ctx.policy.auto else ctx.policy  # auto: tiers only when full
    memory_policy = ctx.policy.at_fraction(0.0) if ctx.policy.auto else ctx.policy
    share = tier_shares(timing_policy, m)
    kept, chunk_read = chunked_step_figures(ctx, timing_policy, m)  # chunked layers: their chunk's T1/T2, their reads
    pp = scenario.parallel.pp  # each of pp batches in flight is one engine step's (token budget included)
    caps = concurrency_caps(memory, sched, m, tier_shares(memory_policy, m), pp)
    cap_name = min(caps, key=caps.get)
    top = max(1.0, caps[cap_name])
    batches = np.unique(np.geomspace(1.0, top, GRID))
    ridge = ctx.hw.peak_flop_per_s / ctx.hw.weight_hbm_bytes_per_s  # rows where a bf16 GEMM turns compute-bound
    token_s = pipeline_token_s(ctx, pp)
    w_dtype, group = scenario.model.weight_dtype, scenario.model.weight_group_size

    timed = partial(_timed, ctx, pol.staging_buffers, token_s)
    alone = not sched.mixed_prefill and not decode_only  # SGLang's order: a chunk runs in a step of its own
    empty = mixed_step_cost(ctx.model, ctx.hw, w_dtype, group, pol.prefetch, 0, 0, 0, 0, ctx.kv_bytes_per_token_layer,
                            ctx.t2_bytes_per_token_layer) if alone else None  # the step a chunk runs alone in

    def costs(b: int, chunk: int):
        """(decode-only step, the same step with one prompt chunk of `chunk` tokens - or that chunk alone,
        without mixed prefill), each timed."""
        ctx_tokens = b * m.running_context_tokens
        t1, t2 = int(ctx_tokens * share[1]), int(ctx_tokens * share[2])
        plain = mixed_step_cost(ctx.model, ctx.hw, w_dtype, group, pol.prefetch, b, int(ctx_tokens * share[0]), t1, t2,
                                ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, 0, 0, 0, 0,
                                ctx.policy.tiering, pol.access, pol.staging_buffers,
                                chunk_tokens=None if chunk_read is None else round(b * chunk_read),
                                staged_tokens=None if kept is None else (t1 * kept[0], t2 * kept[1]))
        base, rows = (empty, 0) if alone else (plain, b)
        mixed = with_prefill(ctx.model, ctx.hw, w_dtype, group, base, rows, ctx.kv_bytes_per_token_layer, chunk,
                             chunk * (chunk + 1) / 2, chunk, 1)  # (mixed_step_cost's own composition)
        return timed(plain, b, b), timed(mixed, rows + chunk, rows + 1)  # the chunk is one more request

    rates, steps, tails, ttfts, binds = [], [], [], [], []
    for b in batches:
        bi = max(1, round(b / pp))  # one step's decodes: each of pp batches in flight holds 1 / pp of them
        chunk = max(1, min(round(m.prompt_tokens), sched.max_num_batched_tokens - (0 if alone else bi)))
        plain_t, mixed_t = costs(bi, chunk)
        plain_s, mixed_s = plain_t[1], mixed_t[1]  # the time between a request's tokens in each
        chunks = 0.0 if decode_only else b / pp * m.prompt_tokens / m.output_tokens / chunk  # per decode step
        share_mixed = min(1.0, chunks)
        t, tail_s = token_times(plain_s, mixed_s, chunks, alone, m.short_output_tokens)
        rates.append(b / (m.output_tokens * t))
        steps.append(t)
        tails.append(tail_s)
        ttfts.append(0.0 if decode_only else mixed_s * math.ceil(m.prompt_tokens / chunk) + t)  # chunks + a wait
        cost, _, step_s, loop_s = mixed_t if share_mixed >= 0.5 else plain_t  # the step most of them are
        binds.append(step_binds(cost, step_s, bi + share_mixed * chunk, ridge, loop_s))
    return Curve(tuple(float(b) for b in batches), tuple(rates), tuple(steps), tuple(tails), tuple(ttfts), m.output_tokens,
                 cap_name, caps["HBM capacity"], tuple(binds))


def _timed(ctx, staging_buffers: int, token_s, cost, rows: int, requests: int):
    """(cost, time between a request's tokens, the device's step, the engine's host loop over its `requests`):
    the step waits for the loop where that is longer (`engine_rules.host_loop_s`, as `sim.serving` times it)."""
    step_s = cost.closed_form_s(ctx.hw, cost.prefetch_copy_s(ctx.hw.h2d), staging_buffers)
    loop_s = host_loop_s(ctx.hw.launch, requests, ctx.model.attention_dp)
    return cost, token_s(cost, rows, step_s, loop_s), step_s, loop_s


def token_times(plain_s: float, chunk_s: float, chunks: float, alone: bool, short_tokens: float) -> tuple[float, float]:
    """(mean time between a request's tokens, a short request's 99th-percentile one) when `chunks`
    prompt chunks run per decode step, each costing `chunk_s`: mixed into decode steps (a share
    min(1, chunks) of the steps costs chunk_s, the rest plain_s), or `alone` in steps of their own that
    stall the decodes (plain_s + chunks x chunk_s). A short request's share of chunk steps is binomial
    over its `short_tokens` steps: its 99th percentile."""
    share = min(1.0, chunks)
    tail = min(1.0, share + Z99 * math.sqrt(share * (1 - share) / short_tokens))
    if alone:
        return plain_s + chunks * chunk_s, plain_s + max(chunks, tail) * chunk_s
    return (1 - share) * plain_s + share * chunk_s, (1 - tail) * plain_s + tail * chunk_s


def pipeline_token_s(ctx, pp: int):
    """(cost, rows, step seconds, the engine's host loop) -> the time between two tokens of one request.
    pp = 1: the step, or the loop where that is longer. Pipeline parallelism (`sim.serving.pipeline`), in
    the full pipeline the screen assumes: pp batches of the same size in flight, each token pp x the
    slowest stage (`physics.pipeline_stage_s`; a stage waits for the loop over its batch) apart.
    Nothing is staged from the host in a pipeline, so a step's closed form is its compute."""
    if pp == 1:
        return lambda cost, rows, step_s, loop_s: max(step_s, loop_s)
    fabric = catalog.interconnect(ctx.hw.gpu.interconnect)

    def token_s(cost, rows, step_s, loop_s):
        send_s = pipeline_send_s(rows, ctx.model.hidden_size, fabric.bus_bytes_per_s, fabric.alltoall_floor_s)
        return pp * max(*pipeline_stage_s(cost, pp, send_s), loop_s)

    return token_s


def prefill_rate(scenario: Scenario, ttft_s: float | None) -> tuple[float, float, str]:
    """A prefill instance of `scenario` (prompts only, one token out): (the rate it sustains, its
    TTFT at no load, what binds). A full step of max_num_batched_tokens prompt tokens sets the
    throughput; at utilisation u an M/D/1 queue waits u / (2 (1 - u)) services, so the rate is the
    highest u x capacity whose wait + service meets `ttft_s` (no target: u = 0.9)."""
    ctx = build_context(scenario)
    sched, pol, m = scenario.scheduler, scenario.policy, moments(scenario)
    tokens = sched.max_num_batched_tokens
    prompt = max(1, round(m.prompt_tokens))
    seqs = max(1, tokens // prompt)
    full = mixed_step_cost(ctx.model, ctx.hw, scenario.model.weight_dtype, scenario.model.weight_group_size,
                           pol.prefetch, 0, 0, 0, 0, ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer,
                           seqs * prompt, seqs * prompt * (prompt + 1) / 2, seqs * prompt, seqs, False)
    step_s = full.closed_form_s(ctx.hw, 0.0, pol.staging_buffers)
    capacity = seqs / step_s  # requests/s
    service_s = step_s * max(1, math.ceil(prompt / tokens))
    if ttft_s is not None and service_s > ttft_s:
        return 0.0, service_s, "compute"
    u = 0.9
    if ttft_s is not None:  # wait + service <= ttft: u / (2 (1 - u)) <= ttft / service - 1
        k = ttft_s / service_s - 1.0
        u = min(u, 2 * k / (1 + 2 * k))
    return u * capacity, service_s, "compute"
