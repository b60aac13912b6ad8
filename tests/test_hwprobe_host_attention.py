"""The real cache's host-side exact attention (policy.access host_attention / split, issue #12) on
the CPU: the LSE merge, outputs equal to full attention, scores (and so tier decisions) equal to the
prefetch path's, split's staged prefix, tokens in transit, link traffic by the simulator's formulas,
and `hwprobe run` end to end."""

from __future__ import annotations

import json
import threading

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from hwprobe.cache import CacheGeometry, CacheOptions, Runtime, TieredKVCache  # noqa: E402
from hwprobe.cache.attention import merge_partials, partial_softmax_attention, union_softmax_attention  # noqa: E402
from sim.device.physics import PARTIAL_BYTES_PER_ELEMENT, SPLIT_STEPS  # noqa: E402

from .conftest import SCENARIOS, run_cli  # noqa: E402
from .test_hwprobe_cache import FULL, GROUP, HKV, MIXED, PROMPT, T1_ONLY, WITH_T2, D, G, make  # noqa: E402
from .test_hwprobe_cache import drive as drive_with_kv  # noqa: E402

TOL_ULPS = 16  # as the merged-softmax tests: split sums reorder, allow this many ulps of the magnitude

HOST = dict(access="host_attention")
SPLIT = dict(access="split", host_fraction=0.5)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def drive(caches, steps, seed=0, on_step=None):
    """Identical random q/k/v into every cache (test_hwprobe_cache's driver); each cache's outputs."""
    return drive_with_kv(caches, steps, seed, on_step)[0]


def max_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def tolerance(outs) -> float:
    return TOL_ULPS * torch.finfo(torch.float32).eps * max(1.0, max(o.abs().max().item() for o in outs))


def test_lse_merge_of_two_shares_is_attention_over_their_union():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, HKV, G, D, generator=g)
    keys = [(torch.randn(2, HKV, n, D, generator=g), torch.randn(2, HKV, n, D, generator=g)) for n in (5, 7)]
    bias = torch.zeros(2, 12)
    bias[0, 6:] = float("-inf")  # row 0: one key of the second share left, row 1: all
    full, _ = union_softmax_attention(q, keys, bias, 0.3)
    o1, lse1, _ = partial_softmax_attention(q, keys[:1], bias[:, :5], 0.3)
    o2, lse2, p2 = partial_softmax_attention(q, keys[1:], bias[:, 5:], 0.3)
    merged, share1, share2 = merge_partials(o1, lse1, o2, lse2)
    assert torch.allclose(merged, full, atol=1e-6)
    assert torch.allclose(share1 + share2, torch.ones_like(share1))
    # a share with no key at all carries no weight and no NaN
    empty = torch.full((2, 7), float("-inf"))
    o3, lse3, p3 = partial_softmax_attention(q, keys[1:], empty, 0.3)
    assert torch.isneginf(lse3).all() and not p3.isnan().any() and not o3.isnan().any()
    alone, _, share3 = merge_partials(o1, lse1, o3, lse3)
    assert torch.allclose(alone, o1) and (share3 == 0).all()


@pytest.mark.parametrize("opts", [HOST, SPLIT], ids=["host_attention", "split"])
def test_t1_on_the_host_equals_full_attention(opts):
    full, tiered = make(FULL), make(T1_ONLY, **opts)
    seen = []
    outs = drive([full, tiered], 30, on_step=lambda s: seen.append(tiered._host_step is not None))
    assert sum(seen) > 10, "the host attended nothing: the comparison would be vacuous"
    assert max_diff(*outs) <= tolerance(outs[0])
    tiered.close()


@pytest.mark.parametrize("policy", [MIXED, WITH_T2], ids=["mixed", "with_t2"])
@pytest.mark.parametrize("opts", [HOST, SPLIT], ids=["host_attention", "split"])
def test_host_path_attends_what_prefetch_does_and_scores_the_same(policy, opts):
    """T2 dequantised on the host gives the staged result; the host's share of every token's
    attention probability reaches the scores, so the re-tier decisions are the prefetch path's."""
    ref, host = make(policy), make(policy, **opts)
    outs = drive([ref, host], 30)
    assert host.t2_high_water > 0 or policy is MIXED
    assert max_diff(*outs) <= tolerance(outs[0])
    assert np.array_equal(ref.tier, host.tier)
    assert np.allclose(ref.score, host.score, rtol=1e-5, atol=1e-7)
    host.close()


