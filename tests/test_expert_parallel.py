"""Expert parallelism and attention data parallelism (issue #22 item 2): routing expectations against
brute-force sampling, one GPU's shard by hand (experts whole, the MLA latent no longer replicated),
the dispatch/combine bytes by hand, bad layouts as one line, and tensor parallelism unchanged."""

from __future__ import annotations

from dataclasses import replace
from math import comb, pi, sqrt

import numpy as np
import pytest

from sim.decode.capacity import max_batch
from sim.decode.context import build_context
from sim.device.kernels import datasheet_hardware
from sim.device.moe_exchange import ALLGATHER_REDUCESCATTER, moe_exchange
from sim.device.physics import ACTIVATION_BYTES, layer_comm_s, moe_exchange_s
from sim.inputs import catalog
from sim.inputs.catalog import NO_FIT
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import tables_available
from sim.inputs.scenario import load_scenario
from sim.model.experts import (
    busiest_rank_experts_touched,
    expected_experts_touched,
    expected_max_standard_normal,
    expected_ranks_hit,
    expected_remote_ranks,
)

from .conftest import SCENARIOS

R1 = ["model.name=deepseek-r1", "model.weight_dtype=fp8", "parallel.tp=8"]
EP8 = ["parallel.ep=8"]
DPA8 = ["parallel.ep=8", "parallel.attention_dp=8"]
NEEDS_TABLES = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (the .[measured] extra) not installed")


def _ctx(*overrides: str, policy: str = "full_hbm"):
    sc = load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*R1, *overrides, f"policy.kind={policy}"])
    return build_context(sc)


def _route(rng, experts: int, top_k: int, tokens: int) -> np.ndarray:
    """Each token's top-k distinct experts, uniformly: a (tokens, k) array."""
    return np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]


