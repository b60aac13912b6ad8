"""The real tiered KV cache on the CPU: exactness per tier, agreement with sim/tiering/tiers.py, token
conservation, compounding eviction, and the staging ring's buffer reuse."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hwprobe.cache import CacheGeometry, CacheOptions, Runtime, TieredKVCache  # noqa: E402
from hwprobe.cache.peaks import batch_peaks  # noqa: E402
from hwprobe.cache.quant import dequantize_int8, max_error_bound, quantize_int8  # noqa: E402
from hwprobe.cache.slots import FREE, SlotTable  # noqa: E402
from sim.inputs.scenario import ImportanceCfg  # noqa: E402
from sim.tiering.sequence import SequenceTiers  # noqa: E402
from sim.tiering.tiers import T0, T1, T2, T3, TierPolicy  # noqa: E402

PROMPT = 6
GROUP = 4
HKV, G, D = 2, 2, 8
FLOAT_SLACK = 1 + 4 * torch.finfo(torch.float32).eps  # dequantisation rounds once more

T1_ONLY = TierPolicy(hbm_ratio=0.5, evict_ratio=0.0, compressed_ratio=0.0, retier_interval=4, sink_tokens=1, recent_window=4)
WITH_T2 = TierPolicy(hbm_ratio=0.3, evict_ratio=0.0, compressed_ratio=0.7, retier_interval=4, sink_tokens=1, recent_window=4)
WITH_T3 = TierPolicy(hbm_ratio=0.5, evict_ratio=0.3, compressed_ratio=0.0, retier_interval=4, sink_tokens=1, recent_window=4)
MIXED = TierPolicy(hbm_ratio=0.4, evict_ratio=0.1, compressed_ratio=0.3, retier_interval=4, sink_tokens=1, recent_window=4)
FULL = TierPolicy(kind="full_hbm")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one thread avoids OpenMP spinning on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make(policy, layers=2, batch=2, lengths=None, trace=None, rt=None, **opts):
    rt = rt or Runtime("cpu", trace=trace)
    lengths = lengths or [40] * batch
    geom = CacheGeometry(layers, batch, HKV, D)
    cache = TieredKVCache(rt, geom, policy, CacheOptions(group_size=GROUP, **opts), PROMPT, lengths, torch.float32)
    cache.fill_prompt_random(torch.Generator().manual_seed(7))
    return cache


def drive(caches, steps, seed=0, on_step=None):
    """Identical random q/k/v into every cache; returns each cache's outputs [(step, layer) -> out]
    and the K/V of every generated token by (row, position)."""
    g = torch.Generator().manual_seed(seed)
    c0 = caches[0]
    B, L = c0.geom.batch, c0.geom.layers
    outs = [[] for _ in caches]
    kv = {}
    for s in range(steps):
        for c in caches:
            c.begin_step()
        for layer in range(L):
            q = torch.randn(B, HKV, G, D, generator=g)
            k = torch.randn(B, HKV, D, generator=g)
            v = torch.randn(B, HKV, D, generator=g)
            for b in range(B):
                kv[(b, PROMPT + s, layer)] = torch.stack((k[b], v[b])).reshape(-1)
            for i, c in enumerate(caches):
                c.layer_start(layer)
                outs[i].append(c.attend(layer, q, k, v))
        for c in caches:
            c.end_step()
        if on_step:
            on_step(s)
    return outs, kv


def test_t1_offload_is_bitwise_exact_with_the_same_kernel():
    full, tiered = make(FULL, attention="ordered"), make(T1_ONLY, attention="ordered")
    seen_t1 = []
    outs, _ = drive([full, tiered], 30, on_step=lambda s: seen_t1.append(tiered.t1_high_water))
    assert max(seen_t1) > 0, "nothing was offloaded: the comparison would be vacuous"
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_t1_offload_merged_softmax_within_float_rounding():
    full, tiered = make(FULL), make(T1_ONLY)
    outs, _ = drive([full, tiered], 30)
    diff = max((a - b).abs().max().item() for a, b in zip(*outs))
    scale = max(a.abs().max().item() for a in outs[0])
    assert diff <= 16 * torch.finfo(torch.float32).eps * max(1.0, scale)


def test_sync_per_step_gives_the_same_result_as_layerwise_async():
    a, b = make(MIXED), make(MIXED, prefetch="sync_per_step")
    outs, _ = drive([a, b], 30)
    assert all(torch.equal(x, y) for x, y in zip(*outs))
    assert b.ring is None and a.ring is not None


def test_quantize_error_at_most_half_a_step():
    x = torch.randn(300, 32) * torch.logspace(-9, 4, 300)[:, None]
    x[0] = 0.0
    q, s = quantize_int8(x, GROUP)
    err = (dequantize_int8(q, s, torch.float32) - x).abs().reshape(300, -1, GROUP)
    assert bool((err <= max_error_bound(s).unsqueeze(-1) * FLOAT_SLACK).all())
    assert q.abs().max().item() == 127 and s.dtype == torch.float16


def test_t2_tokens_hold_int8_within_bound_and_change_attention():
    full, tiered = make(FULL, attention="ordered"), make(WITH_T2, attention="ordered")
    outs, kv = drive([full, tiered], 24)
    st = tiered.stores
    checked = 0
    for b in range(tiered.geom.batch):
        for pos in np.flatnonzero(tiered.tier[b, : tiered.n[b]] == T2):
            slot = tiered.slot[b, pos]
            for layer in range(tiered.geom.layers):
                orig = kv[(b, pos, layer)] if pos >= PROMPT else full.stores.t0[layer, :, b, :, pos].reshape(-1)
                got = dequantize_int8(st.t2q[layer, slot, b], st.t2s[layer, slot, b], torch.float32)
                bound = max_error_bound(st.t2s[layer, slot, b]).repeat_interleave(GROUP)
                assert bool(((got - orig).abs() <= bound * FLOAT_SLACK).all())
                checked += 1
    assert checked > 0
    assert any(not torch.equal(a, b) for a, b in zip(*outs)), "int8 T2 should perturb attention"


def test_eviction_changes_the_output():
    full, tiered = make(FULL, attention="ordered"), make(WITH_T3, attention="ordered")
    outs, _ = drive([full, tiered], 20)
    before = WITH_T3.retier_interval * full.geom.layers  # outputs before the first re-tier are equal
    assert all(torch.equal(a, b) for a, b in zip(outs[0][:before], outs[1][:before]))
    assert tiered.evicted_tokens > 0
    assert max((a - b).abs().max().item() for a, b in zip(outs[0][before:], outs[1][before:])) > 1e-3


@pytest.mark.parametrize("semantics", ["global", "paper_prototype"])
def test_tier_counts_equal_the_simulator(semantics):
    policy = TierPolicy(semantics=semantics, hbm_ratio=0.4, evict_ratio=0.1, compressed_ratio=0.3,
                        retier_interval=4, sink_tokens=1, recent_window=4)
    cache = make(policy, batch=2, lengths=[40, 40])
    rng = np.random.default_rng(0)
    sims = [SequenceTiers(PROMPT, PROMPT + 40, policy, ImportanceCfg(), rng) for _ in range(2)]
    mismatches = []

    def check(step):
        for b, seq in enumerate(sims):
            seq.append_token()
            if policy.retier_due(step):
                seq.retier()
            if tuple(cache.row_counts()[b]) != seq.counts():
                mismatches.append((step, b, tuple(cache.row_counts()[b]), seq.counts()))

    drive([cache], 40, on_step=check)
    assert not mismatches
    assert cache.row_counts()[:, T1].min() > 0 and cache.row_counts()[:, T2].min() > 0


def test_physical_stores_hold_exactly_the_assigned_tokens():
    """Each tier's slot table holds the positions sim/tiering/tiers.py assigned to that tier, and T0/T1
    slots hold those tokens' K/V bit for bit (unless the token passed through lossy T2)."""
    full, cache = make(FULL), make(MIXED)
    problems = []
    was_t2 = np.zeros((cache.geom.batch, cache.tier.shape[1]), dtype=bool)

    def check(step):
        was_t2[:] |= cache.tier == T2
        for b in range(cache.geom.batch):
            n = int(cache.n[b])
            for tier in (T0, T1, T2):
                table = cache.tables[tier]
                stored = np.sort(table.pos[b][table.pos[b] != FREE])
                assigned = np.flatnonzero(cache.tier[b, :n] == tier)
                if not np.array_equal(stored, assigned):
                    problems.append((step, b, tier))
            for pos in np.flatnonzero((cache.tier[b, :n] == T1) & ~was_t2[b, :n]):
                want = full.stores.t0[:, :, b, :, pos].reshape(cache.geom.layers, -1)
                if not torch.equal(cache.stores.t1[:, cache.slot[b, pos], b], want):
                    problems.append((step, b, "t1 data", pos))
            for pos in np.flatnonzero((cache.tier[b, :n] == T0) & ~was_t2[b, :n]):
                if not torch.equal(cache.stores.t0[:, :, b, :, cache.slot[b, pos]], full.stores.t0[:, :, b, :, pos]):
                    problems.append((step, b, "t0 data", pos))

    drive([full, cache], 32, on_step=check)
    assert not problems
    assert was_t2.any() and (cache.tier == T1).any()


