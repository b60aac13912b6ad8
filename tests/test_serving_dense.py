"""The serving engine's shortcuts for runs that hold every token in HBM: the scheduler's dense counts
(`Scheduler.dense`: full_hbm, one column of prompt + generated tokens) and the decode
steps costed once per batch size (`ServingSim.decode_cost`). Each must give exactly what the general
path gives - every request's times and every timeline row, bit for bit - in every regime it covers:
an open queue, preemption (recompute and swap), TensorRT-LLM's no-evict admission, unchunked prefill, closed-loop
clients, a decode instance's prefilled requests and a model with window layers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.decode.context import build_context
from sim.device.physics import mixed_step_cost
from sim.inputs.scenario import scenario_from_dict
from sim.serving.engine import ServingSim
from sim.serving.kv_memory import kv_memory
from sim.serving.run import simulate_serving
from sim.serving.scheduler import Scheduler


def scenario(model: str = "llama-3.1-8b", scheduler: dict | None = None, arrivals: dict | None = None,
             hardware: dict | None = None, policy: str = "full_hbm") -> dict:
    return {
        "name": "dense",
        "model": {"name": model},
        "hardware": hardware or {"gpu": "h100-sxm"},
        "workload": {"prompt_tokens": {"dist": "uniform", "min": 64, "max": 1536},
                     "reasoning_tokens": {"dist": "lognormal", "mean": 256, "std": 128, "min": 8, "max": 1024},
                     "seed": 3, "arrivals": arrivals or {"kind": "poisson", "rate_per_s": 30.0, "requests": 300}},
        "scheduler": scheduler or {},
        "policy": {"kind": policy},
        "sim": {"detail": "step"},
    }


def tight_hardware(data: dict, sequences: int) -> dict:
    """The scenario's GPU with a KV budget of about `sequences` sequences of 1,000 tokens: growth preempts."""
    ctx = build_context(scenario_from_dict(data, "dense.yaml"))
    mem = kv_memory(ctx, 8192, 256)
    reserve = mem.hbm_capacity_bytes - mem.weights_bytes - mem.activation_bytes - sequences * 1000 * ctx.kv_bytes_per_token
    return {"gpu": "h100-sxm", "efficiency": {"runtime_reserve_bytes": reserve}}


def general(monkeypatch) -> None:
    """Turn both shortcuts off: the tier counter's counts and every step through `mixed_step_cost`."""
    monkeypatch.setattr(Scheduler, "dense", property(lambda self: False, lambda self, value: None), raising=False)

    def full_cost(self, n: int, t0: int, chunk_tokens: int | None = None):
        ctx, m, pol = self.ctx, self.ctx.scenario.model, self.ctx.scenario.policy
        return mixed_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, pol.prefetch, n, t0, 0, 0,
                               ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, staged=self.device.staged,
                               access=pol.access, buffers=pol.staging_buffers, chunk_tokens=chunk_tokens)

    monkeypatch.setattr(ServingSim, "decode_cost", full_cost)


def runs(data: dict, monkeypatch, prefilled: bool = False):
    """(shortcut run, general run, whether the shortcut run took the dense path)."""
    seen = []
    init = Scheduler.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(self.dense)

    monkeypatch.setattr(Scheduler, "__init__", spy)
    sc = scenario_from_dict(data, "dense.yaml")
    fast = simulate_serving(sc, prefilled=prefilled)
    with monkeypatch.context() as m:
        general(m)
        slow = simulate_serving(sc, prefilled=prefilled)
    return fast, slow, seen[0]


