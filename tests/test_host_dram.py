"""Host DRAM shared by the host attention stream and the link's DMA (issue #12): the max-min shares,
the SimPy resource, the closed form of a host-access step and the engine's event log, each against
hand arithmetic."""

from __future__ import annotations

import dataclasses

import pytest
import simpy

from sim.device.hardware import HostCpu
from sim.device.host_dram import HostDram
from sim.device.host_pipeline import HostLayer, dram_shares_bytes_per_s, dram_speeds, host_pipeline

from .test_engine_events import MOVED, context, run, two_step_plan

GB = 1e9


def test_max_min_shares_by_hand():
    assert dram_shares_bytes_per_s([10 * GB, 20 * GB], 100 * GB) == [10 * GB, 20 * GB]  # they fit
    # a 55 GB/s copy beside a 368.64 GB/s socket keeps its rate; the stream gets the rest
    assert dram_shares_bytes_per_s([368.64 * GB, 55 * GB], 368.64 * GB) == pytest.approx([313.64 * GB, 55 * GB])
    # Grace's C2C (340 GB/s) is above half of 409.6: both get half
    assert dram_shares_bytes_per_s([409.6 * GB, 340 * GB], 409.6 * GB) == pytest.approx([204.8 * GB, 204.8 * GB])
    # three: 10 is below 90/3 and served; 50 is above (90 - 10)/2 = 40: both others get 40
    assert dram_shares_bytes_per_s([100 * GB, 10 * GB, 50 * GB], 90 * GB) == pytest.approx([40 * GB, 10 * GB, 40 * GB])
    # copies alone run at their link rates; a flow alone at its own
    assert dram_speeds([80 * GB, 80 * GB], [False, False], 100 * GB) == [1.0, 1.0]
    assert dram_speeds([120 * GB], [True], 100 * GB) == [1.0]
    assert dram_speeds([100 * GB, 25 * GB], [True, False], 100 * GB) == pytest.approx([0.75, 1.0])


def _run(dram: HostDram, flows: list[tuple[float, float, float, bool]]) -> list[float]:
    """Start each (start_s, alone_s, bytes, stream) flow at its time; each one's finish."""
    env, ends = dram.env, [0.0] * len(flows)

    def one(i, start, alone, nbytes, stream):
        yield env.timeout(start)
        yield from dram.flow(alone, nbytes, stream)
        ends[i] = env.now

    for i, f in enumerate(flows):
        env.process(one(i, *f))
    env.run()
    return ends


def test_host_attention_beside_an_offload_by_hand():
    """A stream of X = 6 GB with B = 100 GB/s to itself (0.06 s) starts at 20 ms, while an offload of
    Y = 2 GB at the link's L = 25 GB/s (0.08 s) started at 0 is in flight."""
    env = simpy.Environment()
    offload_end, stream_end = _run(HostDram(env, 100 * GB), [(0.0, 0.08, 2 * GB, False), (0.02, 0.06, 6 * GB, True)])
    # L = 25 is below an equal split of B: the offload keeps its rate and lands at Y / L
    assert offload_end == pytest.approx(0.08)
    # the stream gets B - L = 75 GB/s until then: 0.06 s x 75 = 4.5 GB; the last 1.5 GB at 100 GB/s
    assert stream_end == pytest.approx(0.02 + 0.06 + 1.5 / 100)
    # a socket of B = 40 GB/s (a stream of 2.4 GB takes 0.06 s) is below 2 x L: both get 20 GB/s
    env = simpy.Environment()
    offload_end, stream_end = _run(HostDram(env, 40 * GB), [(0.0, 0.08, 2 * GB, False), (0.02, 0.06, 2.4 * GB, True)])
    assert offload_end == pytest.approx(0.02 + 1.5 / 20)  # 1.5 GB left at 20 ms, at 20 GB/s
    assert stream_end == pytest.approx(0.095 + (2.4 - 20 * 0.075) / 40)  # 1.5 GB by then, 0.9 GB left at 40
    # nothing beside it: a flow takes exactly its time alone
    env = simpy.Environment()
    assert _run(HostDram(env, 40 * GB), [(0.01, 0.06, 2.4 * GB, True)]) == [0.01 + 0.06]