def test_tokens_are_conserved_every_step():
    lengths = [30, 17, 23]
    cache = make(MIXED, batch=3, lengths=lengths)
    bad = []

    def check(step):
        counts = cache.row_counts()
        expected = PROMPT + np.minimum(step + 1, lengths)
        if not np.array_equal(counts.sum(axis=1), expected):
            bad.append((step, counts.sum(axis=1), expected))
        for b in range(3):
            by_tier = np.bincount(cache.tier[b, : cache.n[b]], minlength=4)
            if not np.array_equal(by_tier, counts[b]):
                bad.append((step, b, by_tier, counts[b]))

    drive([cache], max(lengths), on_step=check)
    assert not bad
    assert list(cache.n) == [PROMPT + n for n in lengths]


def test_paper_prototype_eviction_compounds_global_does_not():
    kw = dict(hbm_ratio=0.5, evict_ratio=0.2, compressed_ratio=0.0, retier_interval=4, sink_tokens=1, recent_window=4)
    glob = make(TierPolicy(semantics="global", **kw), batch=1, lengths=[60])
    paper = make(TierPolicy(semantics="paper_prototype", **kw), batch=1, lengths=[60])
    t1_sizes = []
    drive([glob, paper], 60, on_step=lambda s: t1_sizes.append(paper.row_counts()[0, T1]))
    n = int(glob.n[0])
    unprotected = n - PROMPT - kw["sink_tokens"] - kw["recent_window"]
    assert glob.row_counts()[0, T3] == int(unprotected * kw["evict_ratio"])
    assert paper.row_counts()[0, T3] > glob.row_counts()[0, T3]
    assert all(a <= b for a, b in zip(t1_sizes, t1_sizes[1:])), "paper T1 is append-only"