@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_experts_touched_and_ranks_hit_match_sampling(tokens):
    rng = np.random.default_rng(7)
    E, k, ranks, trials = 64, 6, 8, 4000
    touched, hit = [], []
    for _ in range(trials):
        picks = _route(rng, E, k, tokens)
        touched.append(len(np.unique(picks)))
        hit.append(np.mean([len(np.unique(row // (E // ranks))) for row in picks]))
    assert np.mean(touched) == pytest.approx(expected_experts_touched(E, k, tokens), rel=0.01)
    assert np.mean(hit) == pytest.approx(expected_ranks_hit(E, k, ranks), rel=0.01)


def test_ranks_hit_by_hand():
    # DeepSeek-R1 over 8 GPUs: 32 experts each; a token misses a rank when its 8 picks fall in the other 224
    miss = comb(224, 8) / comb(256, 8)
    assert expected_ranks_hit(256, 8, 8) == pytest.approx(8 * (1 - miss))
    assert expected_remote_ranks(256, 8, 8) == pytest.approx(8 * (1 - miss) * 7 / 8)
    assert 5.0 < expected_ranks_hit(256, 8, 8) < 8.0
    assert expected_ranks_hit(256, 8, 1) == 1.0 and expected_remote_ranks(256, 8, 1) == 0.0


def test_expected_max_of_normals():
    assert expected_max_standard_normal(1) == 0.0
    assert expected_max_standard_normal(2) == pytest.approx(1 / sqrt(pi), abs=1e-6)  # exact: 1 / sqrt(pi)
    assert expected_max_standard_normal(8) == pytest.approx(1.4236, abs=1e-3)  # tabulated order statistics


@pytest.mark.parametrize("tokens", [4, 16, 64])
def test_busiest_rank_matches_sampling(tokens):
    rng = np.random.default_rng(3)
    E, k, ranks = 256, 8, 8
    busiest = []
    for _ in range(1500):
        hit = np.zeros(E, bool)
        hit[_route(rng, E, k, tokens).ravel()] = True
        busiest.append(hit.reshape(ranks, -1).sum(axis=1).max())
    assert busiest_rank_experts_touched(E, k, tokens, ranks) == pytest.approx(np.mean(busiest), rel=0.04)
    assert busiest_rank_experts_touched(E, k, tokens, ranks) > expected_experts_touched(E, k, tokens, E // ranks)


def test_expert_parallel_shard_holds_whole_experts_and_the_same_bytes():
    tp, ep = _ctx(), _ctx(*EP8)
    assert (tp.model.local_experts, tp.model.moe_intermediate_size) == (256, 2048 // 8)
    assert (ep.model.local_experts, ep.model.moe_intermediate_size) == (32, 2048)
    assert ep.weights_bytes == pytest.approx(tp.weights_bytes, rel=1e-12)  # 1/8 of each expert, or 1/8 of them
    assert ep.kv_bytes_per_token_layer == tp.kv_bytes_per_token_layer == (512 + 64) * 2  # latent replicated
    # the step waits for the busiest GPU's experts: more weight bytes read than under tensor parallelism
    assert ep.model.layer_weight_bytes_read("fp8", 64) > tp.model.layer_weight_bytes_read("fp8", 64)
    # at a batch that touches every expert there is no imbalance left
    assert ep.model.layer_weight_bytes_read("fp8", 4096) == pytest.approx(tp.model.layer_weight_bytes_read("fp8", 4096))


def test_attention_data_parallel_splits_the_latent_and_fits_more():
    tp, dpa = _ctx(), _ctx(*DPA8)
    assert dpa.kv_bytes_per_token_layer == (512 + 64) * 2 / 8  # each GPU holds its 1/8 of the sequences
    assert dpa.model.num_heads == 128  # attention tensor-parallel over tp / 8 = 1 GPU
    # attention weights replicated over the 8 ranks: more weights per GPU than tp=8 shards them to
    assert dpa.weights_bytes > tp.weights_bytes
    full = catalog.resolve_model(tp.scenario.model)
    # q_b, kv_b and o split by heads (q_a and kv_a feed every head: each GPU holds them whole anyway)
    a = full.mla
    per_layer = (a.q_lora_rank * 128 * a.qk_head_dim + a.kv_lora_rank * 128 * (a.qk_nope_head_dim + a.v_head_dim)
                 + 128 * a.v_head_dim * full.hidden_size)
    assert dpa.weights_bytes - tp.weights_bytes == pytest.approx(61 * per_layer * 7 / 8, rel=1e-3)  # fp8: 1 B a weight
    assert max_batch(dpa) > 5 * max_batch(tp)


def test_the_engines_exchange_by_hand():
    """No engine: vLLM's default, all_gatherv of the fp8-quantised hidden states (one byte an element and
    an fp32 scale per 128) with the top-8 ids and weights (8 B each), reduce_scatterv of the bf16 outputs."""
    ctx = _ctx(*DPA8)
    m, hw, rows = ctx.model, ctx.hw, 256
    h = m.hidden_size
    assert hw.moe_exchange.method == ALLGATHER_REDUCESCATTER
    gather = hw.gather_s("all_gather", rows * (h * (1 + 4 / 128) + 8 * 8))
    scatter = hw.gather_s("reduce_scatter", rows * h * ACTIVATION_BYTES)
    dense = hw.allreduce_s(rows * h * ACTIVATION_BYTES)  # the 3 dense-MLP layers, over all 8 GPUs
    # attention is tensor-parallel over one GPU: no all-reduce after it
    assert layer_comm_s(m, hw, rows) == pytest.approx((58 * (gather + scatter) + 3 * dense) / 61)
    assert "allgather_reducescatter" in hw.sources["moe_exchange"] and gather > 0 and scatter > 0
    # tensor parallelism (with or without ep): the two all-reduces, as before
    tp = _ctx(*EP8)
    assert layer_comm_s(tp.model, tp.hw, rows) == 2 * tp.hw.allreduce_s(rows * h * ACTIVATION_BYTES)
    assert "moe_exchange" not in tp.hw.sources


def test_an_all_to_all_by_hand():
    """moe_comm alltoall, datasheet: each phase floor + rows / D x remote ranks x h x 2 B / rate, DeepEP's
    low-latency kernels at 32 tokens a rank, their figures fitted on the tables (the catalog's without a fit)."""
    ctx = _ctx(*DPA8, "parallel.moe_comm=alltoall", "hardware.kernels=datasheet")
    m, hw, rows = ctx.model, ctx.hw, 256
    h = m.hidden_size
    remote = expected_remote_ranks(256, 8, 8)
    fits = {(k, p): (f, r) for k, p, f, r in hw.alltoall_fits}
    assert set(fits) == {("ll", "dispatch"), ("ll", "combine"), ("ht", "dispatch"), ("ht", "combine")}
    ways = [fits[("ll", p)][0] + rows / 8 * remote * h * 2 / fits[("ll", p)][1] for p in ("dispatch", "combine")]
    dense = hw.allreduce_s(rows * h * ACTIVATION_BYTES)
    assert layer_comm_s(m, hw, rows) == pytest.approx((58 * sum(ways) + 3 * dense) / 61)
    assert "DeepEP" in hw.sources["moe_exchange"] and "fitted on measured tables" in hw.sources["moe_exchange"]
    bare = replace(hw, alltoall_fits=())  # no fit: the catalog fabric's figures, the same either way
    one_way = bare.alltoall_floor_s + rows / 8 * remote * h * 2 / bare.alltoall_bytes_per_s
    assert layer_comm_s(m, bare, rows) == pytest.approx((58 * 2 * one_way + 3 * dense) / 61)
    assert bare.alltoall_bytes_per_s == 360e9


@NEEDS_TABLES
def test_an_all_to_all_from_deepeps_tables():
    """Measured: TensorRT-LLM's DeepEP tables (latency in microseconds), at a timed point exactly; its LL
    dispatch carries an fp8 model's activations in fp8, its combine and HT kernels bf16."""
    ctx = _ctx(*DPA8, "parallel.moe_comm=alltoall", "engine.name=tensorrt-llm")
    m, hw = ctx.model, ctx.hw
    a = hw.kernels.tables.a2a
    want = 0.0
    for phase, wire in (("dispatch", "fp8"), ("combine", "bf16")):
        r = a[(a.backend == "ll") & (a.phase == phase) & (a.wire == wire) & (a.hidden == 7168) & (a.top_k == 8)
              & (a.experts == 256) & (a.ep == 8) & (a.tokens == 32)]
        want += float(r.latency_s.iloc[0])
    assert 30e-6 < want / 2 < 200e-6  # DeepEP's floors: tens of microseconds
    assert moe_exchange_s(m, hw, 32 * 8) == pytest.approx(want, rel=1e-9)
    assert "moe_a2a DeepEP" in hw.sources["moe_exchange"]
    assert moe_exchange_s(m, hw, 4096 * 8) > moe_exchange_s(m, hw, 256 * 8)  # the HT kernels beyond 256 a rank


def test_gather_collectives_by_hand():
    hw = _ctx(*DPA8).hw
    ring = replace(hw, kernels=None, gather_protocols=(), interconnect_bytes_per_s=400e9, interconnect_hop_s=1e-6)
    assert ring.gather_s("all_gather", 16e6) == pytest.approx(7 / 8 * 16e6 / 400e9 + 7e-6)  # (N - 1) / N of the buffer
    assert ring.gather_s("all_gather", 16e6, gpus=1) == 0.0
    fitted = replace(ring, gather_protocols=(("reduce_scatter", ((8, 5e-6, 100e9, 20e-6, 400e9),)),))
    assert fitted.gather_s("reduce_scatter", 1e6) == pytest.approx(min(5e-6 + 0.875e6 / 100e9, 20e-6 + 0.875e6 / 400e9))
    assert fitted.gather_s("all_gather", 1e6) == ring.gather_s("all_gather", 1e6)  # no fit of that op: the ring


def test_a_gpu_without_a_fit_costs_its_collectives_on_the_fabric():
    hw = datasheet_hardware("h200-sxm", tp=8, fit_from=NO_FIT)
    assert hw.alltoall_fits == () and hw.gather_protocols == ()
    assert hw.gather_s("all_gather", 1e7) == pytest.approx(7 / 8 * 1e7 / 370e9 + 7 * 1e-6)  # nvlink4's ring
    assert hw.alltoall_s(1e6, "ll", "dispatch") == pytest.approx(15e-6 + 1e6 / 360e9)  # the catalog's all-to-all


@pytest.mark.parametrize("engine, dtype, per_element, per_pick", [
    ("vllm", "fp8", 1 + 4 / 128, 8.0), ("vllm", "bf16", 2.0, 8.0),
    ("sglang", "fp8", 2.0, 0.0), ("tensorrt-llm", "fp8", 2.0, 8.0),
    ("tensorrt-llm", "nvfp4", 0.5 + 1 / 16, 8.0),  # quantised before the gather: FP4 values and an fp8 scale per 16
])
def test_each_engines_dispatch_wire(engine, dtype, per_element, per_pick):
    x = moe_exchange(engine, dtype)
    assert (x.method, x.dispatch_bytes_per_element, x.routing_bytes_per_pick) == (ALLGATHER_REDUCESCATTER, per_element,
                                                                                 per_pick)
    assert x.dispatch_bytes_per_token(7168, 8) == 7168 * per_element + 8 * per_pick
    assert moe_exchange(engine, dtype, "alltoall").method == "alltoall"
    with pytest.raises(ValueError, match="moe_comm must be one of engine, alltoall"):
        moe_exchange(engine, dtype, "deepep")


@pytest.mark.parametrize("overrides, field, says", [
    (["parallel.ep=4"], "parallel.ep", "expected 1 (experts split by tensor parallelism) or 8"),
    (["parallel.attention_dp=3"], "parallel.attention_dp", "attention_dp 3 must divide tp 8"),
    (["parallel.attention_dp=8"], "parallel.attention_dp", "needs expert parallelism over the group (ep: 8)"),
])
def test_bad_layouts_are_one_line(overrides, field, says):
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*R1, *overrides])
    assert err.value.field == field and says in str(err.value) and "\n" not in str(err.value)


def test_expert_parallelism_needs_experts():
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["parallel.tp=4", "parallel.ep=4"])
    assert err.value.field == "parallel.ep" and "needs a mixture-of-experts model" in str(err.value)


def test_tensor_parallel_scenarios_dump_as_before():
    sc = load_scenario(SCENARIOS / "h200-7b-batch.yaml", R1)
    assert sc.model_dump(mode="json")["parallel"] == {"tp": 8}
    sc = load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*R1, *DPA8])
    assert sc.model_dump(mode="json")["parallel"] == {"tp": 8, "ep": 8, "attention_dp": 8}


# ---- the planner: expert layouts searched, their scenarios and launch commands ----------------------

def _moe_base():
    from sim.inputs.scenario import load_scenario as load

    return load(SCENARIOS / "serving-h100-70b-tp4.yaml", ["model.name=qwen3-30b-a3b", "parallel.tp=1"])


def test_the_planner_searches_expert_layouts_for_a_mixture_of_experts():
    from sim.plan import candidates as C
    from sim.plan import search as P

    base = _moe_base()
    cands, _ = P.candidates(base, ["h100-sxm"], [2], ["full_hbm"], disagg=False)
    got = {(c.tp_size, c.replicas, c.experts, c.layout) for c in cands}
    assert got == {(1, 2, None, "TP1 x 2"), (2, 1, None, "TP2"), (2, 1, "ep", "TP2+EP2"), (2, 1, "ep+dpa", "DPA2+EP2")}
    dpa = next(c for c in cands if c.experts == "ep+dpa")
    sc = C.candidate_scenario(base, dpa, 1.0, C.PlanSpec(1.0, 2.0, 0.05))
    assert sc.parallel.layout == (2, 2, 2)
    # a dense model gets tensor parallelism only
    dense = load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml", ["parallel.tp=1", "model.name=deepseek-r1-distill-qwen-7b"])
    assert {c.experts for c in P.candidates(dense, ["h100-sxm"], [2], ["full_hbm"], disagg=False)[0]} == {None}
    assert C.expert_layouts(base, "h100-sxm", 1) == [None]


def test_expert_layout_launch_commands():
    from sim.plan import launch as L

    rest = (8192, 0.9, True, "full_hbm", None, "bf16", "bf16")
    ep = L.launch_commands("Qwen/Qwen3-30B-A3B", 2, 1, 256, *rest, experts="ep")
    assert ep["vllm"].endswith("--enable-chunked-prefill --enable-expert-parallel")
    assert "--tensor-parallel-size 2 --data-parallel-size 1" in ep["vllm"]
    assert ep["sglang"].endswith("--ep-size 2")
    dpa = L.launch_commands("Qwen/Qwen3-30B-A3B", 2, 3, 256, *rest, experts="ep+dpa")
    # vLLM: 2 data-parallel ranks of one GPU each, 128 sequences a rank; SGLang: the group's cap over its dp ranks
    assert "--tensor-parallel-size 1 --data-parallel-size 2 --max-num-seqs 128" in dpa["vllm"]
    assert "--enable-expert-parallel" in dpa["vllm"]
    assert "--tp-size 2 --dp-size 2 --max-running-requests 256" in dpa["sglang"]
    assert "--enable-dp-attention --ep-size 2" in dpa["sglang"]
    assert all(line.endswith("run 3 behind the load balancer") for line in dpa.values())


# ---- skewed routing ----------------------------------------------------------------------------------

def test_routing_probabilities_sum_to_top_k_capped_at_one():
    from sim.model.experts import routing_probabilities

    assert routing_probabilities(256, 8, 0.0) == (8 / 256,) * 256  # uniform
    for skew in (0.5, 1.0, 2.0):
        pi = np.array(routing_probabilities(256, 8, skew))
        assert pi.sum() == pytest.approx(8.0) and pi.max() <= 1.0 and pi.min() > 0
    assert np.array(routing_probabilities(256, 8, 2.0)).max() == 1.0  # the top expert serves every token


@pytest.mark.parametrize("skew", [0.5, 1.0])
def test_skewed_experts_touched_match_sampling(skew):
    from sim.model.experts import routing_probabilities, skewed_busiest_rank, skewed_experts_touched

    pi = np.array(routing_probabilities(64, 6, skew))
    rng = np.random.default_rng(11)
    hits = rng.random((3000, 16, 64)) < pi  # 16 tokens, each expert taken with its marginal probability
    touched = hits.any(axis=1)
    assert touched.sum(axis=1).mean() == pytest.approx(skewed_experts_touched(64, 6, 16, skew), rel=0.01)
    busiest = touched.reshape(3000, 8, 8).sum(axis=2).max(axis=1).mean()
    assert skewed_busiest_rank(64, 6, 16, 8, skew) == pytest.approx(busiest, rel=0.08)


def test_skew_helps_tensor_parallelism_and_unbalances_expert_parallelism():
    from sim.model.experts import busiest_routing_share

    assert busiest_routing_share(256, 8, 8, 0.0) == pytest.approx(1.0)
    assert busiest_routing_share(256, 8, 8, 1.0) > 1.2
    uniform, skewed = _ctx(), _ctx("model.routing_skew=1.0")
    # popular experts: fewer distinct ones per step, fewer weight bytes read under TP
    assert skewed.model.layer_weight_bytes_read("fp8", 32) < 0.8 * uniform.model.layer_weight_bytes_read("fp8", 32)
    ep = _ctx(*EP8, "model.routing_skew=1.0")
    # under EP the busiest GPU holds more than its share of the popular experts
    assert ep.model.expected_experts_touched(32) > skewed.model.expected_experts_touched(32) / 8 * 1.2
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["model.routing_skew=1"])
    assert err.value.field == "model.routing_skew" and "mixture-of-experts" in str(err.value)
    assert "routing_skew" not in load_scenario(SCENARIOS / "h200-7b-batch.yaml").model_dump(mode="json")["model"]


def test_attention_waits_for_the_busiest_data_parallel_rank():
    from sim.device.physics import busiest_rank_factor, decode_attention_s

    assert busiest_rank_factor(4, 8) == 2.0 and busiest_rank_factor(16, 8) == 1.0
    assert busiest_rank_factor(198, 8) == pytest.approx(25 * 8 / 198)
    ctx = _ctx(*DPA8)
    m, hw, kvl = ctx.model, ctx.hw, ctx.kv_bytes_per_token_layer

    def attention(batch: int) -> float:
        tokens = batch * 4096
        return decode_attention_s(m, hw, batch, tokens, (tokens + batch) * kvl, kvl)

    # 4 sequences over 8 ranks: the busiest holds one, as with 8 sequences - the same time
    assert attention(4) == pytest.approx(attention(8))
    assert attention(9) == pytest.approx(attention(16))  # 9 over 8: one rank holds 2, as 16 over 8


def test_engines_that_run_the_dense_parts_data_parallel_replicate_them_on_every_rank():
    """TensorRT-LLM and vLLM under attention DP: the dense MLPs, shared experts, embedding and LM head
    unsplit on each of D = tp ranks (SGLang and a run without an engine split them over the group).
    DeepSeek-R1 over 8 GPUs: each rank then holds 7/8 more of them, in bytes exactly."""
    from sim.device.engine_rules import engine_dense_dp
    from sim.model.spec import MLP_MATRICES

    assert engine_dense_dp("tensorrt-llm") and engine_dense_dp("vllm")
    assert not engine_dense_dp("sglang") and not engine_dense_dp(None)
    r1 = catalog.model("deepseek-r1")
    split, replicated = r1.shard(8, 8, 8), r1.shard(8, 8, 8, dense_dp=True)
    assert (split.intermediate_size, replicated.intermediate_size) == (r1.intermediate_size // 8, r1.intermediate_size)
    assert replicated.shared_expert_intermediate_size == r1.shared_expert_intermediate_size
    assert replicated.vocab_size == r1.vocab_size and replicated.dense_dp and not split.dense_dp
    h = r1.hidden_size
    dense = r1.dense_mlp_layers * MLP_MATRICES * h * r1.intermediate_size  # fp8, one byte (+ block scales)
    shared = r1.moe_layers * MLP_MATRICES * h * r1.shared_expert_intermediate_size
    vocab = 2 * 2 * r1.vocab_size * h  # embedding + LM head, bf16
    more = replicated.weight_bytes("fp8") - split.weight_bytes("fp8")
    assert more == pytest.approx(7 / 8 * (dense + shared) + 7 / 8 * vocab, rel=0.01)
    # the rank's own tokens: per token of the group's batch, 1/8 of the replicated parts' parameters
    assert replicated.active_linear_params_layer() == pytest.approx(split.active_linear_params_layer(), rel=1e-9)
    # without attention DP nothing changes
    assert r1.shard(8, 8, 1, dense_dp=True) == r1.shard(8, 8, 1)


def test_sglang_holds_the_whole_embedding_under_attention_dp_and_splits_the_lm_head():
    """SGLang under --enable-dp-attention: VocabParallelEmbedding(enable_tp=not is_dp_attention_enabled())
    - every GPU the whole embedding - while the LM head stays vocab-parallel over the group: DeepSeek-R1
    over 8 GPUs holds 7/8 of a bf16 vocab x hidden matrix more a GPU than split, its LM head's bytes a
    step unchanged; nothing changes without attention DP or for the other engines."""
    from sim.device.engine_rules import engine_whole_embedding

    assert engine_whole_embedding("sglang")
    assert not any(engine_whole_embedding(e) for e in ("vllm", "tensorrt-llm", None))
    r1 = catalog.model("deepseek-r1")
    split, whole = r1.shard(8, 8, 8), r1.shard(8, 8, 8, whole_embedding=True)
    assert whole.embedding_vocab_size == r1.vocab_size and whole.vocab_size == split.vocab_size == -(-r1.vocab_size // 8)
    more = whole.weight_bytes("fp8") - split.weight_bytes("fp8")
    assert more == 2 * (r1.vocab_size - split.vocab_size) * r1.hidden_size  # bf16, exactly
    assert whole.lm_head_bytes() == split.lm_head_bytes()
    assert r1.shard(8, 8, 1, whole_embedding=True) == r1.shard(8, 8, 1)
    sglang, plain = _ctx(*DPA8, "engine.name=sglang"), _ctx(*DPA8)
    assert sglang.model.embedding_params() == r1.vocab_size * r1.hidden_size
    assert plain.model.embedding_params() == split.vocab_size * r1.hidden_size


def test_a_data_parallel_dense_layer_reduces_within_its_attention_group_only():
    r1 = catalog.model("deepseek-r1")
    hw = datasheet_hardware("h200-sxm", tp=8)
    split, replicated = r1.shard(8, 8, 8), r1.shard(8, 8, 8, dense_dp=True)
    rows = 1024
    exchange = moe_exchange_s(split, hw, rows)
    attention = hw.allreduce_s(rows / 8 * r1.hidden_size * ACTIVATION_BYTES, gpus=1)
    group = hw.allreduce_s(rows * r1.hidden_size * ACTIVATION_BYTES)
    L = r1.num_layers
    assert layer_comm_s(split, hw, rows) == pytest.approx(
        attention + (r1.moe_layers * exchange + r1.dense_mlp_layers * group) / L)
    assert layer_comm_s(replicated, hw, rows) == pytest.approx(
        attention + (r1.moe_layers * exchange + r1.dense_mlp_layers * attention) / L)


def test_a_data_parallel_dense_gemm_runs_over_its_ranks_rows():
    """Under attention DP with data-parallel dense parts (TensorRT-LLM's DEP) each rank multiplies its own
    ceil(rows / D) tokens through its whole dense weights: the GEMM's tiles, weight re-reads and per-row
    work are the rank's. DeepSeek-R1 NVFP4 over 4 B200s at 2,048 rows: the dense part is the datasheet
    kernel at 512 rows; where the dense parts split over the group (SGLang), at 2,048."""
    from sim.device.moe_datasheet import moe_fit_for
    from sim.device.moe_mla_costs import routed_work
    from sim.device.physics import (
        GEMM_CALLS_PER_LAYER,
        _layer_weights_read,
        gemm_flop,
        model_moe_s,
        moe_quant,
        rank_rows,
        weight_gemm_s,
        weight_kernel_s,
    )

    r1 = catalog.model("deepseek-r1")
    hw = datasheet_hardware("b200", "nvfp4", tp=4)
    replicated, split = r1.shard(4, 4, 4, dense_dp=True), r1.shard(4, 4, 4)
    assert rank_rows(replicated, 2048) == 512 and rank_rows(split, 2048) == 2048
    assert rank_rows(replicated, 2045) == 512 and rank_rows(r1.shard(4, 4, 1, dense_dp=True), 2048) == 2048
    rows = 2048
    quant = moe_quant(replicated, hw, "nvfp4", 16)
    w, p = _layer_weights_read(replicated, "nvfp4", 16, rows)
    rb, rp, rf = routed_work(replicated, "nvfp4", 16, rows)
    rest = weight_gemm_s(hw, w - rb, p - rp, gemm_flop(replicated, rows) - rf, 512, GEMM_CALLS_PER_LAYER)
    fitted, alpha = moe_fit_for(replicated, hw, "nvfp4", 16)
    routed = model_moe_s(replicated, fitted, "nvfp4", 16, rows, alpha)  # the datasheet's MoE fit over the group's rows
    assert quant is None and fitted is not None
    assert weight_kernel_s(replicated, hw, "nvfp4", 16, rows) == pytest.approx(rest + routed, rel=1e-12)
    # the 16 row tiles of the group's batch would re-read the weights 4x as often as the rank's 4
    assert weight_gemm_s(hw, w - rb, p - rp, gemm_flop(replicated, rows) - rf, rows, GEMM_CALLS_PER_LAYER) > 2 * rest