def test_closed_form_of_a_split_step_by_hand():
    """Two layers, one staging buffer, copy 4 s (4 GB), stream 2 s alone (6 GB, 3 GB/s)."""
    x = HostLayer(pre_s=1.0, attention_s=1.0, after_s=1.0, copy_s=4.0, copy_bytes=4 * GB, query_s=0.5,
                  query_shared_s=1.0, dispatch_s=0.0, stream_s=2.0, stream_bytes=6 * GB, partials_s=0.5)
    t = host_pipeline(x, 2, 1, 3.5 * GB, partials_behind_copies=False)
    # copy 0 [0, 4]; layer 0 takes it at 4 and issues copy 1 [4, 8]: the query shares (1 s), the stream
    # starts at 5 beside 3 s of copy: demands (3, 1) of 3.5 GB/s -> the stream 2.5/3 of its speed,
    # done after 2 / (5/6) = 2.4 s at 7.4 (the copy keeps its rate: ends at 8); partials [7.4, 7.9],
    # layer 0 ends at max(4 + 1, 7.9) + 1 = 8.9
    assert t.copies == [(0.0, 4.0), (4.0, pytest.approx(8.0))]
    assert t.host[0] == (5.0, pytest.approx(7.4)) and t.layers[0][1] == pytest.approx(8.9)
    # layer 1: put at 9.9, no copy in flight: query 0.5, stream alone 2 s, partials, after: 13.9
    assert t.host[1] == (pytest.approx(10.4), pytest.approx(12.4)) and t.finish_s == pytest.approx(13.9)
    # the partials queue behind the copy where they share its engine: [8, 8.5]; then 10.5 + 0.5 + 2 + 0.5 + 1
    t = host_pipeline(x, 2, 1, 3.5 * GB, partials_behind_copies=True)
    assert t.partials[0] == (pytest.approx(8.0), pytest.approx(8.5)) and t.finish_s == pytest.approx(14.5)
    # a copy of 8 GB in 4 s (2 GB/s) beside a 3 GB/s socket: above half of it, so both flows get 1.5:
    # the stream runs at 1/2 of its speed, the copy at 3/4; copy 1's 3 s left at 5 take 4 s, as the
    # stream's 2 s at half speed do: both end at 9; partials [9, 9.5], layer 0 ends at 10.5
    x2 = dataclasses.replace(x, copy_bytes=8 * GB)
    t = host_pipeline(x2, 2, 1, 3 * GB, partials_behind_copies=False)
    assert t.copies[1] == (4.0, pytest.approx(9.0)) and t.host[0] == (5.0, pytest.approx(9.0))
    assert t.layers[0][1] == pytest.approx(10.5)
    assert t.finish_s == pytest.approx(11.5 + 0.5 + 2 + 0.5 + 1)  # layer 1 alone: put at 11.5


def _host_context(memory_bytes_per_s: float, stream_bytes_per_s: float):
    """The engine-events context (no latency, 1 GB/s each way) with host attention on a host whose
    stream reads at `stream_bytes_per_s` from a DRAM of `memory_bytes_per_s`, no dispatch, FLOPs free."""
    ctx = context("policy.access=host_attention")
    cpu = HostCpu("hand", dram_bytes_per_s=stream_bytes_per_s, flop_per_s=1e30, dispatch_s=0.0,
                  memory_bytes_per_s=memory_bytes_per_s)
    return dataclasses.replace(ctx, hw=dataclasses.replace(ctx.hw, host_cpu=cpu, copy_engines=3))


def _logs(sim):
    """Step 0's offload (None without one) and step 1's host intervals."""
    offload = next((r for r in sim.timeline if r["what"] == "offload"), None)
    host = [(r["start_s"], r["end_s"]) for r in sim.timeline if r.get("step") == 1 and r["kind"] == "host"]
    return offload, host


