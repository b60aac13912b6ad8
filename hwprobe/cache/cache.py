"""The real tiered KV cache: T0 on the device, T1/T2 in host memory, T3 dropped.

Per decode step the decode loop calls `begin_step()`, then for each layer `layer_start(l)` (issues
the prefetch of the next layer(s)) and `attend(l, q, k, v)` (stores the new token's K/V in T0 and
attends over T0 plus the staged T1/T2 tokens), then `end_step()` (re-tiers when due). Tier
decisions are sim/tiering/tiers.py's, on scores = attention probability received, averaged over query
heads and layers, accumulated with no decay - or, with `replay`, the simulator's own decisions.

How T1/T2 reach attention follows the prefetch mode (DESIGN.md "Tier policy"): `layerwise_async`
stages layer by layer in a ring of buffers (staging.py), `sync_per_step` copies every layer before
the forward pass (prototype.py), `per_interval` keeps every layer resident from one re-tier to the
next (resident.py). Staged tokens are then laid out for attention in one workspace of one layer's
T1 + T2 at full precision (`attention_workspace_bytes`), in every mode. With `access` host_attention
the host attends its tokens where they live instead (host_attention.py) and the device merges the two
partial results by log-sum-exp; `split` stages a prefix of each layer's host slots and attends the
rest on the host. Host tiers are stored
[slot, row] per layer and copied as one block of high-water slots for every row, so a batch of
unequal lengths copies padding the simulator (live tokens only) does not count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.inputs.scenario import DEFAULT_POLICY
from sim.model.units import KV_TENSORS
from sim.tiering.tiers import T0, T1, T2, T3, TIERS, TierPolicy

from .attention import (
    NEG_INF,
    merge_partials,
    ordered_union,
    partial_softmax_attention,
    union_softmax_attention,
    unorder_probs,
)
from .counters import StepCounters
from .host_attention import HostAttention, HostSpan
from .offload import OffloadLane
from .peaks import TierPeaks, batch_peaks
from .prototype import PrototypeCopies
from .quant import dequantize_int8, effective_group
from .resident import ResidentStage
from .retier import retier
from .slots import FREE, SlotTable
from .staging import StagingRing
from .store import CacheGeometry, TierStores

PREFETCH_MODES = ("layerwise_async", "sync_per_step", "per_interval")
ATTENTION_MODES = ("merged", "ordered")
ACCESS_MODES = ("prefetch", "host_attention", "split")


@dataclass(frozen=True)
class CacheOptions:
    """Policy fields default to the scenario schema's (sim/inputs/scenario.py DEFAULT_POLICY)."""

    # layerwise_async (this project) | sync_per_step (the paper's prototype) | per_interval
    prefetch: str = DEFAULT_POLICY.prefetch
    staging_buffers: int = DEFAULT_POLICY.staging_buffers
    pinned: bool = DEFAULT_POLICY.pinned  # T1/T2 in page-locked memory (only meaningful on CUDA)
    group_size: int = DEFAULT_POLICY.compressed_group_size  # T2 quantisation group (capped at head_dim)
    attention: str = "merged"  # merged: T0 in place + staged, one softmax; ordered: one key set in token order
    scoring: str = DEFAULT_POLICY.scoring  # cumulative (paper) | recent (last interval only)
    access: str = DEFAULT_POLICY.access  # prefetch | host_attention | split: how attention reaches T1/T2
    # split: share of each layer's host slots attended on the host; None: the cache's split_rule per step
    host_fraction: float | None = None

    @classmethod
    def from_policy(cls, cfg, attention: str = "merged", host_fraction: float | None = None) -> "CacheOptions":
        return cls(prefetch=cfg.prefetch, staging_buffers=cfg.staging_buffers, pinned=cfg.pinned,
                   group_size=cfg.compressed_group_size, attention=attention, scoring=cfg.scoring,
                   access=cfg.access, host_fraction=host_fraction)


