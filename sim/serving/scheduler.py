"""Continuous batching in vLLM's style (v1 scheduler), as pure bookkeeping: no SimPy, no time cost.

Each step: (1) the running requests' K/V for this step must fit - while it does not, the newest
running request is preempted and goes back to the front of the queue: recompute drops its K/V,
swap (`swap.py`) copies it to host memory where that has room (else recompute) - under SGLang's
admission (reserve_ratio) the least decoded is retracted first, until what the rest leave free holds
20 tokens each, and joins the back of the queue (`sglang_retraction_keep`); (2) every
running request is scheduled in admission order, a decode taking one token of the step's budget
(`max_num_batched_tokens`) and an unfinished prefill its next chunk; (3) if nothing was preempted,
waiting requests are admitted first come, first served while fewer than `max_num_seqs` run, tokens
are left and memory holds the newcomer's reservation - the head of the queue that does not fit
stops admission (no overtaking). Without chunked prefill a prompt is scheduled whole or waits.
Without mixed prefill (`mixed_prefill` off: SGLang's default, scheduler.py `get_next_batch_to_run`) a
step that can carry a prefill - an unfinished one running, or a waiting request admitted - carries
prefill chunks alone, the whole budget theirs, and the decodes wait for a step without one.
With admission no_evict (TensorRT-LLM's GUARANTEED_NO_EVICT) a request is admitted only while the
whole length - prompt + output tokens, in HBM - of every running request and its own fits the KV
budget, so the running ones never outgrow memory and none is preempted. With admission reserve_ratio
(SGLang's, `new_token_ratio`) a request is admitted only while its prompt + (clipped) output and a
decaying share of the running requests' remaining outputs fit beside what they hold. Pipelined (`pipelined`,
`sim.serving.pipeline`): batches overlap, and a request in a batch in flight keeps its memory but is
neither scheduled nor preempted until its batch is back.

Memory is tier-aware (`kv_memory`, `row_counts`): a decoding request holds its T0 tokens (+ staging
for the T1/T2 it attends, + its window and linear layers' bounded bytes) in HBM and its T1/T2 in host
memory, at its own current length; a
(re)admitted one reserves what it will hold once prefilled - its prompt in T0, or for a resumed
one its tier counts at its current length (a tiered cache re-tiers what it recomputes). A swapped
request takes its place again in the queue's order: its K/V comes back over the link (the step's
`swap_in_bytes`) and, if it was decoding, it decodes in this step; host memory counts the swapped
requests' K/V as held until then.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from sim.tiering.tiers import T0, T1, T2

from .kv_memory import KvMemory
from .new_token_ratio import RETRACT_STEPS, NewTokenRatio, clipped_remaining
from .request import RequestTable
from .row_counts import FixedRows, PressureRows
from .swap import SwapSpace, swap_bytes

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class StepPlan:
    """One step: who decodes, which prefill chunks run, who was preempted, and the step's tier
    counts summed over its decodes (what `physics.mixed_step_cost` and the re-tier traffic need).
    Requests are indices into the `RequestTable`."""

    decodes: np.ndarray = field(default_factory=lambda: _EMPTY)
    chunks: np.ndarray = field(default_factory=lambda: _EMPTY)  # requests prefilling this step
    chunk_tokens: np.ndarray = field(default_factory=lambda: _EMPTY)
    chunk_prefix: np.ndarray = field(default_factory=lambda: _EMPTY)  # tokens each chunk's request has computed before it
    preempted: list[int] = field(default_factory=list)
    attended: np.ndarray = field(default_factory=lambda: np.zeros(4, dtype=np.int64))  # T0..T3 over decodes
    decode_counts: np.ndarray | None = None  # each decode's T0..T3 (rows as `decodes`); None when every token is in T0
    # tokens the decodes' re-tiers move to T1, T2 (net); with chunked layers each at the share of its bytes the
    # host holds (`KvMemory.chunk_kept`), as are `promoted` and `resident`
    demoted: tuple[int, int] = (0, 0)
    promoted: tuple[int, int] = (0, 0)  # ... and back to T0 from T1, T2 (net; hbm_ratio auto as pressure falls)
    resident: tuple[int, int] = (0, 0)  # T1, T2 held after the step by the decodes that re-tier
    retiers: int = 0
    hbm_kv_bytes: float = 0.0  # T0 KV + staging held during the step (reservations of prefills included)
    host_bytes: float = 0.0  # T1/T2 of the running requests + K/V of the swapped ones
    swap_out_bytes: float = 0.0  # K/V the preempted requests copy to the host before the step (swap)
    swap_out_requests: int = 0
    swap_in_bytes: float = 0.0  # K/V the readmitted swapped requests copy back before the step
    swap_in_requests: int = 0

    @property
    def empty(self) -> bool:
        return not len(self.decodes) and not len(self.chunks)

    @property
    def prefill_tokens(self) -> int:
        return int(self.chunk_tokens.sum()) if len(self.chunk_tokens) else 0

    def prefill_position_sum(self) -> int:
        """sum over chunk tokens of the number of tokens each attends (its 1-based position):
        a chunk of c tokens after a computed prefix a: c * a + c (c + 1) / 2."""
        c, a = self.chunk_tokens, self.chunk_prefix
        return int(np.sum(c * a + c * (c + 1) // 2)) if len(c) else 0  # (most steps have no chunk)

    def prefill_kv_tokens(self) -> int:
        """K/V tokens the chunks' attention reads (prefix) and writes (chunk): sum of a + c."""
        return int(np.sum(self.chunk_prefix + self.chunk_tokens)) if len(self.chunk_tokens) else 0