def test_capacity_plan_is_exact():
    """Stores are sized from the ratios alone; the run reaches every planned peak and never exceeds it."""
    lengths = [40, 33]
    cache = make(MIXED, lengths=lengths)
    peak = np.zeros(3, dtype=np.int64)

    def track(step):
        peak[:] = np.maximum(peak, cache.row_counts()[:, :3].max(axis=0))
        peak[0] = max(peak[0], max(cache.tables[T0].high_water(b) for b in range(2)))

    drive([cache], 40, on_step=track)
    plan = batch_peaks(MIXED, PROMPT, lengths)
    assert (plan.t0, plan.t1, plan.t2) == tuple(int(x) for x in peak)


def test_slot_table_takes_lowest_free_slot_and_keeps_prefix_tight():
    t = SlotTable(1, 8)
    assert list(t.alloc(0, [10, 11, 12, 13])) == [0, 1, 2, 3]
    t.release(0, [1, 2])
    assert list(t.peek(0, 3)) == [1, 2, 4]
    assert list(t.alloc(0, [20])) == [1]
    assert t.high_water(0) == 4 and t.live(0) == 3
    with pytest.raises(RuntimeError):
        t.release(0, [2])
    t.place(np.array([0]), np.array([2]), np.array([21]))  # a planned append takes the next free slot
    assert t.live(0) == 4 and list(t.live_counts()) == [4]
    with pytest.raises(RuntimeError):
        t.place(np.array([0]), np.array([7]), np.array([22]))  # not the next free slot