class TieredKVCache:
    def __init__(self, rt, geom: CacheGeometry, policy: TierPolicy, options: CacheOptions,
                 prompt_tokens: int, lengths, dtype, replay: list | None = None, split_rule=None):
        """replay: per row, the simulator's SequenceTiers (sim.tiering.tier_plan.sequence_tiers); re-tier
        decisions then follow the simulator's seeded scores instead of this cache's attention.
        split_rule: (active rows, t0, t1, t2 tokens) -> share attended on the host, for access split
        without a fixed `host_fraction` (host_attention.simulator_split_rule)."""
        import torch

        if options.prefetch not in PREFETCH_MODES:
            raise ValueError(f"prefetch {options.prefetch!r} is not implemented here; expected one of {PREFETCH_MODES}")
        if options.attention not in ATTENTION_MODES:
            raise ValueError(f"attention {options.attention!r}; expected one of {ATTENTION_MODES}")
        _check_access(options, split_rule)
        group = effective_group(options.group_size, geom.head_dim)
        if geom.head_dim % group:
            raise ValueError(f"T2 group size {group} does not divide head_dim {geom.head_dim}")
        self.torch, self.rt, self.geom, self.policy, self.options, self.dtype = torch, rt, geom, policy, options, dtype
        self.prompt = int(prompt_tokens)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.steps = int(self.lengths.max()) if len(self.lengths) else 0
        B, max_tokens = geom.batch, self.prompt + self.steps
        self.peaks = batch_peaks(policy, self.prompt, self.lengths) if policy.tiering else TierPeaks(max_tokens, 0, 0)
        self.stores = TierStores(rt, geom, self.peaks, dtype, group, options.pinned)
        self.tables = (SlotTable(B, self.peaks.t0), SlotTable(B, self.peaks.t1), SlotTable(B, self.peaks.t2))
        self.n = np.full(B, self.prompt, dtype=np.int64)
        self.tier = np.full((B, max_tokens), T3, dtype=np.int8)  # only [:n] is meaningful
        self.tier[:, : self.prompt] = T0
        self.slot = np.full((B, max_tokens), FREE, dtype=np.int64)
        for b in range(B):
            self.slot[b, : self.prompt] = self.tables[T0].alloc(b, np.arange(self.prompt))
        self.score = np.zeros((B, max_tokens))
        if replay is not None and len(replay) != B:
            raise ValueError(f"replay needs one sequence per row: {len(replay)} for batch {B}")
        self.replay = replay
        cap_s = self.peaks.t1 + self.peaks.t2
        self.acc0 = rt.device_zeros((B, self.peaks.t0), torch.float32)
        self.acc_s = rt.device_zeros((B, cap_s), torch.float32)
        self.bias0 = torch.full((B, self.peaks.t0), NEG_INF, device=rt.device)
        self.bias0[:, : self.prompt] = 0.0
        self.bias_s = torch.full((B, cap_s), NEG_INF, device=rt.device)
        self._zero = torch.zeros((), device=rt.device)  # device scalar: unmasking a slot needs no host value
        stages = options.access != "host_attention"  # host_attention stages nothing: no ring, no workspace
        ws_slots = cap_s if stages else 0  # staged K/V for attention
        self.ws = rt.device_zeros((KV_TENSORS, B, geom.kv_heads, ws_slots, geom.head_dim), dtype)
        mode = options.prefetch if policy.tiering else None
        caps = (self.peaks.t1, self.peaks.t2, B, geom.row_elems, self.stores.groups, dtype)
        self.ring = StagingRing(rt, options.staging_buffers, *caps) if mode == "layerwise_async" and stages else None
        self.proto = PrototypeCopies(rt, geom.layers) if mode == "sync_per_step" else None
        self.resident = ResidentStage(rt, geom.layers, *caps) if mode == "per_interval" else None
        # the simulator's rule: an offload blocks under sync_per_step or pageable memory
        self.lane = OffloadLane(rt, self.stores, asynchronous=options.prefetch != "sync_per_step" and options.pinned,
                                prototype=options.prefetch == "sync_per_step", pinned=options.pinned)
        self.promotion_sources: list = []  # pinned host blocks of the last promotions (kept until the next re-tier)
        self.scale = geom.head_dim ** -0.5
        # the host's side of host_attention / split; it keeps scores unless the simulator's decisions are replayed
        self.host = (HostAttention(rt, self.stores, dtype, self.scale, geom.layers, replay is None, cap_s)
                     if policy.tiering and options.access != "prefetch" else None)
        self.split_rule = split_rule
        self._staged: dict[int, tuple[int, int]] = {}  # step -> T1, T2 slots staged (split: a prefix of each)
        self._staged_now = (0, 0)
        self._host_step = None  # this step's (host spans, host mask), None when the host attends nothing
        self.host_bias = torch.zeros((B, 0))  # 0 / -inf per host slot, T1 slots then T2 slots (host memory)
        self.step = -1
        # per tier, slots [0, high water) are the ones any row uses: what attention reads, what copies move
        self.t0_high_water, self.t1_high_water, self.t2_high_water = self.prompt, 0, 0
        self._bias = None  # this step's mask over [T0 prefix | staged], None when nothing is masked
        self._appends: dict[int, tuple] = {}
        self._order = None
        self.counters = StepCounters()
        self._ahead_h2d_bytes = 0  # bytes of the next step's first fills, issued at the end of this one
        self.device_kv_peak_bytes = 0
        self.offloaded_tokens = 0
        self.evicted_tokens = 0

    # ---- prompt -----------------------------------------------------------------------------
    def write_prompt(self, layer: int, k, v) -> None:
        """K, V [B, Hkv, P, d] of the prompt (prefill), in slots 0..P-1."""
        self.stores.t0[layer, 0, :, :, : self.prompt] = k
        self.stores.t0[layer, 1, :, :, : self.prompt] = v

    def fill_prompt_random(self, generator) -> None:
        """Seeded random prompt K/V: decode timing does not depend on the values."""
        view = self.stores.t0[:, :, :, :, : self.prompt]
        view.copy_(self.torch.randn(view.shape, generator=generator, device=self.rt.device, dtype=self.dtype))

    # ---- one decode step ---------------------------------------------------------------------
    def begin_step(self) -> None:
        """The new token of every active row takes a T0 slot; sync_per_step copies all layers now."""
        self.step += 1
        s = self.step
        self._staged_now = self.staged_slots(s)  # before the append, as end_step saw the counts
        if s not in self._appends:
            self._plan_appends(s)
        b_host, s_host, b_dev, s_dev = self._appends.pop(s)
        t0 = self.tables[T0]
        pos = self.n[b_host]
        t0.place(b_host, s_host, pos)
        if self.rt.trace is not None:
            self.rt.note("t0_write", list(zip(b_host.tolist(), s_host.tolist())))
        self.slot[b_host, pos], self.tier[b_host, pos] = s_host, T0
        self.n[b_host] += 1
        self._app = (b_dev, s_dev, len(b_host) == self.geom.batch)
        if len(b_host):
            self.bias0.index_put_((b_dev, s_dev), self._zero)
        self.t0_high_water = t0.high_water()
        self._set_bias()
        if self.options.attention == "ordered":
            self._build_order()
        self._host_step = self._host_spans() if self.host is not None else None
        if self._host_step is not None and self.lane.pending is not None:
            with self.rt.exposed(self.counters.stalls):  # the host reads its tokens where they land:
                self.lane.finish()  # an offload still in transit must land first
        if self.proto is not None and self.t1_high_water + self.t2_high_water:
            self.proto.copy_all(self.stores, self.t1_high_water, self.t2_high_water, self.counters)
            self._track_device_bytes()
        elif self.ring is not None and sum(self._staged_now):
            self._prefetch_ahead(s, 0)

    def layer_start(self, layer: int) -> None:
        """Called before a layer's first kernel: issue the copies of the next layer(s)."""
        if self.ring is not None and sum(self._staged_now):
            self._prefetch_ahead(self.step, layer)

    def attend(self, layer: int, q, k, v):
        """q [B, Hkv, G, d]; k, v [B, Hkv, d] of the new token. Returns [B, Hkv, G, d]."""
        torch = self.torch
        host_job = None
        if self._host_step is not None:  # the queries leave first: the host attends while the device does
            host_job = self.host.launch(layer, q, *self._host_step, self.counters)
        b_dev, s_dev, all_rows = self._app
        t0l = self.stores.t0[layer]
        if len(b_dev):
            kv = torch.stack((k, v), dim=1)
            t0l[:, b_dev, :, s_dev] = kv if all_rows else kv[b_dev]
        g1, g2 = self._staged_now
        n0, n_s = self.t0_high_water, g1 + g2
        parts = [(t0l[0, :, :, :n0], t0l[1, :, :, :n0])]
        if n_s:
            self._stage(layer)
            parts.append((self.ws[0, :, :, :n_s], self.ws[1, :, :, :n_s]))
        if host_job is not None:
            out, probs = self._merge_host(host_job, q, parts)
        elif self.options.attention == "ordered":
            dsts, width = self._order
            k_all, v_all, bias = ordered_union(parts, dsts, width)
            out, probs = union_softmax_attention(q, [(k_all, v_all)], bias, self.scale)
            probs = unorder_probs(probs, dsts)
        else:
            out, probs = union_softmax_attention(q, parts, self._bias, self.scale)
        weight = 1.0 / self.geom.layers  # averaged over layers
        self.acc0[:, :n0].add_(probs[:, :n0], alpha=weight)
        if n_s and g1 == self.t1_high_water:  # every T1 slot staged: T1 and T2 columns are adjacent
            self.acc_s[:, :n_s].add_(probs[:, n0:], alpha=weight)
        elif n_s:
            n1 = self.t1_high_water
            self.acc_s[:, :g1].add_(probs[:, n0 : n0 + g1], alpha=weight)
            self.acc_s[:, n1 : n1 + g2].add_(probs[:, n0 + g1 :], alpha=weight)
        return out

    def _merge_host(self, job, q, parts):
        """The device's partial attention (T0 + staged) merged by LSE with the host's; returns the
        output and the device tokens' probabilities in the merged softmax, averaged over heads."""
        out0, lse0, p0 = partial_softmax_attention(q, parts, self._bias, self.scale)
        if self.host.scoring:
            self.host.send_lse(job, lse0, self.counters)
        out_h, lse_h = self.host.collect(job, self.counters)
        out, share0, _ = merge_partials(out0, lse0, out_h, lse_h)
        return out.to(q.dtype), (p0 * share0[..., None]).mean(dim=(1, 2))

    def end_step(self) -> np.ndarray:
        """Re-tier if due; returns tier counts (T0..T3) summed over the rows active this step."""
        s = self.step
        active = np.flatnonzero(self.lengths > s)
        if self.host is not None:
            self.host.drain()  # the step's score folds are done: re-tiering reads the scores
        if self.proto is not None:
            self.proto.discard()  # the prototype drops its copies after the step
        if self.policy.retier_due(s):
            retier(self, active)
            if self.resident is not None and self.t1_high_water + self.t2_high_water:
                self.resident.refresh(self.stores, self.t1_high_water, self.t2_high_water, self.counters,
                                      self.lane.patch)
            self._track_device_bytes()
        self.lane.poll()
        if self.ring is not None and s + 1 < self.steps and sum(self.staged_slots(s + 1)):
            before = self.counters.h2d_bytes
            self._prefetch_ahead(s + 1, 0)  # overlaps the LM head and sampling
            # its bytes are step s+1's (as the simulator counts them); its copy time stays where it ran
            self._ahead_h2d_bytes, self.counters.h2d_bytes = self.counters.h2d_bytes - before, before
        self._track_device_bytes()
        return self.row_counts()[active].sum(axis=0)

    def drain(self) -> None:
        """Land any offload still in flight (host-blocking): the host stores are then complete."""
        if self.host is not None:
            self.host.drain()
        self.lane.finish()

    def close(self) -> None:
        """Stop the host attention worker (nothing else holds a thread)."""
        if self.host is not None:
            self.host.close()

    def take_counters(self) -> StepCounters:
        c, self.counters = self.counters, StepCounters(h2d_bytes=self._ahead_h2d_bytes)
        self._ahead_h2d_bytes = 0
        return c

    # ---- state ------------------------------------------------------------------------------
    def row_counts(self) -> np.ndarray:
        """[B, 4] live tokens per tier; T3 = tokens that exist minus resident ones."""
        out = np.zeros((self.geom.batch, len(TIERS)), dtype=np.int64)
        for tier in (T0, T1, T2):
            out[:, tier] = self.tables[tier].live_counts()
        out[:, T3] = self.n - out[:, :T3].sum(axis=1)
        return out

    def after_retier(self) -> None:
        """Masks and prefixes follow the slot tables (called by the re-tier once data has moved)."""
        torch = self.torch
        t0, t1, t2 = self.tables
        self.bias0.copy_(torch.as_tensor(np.where(t0.pos != FREE, 0.0, NEG_INF), dtype=torch.float32))
        self.t1_high_water, self.t2_high_water = t1.high_water(), t2.high_water()
        live = np.concatenate([t1.live_mask(self.t1_high_water), t2.live_mask(self.t2_high_water)], axis=1)
        self.bias_s.fill_(NEG_INF)
        if live.shape[1]:
            self.bias_s[:, : live.shape[1]] = torch.as_tensor(np.where(live, 0.0, NEG_INF), dtype=torch.float32)
        if self.host is not None:
            self.host_bias = torch.as_tensor(np.where(live, 0.0, NEG_INF), dtype=torch.float32)
        self._appends.clear()
        self._staged.clear()

    def attention_workspace_bytes(self) -> int:
        """The one-layer workspace attention reads staged tokens from: a real allocation beside the
        staging the simulator counts (`staging_buffers` layer buffers, or every layer)."""
        return self.ws.numel() * self.ws.element_size()

    def staging_bytes(self) -> int:
        """Device copies of T1/T2 held now: ring buffers, resident layers or this step's prototype copies."""
        held = [x.nbytes() for x in (self.ring, self.resident, self.proto) if x is not None]
        return sum(held)

    def device_kv_bytes(self) -> int:
        """T0 live bytes + staging + attention workspace + offloads in flight: the cache's share of
        device memory now."""
        live0 = int(self.tables[T0].live_counts().sum())
        return (live0 * self.geom.layers * self.stores.full_row_bytes + self.staging_bytes()
                + self.attention_workspace_bytes() + self.lane.device_bytes())

    def _track_device_bytes(self) -> None:
        """Called where device memory peaks inside a step (prototype copies, a re-tier's offload)."""
        self.device_kv_peak_bytes = max(self.device_kv_peak_bytes, self.device_kv_bytes())

    def host_kv_bytes(self) -> int:
        """T1 + T2 live bytes (the simulator's host figure)."""
        L = self.geom.layers
        live1 = int(self.tables[T1].live_counts().sum())
        live2 = int(self.tables[T2].live_counts().sum())
        return L * (live1 * self.stores.full_row_bytes + live2 * self.stores.t2_row_bytes)

    # ---- internals ----------------------------------------------------------------------------
    def _next_retier_step(self, s: int) -> int:
        for t in range(s, self.steps):
            if self.policy.retier_due(t):
                return t
        return self.steps - 1

    def _plan_appends(self, s: int) -> None:
        """T0 slots of every append until the next re-tier: no frees happen in between, so they are
        known now, and the device index tensors are uploaded once, outside the hot loop."""
        torch = self.torch
        last = self._next_retier_step(s)
        per_row = {}
        for b in range(self.geom.batch):
            k = max(0, min(int(self.lengths[b]), last + 1) - s)
            per_row[b] = self.tables[T0].peek(b, k)
        for t in range(s, last + 1):
            rows = np.flatnonzero(self.lengths > t)
            slots = np.array([per_row[b][t - s] for b in rows], dtype=np.int64)
            self._appends[t] = (rows, slots, torch.as_tensor(rows, device=self.rt.device),
                                torch.as_tensor(slots, device=self.rt.device))

    def staged_slots(self, step: int) -> tuple[int, int]:
        """T1 and T2 slots [0, g1), [0, g2) staged to the device at `step`; the rest of each host
        tier's slots [g, high water) is attended on the host (prefetch: every slot staged)."""
        n1, n2 = self.t1_high_water, self.t2_high_water
        if self.options.access == "prefetch" or not self.policy.tiering or n1 + n2 == 0:
            return n1, n2
        if step not in self._staged:
            f = self._host_fraction(step)
            self._staged[step] = (n1 - round(f * n1), n2 - round(f * n2))
        return self._staged[step]

    def _host_fraction(self, step: int) -> float:
        """Share of the host slots attended on the host: all (host_attention), the fixed option, or
        the split rule for the step's tier counts (active rows, their new tokens in T0)."""
        if self.options.access == "host_attention":
            return 1.0
        if self.options.host_fraction is not None:
            return self.options.host_fraction
        active = np.flatnonzero(self.lengths > step)
        t0, t1, t2, _ = (int(x) for x in self.row_counts()[active].sum(axis=0))
        return float(self.split_rule(len(active), t0 + len(active), t1, t2))

    def _host_spans(self):
        """(spans, mask) of the slots the host attends this step, or None."""
        (g1, g2), n1, n2 = self._staged_now, self.t1_high_water, self.t2_high_water
        spans = tuple(HostSpan(tier, g, n, column)
                      for tier, g, n, column in ((T1, g1, n1, 0), (T2, g2, n2, n1)) if g < n)
        if not spans:
            return None
        bias = self.torch.cat([self.host_bias[:, sp.column + sp.start : sp.column + sp.end] for sp in spans], dim=1)
        return spans, bias

    def _set_bias(self) -> None:
        """One mask per step (not per layer): empty T0 slots and empty staged slots."""
        t0_holes = bool((self.tables[T0].live_counts() < self.t0_high_water).any())
        (g1, g2), n1 = self._staged_now, self.t1_high_water
        n_s = g1 + g2
        if n_s and g1 == n1:  # every T1 slot staged: the staged columns are a prefix of bias_s
            self._bias = self.torch.cat([self.bias0[:, : self.t0_high_water], self.bias_s[:, :n_s]], dim=1)
        elif n_s:
            self._bias = self.torch.cat([self.bias0[:, : self.t0_high_water], self.bias_s[:, :g1],
                                         self.bias_s[:, n1 : n1 + g2]], dim=1)
        else:
            self._bias = self.bias0[:, : self.t0_high_water] if t0_holes else None

    def _prefetch_ahead(self, step: int, layer: int) -> None:
        """Fill, in layer order, every buffer whose previous contents have been read."""
        ring, L = self.ring, self.geom.layers
        for j in range(layer, min(layer + len(ring.buffers), L)):
            key = (step, j)
            if ring.holds(key, j):
                continue
            if not ring.can_fill(key, j):
                break
            ring.fill(key, j, self.stores, *self.staged_slots(step), self.counters, self.lane.patch)

    def _stage(self, layer: int) -> None:
        """This layer's T1/T2 tokens into the attention workspace (T2 dequantised)."""
        if self.ring is not None:
            key = (self.step, layer)
            if not self.ring.holds(key, layer):
                self._prefetch_ahead(self.step, layer)
            buf = self.ring.acquire(key, layer, self.counters)
            self._to_workspace(buf.t1, buf.t2q, buf.t2s)
            self.ring.release(buf)
        else:
            stage = self.proto if self.proto is not None else self.resident
            self._to_workspace(*stage.layer(layer))

    def _to_workspace(self, t1, t2q, t2s) -> None:
        """t1: rows [n, B, R], or (K, V) halves [n, B, R/2] as the prototype copies them; the
        step's staged slots of each tier."""
        g, (n1, n2) = self.geom, self._staged_now
        shape = (g.batch, KV_TENSORS, g.kv_heads, g.head_dim)
        if n1 and isinstance(t1, tuple):
            for i, half in enumerate(t1):
                self.ws[i, :, :, :n1].copy_(half[:n1].view(n1, g.batch, g.kv_heads, g.head_dim).permute(1, 2, 0, 3))
        elif n1:
            self.ws[:, :, :, :n1].copy_(t1[:n1].view(n1, *shape).permute(2, 1, 3, 0, 4))
        if n2:
            x = dequantize_int8(t2q[:n2], t2s[:n2], self.dtype)
            self.ws[:, :, :, n1 : n1 + n2].copy_(x.view(n2, *shape).permute(2, 1, 3, 0, 4))

    def _build_order(self) -> None:
        """For `ordered` attention: where each T0 / staged slot lands in token order."""
        torch = self.torch
        t0, t1, t2 = self.tables
        pos0 = t0.pos[:, : self.t0_high_water]
        pos_s = np.concatenate([t1.pos[:, : self.t1_high_water], t2.pos[:, : self.t2_high_water]], axis=1)
        both = np.concatenate([pos0, pos_s], axis=1)
        counts = (both != FREE).sum(axis=1)
        width = int(counts.max())
        dst = np.full(both.shape, width, dtype=np.int64)
        for b in range(self.geom.batch):
            live = both[b] != FREE
            order = np.sort(both[b, live])
            dst[b, live] = np.searchsorted(order, both[b, live])
        src = torch.from_numpy(dst)
        if self.rt.is_cuda:  # pinned + non_blocking: a pageable upload would make the host wait every step
            src = src.pin_memory()
        dev = src.to(self.rt.device, non_blocking=True)
        self._order = ([dev[:, : self.t0_high_water], dev[:, self.t0_high_water :]], width)


def _check_access(options: CacheOptions, split_rule) -> None:
    if options.access not in ACCESS_MODES:
        raise ValueError(f"access {options.access!r}; expected one of {ACCESS_MODES}")
    if options.access == "prefetch":
        return
    if options.prefetch != "layerwise_async":
        raise ValueError(f"access {options.access!r} runs with prefetch 'layerwise_async', got {options.prefetch!r}")
    if options.attention != "merged":
        raise ValueError(f"access {options.access!r} merges the host's partial attention by LSE: "
                         f"attention 'merged' only")
    f = options.host_fraction
    if f is not None and not 0.0 <= f <= 1.0:
        raise ValueError(f"host_fraction {f}: expected 0 to 1")
    if options.access == "split" and f is None and split_rule is None:
        raise ValueError("access 'split' needs a host_fraction or a split_rule")