@dataclass
class StepTokens:
    """What a finished step handed out: requests that finished, tokens whose previous token came
    the step before (their inter-token latency is this step's time), and every other gap."""

    finished: np.ndarray
    regular: int
    gaps: np.ndarray


def sglang_retraction_order(generated: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """The running requests in the order SGLang keeps them when it must retract (schedule_batch.py
    `retract_decode`: sorted by (output tokens, -prompt tokens) descending, retracting from the end):
    most decoded first, among equals the shortest prompt first; ties keep their order."""
    return np.lexsort((prompt, -generated))


def sglang_retraction_keep(cum_hbm: np.ndarray, fits: int, budget_bytes: float, bytes_per_token: float) -> int:
    """How many of the running requests (in `sglang_retraction_order`, `cum_hbm` their cumulative HBM)
    SGLang keeps: it retracts one at least, then on while what the kept leave free holds fewer than
    RETRACT_STEPS tokens for each (`retract_decode`: available < kept x SGLANG_RETRACT_DECODE_STEPS);
    never more than `fits`, the most whose step fits; one request is never retracted."""
    keep = min(fits, len(cum_hbm) - 1)
    while keep > 1 and budget_bytes - cum_hbm[keep - 1] < keep * RETRACT_STEPS * bytes_per_token:
        keep -= 1
    return max(keep, min(1, fits))


@dataclass
class _Draft:
    """A step being formed: the running requests (admission order) with their tier counts and memory
    needs, the step's memory totals, and what it has handed out so far."""

    run: np.ndarray
    decoding: np.ndarray
    att: np.ndarray  # tier counts during the step
    aft: np.ndarray  # ... and after its re-tier
    hbm: np.ndarray  # HBM KV bytes per request
    host: np.ndarray  # host bytes per request
    total_hbm: float = 0.0
    total_host: float = 0.0
    admit_hbm: float = 0.0  # what admission counts (auto: all in T0)
    tokens: int = 0  # the step's token budget left
    chunks: list = field(default_factory=list)
    chunk_tokens: list = field(default_factory=list)
    dec_att: np.ndarray = field(default_factory=lambda: _EMPTY)
    dec_aft: np.ndarray = field(default_factory=lambda: _EMPTY)

    def keep(self, n) -> None:
        """Only the first n running requests stay (the rest were preempted); or those a mask keeps."""
        rows = slice(None, n) if isinstance(n, int) else n
        self.run, self.decoding, self.att, self.aft = self.run[rows], self.decoding[rows], self.att[rows], self.aft[rows]
        self.hbm, self.host = self.hbm[rows], self.host[rows]


class Scheduler:
    def __init__(self, cfg, memory: KvMemory, counter: FixedRows | PressureRows, table: RequestTable):
        self.cfg, self.memory, self.counter, self.table = cfg, memory, counter, table
        self.running = _EMPTY  # in admission order: the last is the newest
        self.waiting: deque[int] = deque()  # arrived, not running; preempted ones at the front
        self.preemptions = 0
        self.swap = SwapSpace(cfg.swap_space_bytes or np.inf) if cfg.preemption == "swap" else None
        self.swaps = 0
        self.swap_fallbacks = 0  # preemptions recomputed because the swap had no room
        self.in_flight = None  # pipeline parallelism (`pipelined`): the requests of the batches in flight
        self.ratio = NewTokenRatio(cfg.schedule_conservativeness) if cfg.admission == "reserve_ratio" else None
        # every token in T0 (full_hbm): counts are one column, prompt + generated, and the host holds
        # nothing of the running requests (only swapped K/V) - the same figures with fewer array passes
        # (`_dense_needs`)
        self.dense = isinstance(counter, FixedRows) and not counter.counter.tiering

    def pipelined(self) -> None:
        """Batches overlap (pipeline parallelism, vLLM's batch queue): a request in a batch in flight
        holds its memory but is not scheduled again, nor preempted, until its batch is back."""
        self.in_flight = np.zeros(len(self.table.prompt), dtype=bool)
        self.dense = False

    def dispatch(self, plan: "StepPlan", flying: bool) -> None:
        """Mark (True) or clear (False) a batch's requests as in flight."""
        self.in_flight[plan.decodes] = flying
        self.in_flight[plan.chunks] = flying

    def arrive(self, i: int) -> None:
        self.waiting.append(i)

    def _needs(self, att: np.ndarray, aft: np.ndarray, decoding: np.ndarray,
               prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(HBM KV bytes, host bytes) per request (prompt tokens `prompt`): T0 + staged T1/T2 (decodes only)
        + the window and linear layers' bytes of the tokens it holds during the step; host the larger of
        during the step and after its re-tier."""
        m = self.memory
        held = att.sum(axis=1)
        hbm = m.hbm_kv_bytes(att[:, T0], np.where(decoding, att[:, T1] + att[:, T2], 0), held)
        host = np.maximum(m.host_bytes(att[:, T1], att[:, T2], held, prompt),
                          m.host_bytes(aft[:, T1], aft[:, T2], aft.sum(axis=1), prompt))
        return hbm, host

    def _held_host_bytes(self) -> float:
        return self.swap.held_bytes if self.swap is not None else 0.0

    def schedule(self, now: float) -> StepPlan:
        """The next step, in vLLM's order: (1) preempt the newest running requests until the rest
        fit, (2) schedule the running ones (decodes, chunked prefills), (3) admit waiting requests
        unless something was preempted, then the decodes' tier counts and re-tiers."""
        plan = StepPlan()
        if self.ratio is not None and not len(self.running):
            self.ratio.idle()
        step = self._running_needs()
        self._preempt_until_fits(step, plan)
        if self.cfg.mixed_prefill or plan.preempted:
            self._schedule_running(step, plan)
            if not plan.preempted:
                self._admit_waiting(step, plan, now)
        else:
            self._prefill_or_decode(step, plan, now)
        self._close(step, plan)
        if self.ratio is not None:
            self._move_ratio(plan)
        return plan

    def _move_ratio(self, plan: StepPlan) -> None:
        """SGLang's estimate after a step: set by what the requests left running have shown where some
        were preempted, one step of decay after a decode step."""
        t = self.table
        if plan.preempted:
            self.ratio.retracted(t.generated[self.running], t.output[self.running])
        elif len(plan.decodes) and not len(plan.chunks):
            self.ratio.decode_step()

    def _prefill_or_decode(self, d: _Draft, plan: StepPlan, now: float) -> None:
        """Without mixed prefill: the running requests' unfinished prefills and then admissions, the
        decodes left out, where that gives the step a chunk; else the decodes, formed as usual, with any
        request admitted decoding (a swapped one, or one prefilled elsewhere) among them."""
        if not self.waiting and d.decoding.all():  # nothing to prefill: a decode step, formed once
            self._schedule_running(d, plan)
            return
        self._schedule_running(d, plan, decodes=False)
        self._admit_waiting(d, plan, now)
        if sum(len(c) for c in d.chunks):
            return
        resumed, att, aft = plan.decodes, d.dec_att, d.dec_aft  # only those admitted decoding (no running one)
        self._schedule_running(d, plan)
        if len(resumed):
            plan.decodes = np.concatenate([plan.decodes, resumed])
            d.dec_att, d.dec_aft = np.concatenate([d.dec_att, att]), np.concatenate([d.dec_aft, aft])

    def _running_needs(self) -> _Draft:
        t = self.table
        run = self.running
        decoding = t.computed[run] >= t.target[run]
        if self.dense:
            tokens, hbm = self._dense_needs(run)
            return _Draft(run, decoding, tokens, tokens, hbm, np.zeros(len(run)))
        self.counter.begin_step(run, t.generated[run], decoding)
        att, aft = self.counter.step_counts(run, t.generated[run], decoding)
        hbm, host = self._needs(att, aft, decoding, t.prompt[run])
        return _Draft(run, decoding, att, aft, hbm, host)

    def _dense_needs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, HBM KV bytes) per request when every token is in T0: prompt + generated tokens
        (`TierCounter.step_counts` without tiering, during and after the step alike), nothing staged.
        The draft's counts are then this one column (T0)."""
        tokens = self.table.prompt[rows] + self.table.generated[rows]
        return tokens, self.memory.hbm_kv_bytes(tokens, 0, tokens)

    def _preempt_until_fits(self, d: _Draft, plan: StepPlan) -> None:
        """(1) Preempt the newest (SGLang: in `sglang_retraction_order`) until the rest fits (cumulative
        sums grow, so what fits is a prefix); then the step's memory totals and what admission counts
        (auto: all in T0)."""
        m = self.memory
        host_free = m.host_capacity_bytes - self._held_host_bytes()  # swapped K/V holds its host memory
        if self.in_flight is not None:
            self._preempt_idle_until_fits(d, plan, host_free)
            self._totals(d)
            return
        keep = len(d.run)
        over = keep and (float(d.hbm.sum()) > m.kv_budget_bytes or float(d.host.sum()) > host_free)
        if over and self.ratio is not None:  # SGLang retracts in its own order (`sglang_retraction_order`)
            d.keep(sglang_retraction_order(self.table.generated[d.run], self.table.prompt[d.run]))
        cum_hbm = np.cumsum(d.hbm)
        if self.dense:  # nothing of theirs on the host (host_free < 0 only where swapped K/V overfills it)
            if over:
                keep = 0 if host_free < 0 else int(np.count_nonzero(cum_hbm <= m.kv_budget_bytes))
        elif over:  # all fit unless the last does not
            keep = int(np.count_nonzero((cum_hbm <= m.kv_budget_bytes) & (np.cumsum(d.host) <= host_free)))
        if over and self.ratio is not None:
            keep = sglang_retraction_keep(cum_hbm, keep, m.kv_budget_bytes, m.pool_bytes_per_token)
        if keep < len(d.run):
            self._preempt(d.run[keep:][::-1], m.host_capacity_bytes - float(d.host[:keep].sum()), plan)
            d.keep(keep)
            self.running = d.run
        self._totals(d)

    def _totals(self, d: _Draft) -> None:
        if self.dense:  # admission counts HBM as it is (FixedRows); the host holds swapped K/V alone
            d.total_hbm = d.admit_hbm = float(d.hbm.sum())
            d.total_host = self._held_host_bytes()
            return
        d.total_hbm, d.total_host = float(d.hbm.sum()), float(d.host.sum()) + self._held_host_bytes()
        d.admit_hbm = float(self.counter.admission_bytes(d.att, d.hbm).sum())

    def _preempt_idle_until_fits(self, d: _Draft, plan: StepPlan, host_free: float) -> None:
        """(1) with batches in flight: preempt the newest requests not in flight until the rest fits; a
        request in flight is never preempted (its batch is computing), so memory may stay over until it is back."""
        m, idle = self.memory, ~self.in_flight[d.run]
        hbm, host = float(d.hbm.sum()), float(d.host.sum())
        keep = np.ones(len(d.run), dtype=bool)
        for k in np.flatnonzero(idle)[::-1]:
            if hbm <= m.kv_budget_bytes and host <= host_free:
                break
            keep[k] = False
            hbm, host = hbm - float(d.hbm[k]), host - float(d.host[k])
        if not keep.all():
            self._preempt(d.run[~keep][::-1], m.host_capacity_bytes - float(d.host[keep].sum()), plan)
            d.keep(keep)
            self.running = d.run

    def _schedule_running(self, d: _Draft, plan: StepPlan, decodes: bool = True) -> None:
        """(2) The running requests in admission order: a decode takes one token of the budget (none
        without `decodes`), an unfinished prefill its next chunk."""
        t, run, decoding = self.table, d.run, d.decoding
        budget = self.cfg.max_num_batched_tokens
        flying = self.in_flight is not None and self.in_flight[run].any()
        if decodes and decoding.all() and len(run) <= budget and not flying:  # every running request decodes one token
            plan.decodes, d.dec_att, d.dec_aft = run, d.att, d.aft
            d.chunks, d.chunk_tokens = [_EMPTY], [_EMPTY]
            d.tokens = budget - len(run)
            return
        want = np.where(decoding, int(decodes), t.target[run] - t.computed[run])
        if flying:  # a request in a batch in flight has nothing to schedule until it is back
            want = np.where(self.in_flight[run], 0, want)
        take = np.minimum(want, np.maximum(budget - (np.cumsum(want) - want), 0))
        sched = take > 0
        dec = sched & decoding
        plan.decodes = run[dec]
        d.dec_att, d.dec_aft = d.att[dec], d.aft[dec]
        pre = sched & ~decoding
        d.chunks, d.chunk_tokens = [run[pre]], [take[pre]]
        d.tokens = budget - int(take.sum())

    def _admit_waiting(self, d: _Draft, plan: StepPlan, now: float) -> None:
        """(3) Admission, first come first served: while sequences and tokens are left and memory holds
        the head of the queue; the head that does not fit stops it (no overtaking)."""
        t, m = self.table, self.memory
        admitted, resumed = [], []  # resumed: swapped decodes, decoding again this step
        reserved = self._reserved_bytes(d.run)
        while self.waiting and d.tokens > 0 and len(d.run) + len(admitted) < self.cfg.max_num_seqs:
            i = self.waiting[0]
            left = int(t.target[i] - t.computed[i])
            if left > d.tokens and not self.cfg.chunked_prefill:
                break
            reserved = self._reserve(i, left, d, not (len(d.run) or admitted), reserved)
            if reserved is None:
                break
            swapped = self.swap is not None and i in self.swap
            decodes_now = left == 0 and (swapped or t.prefilled)  # its K/V is here (or coming back): it decodes
            h, ho, h_admit = self._admission_needs(i, decodes_now)
            if swapped:  # its swapped K/V leaves the host (T0 to HBM, T1/T2 counted in ho)
                ho -= self.swap.host_bytes[i]
            if not m.fits(d.total_hbm + h, d.total_host + ho) or d.admit_hbm + h_admit > m.kv_budget_bytes:
                if self.swap and not len(d.run) and not admitted:  # nothing runs: the swapped K/V must not block it
                    d.total_host -= self._drop_swapped()
                    continue
                break
            self.waiting.popleft()
            d.total_hbm += h
            d.total_host += ho
            d.admit_hbm += h_admit
            admitted.append(i)
            if np.isnan(t.admitted_s[i]):
                t.admitted_s[i] = now
            if swapped:
                plan.swap_in_bytes += self.swap.take(i)
                plan.swap_in_requests += 1
            if decodes_now:
                resumed.append(i)
                d.tokens -= 1
                continue
            chunk = min(left, d.tokens)
            d.chunks.append(np.array([i]))
            d.chunk_tokens.append(np.array([chunk]))
            d.tokens -= chunk
        if admitted:
            self.running = np.concatenate([d.run, np.asarray(admitted, dtype=np.int64)])
        if resumed:
            r = np.asarray(resumed, dtype=np.int64)
            if self.dense:
                a = b = self._dense_needs(r)[0]
            else:
                a, b = self.counter.step_counts(r, t.generated[r], np.ones(len(r), dtype=bool))
            plan.decodes = np.concatenate([plan.decodes, r])
            d.dec_att, d.dec_aft = np.concatenate([d.dec_att, a]), np.concatenate([d.dec_aft, b])

    def _reserved_bytes(self, running: np.ndarray) -> float:
        """What admission keeps for the running requests beyond what they hold: no_evict their whole
        lengths; reserve_ratio (SGLang's) their remaining outputs, each clipped, times the ratio
        (`new_token_ratio`); on_demand nothing."""
        if self.cfg.admission == "no_evict":
            return float(self._whole_length_bytes(running).sum())
        if self.ratio is None or not len(running):
            return 0.0
        rest = clipped_remaining(self.table.output[running], self.table.generated[running])
        return float(rest.sum()) * self.ratio.current * self.memory.pool_bytes_per_token

    def _reserve(self, i: int, left: int, d: _Draft, alone: bool, reserved: float) -> float | None:
        """`reserved` with waiting request i's reservation added, or None where it does not fit (a request
        `alone` is let in whatever its length, as on_demand would run it). no_evict: its whole length
        beside the running ones'; reserve_ratio: its `left` tokens to prefill and its clipped output beside
        what the running hold and keep (SGLang's NO_TOKEN at >=), its output then kept in full this round."""
        m = self.memory
        if self.cfg.admission == "no_evict":
            add = float(self._whole_length_bytes(np.array([i]))[0])
            blocked = reserved + add > m.kv_budget_bytes
        elif self.ratio is not None:
            add = float(clipped_remaining(self.table.output[i], self.table.generated[i])) * m.pool_bytes_per_token
            blocked = d.admit_hbm + reserved + left * m.pool_bytes_per_token + add >= m.kv_budget_bytes
        else:
            return reserved
        return None if blocked and not alone else reserved + add

    def _whole_length_bytes(self, requests: np.ndarray) -> np.ndarray:
        """no_evict: the HBM each request's whole length needs - prompt + output tokens in T0, with
        its window and linear layers' bytes - what GUARANTEED_NO_EVICT reserves at admission."""
        tokens = self.table.prompt[requests] + self.table.output[requests]
        return self.memory.hbm_kv_bytes(tokens, 0, tokens)

    def _admission_needs(self, i: int, resumes_decoding: bool) -> tuple[float, float, float]:
        """(HBM bytes, host bytes, HBM bytes admission counts) waiting request i needs: a swapped
        decode this step's needs; any other what it will hold once prefilled."""
        t, m = self.table, self.memory
        if self.dense:  # what it holds once prefilled, or decoding now: prompt + generated tokens either way
            h = float(self._dense_needs(np.array([i]))[1][0])
            return h, 0.0, h
        if resumes_decoding:  # a decode whose K/V comes back: this step's needs
            a, b = self.counter.step_counts(np.array([i]), t.generated[[i]], np.array([True]))
            h, ho = (float(x[0]) for x in self._needs(a, b, np.array([True]), t.prompt[[i]]))
        else:
            a = self.counter.held(i, int(t.generated[i]) + 1)[None, :]
            h, ho = m.hbm_kv_bytes(a[0, T0], 0, a[0].sum()), m.host_bytes(a[0, T1], a[0, T2], a[0].sum(), t.prompt[i])
        return h, ho, float(self.counter.admission_bytes(a, np.array([h]))[0])

    def _close(self, d: _Draft, plan: StepPlan) -> None:
        """The plan's chunks and memory, and its decodes' tier counts and re-tiers (committed)."""
        t = self.table
        plan.chunks, plan.chunk_tokens = np.concatenate(d.chunks), np.concatenate(d.chunk_tokens)
        plan.chunk_prefix = t.computed[plan.chunks]
        plan.hbm_kv_bytes, plan.host_bytes = d.total_hbm, d.total_host
        if not len(plan.decodes):
            return
        a, b = d.dec_att, d.dec_aft
        if self.dense:  # one column, T0; nothing re-tiers
            plan.attended = np.array([a.sum(), 0, 0, 0], dtype=np.int64)
            return
        plan.attended, plan.decode_counts = a.sum(axis=0), a
        steps = t.generated[plan.decodes] - 1
        due = self.counter.retier_due(steps)
        if due.any():
            ra, rb = a[due], b[due]
            if self.memory.chunk_kept is not None:  # each row's moves and residents at the share the host holds
                share = self.memory.chunk_kept(rb.sum(axis=1), t.prompt[plan.decodes[due]])[:, None]
                ra, rb = ra * share, rb * share
            moved, back = self.counter.retier_moves(ra, rb)
            held = rb[:, [T1, T2]].sum(axis=0)
            number = int if self.memory.chunk_kept is None else float
            plan.demoted, plan.promoted = (number(moved[0]), number(moved[1])), (number(back[0]), number(back[1]))
            plan.resident = (number(held[0]), number(held[1]))
            plan.retiers = int(due.sum())
            self.counter.commit(plan.decodes, steps, b)

    def _preempt(self, victims: np.ndarray, host_free: float, plan: StepPlan) -> None:
        """Preempt `victims` (newest first; each goes to the front, so the oldest ends first in line).
        Swap: each whose K/V has room on the host (`host_free`: what the kept requests leave) is
        swapped, the others recomputed."""
        t = self.table
        for i in (int(v) for v in victims):
            swap = False
            if self.swap is not None:
                link, held = self._swap_bytes(i)
                swap = self.swap.fits(link, held, host_free)
                if swap:
                    self.swap.put(i, link, held)
                    plan.swap_out_bytes += link
                    plan.swap_out_requests += 1
                    self.swaps += 1
                else:
                    self.swap_fallbacks += 1
            t.preempt(i, swap=swap)
            if self.ratio is None:
                self.waiting.appendleft(i)
            else:  # SGLang's retracted requests join the back of its queue (`_extend_requests_to_queue`)
                self.waiting.append(i)
            plan.preempted.append(i)
        self.preemptions += len(victims)

    def _swap_bytes(self, i: int) -> tuple[float, float]:
        """(link bytes, host bytes while swapped) of request i: its cache's tier counts (`held`) while
        decoding; mid-prefill, the tokens computed so far, all in HBM."""
        t, m = self.table, self.memory
        if t.computed[i] < t.target[i]:
            return swap_bytes(int(t.computed[i]), 0, 0, m.kv_bytes_per_token, m.t2_bytes_per_token)
        c = self.counter.held(i, int(t.generated[i]))
        link, held = swap_bytes(int(c[T0]), int(c[T1]), int(c[T2]), m.kv_bytes_per_token, m.t2_bytes_per_token)
        if m.chunk_kept is not None:  # its T1/T2 at the share the host holds (`KvMemory.host_bytes`)
            held = link + m.host_bytes(int(c[T1]), int(c[T2]), int(c.sum()), int(t.prompt[i]))
        return link, held

    def _drop_swapped(self) -> float:
        """Recompute every swapped request instead (when nothing runs and their host memory keeps the
        head of the queue out); the host bytes freed."""
        freed = self.swap.held_bytes
        for i in list(self.swap.link_bytes):
            self.swap.take(i)
            self.table.recompute(i)
            self.swap_fallbacks += 1
        return freed

    def complete(self, plan: StepPlan, now: float, step: int, consecutive: bool = True) -> StepTokens:
        """Apply a finished step: decodes sample a token, chunks advance (a prefill that completes
        samples one); finished requests leave the running set. `consecutive` False (batches in
        flight overlap): no gap is one step's time, each is counted as it is."""
        t = self.table
        if len(plan.chunks):
            t.computed[plan.chunks] += plan.chunk_tokens
            done_prefill = plan.chunks[t.computed[plan.chunks] >= t.target[plan.chunks]]
            produced = np.concatenate([plan.decodes, done_prefill])
        else:  # a decode-only step (most of them)
            produced = plan.decodes
        generated = t.generated[produced] + 1  # (a request is produced once a step: no index repeats)
        t.generated[produced] = generated
        first = generated == 1
        later = produced
        if first.any():
            t.first_token_s[produced[first]] = now
            later = produced[~first]
        regular = t.last_token_step[later] == step - 1 if consecutive else np.zeros(len(later), dtype=bool)
        gaps = now - t.last_token_s[later[~regular]]
        t.last_token_s[produced] = now
        t.last_token_step[produced] = step
        finished = produced[generated >= t.output[produced]]
        if len(finished):
            t.finish_s[finished] = now
            self.running = self.running[np.isnan(t.finish_s[self.running])]  # (only the finished have a finish time)
        return StepTokens(finished, int(np.count_nonzero(regular)), gaps)