def _ring_ops_are_ordered(trace, ring):
    """Replays the event log: a buffer is refilled only by a copy stream that waited on a `free`
    recorded after the last read, and read only by a compute stream that waited on the `ready`
    recorded by the copy it reads."""
    ready = {id(b.ready): b.index for b in ring.buffers}
    free = {id(b.free): b.index for b in ring.buffers}
    held = {}  # buffer -> key being copied / read
    recorded_ready, recorded_free = set(), set()  # buffers whose event was recorded since last use
    waited_free, waited_ready = set(), set()
    reads = set()
    refills = 0  # fills of a buffer read before: the case the free-event ordering is about
    for op, *args in trace:
        if op == "record_copy" and args[0] in ready:
            recorded_ready.add(ready[args[0]])
        elif op == "record_compute" and args[0] in free:
            recorded_free.add(free[args[0]])
        elif op == "copy_waits" and args[0] in free:
            assert free[args[0]] in recorded_free, "copy waits on a free event nobody recorded"
            waited_free.add(free[args[0]])
        elif op == "compute_waits" and args[0] in ready:
            assert ready[args[0]] in recorded_ready
            waited_ready.add(ready[args[0]])
        elif op == "fill":
            buf, key = args
            if buf in reads:  # reused: must have waited on the free recorded after the last read
                assert buf in waited_free, f"buffer {buf} refilled for {key} without waiting for its reader"
                refills += 1
            assert held.get(buf, ("released",))[0] == "released", f"buffer {buf} refilled before release"
            held[buf] = ("filled", key)
            recorded_free.discard(buf)
            waited_free.discard(buf)
            waited_ready.discard(buf)
        elif op == "acquire":
            buf, key = args
            assert held.get(buf) == ("filled", key), f"layer {key} read from buffer {buf} holding {held.get(buf)}"
            assert buf in waited_ready, f"layer {key} read before waiting for its copy"
            held[buf] = ("reading", key)
            reads.add(buf)
        elif op == "release":
            buf, key = args
            assert held.get(buf) == ("reading", key)
            recorded_ready.discard(buf)
            held[buf] = ("released", key)
    assert reads == set(range(len(ring.buffers)))
    assert refills > 0, "no buffer was refilled after a read: the replay checked no reuse"


@pytest.mark.parametrize("n_buffers", [1, 2, 3])
def test_staging_buffer_reuse_across_many_layers(n_buffers):
    """12 layers through 1-3 buffers: each layer must read its own layer's data (a stale or
    neighbouring buffer would change the ordered-attention output) and the events must order
    every refill after the previous read."""
    trace = []
    full = make(FULL, layers=12, attention="ordered")
    tiered = make(MIXED, layers=12, attention="ordered", staging_buffers=n_buffers, trace=trace)
    outs, _ = drive([full, tiered], 16)
    assert tiered.t1_high_water > 0
    fills = [t for t in trace if t[0] == "fill"]
    assert len(fills) >= 12 * 8
    _ring_ops_are_ordered(trace, tiered.ring)
    # T2 is lossy: compare against a tiered run without T2 instead of the full cache
    t1_trace = []
    a = make(FULL, layers=12, attention="ordered")
    b = make(T1_ONLY, layers=12, attention="ordered", staging_buffers=n_buffers, trace=t1_trace)
    outs, _ = drive([a, b], 16)
    assert all(torch.equal(x, y) for x, y in zip(*outs))
    _ring_ops_are_ordered(t1_trace, b.ring)


