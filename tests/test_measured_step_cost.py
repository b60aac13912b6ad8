"""`hardware.kernels`: the step cost from AIConfigurator's measured tables (dense GEMMs, decode
attention, custom all-reduce) instead of the datasheet model - the default (`auto`) where the tables
cover the GPU and no profile is given."""

from __future__ import annotations

import numpy as np
import pytest

from sim.decode.context import build_context
from sim.decode.simulate import simulate
from sim.device.kernels import measured_kernels
from sim.device.physics import decode_layer_cost, lm_head_s
from sim.inputs.kernel_tables import tables_available
from sim.inputs.scenario import load_scenario

from .conftest import SCENARIOS, run_cli
from .promise import assert_refused

pytestmark = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (the .[measured] extra) not installed")
FULL = ["policy.kind=full_hbm", "workload.reasoning_tokens=512", "workload.batch_size=32"]


def _ctx(*overrides):
    return build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*FULL, *overrides]))


def test_a_layers_gemms_are_the_tables_fused_shapes_summed():
    ctx = _ctx("hardware.kernels=measured")
    m = ctx.model
    mk = measured_kernels("h200-sxm")
    shapes = m.layer_gemm_shapes()
    assert shapes[0] == (m.q_dim + 2 * m.kv_dim, m.hidden_size) and shapes[3] == (m.hidden_size, m.intermediate_size)
    by_hand = sum(float(mk.gemm_s(32, n, k, "bf16").seconds[0]) for n, k in shapes)
    cost = decode_layer_cost(m, ctx.hw, "bf16", 128, 32, 32 * 1024, ctx.kv_bytes_per_token_layer)
    assert cost.gemm_s == pytest.approx(by_hand, rel=1e-12)
    att = float(mk.decode_attention_s(32, 1024, m.num_heads, m.num_kv_heads, m.head_dim, "bf16").seconds[0])
    assert cost.attention_s == pytest.approx(att, rel=1e-12)  # no T2: nothing beyond the table's kernel
    assert lm_head_s(m, ctx.hw, 32) == pytest.approx(float(mk.gemm_s(32, m.vocab_size, m.hidden_size).seconds[0]))


def test_measured_kernels_are_slower_than_the_datasheet_and_say_so():
    data = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*FULL, "hardware.kernels=datasheet"]),
                    with_max_batch=False).summary
    meas = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*FULL, "hardware.kernels=measured"]),
                    with_max_batch=False).summary
    assert meas.tpot_p50_s != data.tpot_p50_s  # two models: the fitted datasheet is near, not equal
    assert "kernels" not in data.sources
    assert "aiconfigurator-core" in meas.sources["kernels"] and "h200_sxm" in meas.sources["kernels"]
    assert meas.hbm_peak_bytes == data.hbm_peak_bytes  # kernels change time, not memory


@pytest.mark.parametrize("policy", [["policy.kind=full_hbm"], ["policy.kind=tiered", "policy.hbm_ratio=0.5"]])
def test_fast_level_agrees_with_the_layer_level_under_measured_kernels(policy):
    base = ["workload.reasoning_tokens=256", "workload.batch_size=16", "hardware.kernels=measured", *policy]
    runs = {d: simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*base, f"sim.detail={d}"]),
                        with_max_batch=False).summary for d in ("layer", "fast")}
    assert runs["fast"].throughput_tok_per_s == pytest.approx(runs["layer"].throughput_tok_per_s, rel=0.01)


