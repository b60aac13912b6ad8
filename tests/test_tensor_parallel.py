"""Tensor parallelism (issue #14, part 2): one GPU's shard of the model, the two all-reduces per
layer on the catalog interconnect, and tp = 1 identical to a single GPU (the golden files pin that)."""

from __future__ import annotations

import pytest

from sim.decode.context import build_context
from sim.decode.simulate import simulate
from sim.device.physics import decode_layer_cost
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.scenario import load_scenario

from .conftest import SCENARIOS

LLAMA_70B = "deepseek-r1-distill-llama-70b"  # 80 layers, 64 heads, 8 KV heads, h 8192, I 28672, V 128256


def test_tp1_is_the_model_itself():
    m = catalog.model(LLAMA_70B)
    assert m.shard(1) is m


def test_a_tp4_shard_by_hand():
    s = catalog.model(LLAMA_70B).shard(4)
    assert (s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size, s.vocab_size) == (16, 2, 128, 7168, 32064)
    assert s.kv_bytes_per_token("bf16") == 327_680 / 4
    h = 8192
    linear = h * 16 * 128 + 2 * h * 2 * 128 + 16 * 128 * h + 3 * h * 7168
    assert s.layer_weight_bytes("bf16") == 2 * (linear + 2 * h)  # + two RMSNorms, replicated


def test_kv_heads_replicate_past_their_count():
    s = catalog.model(LLAMA_70B).shard(16)
    assert s.num_kv_heads == 1 and s.num_heads == 4
    assert s.kv_bytes_per_token("bf16") == 2 * 80 * 1 * 128 * 2


def test_allreduce_by_hand_and_in_the_layer():
    sc = load_scenario(SCENARIOS / "h200-70b-int4.yaml", ["parallel.tp=4", "hardware.gpu=h100-sxm", "hardware.kernels=datasheet"])
    ctx = build_context(sc)
    hw = ctx.hw
    nbytes = 8 * 8192 * 2  # batch 8 x hidden x bf16
    p = catalog.fitted_kernels()["h100-sxm"].allreduce["custom"].by_gpus[4]  # fitted on vLLM's custom all-reduce
    ring = 2 * 3 / 4 * nbytes
    expect = min(p.latency_floor_s + ring / p.latency_bus_bytes_per_s, p.bandwidth_floor_s + ring / p.bandwidth_bus_bytes_per_s)
    assert hw.allreduce_s(nbytes) == pytest.approx(expect)
    assert hw.sources["interconnect"].startswith("fitted on measured custom all-reduces")
    cost = decode_layer_cost(ctx.model, hw, "int4", 128, 8, 8 * 1000, ctx.kv_bytes_per_token_layer)
    assert cost.allreduce_s == pytest.approx(2 * expect)
    assert cost.device_s == pytest.approx(cost.gemm_s + cost.attention_s + cost.overhead_s + 2 * expect)


def test_more_gpus_fit_more_and_decode_faster():
    base = ["model.weight_dtype=bf16", "hardware.gpu=h100-sxm", "policy.kind=full_hbm", "workload.batch_size=8",
            "workload.reasoning_tokens=512", "sim.detail=step"]
    runs = {tp: simulate(load_scenario(SCENARIOS / "h200-70b-int4.yaml", [*base, f"parallel.tp={tp}"])).summary
            for tp in (1, 2, 4)}
    assert runs[1].fits is False  # 141 GB of bf16 weights on one 85.5 GB H100
    assert runs[2].fits and runs[4].fits
    assert runs[4].throughput_tok_per_s > runs[2].throughput_tok_per_s
    assert runs[4].max_batch > runs[2].max_batch > 0
    assert runs[4].weights_bytes == pytest.approx(runs[1].weights_bytes / 4, rel=0.01)  # per GPU


def test_a_tp_the_model_cannot_take_names_the_field():
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-70b-int4.yaml", ["parallel.tp=3"])
    assert err.value.field == "parallel.tp" and "not divisible by tp 3" in err.value.message
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["parallel.tp=8"])  # 28 heads
    assert err.value.field == "parallel.tp"


def test_every_gpu_names_a_catalog_interconnect():
    for gpu in catalog.gpus().values():
        assert catalog.interconnect(gpu.interconnect).bus_bytes_per_s > 0