@pytest.mark.cuda
@pytest.mark.parametrize("prefetch", ["layerwise_async", "sync_per_step", "per_interval"])
def test_cuda_prefetch_and_offload_are_exact(prefetch):
    """Real streams: async prefetch, the offload on its own stream (tokens in transit patched in),
    promotions; T1 is bitwise exact, and every mode attends exactly what layerwise_async does."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rt = Runtime("cuda")
    geom = CacheGeometry(12, 4, HKV, D)

    def cuda_cache(policy, mode="layerwise_async"):
        opts = CacheOptions(group_size=GROUP, attention="ordered", prefetch=mode)
        c = TieredKVCache(rt, geom, policy, opts, PROMPT, [64] * 4, torch.float32)
        c.fill_prompt_random(torch.Generator(device="cuda").manual_seed(7))
        return c

    caches = [cuda_cache(FULL), cuda_cache(T1_ONLY, prefetch), cuda_cache(MIXED), cuda_cache(MIXED, prefetch)]
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(64):
        for c in caches:
            c.begin_step()
        for layer in range(12):
            q = torch.randn(4, HKV, G, D, generator=g, device="cuda")
            k = torch.randn(4, HKV, D, generator=g, device="cuda")
            v = torch.randn(4, HKV, D, generator=g, device="cuda")
            outs = []
            for c in caches:
                c.layer_start(layer)
                outs.append(c.attend(layer, q, k, v))
            assert torch.equal(outs[0], outs[1]) and torch.equal(outs[2], outs[3])
        for c in caches:
            c.end_step()
    assert caches[1].t1_high_water > 0 and caches[3].t2_high_water > 0 and caches[3].offloaded_tokens > 0


# ---- prefetch modes, copy counts and the re-tier offload ------------------------------------------

class SlowLink(Runtime):
    """The CPU runtime, except that each event reports "not done" for its first `polls` queries:
    an offload then stays in transit for a few steps, as it does behind a real link."""

    def __init__(self, polls: int = 2, trace=None):
        super().__init__("cpu", trace=trace)
        self.polls = polls

    def event_done(self, event) -> bool:
        event.asked = getattr(event, "asked", 0) + 1
        return event.asked > self.polls


def make_on(rt, policy, layers=2, batch=2, **opts):
    geom = CacheGeometry(layers, batch, HKV, D)
    cache = TieredKVCache(rt, geom, policy, CacheOptions(group_size=GROUP, **opts), PROMPT, [40] * batch, torch.float32)
    cache.fill_prompt_random(torch.Generator().manual_seed(7))
    return cache


@pytest.mark.parametrize("policy", [MIXED, WITH_T2], ids=["mixed", "with_t2"])
@pytest.mark.parametrize("prefetch", ["layerwise_async", "sync_per_step", "per_interval"])
def test_copy_counts_are_the_simulators(prefetch, policy):
    """Every copy call hwprobe issues, per step and per re-tier, is one the simulator counts
    (sim/device/physics.py): prefetch per layer, re-tier moves gathered per destination tier (the
    prototype: per layer, K and V apart), per_interval's resident refresh per layer."""
    from sim.device.physics import prefetch_copies_per_layer, retier_copies

    L = 3
    cache = make(policy, layers=L, prefetch=prefetch)
    seen, expect = {"h2d": 0, "d2h": 0}, {"h2d": 0, "d2h": 0}
    prev = {"tier": cache.tier.copy(), "n": cache.n.copy(), "high_water": (0, 0)}

    def check(step):
        c = cache.take_counters()
        seen["h2d"] += c.h2d_copies
        seen["d2h"] += c.d2h_copies
        t1_slots, t2_slots = prev["high_water"]
        if prefetch != "per_interval" and (t1_slots or t2_slots):
            expect["h2d"] += L * prefetch_copies_per_layer(prefetch, t1_slots > 0, t2_slots > 0)
        if policy.retier_due(step):
            old, new = prev["tier"].copy(), cache.tier
            old[np.arange(cache.geom.batch), prev["n"]] = T0  # this step's token, before the re-tier

            def moved(a, b):
                return bool(((old == a) & (new == b)).any())

            expect["d2h"] += retier_copies(prefetch, L, moved(T0, T1), moved(T0, T2))
            expect["h2d"] += retier_copies(prefetch, L, moved(T1, T0), moved(T2, T0))
            if prefetch == "per_interval":
                expect["h2d"] += L * prefetch_copies_per_layer(prefetch, cache.t1_high_water > 0,
                                                               cache.t2_high_water > 0)
        prev.update(tier=cache.tier.copy(), n=cache.n.copy(), high_water=(cache.t1_high_water, cache.t2_high_water))

    drive([cache], 40, on_step=check)
    assert seen == expect and expect["d2h"] > 0 and expect["h2d"] > 0