CASES = {
    "open queue": scenario(),
    "unchunked, a small token budget": scenario(scheduler={"chunked_prefill": False, "max_num_batched_tokens": 2048}),
    "no-evict admission": scenario(scheduler={"admission": "no_evict"}),
    "closed loop": scenario(arrivals={"kind": "closed_loop", "concurrency": 48, "requests": 200}),
    "window layers (gpt-oss-20b)": scenario(model="gpt-oss-20b"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_dense_path_gives_the_general_figures_bit_for_bit(case, monkeypatch):
    fast, slow, dense = runs(CASES[case], monkeypatch)
    assert dense
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.timeline, slow.timeline, check_exact=True)
    assert fast.summary == slow.summary


def test_preempted_requests_are_recomputed_alike(monkeypatch):
    data = scenario(arrivals={"kind": "poisson", "rate_per_s": 60.0, "requests": 300})
    data["hardware"] = tight_hardware(data, 24)
    fast, slow, dense = runs(data, monkeypatch)
    assert dense and fast.summary.preemptions > 0
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    assert fast.summary == slow.summary


def test_a_decode_instance_admits_its_prefilled_requests_alike(monkeypatch):
    fast, slow, dense = runs(scenario(), monkeypatch, prefilled=True)
    assert dense
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    assert fast.summary == slow.summary


@pytest.mark.parametrize("policy", ["tiered", "evict_only"])
def test_policies_that_move_tokens_keep_the_general_path(policy, monkeypatch):
    fast, slow, dense = runs(scenario(policy=policy), monkeypatch)
    assert not dense  # (their steps that attend T0 alone still take the per-batch decode cost)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)


@pytest.mark.parametrize("swap_space_bytes", [None, 3e8])
def test_swapped_requests_come_back_alike(swap_space_bytes, monkeypatch):
    """Swap preemption: K/V out to the host and back, and (a small swap space) recomputed where it has no room."""
    data = scenario(scheduler={"preemption": "swap", "swap_space_bytes": swap_space_bytes},
                    arrivals={"kind": "poisson", "rate_per_s": 60.0, "requests": 300})
    data["hardware"] = tight_hardware(data, 24)
    fast, slow, dense = runs(data, monkeypatch)
    assert dense and fast.summary.preemptions > 0 and fast.summary.swaps > 0
    if swap_space_bytes:
        assert fast.summary.swap_fallbacks > 0
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.timeline, slow.timeline, check_exact=True)
    assert fast.summary == slow.summary


def test_fields_replaced_is_dataclasses_replace():
    """The step cost's fast copy is `dataclasses.replace` for these classes (nothing runs after __init__)."""
    import dataclasses

    from sim.device.physics import LayerCost, StepCost, fields_replaced

    layer = LayerCost(1e-4, 2e-4, 5e-6, qkv_share=0.2, host_s=1e-5, allreduce_s=3e-5)
    cost = StepCost(layer, 80, 1e-3, 0.0, 0)
    assert not hasattr(LayerCost, "__post_init__") and not hasattr(StepCost, "__post_init__")
    got = fields_replaced(cost, layer=fields_replaced(layer, attention_s=7e-4), tail_s=2e-3)
    want = dataclasses.replace(cost, layer=dataclasses.replace(layer, attention_s=7e-4), tail_s=2e-3)
    assert got == want and type(got.layer) is LayerCost and got.layer.total_s == want.layer.total_s
    assert layer.attention_s == 2e-4  # the original is untouched


def test_the_uniform_pipeline_end_is_the_layerwise_pipeline_end():
    """`uniform_pipeline_finish_s` (the closed form of a tiered step) ends where `layerwise_pipeline`'s
    last layer ends, bit for bit: copies shorter and longer than a layer, one to four buffers, none staged."""
    from sim.device.physics import layerwise_pipeline, uniform_pipeline_finish_s

    rng = np.random.default_rng(7)
    for _ in range(300):
        pre, rest = (float(x) for x in rng.uniform(1e-6, 1e-3, 2))
        copy = float(rng.choice([0.0, rng.uniform(1e-7, 3e-3)]))
        layers, buffers = int(rng.integers(1, 96)), int(rng.integers(1, 5))
        _, spans = layerwise_pipeline([pre] * layers, [rest] * layers, [copy] * layers, buffers)
        assert uniform_pipeline_finish_s(pre, rest, copy, layers, buffers) == spans[-1][1]
