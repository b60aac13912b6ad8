"""A chunked layer reads only its current chunk, so a tiered run stages - prefetches, or reads on the host -
only the T1/T2 tokens there for those layers (`RunContext.staged_tokens`), and its host tiers hold and its
re-tiers move only those layers' copies there (`RunContext.chunk_kept`); full and MLA layers stage, hold and
move every host token. Llama 4 Maverick: 12 full + 36 chunked (8,192) layers of equal bytes, so past its
first chunk a staged token crosses the link for a quarter of the layers plus the chunked ones' share in the
chunk. A closed batch's chunked reads are exact per step (`RunContext.closed_chunk_tokens`)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.decode.simulate import simulate
from sim.device.physics import decode_step_cost
from sim.inputs.scenario import scenario_from_dict
from sim.model.spec import ModelSpec
from sim.serving.engine import ServingSim
from sim.serving.run import simulate_serving
from sim.tiering.counts import unprotected_share_of_last
from sim.tiering.tiers import TierPolicy, protected_mask

C = 8192


def _closed(detail="fast", prompt=C, out=1024, access="prefetch", model="llama-4-maverick", policy="tiered"):
    tiers = {"kind": "tiered", "hbm_ratio": 0.25, "access": access} if policy == "tiered" else {"kind": policy}
    return scenario_from_dict({
        "name": "m", "model": {"name": model, "weight_dtype": "fp8"}, "hardware": {"gpu": "h200-sxm"},
        "parallel": {"tp": 8}, "workload": {"batch_size": 4, "prompt_tokens": prompt, "reasoning_tokens": out},
        "policy": tiers, "sim": {"detail": detail}}, "t.yaml")


def _serving(model="llama-4-maverick"):
    """Four requests of 7,680 + 1,024 tokens: their decodes cross into the second chunk halfway."""
    return scenario_from_dict({
        "name": "m", "model": {"name": model, "weight_dtype": "fp8"}, "hardware": {"gpu": "h200-sxm"},
        "parallel": {"tp": 8}, "workload": {"prompt_tokens": 7680, "reasoning_tokens": 1024, "seed": 1,
                                            "arrivals": {"kind": "closed_loop", "concurrency": 4, "requests": 4}},
        "policy": {"kind": "tiered", "hbm_ratio": 0.25}, "sim": {"detail": "step"}}, "t.yaml")


def test_unprotected_share_of_the_last_positions_matches_the_mask():
    cases = [(n, p, last, TierPolicy(kind="tiered", sink_tokens=s, recent_window=w, protect_prompt=pp))
             for n in (1, 7, 300, 2000) for p in (0, 5, 299) for last in (0, 3, 150, 2500)
             for s in (0, 4) for w in (0, 128) for pp in (True, False)]
    for n, p, last, pol in cases:
        free = ~protected_mask(n, p, pol)
        want = free[max(0, n - last):].sum() / free.sum() if free.sum() else 0.0
        assert unprotected_share_of_last(n, p, pol, last) == pytest.approx(want, abs=1e-15), (n, p, last, pol)
    # arrays broadcast: the same figures at once
    pol = TierPolicy(kind="tiered")
    got = unprotected_share_of_last(np.array([2000, 300]), np.array([5, 0]), pol, np.array([150, 3]))
    assert list(got) == [unprotected_share_of_last(2000, 5, pol, 150), unprotected_share_of_last(300, 0, pol, 3)]


def test_staged_tokens_by_hand():
    """10,000 tokens, prompt 1,024 protected, 4 sinks, 128 recent (the defaults): its chunk is the last 1,808
    positions, 128 of them protected; 10,000 - 1,024 - 4 - 128 = 8,844 unprotected, 1,680 in the chunk. The
    mean layer stages 12/48 of every host token + 36/48 of that share. In the first chunk, everything."""
    ctx = build_context(_closed(prompt=1024))
    assert ctx.model.chunked_tier_share == 0.75
    kept = 0.25 + 0.75 * 1680 / 8844
    s1, s2 = ctx.staged_tokens(1000, 500, 10_000, 1024)
    assert (s1, s2) == (pytest.approx(1000 * kept, rel=1e-12), pytest.approx(500 * kept, rel=1e-12))
    assert ctx.staged_tokens(1000, 500, 5000, 1024) == (1000.0, 500.0)
    # a closed batch's rows: every sequence holds prompt + step + 1 tokens
    att = np.array([[40_000, 4000, 2000, 4]])
    r1, r2 = ctx.closed_staged_tokens(att, np.array([10_000 - 1024 - 1]))
    assert (r1[0], r2[0]) == (pytest.approx(4000 * kept, rel=1e-12), pytest.approx(2000 * kept, rel=1e-12))


def test_a_model_without_chunked_layers_stages_every_host_token():
    ctx = build_context(_closed(model="llama-3.1-70b"))
    assert ctx.model.chunked_tier_share == 0.0
    assert ctx.staged_tokens(1000, 500, 10_000, 1024) == (1000, 500)
    assert ctx.closed_staged_tokens(np.array([[1, 2, 3, 4]]), np.array([0])) is None


def test_the_step_cost_moves_and_reads_the_staged_tokens():
    ctx = build_context(_closed())
    m, kvl, t2l = ctx.scenario.model, ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer
    args = (ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, "layerwise", 4, 20_000, 10_000, 4000, kvl, t2l)
    every = decode_step_cost(*args)
    part = decode_step_cost(*args, staged_tokens=(3000.0, 1500.0))
    assert every.prefetch_bytes_per_layer == 10_000 * kvl + 4000 * t2l
    assert part.prefetch_bytes_per_layer == 3000.0 * kvl + 1500.0 * t2l
    assert part.layer.attention_s < every.layer.attention_s  # fewer T2 tokens dequantised in the staging buffer
    hctx = build_context(_closed(access="host_attention"))  # its hardware carries the host CPU
    host = decode_step_cost(hctx.model, hctx.hw, *args[2:], True, "host_attention", staged_tokens=(3000.0, 1500.0))
    assert host.host.kv_bytes == 3000.0 * kvl + 1500.0 * t2l and host.prefetch_bytes_per_layer == 0.0


def test_maverick_past_its_chunk_stages_less_and_every_level_agrees(monkeypatch):
    """Prompt 6,144 (protected) + 4,096 generated: the host tiers hold generated tokens alone, and from the
    2,048th step on those of the first chunk lie behind the current one. The prefetched bytes lie between the
    full layers' share of every host token and all of it, and the fast, step and layer levels count the same."""
    runs = {d: simulate(_closed(d, 6144, 4096), with_max_batch=False).summary for d in ("fast", "step", "layer")}
    assert runs["fast"].h2d_bytes == runs["step"].h2d_bytes == runs["layer"].h2d_bytes > 0
    assert runs["fast"].d2h_bytes == runs["step"].d2h_bytes == runs["layer"].d2h_bytes > 0
    monkeypatch.setattr(ModelSpec, "chunked_tier_share", property(lambda self: 0.0))  # every layer stages all
    every = simulate(_closed("fast", 6144, 4096), with_max_batch=False).summary
    for field in ("h2d_bytes", "d2h_bytes", "host_peak_bytes"):  # the link both ways, and what the host holds
        assert 0.25 * getattr(every, field) < getattr(runs["fast"], field) < 0.9 * getattr(every, field), field
    assert runs["fast"].throughput_tok_per_s > every.throughput_tok_per_s