def test_sync_per_step_copies_k_and_v_apart():
    layers = 3
    cache = make(T1_ONLY, layers=layers, prefetch="sync_per_step")
    copies, t1_slots = [], [0]
    drive([cache], 20, on_step=lambda s: (copies.append(cache.take_counters().h2d_copies),
                                          t1_slots.append(cache.t1_high_water)))
    # every step that starts with T1 tokens copies each layer's K and V, not a re-tier among them
    per_step = [(n, h) for s, (n, h) in enumerate(zip(copies, t1_slots)) if not T1_ONLY.retier_due(s)]
    assert [n for n, h in per_step if h] == [2 * layers] * sum(1 for _, h in per_step if h)
    assert [n for n, h in per_step if not h] == [0] * sum(1 for _, h in per_step if not h)
    assert sum(1 for _, h in per_step if h) >= 5


@pytest.mark.parametrize("prefetch", ["sync_per_step", "per_interval"])
def test_every_prefetch_mode_attends_exactly_what_layerwise_async_does(prefetch):
    for policy in (MIXED, WITH_T2):  # WITH_T2 also promotes T2 tokens back to T0
        a, b = make(policy), make(policy, prefetch=prefetch)
        outs, _ = drive([a, b], 30)
        assert all(torch.equal(x, y) for x, y in zip(*outs))
    t1 = [make(FULL, attention="ordered"), make(T1_ONLY, attention="ordered", prefetch=prefetch)]
    outs, _ = drive(t1, 30)
    assert all(torch.equal(x, y) for x, y in zip(*outs))


def test_per_interval_keeps_every_layer_on_the_device():
    L = 4
    ring, resident = make(MIXED, layers=L), make(MIXED, layers=L, prefetch="per_interval")
    drive([ring, resident], 12)
    one_layer = ring.ring.buffers[0].nbytes()
    assert resident.staging_bytes() == L * one_layer and ring.staging_bytes() == 2 * one_layer
    assert resident.device_kv_bytes() - ring.device_kv_bytes() == (L - 2) * one_layer
    assert resident.attention_workspace_bytes() == ring.attention_workspace_bytes() > 0


@pytest.mark.parametrize("prefetch, pinned, asynchronous", [
    ("layerwise_async", True, True), ("per_interval", True, True),
    ("layerwise_async", False, False), ("sync_per_step", True, False), ("sync_per_step", False, False)])
def test_offload_is_asynchronous_only_where_the_simulator_says(prefetch, pinned, asynchronous):
    """Pinned memory and not the prototype: the offload is still in flight after the re-tier step."""
    cache = make_on(SlowLink(), WITH_T2, prefetch=prefetch, pinned=pinned)
    in_flight = []  # after each step that offloaded: is the offload still in flight?

    def check(step):
        if cache.take_counters().d2h_copies:
            in_flight.append(cache.lane.pending is not None)

    drive([cache], 24, on_step=check)
    assert cache.lane.asynchronous == asynchronous
    assert len(in_flight) >= 3 and set(in_flight) == {asynchronous}


