"""The decode engine's exact event log, SimPy-test style: for a hand-built two-step tier plan on the
tiny 4-layer model, who used which link direction from when to when. Link figures are set by hand
(no latency, 1 GB/s each way, 0.25 GB/s each while both are busy) so every copy's duration is
bytes / bandwidth; compute durations come from the step's own cost (`physics.decode_step_cost`).

Pinned here: one copy engine vs several, both directions busy at once (bidirectional share), a
blocking offload vs an asynchronous one, and `per_interval` traffic."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.decode.engine import DecodeSim
from sim.device.hardware import LinkModel
from sim.inputs.scenario import load_scenario
from sim.tiering.tier_plan import MOVE_COLUMNS, MV_D2H_T1, TierPlan

from .conftest import SCENARIOS

BW, BIDIR = 1e9, 0.25e9  # bytes/s one way; each way while both directions are busy
PROMPT, ACTIVE, MOVED = 100, 1, 40  # T0 tokens at step 0; one sequence; tokens the re-tier moves to T1


def context(*overrides: str):
    sc = load_scenario(SCENARIOS / "cpu-tiny.yaml", ["workload.batch_size=1", *overrides])
    ctx = build_context(sc)
    link = LinkModel(per_copy_latency_s=0.0, bytes_per_s=BW, bidirectional_bytes_per_s=BIDIR)
    hw = dataclasses.replace(ctx.hw, h2d=link, d2h=link, copy_engines=ctx.hw.copy_engines)
    return dataclasses.replace(ctx, hw=hw)


def with_engines(ctx, engines: int):
    return dataclasses.replace(ctx, hw=dataclasses.replace(ctx.hw, copy_engines=engines))


def two_step_plan() -> TierPlan:
    """Step 0 attends T0 only; its re-tier moves MOVED tokens to T1; step 1 attends them from T1."""
    attended = np.array([[PROMPT, 0, 0, ACTIVE], [PROMPT + 1 - MOVED, MOVED, 0, ACTIVE]])
    tiers_after = np.array([[PROMPT - MOVED, MOVED, 0, 0], [PROMPT + 1 - MOVED, MOVED, 0, 0]])
    moves = np.zeros((2, MOVE_COLUMNS), dtype=np.int64)
    moves[0, MV_D2H_T1] = MOVED
    return TierPlan(lengths=np.array([2]), attended=attended, tiers_after=tiers_after, retier_moves=moves,
                    retier_due=np.array([True, False]))


def link_log(sim: DecodeSim) -> list[tuple[str, str, float, float]]:
    """(direction, what, start, end) of every copy, in start order."""
    rows = [(r["kind"], r["what"], r["start_s"], r["end_s"]) for r in sim.timeline if r["kind"] != "compute"]
    return sorted(rows, key=lambda r: (r[2], r[0]))


def run(ctx, plan=None) -> DecodeSim:
    sim = DecodeSim(ctx, plan or two_step_plan())
    sim.run()
    return sim


def test_async_offload_shares_the_link_with_the_next_steps_prefetch():
    ctx = with_engines(context(), 2)
    sim = run(ctx)
    L, kv = ctx.num_layers, ctx.kv_bytes_per_token_layer
    step0 = sim.step_cost(0).compute_s
    offload_s = L * MOVED * kv / BW  # nothing else on the link when it starts: full bandwidth
    log = link_log(sim)
    assert log[0] == ("d2h", "offload", pytest.approx(step0), pytest.approx(step0 + offload_s))
    first_prefetch = log[1]
    assert first_prefetch[:2] == ("h2d", "prefetch L0")
    # the copier issues each layer's copy as soon as a staging buffer is free: layer 0 at the step start
    assert first_prefetch[2] == pytest.approx(step0)
    assert first_prefetch[3] - first_prefetch[2] == pytest.approx(MOVED * kv / BIDIR)  # D2H busy: shared
    assert sim.records[0].step_s == pytest.approx(step0)  # the offload did not block step 0
    assert sim.records[0].d2h_bytes == L * MOVED * kv and sim.records[1].h2d_bytes == L * MOVED * kv


def test_one_copy_engine_serialises_the_offload_and_the_prefetch():
    ctx = with_engines(context(), 1)
    sim = run(ctx)
    L, kv = ctx.num_layers, ctx.kv_bytes_per_token_layer
    log = link_log(sim)
    offload, first_prefetch = log[0], log[1]
    assert offload[:2] == ("d2h", "offload")
    assert first_prefetch[:2] == ("h2d", "prefetch L0")
    assert first_prefetch[2] == pytest.approx(offload[3])  # waits for the shared copy engine
    assert first_prefetch[3] - first_prefetch[2] == pytest.approx(MOVED * kv / BW)  # no sharing: full bandwidth
    prefetches = [r for r in log if r[0] == "h2d"]
    assert len(prefetches) == L
    for a, b in zip(prefetches, prefetches[1:]):
        assert b[2] >= a[3] - 1e-15  # one direction never overlaps itself


def test_blocking_offload_ends_the_step_before_the_next_starts():
    ctx = with_engines(context("policy.pinned=false"), 2)
    sim = run(ctx)
    L, kv = ctx.num_layers, ctx.kv_bytes_per_token_layer
    step0 = sim.step_cost(0).compute_s
    offload_s = L * MOVED * kv / BW
    assert sim.records[0].step_s == pytest.approx(step0 + offload_s)
    assert sim.records[0].stall_s == pytest.approx(offload_s)
    log = link_log(sim)
    assert log[0] == ("d2h", "offload", pytest.approx(step0), pytest.approx(step0 + offload_s))
    assert log[1][2] == pytest.approx(step0 + offload_s)  # the next step's first copy starts after it
    assert log[1][3] - log[1][2] == pytest.approx(MOVED * kv / BW)  # the link is no longer shared


def test_per_interval_brings_host_tokens_back_at_the_retier_and_not_every_step():
    ctx = with_engines(context("policy.prefetch=per_interval"), 2)
    sim = run(ctx)
    L, kv = ctx.num_layers, ctx.kv_bytes_per_token_layer
    step0 = sim.step_cost(0).compute_s
    log = link_log(sim)
    assert [r[:2] for r in log] == [("d2h", "offload"), ("h2d", "promote")]  # no per-layer prefetch
    offload, bring_back = log
    # the resident copy of T1 (L layers x one block each) runs while the offload is in flight: shared
    assert bring_back[2] == pytest.approx(step0)
    assert bring_back[3] - bring_back[2] == pytest.approx(L * MOVED * kv / BIDIR)
    assert sim.records[0].h2d_bytes == L * MOVED * kv  # counted at the re-tier...
    assert sim.records[1].h2d_bytes == 0.0  # ...and not again while the tokens stay resident
    assert sim.records[1].stall_s == 0.0