def test_split_stages_a_prefix_of_each_tier_and_the_host_attends_the_rest():
    cache = make(MIXED, **SPLIT)
    ring_bytes, checked = [], []

    def check(step):
        c = cache.take_counters()
        n1, n2 = cache.t1_high_water, cache.t2_high_water
        g1, g2 = cache.staged_slots(step)
        if n1 + n2 and cache._host_step is not None and not cache.policy.retier_due(step):  # same tiers as the step saw
            assert (g1, g2) == (n1 - round(0.5 * n1), n2 - round(0.5 * n2))
            spans = cache._host_step[0]
            assert [(s.start, s.end) for s in spans] == [(g, n) for g, n in ((g1, n1), (g2, n2)) if g < n]
            checked.append(step)
        ring_bytes.append(c.h2d_bytes)

    drive([cache], 24, on_step=check)
    assert len(checked) > 5
    assert cache.attention_workspace_bytes() > 0 and cache.ring is not None
    cache.close()


def test_host_attention_stages_nothing():
    cache = make(MIXED, **HOST)
    drive([cache], 12)
    assert cache.ring is None and cache.attention_workspace_bytes() == 0
    assert cache.staged_slots(cache.step) == (0, 0)
    cache.close()


def test_host_attention_runs_on_one_worker_thread():
    cache = make(T1_ONLY, **HOST)
    names = set()
    attend = cache.host._attend

    def spy(*args):
        names.add(threading.current_thread().name)
        return attend(*args)

    cache.host._attend = spy
    drive([cache], 12)
    assert names and all(n.startswith("host-attention") for n in names)
    cache.close()


def test_per_step_traffic_is_the_simulators_formula_plus_the_score_copy():
    """Per layer: queries B x H x d x itemsize device->host, partials + LSE B x H x (d + 1) x 4 B
    host->device, and (scores on this cache's attention) the T0 LSE B x H x 4 B device->host."""
    L, B = 2, 2
    cache = make(T1_ONLY, layers=L, batch=B, **HOST)
    heads = HKV * G
    checked = []

    def check(step):
        c = cache.take_counters()
        if cache._host_step is None or cache.policy.retier_due(step) or cache.policy.retier_due(step - 1):
            return  # re-tier steps move tokens too
        assert c.d2h_bytes == L * (B * heads * D * 4 + B * heads * 4)
        assert c.h2d_bytes == L * B * heads * (D + 1) * PARTIAL_BYTES_PER_ELEMENT
        assert (c.d2h_copies, c.h2d_copies) == (2 * L, L)
        assert c.host_busy_s > 0
        checked.append(step)

    drive([cache], 30, on_step=check)
    assert len(checked) > 5
    cache.close()


class SlowLink(Runtime):
    """CPU runtime whose events report "not done" for their first polls: offloads stay in transit."""

    def event_done(self, event) -> bool:
        event.asked = getattr(event, "asked", 0) + 1
        return event.asked > 2


@pytest.mark.parametrize("opts", [HOST, SPLIT], ids=["host_attention", "split"])
def test_tokens_in_transit_land_before_the_host_reads_them(opts):
    slow, prompt = make(MIXED, rt=SlowLink("cpu"), **opts), make(MIXED, **opts)
    landed = []

    def check(step):
        landed.append(slow.lane.pending is not None)

    outs = drive([slow, prompt], 30, on_step=check)
    assert sum(landed) >= 3, "no offload stayed in transit: the test would be vacuous"
    assert all(torch.equal(x, y) for x, y in zip(*outs))
    slow.close()
    prompt.close()


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="merged"):
        make(T1_ONLY, access="host_attention", attention="ordered")
    with pytest.raises(ValueError, match="layerwise_async"):
        make(T1_ONLY, access="split", host_fraction=0.5, prefetch="per_interval")
    with pytest.raises(ValueError, match="split_rule"):
        make(T1_ONLY, access="split")
    with pytest.raises(ValueError, match="0 to 1"):
        make(T1_ONLY, access="split", host_fraction=1.5)


def test_simulator_split_rule_picks_a_grid_fraction():
    from hwprobe.cache.host_attention import simulator_split_rule
    from sim.decode.context import build_context
    from sim.inputs.scenario import load_scenario

    rule = simulator_split_rule(build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml",
                                                            ["policy.access=split"])))
    assert rule(4, 400, 0, 0) == 0.0
    f = rule(4, 400, 20000, 0)
    assert f in {1 - i / SPLIT_STEPS for i in range(SPLIT_STEPS + 1)} and f > 0  # long T1: some on the host


# ---- hwprobe run --------------------------------------------------------------------------
CPU_TINY = SCENARIOS / "cpu-tiny.yaml"
SHORT = ["--set", "workload.reasoning_tokens=80", "--set", "policy.retier_interval=16"]