def test_tensor_parallel_all_reduce_comes_from_the_custom_all_reduce_table():
    ctx = build_context(load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml", ["hardware.kernels=measured"]))
    nbytes = 8 * ctx.model.hidden_size * 2
    want = float(measured_kernels("h100-sxm").allreduce_s(nbytes, 4, "custom").seconds[0])
    assert ctx.hw.allreduce_s(nbytes) == pytest.approx(want, rel=1e-12)
    datasheet = build_context(load_scenario(SCENARIOS / "serving-h100-70b-tp4.yaml", ["hardware.kernels=datasheet"]))
    assert ctx.hw.allreduce_s(nbytes) != datasheet.hw.allreduce_s(nbytes)


def test_auto_is_measured_where_tables_cover_the_gpu_and_datasheet_elsewhere():
    covered = _ctx("hardware.kernels=auto")
    assert covered.hw.kernels is not None
    rtx = _ctx("hardware.kernels=auto", "hardware.gpu=rtx-4090")
    assert rtx.hw.kernels is None and "kernels" not in rtx.hw.sources


def test_measured_kernels_on_an_uncovered_gpu_are_refused_at_load(tmp_path):
    path = SCENARIOS / "h200-7b-batch.yaml"
    res = run_cli("run", str(path), "--set", "hardware.gpu=rtx-4090", "--set", "hardware.kernels=measured",
                  "--out", str(tmp_path / "run"))
    assert_refused(res, str(path), "hardware.kernels", "no measured kernel tables for 'rtx-4090'")
    assert not (tmp_path / "run").exists()


def test_auto_is_the_default_and_a_profile_turns_it_off():
    assert _ctx().hw.kernels is not None  # covered GPU, no profile: the tables
    from sim.inputs.profile import Profile

    prof = Profile(device="cuda", device_name="NVIDIA H200", machine="t", created_utc="2026-12-01T00:00:00Z")
    sc = load_scenario(SCENARIOS / "h200-7b-batch.yaml", FULL)
    assert build_context(sc, prof).hw.kernels is None  # your own GPU, measured: the profile's figures
    assert build_context(load_scenario(SCENARIOS / "h200-7b-batch.yaml", [*FULL, "hardware.kernels=measured"]),
                         prof).hw.kernels is not None  # asked for explicitly


def test_datasheet_attention_path_is_unchanged_by_the_seam():
    ctx = _ctx("hardware.kernels=datasheet")
    m = ctx.model
    cost = decode_layer_cost(m, ctx.hw, "bf16", 128, 32, 32 * 1024, ctx.kv_bytes_per_token_layer)
    flop = 4 * 32 * 1024 * m.num_heads * m.head_dim
    kv = (32 * 1024 + 32) * ctx.kv_bytes_per_token_layer
    hw, shape, blocks = ctx.hw, ctx.hw.attention_shape, 32 * m.num_kv_heads  # a block per (sequence, KV head)
    stream = kv / (hw.attention_hbm_bytes_per_s * blocks / (blocks + shape.half_ctas))
    assert shape.half_ctas > 0 and shape.per_cta_s > 0  # the fitted shape (sim/catalog/fitted_kernels.yaml)
    assert cost.attention_s == pytest.approx(max(flop / hw.attention_flop_per_s,
                                                 hw.attention_latency_s + max(stream, blocks * shape.per_cta_s)))
    assert np.isfinite(cost.gemm_s)


@pytest.mark.parametrize("gpu, kv", [("h100-sxm", "bf16"), ("h200-sxm", "fp8")])
def test_one_step_scalar_path_gives_the_array_paths_bits(gpu, kv):
    """A serving step asks decode attention one point at a time; the scalar path must give exactly
    what the array path gives for that point (goldens depend on the bits)."""
    from sim.device.physics import gqa_attention_s

    ctx = _ctx(f"hardware.gpu={gpu}", f"model.kv_dtype={kv}")
    rng = np.random.default_rng(7)
    for _ in range(300):
        b = int(rng.integers(1, 600))
        tokens = int(b * rng.integers(1, 40_000))
        kv_bytes = float(tokens * ctx.kv_bytes_per_token_layer * rng.uniform(1.0, 1.3))
        args = (ctx.model, ctx.hw, b, tokens, kv_bytes, ctx.kv_bytes_per_token_layer, 0.0)
        one = gqa_attention_s(*args)
        arr = gqa_attention_s(ctx.model, ctx.hw, np.array([b]), np.array([tokens]), np.array([kv_bytes]),
                              ctx.kv_bytes_per_token_layer, np.zeros(1))
        assert isinstance(one, float) and one == float(arr[0])