def test_the_host_holds_and_moves_the_kept_share_by_hand():
    """The closed batch's host bytes at a step past the chunk are its T1/T2 bytes x `chunk_kept` of that
    step's length; a re-tier moves the same share of its tokens; a serving request's host bytes likewise."""
    from sim.decode.capacity import batch_counts
    from sim.device.physics import retier_traffic
    from sim.serving.kv_memory import kv_memory
    from sim.tiering.tiers import T1, T2

    ctx = build_context(_closed(prompt=6144, out=4096))
    c = batch_counts(ctx, 4)
    trace = c.trace(ctx)
    s = 3000  # 6,144 + 3,001 tokens: 953 into the second chunk
    kept = ctx.chunk_kept(6144 + s + 1, 6144)
    assert kept == pytest.approx(0.25 + 0.75 * (953 - 128) / (3001 - 4 - 128), rel=1e-12)
    host = (c.attended[s, T1] * ctx.kv_bytes_per_token + c.attended[s, T2] * ctx.t2_bytes_per_token) * kept
    after = (c.tiers_after[s, T1] * ctx.kv_bytes_per_token + c.tiers_after[s, T2] * ctx.t2_bytes_per_token) * kept
    assert trace.host_bytes[s] == pytest.approx(max(host, after), rel=1e-12)
    kvl, t2l = ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer
    tr = retier_traffic("layerwise", 48, kvl, t2l, 100, 40, 10, 4, kept=0.5)
    assert tr.d2h_bytes == pytest.approx(48 * 0.5 * (100 * kvl + 40 * t2l)) and tr.d2h_copies > 0
    assert tr.h2d_bytes == pytest.approx(48 * 0.5 * (10 * kvl + 4 * t2l))
    memory = kv_memory(build_context(_serving()), 8192, 256)
    assert memory.host_bytes(1000, 500, 10_000, 1024) == pytest.approx(
        (1000 * ctx.kv_bytes_per_token + 500 * ctx.t2_bytes_per_token) * (0.25 + 0.75 * 1680 / 8844), rel=1e-12)
    assert memory.host_bytes(1000, 500) == 1000 * ctx.kv_bytes_per_token + 500 * ctx.t2_bytes_per_token


