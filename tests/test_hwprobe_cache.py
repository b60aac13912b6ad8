"""The real tiered KV cache on the CPU: exactness per tier, agreement with sim/tiers.py, token
conservation, compounding eviction, and the staging ring's buffer reuse."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hwprobe.cache import CacheGeometry, CacheOptions, Runtime, TieredKVCache  # noqa: E402
from hwprobe.cache.plan import batch_peaks  # noqa: E402
from hwprobe.cache.quant import dequantize_int8, max_error_bound, quantize_int8  # noqa: E402
from hwprobe.cache.retier import uniform_block  # noqa: E402
from hwprobe.cache.slots import FREE, SlotTable  # noqa: E402
from sim.scenario import ImportanceCfg  # noqa: E402
from sim.sequence import SequenceTiers  # noqa: E402
from sim.tiers import T0, T1, T2, T3, TierPolicy  # noqa: E402

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


def make(policy, layers=2, batch=2, lengths=None, trace=None, **opts):
    rt = Runtime("cpu", trace=trace)
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
    outs, _ = drive([full, tiered], 30, on_step=lambda s: seen_t1.append(tiered.hw1))
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
    """Each tier's slot table holds the positions sim/tiers.py assigned to that tier, and T0/T1
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


def test_uniform_block_detects_one_contiguous_copy():
    rows = np.array([0, 1, 0, 1])
    assert uniform_block(rows, np.array([5, 5, 6, 6]), 2) == (5, 2)
    assert uniform_block(rows, np.array([5, 6, 6, 5]), 2) == (5, 2)
    assert uniform_block(rows, np.array([5, 5, 7, 7]), 2) is None  # a gap
    assert uniform_block(np.array([0, 0, 1]), np.array([1, 2, 1]), 2) is None  # unequal counts
    assert uniform_block(np.array([0, 0]), np.array([1, 2]), 2) is None  # row 1 would be overwritten


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


@pytest.mark.parametrize("n_buffers", [1, 2, 3])
def test_staging_buffer_reuse_across_many_layers(n_buffers):
    """12 layers through 1-3 buffers: each layer must read its own layer's data (a stale or
    neighbouring buffer would change the ordered-attention output) and the events must order
    every refill after the previous read."""
    trace = []
    full = make(FULL, layers=12, attention="ordered")
    tiered = make(MIXED, layers=12, attention="ordered", staging_buffers=n_buffers, trace=trace)
    outs, _ = drive([full, tiered], 16)
    assert tiered.hw1 > 0
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
def test_cuda_async_prefetch_is_exact():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rt = Runtime("cuda")
    geom = CacheGeometry(12, 4, HKV, D)

    def cuda_cache(policy):
        c = TieredKVCache(rt, geom, policy, CacheOptions(group_size=GROUP, attention="ordered"), PROMPT, [64] * 4,
                          torch.float32)
        c.fill_prompt_random(torch.Generator(device="cuda").manual_seed(7))
        return c

    full, tiered = cuda_cache(FULL), cuda_cache(T1_ONLY)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(64):
        full.begin_step()
        tiered.begin_step()
        for layer in range(12):
            q = torch.randn(4, HKV, G, D, generator=g, device="cuda")
            k = torch.randn(4, HKV, D, generator=g, device="cuda")
            v = torch.randn(4, HKV, D, generator=g, device="cuda")
            full.layer_start(layer)
            tiered.layer_start(layer)
            assert torch.equal(full.attend(layer, q, k, v), tiered.attend(layer, q, k, v))
        full.end_step()
        tiered.end_step()
    assert tiered.hw1 > 0