def test_engine_host_attention_shares_the_dram_with_the_offload():
    """Step 0's re-tier offloads L x 40 tokens at 1 GB/s beside step 1, which attends those 40 tokens
    per layer on the host: a stream of X = 40 x kv bytes per layer at 2.5 GB/s from a 3 GB/s DRAM.
    While the offload is in flight the stream gets 3 - 1 = 2 GB/s; after it lands, 2.5. The GPU's own
    attention is made free (no floor) so that the host's stream, not the GPU, sets each layer."""
    ctx = _host_context(3 * GB, 2.5 * GB)
    ctx = dataclasses.replace(ctx, hw=dataclasses.replace(ctx.hw, kernels=None, attention_latency_s=0.0))
    sim = run(ctx, two_step_plan())
    L, kv = ctx.num_layers, ctx.kv_bytes_per_token_layer
    X = MOVED * kv
    offload, host = _logs(sim)
    step0 = sim.records[0].step_s
    assert (offload["start_s"], offload["end_s"]) == (pytest.approx(step0), pytest.approx(step0 + L * X / GB))
    end = offload["end_s"]
    assert host[0][1] < end  # the offload outlasts the first layers' streams
    for a, b in host:
        if b <= end:
            assert b - a == pytest.approx(X / (2 * GB))
        elif a >= end:
            assert b - a == pytest.approx(X / (2.5 * GB))
        else:  # straddles the offload's end: at 2 GB/s until it lands, the rest at 2.5
            assert b - a == pytest.approx((end - a) + (X - 2 * GB * (end - a)) / (2.5 * GB))
    assert sim.records[1].step_s > sim.step_cost(1).closed_form_s(ctx.hw, 0.0, 2)  # slower than with the DRAM to itself


def test_engine_offload_slows_down_where_the_dram_is_short():
    """A 1.5 GB/s DRAM and a stream of 1.5 GB/s: the 1 GB/s offload is above the fair 0.75, so both
    run at 0.75 while a stream is in flight; the offload lands late by a quarter of the stream time
    it overlapped."""
    ctx = _host_context(1.5 * GB, 1.5 * GB)
    sim = run(ctx, two_step_plan())
    L, kv = ctx.num_layers, ctx.kv_bytes_per_token_layer
    X = MOVED * kv
    offload, host = _logs(sim)
    start, end = offload["start_s"], offload["end_s"]
    overlap = sum(max(0.0, min(b, end) - max(a, start)) for a, b in host)
    assert overlap > 0
    assert end == pytest.approx(start + L * X / GB + 0.25 * overlap)  # 3/4 speed while overlapped
    for a, b in host:
        if b <= end:
            assert b - a == pytest.approx(X / (0.75 * GB))
        elif a >= end:
            assert b - a == pytest.approx(X / (1.5 * GB))


def test_without_dma_beside_it_the_host_path_is_unchanged():
    """Nothing else on the link: the host path takes query + stream alone + dispatch + partials, as
    before the DRAM was shared (`HostPath.time_s`), in the engine as in the closed form."""
    ctx = _host_context(3 * GB, 2.5 * GB)
    plan = two_step_plan()
    plan = dataclasses.replace(plan, retier_moves=plan.retier_moves * 0)  # step 0 offloads nothing
    sim = run(ctx, plan)
    cost = sim.step_cost(1)
    offload, host = _logs(sim)
    assert offload is None and len(host) == ctx.num_layers
    assert all(b - a == pytest.approx(cost.host.host_s, rel=1e-12) for a, b in host)
    assert sim.records[1].step_s == pytest.approx(cost.closed_form_s(ctx.hw, 0.0, 2), rel=1e-12)
    layer = cost.layer.total_s - cost.layer.attention_s + max(cost.layer.attention_s, cost.host.time_s(ctx.hw))
    assert sim.records[1].step_s == pytest.approx(ctx.num_layers * layer + cost.tail_s, rel=1e-12)



def test_pair_speeds_array_equals_the_rule():
    import numpy as np

    from sim.decode.fast_host import pair_speeds

    rng = np.random.default_rng(3)
    h = np.concatenate([rng.uniform(0, 5, 300), [0.0, 2.0, 1.0, 1.75]])
    c = np.concatenate([rng.uniform(0, 5, 300), [1.0, 0.0, 1.0, 1.75]])
    s_host, s_copy = pair_speeds(h, c, 3.5)
    for i in range(len(h)):
        assert [s_host[i], s_copy[i]] == dram_speeds([h[i], c[i]], [True, False], 3.5)