def test_maverick_in_its_first_chunk_stages_every_host_token(monkeypatch):
    """Prompt C + 1,024 generated: every generated token, and so every host token, is in the second
    chunk with the decodes reading it - as prompt 2,048 + 1,024 is all in the first."""
    for prompt in (2048, C):
        run = simulate(_closed(prompt=prompt, out=1024), with_max_batch=False).summary
        with monkeypatch.context() as patch:
            patch.setattr(ModelSpec, "chunked_tier_share", property(lambda self: 0.0))
            assert simulate(_closed(prompt=prompt, out=1024), with_max_batch=False).summary.h2d_bytes == run.h2d_bytes


def test_a_serving_run_stages_each_sequence_at_its_own_length(monkeypatch):
    """Each decode's share from its own prompt + generated tokens: the step's staged tokens are the sum
    of `RunContext.staged_tokens` over its decodes, fewer than its T1/T2 once they are past the chunk."""
    seen = []
    original = ServingSim.staged_tokens

    def spy(self, plan):
        out = original(self, plan)
        if out is not None and plan.attended[1] > 0:
            seen.append((out, plan.attended.copy(), self.table.prompt[plan.decodes].copy(),
                         self.table.generated[plan.decodes].copy(), plan.decode_counts.copy()))
        return out

    monkeypatch.setattr(ServingSim, "staged_tokens", spy)
    simulate_serving(_serving())
    assert seen
    assert any(s1 < attended[1] for (s1, _), attended, *_ in seen)  # past the chunk: fewer
    ctx = build_context(_serving())
    for (s1, s2), attended, prompt, generated, counts in seen[::10]:
        by_hand = [ctx.staged_tokens(int(c[1]), int(c[2]), int(p + g), int(p))
                   for c, p, g in zip(counts, prompt, generated)]
        assert s1 == pytest.approx(sum(x[0] for x in by_hand), rel=1e-12)
        assert s2 == pytest.approx(sum(x[1] for x in by_hand), rel=1e-12)
        assert s1 <= attended[1]


def test_a_planner_screen_stages_the_sampled_share():
    from sim.plan.screen import chunked_step_figures, moments

    ctx = build_context(_serving())
    (k1, k2), _ = chunked_step_figures(ctx, ctx.policy, moments(ctx.scenario))
    assert 0.25 < k1 < 1.0 and 0.25 < k2 <= 1.0
    dense = build_context(_serving("llama-3.1-70b"))
    assert chunked_step_figures(dense, dense.policy, moments(dense.scenario)) == (None, None)