@pytest.mark.parametrize("prefetch", ["layerwise_async", "per_interval"])
def test_tokens_in_transit_are_attended_exactly(prefetch):
    """Offloads land two polls late: the steps in between read the demoted rows from the device
    block (patched into every staged copy), and attention is bit for bit what it is when the
    offload lands at once - for T1 and for int8 T2."""
    slow = make_on(SlowLink(), MIXED, attention="ordered", prefetch=prefetch)
    prompt = make(MIXED, attention="ordered", prefetch=prefetch)
    transit = []
    outs, _ = drive([slow, prompt], 30, on_step=lambda s: transit.append(slow.lane.pending is not None))
    assert sum(transit) >= 4, "no offload stayed in transit: the test would be vacuous"
    assert all(torch.equal(x, y) for x, y in zip(*outs))
    slow.drain()
    assert torch.equal(slow.stores.t1, prompt.stores.t1) and torch.equal(slow.stores.t2q, prompt.stores.t2q)


def test_without_the_patch_tokens_in_transit_would_be_read_stale(monkeypatch):
    from hwprobe.cache.offload import OffloadLane

    monkeypatch.setattr(OffloadLane, "patch", lambda self, layer, t1, t2q, t2s: None)
    slow, prompt = make_on(SlowLink(), T1_ONLY, attention="ordered"), make(T1_ONLY, attention="ordered")
    outs, _ = drive([slow, prompt], 12)
    assert any(not torch.equal(x, y) for x, y in zip(*outs))


def _t0_slots_reused_only_after_read(trace) -> int:
    """Replays the event log: a T0 slot an offload's gather reads is written again (an append or a
    promotion) only after the compute stream has waited on that offload's `sources_read`. Returns
    how many writes landed in a slot some offload had read (so a pass is not vacuous)."""
    reading, were_sources, reused = {}, set(), 0
    for op, *args in trace:
        if op == "offload":
            event, pairs = args
            reading.update({pair: event for pair in pairs})
            were_sources.update(pairs)
        elif op == "compute_waits":
            reading = {pair: ev for pair, ev in reading.items() if ev != args[0]}
        elif op == "t0_write":
            for pair in args[0]:
                assert pair not in reading, f"T0 slot {pair} rewritten before the offload had read it"
                reused += pair in were_sources
    return reused


@pytest.mark.parametrize("prefetch", ["layerwise_async", "sync_per_step", "per_interval"])
def test_t0_slots_are_reused_only_after_the_offload_read_them(prefetch):
    trace = []
    cache = make_on(SlowLink(trace=trace), MIXED, prefetch=prefetch)
    drive([cache], 30)
    assert _t0_slots_reused_only_after_read(trace) > 0


def test_reusing_t0_slots_before_the_offload_read_them_is_caught(monkeypatch):
    from hwprobe.cache.offload import OffloadLane

    monkeypatch.setattr(OffloadLane, "_guard_sources", lambda self, sources_read: None)
    trace = []
    drive([make_on(SlowLink(trace=trace), MIXED)], 30)
    with pytest.raises(AssertionError, match="rewritten before the offload"):
        _t0_slots_reused_only_after_read(trace)


@pytest.mark.parametrize("prefetch", ["layerwise_async", "sync_per_step"])
def test_offloads_landing_in_the_preallocated_pool_change_nothing(prefetch):
    """On CUDA with pinned memory offloads land in one pool pinned up front (offload.LandingPool);
    forced on here, every step's attention output is bit-identical to landing in fresh blocks."""
    from hwprobe.cache.offload import LandingPool

    fresh, pooled = make(MIXED, layers=3, prefetch=prefetch), make(MIXED, layers=3, prefetch=prefetch)
    pooled.lane.pool = LandingPool(pooled.rt, pooled.stores)
    for buf in pooled.lane.pool.parts.values():
        buf.zero_()  # (allocated empty) so that what landed shows
    outs, _ = drive([fresh, pooled], 30)
    assert all(torch.equal(x, y) for x, y in zip(*outs))
    parts = pooled.lane.pool.parts
    assert parts[(T1, 0)].numel() == pooled.stores.t1.numel()
    assert all(bool((buf != 0).any()) for buf in parts.values())  # T1 rows, T2 payload and scales landed there
