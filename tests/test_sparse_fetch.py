"""Sparse top-k attention (DeepSeek-V3.2's indexer) and the sparse_fetch access (issue #22 item 3): the
catalog model's bytes by hand, one sparse layer's work by hand, a fetch's bytes and copies by hand for
each copy mode, its staging, the on-demand pipeline, the levels agreeing, and bad input as one line."""

from __future__ import annotations

import math

import pytest

from sim.decode.context import build_context
from sim.decode.simulate import simulate
from sim.device.physics import (
    decode_step_cost,
    kind_attention_flop_per_token,
    on_demand_pipeline,
    sparse_attention_work,
)
from sim.device.sparse_fetch import SparseFetch, fetch_layer, selected_host_rows, staging_bytes
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.hf_config import config_from_mapping
from sim.inputs.scenario import load_scenario
from sim.model.layers import SPARSE

from .conftest import SCENARIOS

V32 = ["model.name=deepseek-v3.2", "model.weight_dtype=fp8", "parallel.tp=8"]
LATENT = (512 + 64) * 2  # bf16 latent a token a layer
INDEXER = 128 + 4  # fp8 key of index_head_dim 128 + one fp32 scale


def _scenario(*overrides: str):
    return load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*V32, *overrides])


def test_catalog_model_by_hand():
    m, r1 = catalog.model("deepseek-v3.2"), catalog.model("deepseek-r1")
    assert m.kind_counts == {SPARSE: 61} and m.sparse.index_topk == 2048
    assert m.kv_bytes_per_token() == 61 * LATENT == 70_272  # what tiers: the latent, as R1's
    assert m.indexer_bytes_per_token() == 61 * INDEXER == 8_052  # what stays in HBM per token
    assert m.bounded_bytes(1000, 2) == pytest.approx(1000 * 8_052)
    # parameters: R1's + each layer's indexer (wq_b 1536 -> 64 x 128, wk 7168 -> 128, weights_proj 7168 -> 64, k_norm)
    indexer = 1536 * 64 * 128 + 7168 * 128 + 7168 * 64 + 2 * 128
    assert m.params - r1.params == 61 * indexer
    assert m.describe_kinds() == "61 sparse (top-2048); 3 dense MLP"
    # tensor parallelism splits the query heads, not the latent nor the indexer (replicated, as engines do)
    s = m.shard(8)
    assert (s.kv_bytes_per_token(), s.indexer_bytes_per_token(), s.sparse) == (70_272, 8_052, m.sparse)


def test_one_sparse_layer_by_hand():
    m = catalog.model("deepseek-v3.2").shard(8)  # 16 query heads a GPU
    flop, nbytes = sparse_attention_work(m, 2, 10_000, "bf16")
    selected = 2 * 2048  # each of the 2 sequences attends its top 2,048
    assert flop == pytest.approx(2 * 16 * (576 + 512) * selected + 2 * 64 * 128 * 10_000)
    assert nbytes == pytest.approx((selected + 2) * LATENT + 10_000 * INDEXER)
    assert kind_attention_flop_per_token(m, SPARSE) == 2 * 16 * (576 + 512)
    # short contexts: every token is attended
    assert sparse_attention_work(m, 2, 1_000, "bf16")[1] == pytest.approx((1_000 + 2) * LATENT + 1_000 * INDEXER)


def test_fetch_by_hand_for_each_copy_mode():
    m = catalog.model("deepseek-v3.2")
    # 4 sequences of 8,192 tokens, a quarter on the host (T1): the indexer's 4 x 2,048 picks, a quarter there
    t0, t1, batch = 4 * 6144, 4 * 2048, 4
    picks = 4 * 2048 * 0.25
    assert selected_host_rows(m, batch, t0, t1, 0) == picks
    assert fetch_layer(m, SparseFetch(copy="rows"), batch, t0, t1, 0, LATENT, 0.0) == (picks * LATENT, 2048, 0.0)
    assert fetch_layer(m, SparseFetch(copy="gather"), batch, t0, t1, 0, LATENT, 0.0) == (picks * LATENT, 1, 0.0)
    # blocks of 64: a sequence's 2,048 host rows are 32 blocks; 512 picks among them hit 32 x (1 - (3/4)^64)
    blocks = 4 * 32 * (1 - 0.75 ** 64)
    nbytes, copies, _ = fetch_layer(m, SparseFetch(copy="blocks", block_tokens=64), batch, t0, t1, 0, LATENT, 0.0)
    assert copies == math.ceil(blocks) and nbytes == pytest.approx(min(blocks * 64, t1) * LATENT)
    # reuse: 60% of the picks were fetched last step
    assert fetch_layer(m, SparseFetch(0.6, "rows"), batch, t0, t1, 0, LATENT, 0.0)[0] == pytest.approx(0.4 * picks * LATENT)
    assert fetch_layer(m, SparseFetch(), batch, t0 + t1, 0, 0, LATENT, 0.0) == (0.0, 0, 0.0)  # nothing on the host