def test_a_closed_batch_reads_each_chunk_exactly(monkeypatch):
    """Its sequences share one length, so a chunked layer's reads are exact: active x ((n - 1) mod C) + 1
    with n = prompt + step + 1 (serving counts each sequence the same way). Prompt C: step s reads s + 1
    tokens a sequence where the bound min(n, C) gave C; every level times it alike, faster than the bound."""
    from sim.decode.context import RunContext

    ctx = build_context(_closed(prompt=C))
    att = np.array([[4 * (C + 11), 0, 0, 4], [3 * (C + 101), 0, 0, 3]])
    assert list(ctx.closed_chunk_tokens(att, np.array([10, 100]))) == [4 * 11, 3 * 101]
    assert build_context(_closed(model="llama-3.1-70b")).closed_chunk_tokens(att, np.array([10, 100])) is None
    full = {d: simulate(_closed(d, C, 1024, policy="full_hbm"), with_max_batch=False).summary
            for d in ("fast", "step", "layer")}
    assert full["fast"].tpot_p50_s == pytest.approx(full["step"].tpot_p50_s, rel=1e-12)
    assert full["fast"].tpot_p50_s == pytest.approx(full["layer"].tpot_p50_s, rel=1e-12)
    monkeypatch.setattr(RunContext, "closed_chunk_tokens", lambda self, att, steps: None)  # the bound min(n, C)
    bound = simulate(_closed("fast", C, 1024, policy="full_hbm"), with_max_batch=False).summary
    assert full["fast"].tpot_p50_s < bound.tpot_p50_s


def test_the_planner_screen_reads_the_mean_current_chunk():
    """Requests of 7,680 + 1,024 tokens: the step-weighted mean of ((n - 1) mod C) + 1 over their decodes, below
    the bound min(n, C) and above the second chunk's few tokens."""
    from sim.plan.screen import _sampled_steps, chunked_step_figures, moments

    ctx = build_context(_serving())
    m = moments(ctx.scenario)
    _, mean = chunked_step_figures(ctx, ctx.policy, m)
    prompt, step, weights, _ = _sampled_steps(ctx.policy, m)
    n = prompt + step + 1
    assert mean == pytest.approx(np.sum(weights * np.where(n > C, n - C, n)) / np.sum(weights), rel=1e-12)
    assert 512 < mean < np.sum(weights * np.minimum(n, C)) / np.sum(weights)
    assert chunked_step_figures(build_context(_serving("llama-3.1-70b")), ctx.policy, m)[1] is None


def test_host_access_reads_the_chunks_on_the_gpu_less_what_the_host_attends():
    """Host access: the GPU's chunked layers read their chunks' tokens less the host-tier tokens there that
    the host attends (`physics.gpu_chunk_tokens`), by hand; the fast level's arrays give the scalar step
    cost's floats, step for step, past the chunk."""
    from sim.decode.fast_host import host_step_arrays
    from sim.device.physics import gpu_chunk_tokens
    from sim.tiering.tier_plan import ACTIVE, ATT_T0, ATT_T1, ATT_T2, plan_tiers

    ctx = build_context(_closed(prompt=6144, out=4096, access="split"))
    # 1,000 host tokens, 400 of them in the chunks: staged = 0.25 x 1,000 + 0.75 x 400 = 550
    assert gpu_chunk_tokens(ctx.model, 2000, 1000, 550.0, 0.5) == pytest.approx(2000 - 0.5 * 400)
    assert gpu_chunk_tokens(ctx.model, None, 1000, 550.0, 0.5) is None
    att = plan_tiers(ctx).attended
    rows = np.flatnonzero((att[:, ATT_T1] + att[:, ATT_T2] > 0) & (np.arange(len(att)) > 2100))[::97]
    a = host_step_arrays(ctx, att[rows], rows)
    m, p = ctx.scenario.model, ctx.scenario.policy
    s1, s2 = ctx.closed_staged_tokens(att[rows], rows)
    chunks = ctx.closed_chunk_tokens(att[rows], rows)
    for j, r in enumerate(rows):
        row = att[r]
        c = decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, p.prefetch, int(row[ACTIVE]),
                             int(row[ATT_T0]), int(row[ATT_T1]), int(row[ATT_T2]), ctx.kv_bytes_per_token_layer,
                             ctx.t2_bytes_per_token_layer, True, p.access, p.staging_buffers,
                             chunk_tokens=int(chunks[j]), staged_tokens=(float(s1[j]), float(s2[j])))
        copy_s = c.prefetch_copy_s(ctx.hw.h2d) if c.stages else 0.0
        assert (a.step_s[j], a.compute_s[j]) == (c.closed_form_s(ctx.hw, copy_s, p.staging_buffers), c.compute_s)