def hwprobe_run(tmp_path, name, *extra):
    out = tmp_path / name
    res = run_cli("run", str(CPU_TINY), "--device", "cpu", "--threads", "1", "--json", "--out", str(out), *SHORT,
                  *extra, tool="hwprobe")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), pd.read_csv(out / "steps.csv")


def test_run_host_attention_reports_and_moves_what_the_simulator_counts(tmp_path):
    """Replaying the simulator's decisions, both sides move the same bytes: queries out and
    partials back each layer, plus the same re-tier traffic."""
    from sim.decode.simulate import simulate
    from sim.inputs.scenario import load_scenario

    summary, steps = hwprobe_run(tmp_path, "host", "--set", "policy.access=host_attention", "--scores", "simulator")
    assert summary["access"] == "host_attention" and 0 < summary["host_attention_share"] < 1
    assert summary["attention_workspace_bytes"] == 0
    overrides = [s for s in SHORT if s != "--set"] + ["policy.access=host_attention"]
    sim = simulate(load_scenario(CPU_TINY, overrides), with_max_batch=False).summary
    assert summary["h2d_bytes"] == pytest.approx(sim.h2d_bytes)
    assert summary["d2h_bytes"] == pytest.approx(sim.d2h_bytes)
    assert (steps["tokens_t1"] > 0).sum() > 10


def test_run_split_with_a_fixed_fraction_and_with_the_simulators(tmp_path):
    fixed, _ = hwprobe_run(tmp_path, "fixed", "--set", "policy.access=split", "--host-fraction", "0.5")
    assert fixed["access"] == "split" and fixed["host_attention_share"] > 0
    assert any("fixed 0.5" in n for n in fixed["notes"])
    chosen, _ = hwprobe_run(tmp_path, "chosen", "--set", "policy.access=split")
    assert any("simulator's choice" in n for n in chosen["notes"])
    prefetch, _ = hwprobe_run(tmp_path, "prefetch")
    assert prefetch["access"] == "prefetch" and prefetch["host_attention_share"] is None
    # scores exact on both paths: the same re-tier decisions, so the same tokens move
    assert (fixed["offloaded_tokens"], fixed["evicted_tokens"]) == (prefetch["offloaded_tokens"], prefetch["evicted_tokens"])
    assert fixed["final_tokens_per_tier"] == prefetch["final_tokens_per_tier"]


@pytest.mark.parametrize("extra, words", [
    (["--set", "policy.access=split", "--host-fraction", "1.5"], "--host-fraction"),
    (["--host-fraction", "0.5"], "--host-fraction"),
    (["--set", "policy.access=host_attention", "--attention", "ordered"], "--attention"),
])
def test_bad_host_options_are_one_line_exit_2(tmp_path, extra, words):
    res = run_cli("run", str(CPU_TINY), "--device", "cpu", "--out", str(tmp_path / "x"), *extra, tool="hwprobe")
    assert res.returncode == 2 and words in res.stderr and res.stderr.strip().count("\n") == 0


@pytest.mark.cuda
@pytest.mark.parametrize("opts", [HOST, SPLIT], ids=["host_attention", "split"])
def test_cuda_host_attention_is_exact(opts):
    """On a GPU: queries over the host-path stream, the worker waiting on a CUDA event, partials
    back through a pinned buffer; outputs equal the prefetch path's within bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rt = Runtime("cuda")
    geom = CacheGeometry(3, 2, HKV, D)

    def cuda_cache(**o):
        c = TieredKVCache(rt, geom, MIXED, CacheOptions(group_size=GROUP, **o), PROMPT, [40, 40], torch.bfloat16)
        c.fill_prompt_random(torch.Generator(device="cuda").manual_seed(7))
        return c

    ref, host = cuda_cache(), cuda_cache(**opts)
    g = torch.Generator(device="cuda").manual_seed(0)
    worst, scale = 0.0, 1.0
    for _ in range(30):
        ref.begin_step()
        host.begin_step()
        for layer in range(3):
            q, k, v = (torch.randn(2, HKV, *s, generator=g, device="cuda", dtype=torch.bfloat16)
                       for s in ((G, D), (D,), (D,)))
            ref.layer_start(layer)
            host.layer_start(layer)
            a, b = ref.attend(layer, q, k, v), host.attend(layer, q, k, v)
            worst = max(worst, (a.float() - b.float()).abs().max().item())
            scale = max(scale, a.float().abs().max().item())
        ref.end_step()
        host.end_step()
    torch.cuda.synchronize()
    assert worst <= TOL_ULPS * torch.finfo(torch.bfloat16).eps * scale
    assert np.array_equal(ref.tier, host.tier)
    host.close()