def test_staging_by_hand():
    m = catalog.model("deepseek-v3.2")
    picks = 4 * 2048 * 0.25
    assert staging_bytes(m, SparseFetch(), 2, 4, 4 * 6144, 4 * 2048, 0, LATENT) == pytest.approx(2 * picks * LATENT)
    # reusing 50% keeps those picks of every sparse layer on the GPU
    assert staging_bytes(m, SparseFetch(0.5), 2, 4, 4 * 6144, 4 * 2048, 0, LATENT) == pytest.approx(
        (2 * 0.5 * picks + 0.5 * picks * 61) * LATENT)


def test_a_fetch_waits_for_its_layer_indexer():
    copies, layers = on_demand_pipeline(1.0, 2.0, 0.5, 3)
    assert copies == [(1.0, 1.5), (4.5, 5.0), (8.0, 8.5)]
    assert layers[-1] == (7.0, 10.5)  # 3 x (pre + copy + rest): nothing overlaps the copies
    ctx = build_context(_scenario("policy.access=sparse_fetch", "policy.fetch_copy=gather"))
    m, hw = ctx.model, ctx.hw
    cost = decode_step_cost(m, hw, "fp8", 128, "layerwise_async", 4, 4 * 6144, 4 * 2048, 0, ctx.kv_bytes_per_token_layer,
                            ctx.t2_bytes_per_token_layer, True, "sparse_fetch", 2, fetch=ctx.sparse_fetch)
    assert cost.on_demand and cost.prefetch_copies_per_layer == 1
    assert cost.prefetch_bytes_per_layer == pytest.approx(2048 * LATENT)
    copy_s = cost.prefetch_copy_s(hw.h2d)
    assert cost.closed_form_s(hw, copy_s, 2) == pytest.approx(cost.compute_s + 61 * copy_s)


def test_the_levels_agree_and_long_contexts_favour_fetching_the_picks():
    base = ["workload.batch_size=8", "workload.reasoning_tokens=512", "policy.access=sparse_fetch",
            "policy.fetch_copy=gather"]
    step = simulate(_scenario(*base, "sim.detail=step")).summary
    layer = simulate(_scenario(*base, "sim.detail=layer")).summary
    fast = simulate(_scenario(*base, "sim.detail=fast")).summary  # timed at the step level (on-demand copies)
    assert layer.throughput_tok_per_s == pytest.approx(step.throughput_tok_per_s, rel=0.02)
    assert fast.throughput_tok_per_s == pytest.approx(step.throughput_tok_per_s, rel=0.02)
    assert step.h2d_bytes > 0
    # 16K-token reasoning, half of it on the host: fetching the 2,048 picks beats prefetching every host token
    long = ["workload.batch_size=16", "workload.reasoning_tokens=16384", "sim.detail=step", "sim.step_stride=16"]
    fetch = simulate(_scenario(*long, "policy.access=sparse_fetch", "policy.fetch_copy=gather")).summary
    prefetch = simulate(_scenario(*long)).summary
    assert fetch.throughput_tok_per_s > 2 * prefetch.throughput_tok_per_s
    assert fetch.h2d_bytes < prefetch.h2d_bytes / 2


def test_sparse_fetch_needs_a_sparse_model():
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["policy.access=sparse_fetch"])
    assert err.value.field == "policy.access" and "needs a sparse-attention model" in str(err.value)
    cfg = {k: v for k, v in next(e for e in catalog._read_catalog("models.yaml")["models"]
                                 if e["name"] == "deepseek-v3.2")["config"].items() if k != "index_n_heads"}
    with pytest.raises(ConfigError) as err:
        config_from_mapping(cfg, "config.json")
    assert err.value.field == "index_n_heads" and "sparse attention" in str(err.value)


def test_sparse_policy_fields_dump_only_when_set():
    plain = _scenario().model_dump(mode="json")["policy"]
    assert not {"sparse_reuse", "fetch_copy", "fetch_block_tokens"} & set(plain)
    set_ = _scenario("policy.access=sparse_fetch", "policy.fetch_copy=blocks").model_dump(mode="json")["policy"]
    assert set_["fetch_copy"] == "blocks"


def test_the_access_study_and_the_planner_compare_sparse_fetch_for_sparse_models():
    from sim.plan.candidates import default_access, parse_policies
    from sim.studies.access_strategies import access_table, strategies

    assert strategies("deepseek-v3.2")[-2:] == ("sparse_fetch/rows", "sparse_fetch/gather")
    assert "sparse_fetch/rows" not in strategies("deepseek-r1")
    assert default_access(_scenario()) == "prefetch,sparse_fetch"
    assert default_access(load_scenario(SCENARIOS / "h200-7b-batch.yaml")) is None
    assert "tiered:0.5/sparse_fetch" in parse_policies("tiered:0.5", default_access(_scenario()))
    table = access_table("deepseek-v3.2", "fp8", ("h200-sxm",), 16384, parallel={"tp": 8, "ep": 8, "attention_dp": 8})
    by = table.set_index("access")
    # a copy per picked row drowns in per-copy latency; gathered, the picks beat prefetching every host token
    assert by.loc["sparse_fetch/rows", "throughput_tok_per_s"] < 0.01 * by.loc["prefetch", "throughput_tok_per_s"]
    assert by.loc["sparse_fetch/gather", "throughput_tok_per_s"] > 2 * by.loc["prefetch", "throughput_tok_per_s"]
    assert by.loc["sparse_fetch/gather", "max_batch"] > by.loc["sparse_fetch/gather", "full_hbm_max_batch"]
