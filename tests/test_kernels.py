"""The operator-cost seam (sim/device/kernels.py): the interpolation grid by hand, the measured tables
read with the units and meanings AIConfigurator's loader gives them, the held-out accuracy of the
measured path, the datasheet figures against hand arithmetic, and `kvsim ops`."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from sim.device.kernel_grid import RatioGrid, fill_cold_side, fill_from_below
from sim.device.kernels import (
    AllReduce,
    DecodeAttention,
    Gemm,
    datasheet_cost,
    datasheet_hardware,
    measured_cost,
    measured_kernels,
)
from sim.inputs import catalog
from sim.inputs.kernel_tables import (
    attention_kv_bytes,
    cache_served,
    gemm_weight_bytes,
    isolated_spikes,
    load_tables,
    split_tables,
    tables_available,
)

from .conftest import run_cli

needs_tables = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (the .[measured] extra) not installed")


# ---- the grid -------------------------------------------------------------------------------------
def test_grid_returns_table_points_and_interpolates_log_log_between():
    g = RatioGrid.from_points(np.array([[1.0], [4.0]]), np.array([2.0, 8.0]))
    ratio, inside = g(np.array([[1.0], [2.0], [4.0]]))
    assert ratio == pytest.approx([2.0, 4.0, 8.0])  # log-linear: at the log midpoint, the geometric mean
    assert inside.all()


def test_grid_holds_the_edge_ratio_outside_and_says_so():
    g = RatioGrid.from_points(np.array([[1.0], [4.0]]), np.array([2.0, 8.0]))
    ratio, inside = g(np.array([[0.5], [100.0]]))
    assert ratio == pytest.approx([2.0, 8.0])
    assert not inside.any()


def test_grid_is_multilinear_in_two_dimensions():
    pts = np.array([[1, 1], [1, 4], [4, 1], [4, 4]], dtype=float)
    g = RatioGrid.from_points(pts, np.array([1.0, 2.0, 4.0, 8.0]))
    ratio, _ = g(np.array([[2.0, 2.0]]))
    assert ratio[0] == pytest.approx(math.exp(np.mean(np.log([1, 2, 4, 8]))))


def test_grid_fills_an_unmeasured_cell_from_its_nearest_measured_one():
    pts = np.array([[1, 1], [1, 4], [4, 1]], dtype=float)  # (4, 4) not measured
    g = RatioGrid.from_points(pts, np.array([1.0, 2.0, 4.0]))
    ratio, _ = g(np.array([[4.0, 4.0]]))
    assert ratio[0] == pytest.approx(2.0)  # (1, 4) and (4, 1) are equally near: the first in C order
    flipped = RatioGrid.from_points(pts, np.array([1.0, 4.0, 2.0]))
    assert flipped(np.array([[4.0, 4.0]]))[0][0] == pytest.approx(4.0)  # the first in C order, whatever its ratio


def test_decode_attentions_fill_takes_the_most_efficient_cell_below_a_hole():
    """`fill_from_below` (decode attention, MLA decode): a hole takes the smallest ratio of the nearest
    measured cells below it along each axis - (4, 4) has (1, 4) below it on the first axis and (4, 1) on
    the second, whichever holds the smaller ratio."""
    pts = np.array([[1, 1], [1, 4], [4, 1]], dtype=float)
    for ratios in ([1.0, 2.0, 4.0], [1.0, 4.0, 2.0]):
        g = RatioGrid.from_points(pts, np.array(ratios), fill=fill_from_below)
        assert g(np.array([[4.0, 4.0]]))[0][0] == pytest.approx(2.0)


def test_a_hole_with_nothing_below_it_takes_the_nearest_cell_once_the_others_are_filled():
    """Measured: (2, 1) 3, (4, 1) 5, (4, 2) 7, (1, 4) 9. (2, 2) has (2, 1) below it: 3. (1, 2) has nothing
    measured below it on either axis ((1, 1) is a hole too): the nearest cell once the others are
    filled - (1, 4) and the filled (2, 2) are equally near, the first in C order."""
    pts = np.array([[2, 1], [4, 1], [4, 2], [1, 4]], dtype=float)
    g = RatioGrid.from_points(pts, np.array([3.0, 5.0, 7.0, 9.0]), fill=fill_from_below)
    assert g(np.array([[2.0, 2.0]]))[0][0] == pytest.approx(3.0)
    assert g(np.array([[1.0, 2.0]]))[0][0] == pytest.approx(9.0)


def test_decode_attentions_interior_hole_takes_the_least_efficient_cell_above_it():
    """`fill_cold_side` (decode attention): a hole with measured cells above it takes the largest ratio of
    the nearest ones above along each axis - (2, 2) has (4, 2) above on the first axis (5) and (2, 4) on
    the second (7): 7, whatever (1, 2) and (2, 1) below it say. (4, 4) has nothing above it: from below,
    the smaller of (2, 4) 7 and (4, 2) 5."""
    pts = np.array([[1, 2], [2, 1], [4, 2], [2, 4]], dtype=float)
    g = RatioGrid.from_points(pts, np.array([1.0, 1.0, 5.0, 7.0]), fill=fill_cold_side)
    assert g(np.array([[2.0, 2.0]]))[0][0] == pytest.approx(7.0)
    assert g(np.array([[4.0, 4.0]]))[0][0] == pytest.approx(5.0)


def test_a_point_is_cache_served_when_it_streams_faster_than_its_dtypes_cold_calls():
    """By hand, DRAM 1 TB/s, COLD_BYTES 256 MiB: bf16's cold calls of >= 256 MiB stream at 0.8 and 0.5 TB/s
    (0.8: its cold rate); 64 MiB in 70 us (0.96 TB/s) was served warm, 64 MiB in 90 us (0.75 TB/s) was not.
    fp8 has no call that large: its rate is the peak, so 2 MB in 1.9 us (1.05 TB/s) is warm and 2 MB in
    2.1 us not. A 1 GB call at 1.6x the peak (blocks shared between sequences) sets no cold rate."""
    mib = 2**20
    nbytes = np.array([512 * mib, 256 * mib, 1e9, 64 * mib, 64 * mib, 2e6, 2e6])
    seconds = nbytes / np.array([0.8e12, 0.5e12, 1.6e12, 0.96e12, 0.75e12, 1.05e12, 0.95e12])
    dtype = np.array(["bf16"] * 5 + ["fp8"] * 2)
    assert cache_served(nbytes, seconds, dtype, 1e12).tolist() == [False, False, True, True, False, True, False]


def test_cold_operand_bytes_by_hand():
    """A GEMM streams n x k weights (fp8: a byte each); attention reads batch x min(tokens, window) x 2 x KV
    heads (MHA: the query heads) x head dim x the KV dtype's bytes."""
    gemm = pd.DataFrame({"dtype": ["bf16", "fp8"], "m": [1, 64], "n": [4096, 4096], "k": [1024, 1024]})
    assert gemm_weight_bytes(gemm).tolist() == [4096 * 1024 * 2, 4096 * 1024]
    attn = pd.DataFrame({"kv_dtype": ["bf16", "fp8", "bf16"], "kv_heads": [2, 0, 8], "head_dim": [128, 64, 128],
                         "window": [0, 0, 128], "heads": [8, 4, 32], "batch": [4, 2, 3], "kv_tokens": [1000, 10, 4096]})
    assert attention_kv_bytes(attn).tolist() == [4 * 1000 * 2 * 2 * 128 * 2, 2 * 10 * 2 * 4 * 64,
                                                 3 * 128 * 2 * 8 * 128 * 2]


@needs_tables
def test_l40s_tables_drop_the_points_its_l2_served_and_h200s_keep_all():
    """L40S's decode attention over 8 x 8,191 bf16 tokens of 2 KV heads (67 MB, in its 96 MB L2) was timed at
    ~38 us, 1.8 TB/s against its 864 GB/s DRAM: dropped, and the grid fills the cell from the larger calls
    beside it, so a query there costs more than streaming its 67 MB at the DRAM peak. H200's tables lose
    nothing."""
    from sim.device.measured_kernels import measured_kernels_for

    t = load_tables("l40s")
    a = t.decode_attention
    cell = a[(a.kv_dtype == "bf16") & (a.kv_heads == 2) & (a.heads == 8) & (a.head_dim == 128) & (a.window == 0)
             & (a.batch == 8) & (a.kv_tokens == 8191)]
    assert cell.empty and t.cache_served["generation_attention"] > 1000 and t.cache_served["gemm"] > 1000
    kv_bytes = 8 * 8191 * 2 * 2 * 128 * 2
    cost = measured_kernels_for("l40s").decode_attention_s(8, 8191, 8, 2, 128).seconds[0]
    assert cost > kv_bytes / catalog.gpu("l40s").hbm_bytes_per_s
    assert load_tables("h200-sxm").cache_served == {}
    from sim.device.hardware import with_measured_kernels
    from sim.device.kernels import datasheet_hardware

    said = with_measured_kernels(datasheet_hardware("l40s")).sources["kernels"]
    assert said.endswith(f"dropped as served from a warm L2: {t.cache_served['gemm']:,} GEMM points and "
                         f"{t.cache_served['generation_attention']:,} decode-attention points")
    assert "warm L2" not in with_measured_kernels(datasheet_hardware("h200-sxm")).sources["kernels"]


def test_datasheet_gemm_is_floor_plus_weight_streaming_at_one_row():
    """Fitted constants where the tables cover the GPU or its sibling, the catalog's defaults without a fit."""
    fit = catalog.fitted_kernels()["h200-sxm"].gemm["bf16"]
    hbm = catalog.gpu("h200-sxm").hbm_bytes_per_s
    c = datasheet_cost("h200-sxm", Gemm(1, 4096, 4096, "bf16"))
    weights = 4096 * 4096 * 2
    streamed = weights + 1 * 4096 * 2  # the weights and the one row of bf16 input
    assert c.seconds == pytest.approx(fit.floor_s + streamed / (hbm * fit.weight_hbm_efficiency)
                                      + 4096 / (hbm * fit.output_hbm_efficiency))  # and its 4,096 outputs written
    f8 = catalog.fitted_kernels()["h200-sxm"].gemm["fp8"]  # W8A8: the input quantised, then the fp8 MMA
    big = datasheet_cost("h200-sxm", Gemm(8192, 8192, 8192, "fp8")).seconds
    mma = 2 * 8192**3 / (catalog.gpu("h200-sxm").fp8_flop_per_s * f8.flop_efficiency)  # 8,192 rows: the curve's plateau
    quant = 8192 * f8.quant_row_s + 8192 * 8192 / (hbm * f8.quant_hbm_efficiency)
    # its tiles: 64 x 64 output tiles of 128 x 128; each of the 63 further row tiles re-reads a share of the weights
    fill = 64 * 64 / (64 * 64 + f8.half_tiles)
    stream = (8192 * 8192 * (1 + f8.weight_reread * 63) + 8192 * 8192) / (hbm * f8.weight_hbm_efficiency * fill)
    assert big == pytest.approx(f8.floor_s + max(mma, stream) + 8192 * 8192 / (hbm * f8.output_hbm_efficiency) + quant)
    # one row through a 5,120 x 8,192 fp8 matrix: the small-M kernel's grid of 40 tiles streams at 40 / (40 + half)
    one = datasheet_cost("h200-sxm", Gemm(1, 5120, 8192, "fp8")).seconds
    fill = 40 / (40 + f8.half_tiles_decode)
    stream = (5120 * 8192 + 8192) / (hbm * f8.weight_hbm_efficiency * fill)
    assert one == pytest.approx(f8.floor_s + stream + 5120 / (hbm * f8.output_hbm_efficiency) + f8.quant_row_s
                                + 8192 / (hbm * f8.quant_hbm_efficiency))
    # no table measures the RTX 4090: it takes L40S's fit (the same AD102 die) at its own datasheet peaks
    assert "rtx-4090" not in catalog.fitted_kernels()
    sib, rtx_hbm = catalog.fitted_kernels()["l40s"].gemm["bf16"], catalog.gpu("rtx-4090").hbm_bytes_per_s
    rtx = datasheet_cost("rtx-4090", Gemm(1, 4096, 4096, "bf16"))
    assert rtx.seconds == pytest.approx(sib.floor_s + streamed / (rtx_hbm * sib.weight_hbm_efficiency)
                                        + 4096 / (rtx_hbm * sib.output_hbm_efficiency))
    # without any fit (catalog.NO_FIT): the catalog's defaults, no activation terms
    eff = catalog.efficiency_defaults()
    flat = datasheet_cost("rtx-4090", Gemm(1, 4096, 4096, "bf16"), fit_from=catalog.NO_FIT)
    assert flat.seconds == pytest.approx(eff.gemm_floor_s + weights / (rtx_hbm * eff.weight_hbm_efficiency["bf16"]))


def test_datasheet_attention_and_allreduce_by_hand():
    gpu, fit = catalog.gpu("h100-sxm"), catalog.fitted_kernels()["h100-sxm"]
    c = datasheet_cost("h100-sxm", DecodeAttention(32, 4096, 32, 8, 128, "bf16"))
    kv_bytes = (32 * 4096 + 32) * 2 * 8 * 128 * 2
    a = fit.attention  # 32 x 8 = 256 thread blocks: the grid streams at 256 / (256 + half_ctas) of the rate
    rate = gpu.hbm_bytes_per_s * a.hbm_efficiency * 256 / (256 + a.half_ctas)
    assert c.seconds == pytest.approx(a.floor_s + max(kv_bytes / rate, 256 * a.per_cta_s))
    thin = datasheet_cost("h100-sxm", DecodeAttention(2048, 16, 32, 8, 128, "bf16"))  # 16,384 blocks of 17 tokens
    assert thin.seconds == pytest.approx(a.floor_s + 16384 * a.per_cta_s)  # each block's serial cost binds
    fp8 = datasheet_cost("h100-sxm", DecodeAttention(32, 4096, 32, 8, 128, "fp8"))  # half the bytes at fp8's rate
    rate8 = gpu.hbm_bytes_per_s * a.fp8_hbm_efficiency * 256 / (256 + a.half_ctas)
    assert fp8.seconds == pytest.approx(a.fp8_floor_s + kv_bytes / 2 / rate8)  # above fp8's own floor
    thin8 = datasheet_cost("h100-sxm", DecodeAttention(2048, 16, 32, 8, 128, "fp8"))
    assert thin8.seconds == pytest.approx(a.fp8_floor_s + 16384 * a.fp8_per_cta_s)  # and fp8's own per-block cost
    assert a.fp8_floor_s != a.floor_s and a.fp8_per_cta_s != a.per_cta_s  # fitted apart
    assert a.fp8_hbm_efficiency < a.hbm_efficiency  # fp8 KV dequantises as it streams: not twice as fast
    p = fit.allreduce["custom"].by_gpus[4]  # the faster of the two fitted protocols, ring bytes 1.5 MB
    got = datasheet_cost("h100-sxm", AllReduce(1e6, 4)).seconds
    assert got == pytest.approx(min(p.latency_floor_s + 1.5e6 / p.latency_bus_bytes_per_s,
                                    p.bandwidth_floor_s + 1.5e6 / p.bandwidth_bus_bytes_per_s))
    q = fit.allreduce["nccl"].by_gpus[8]  # an NCCL operator takes NCCL's fit, not the engine's custom one
    nccl = datasheet_cost("h100-sxm", AllReduce(4096, 8, "nccl"))
    assert nccl.seconds == pytest.approx(min(q.latency_floor_s + 2 * 7 / 8 * 4096 / q.latency_bus_bytes_per_s,
                                             q.bandwidth_floor_s + 2 * 7 / 8 * 4096 / q.bandwidth_bus_bytes_per_s))
    assert "nccl" in nccl.source and nccl.seconds > got  # NCCL's 8-GPU floor (~16 us) over custom's (~5 us)
    # no tables, and its sibling's (L40S's) all-reduce is another fabric's: the catalog's ring
    fabric = catalog.interconnect(catalog.gpu("rtx-4090").interconnect)
    rtx = datasheet_cost("rtx-4090", AllReduce(1e6, 4)).seconds
    assert rtx == pytest.approx(2 * 3 / 4 * 1e6 / fabric.bus_bytes_per_s + 2 * 3 * fabric.per_hop_latency_s)
    assert datasheet_cost("h100-sxm", AllReduce(1e6, 1)).seconds == 0.0


def test_datasheet_attention_with_xqas_sequence_split_by_hand():
    """TensorRT-LLM on H200: its XQA kernel splits each sequence over more thread blocks (K3, fitted over 2-32
    query heads per KV head): floor + stream + blocks x (per block + g x per query head), stream and blocks added."""
    from sim.device.kernels import datasheet_hardware

    gpu, a = catalog.gpu("h200-sxm"), catalog.fitted_kernels("trtllm")["h200-sxm"].attention
    assert a.sequence_split and a.per_cta_head_s > 0 and gpu.sm_count == 132
    hw = datasheet_hardware("h200-sxm", framework="trtllm")
    assert hw.attention_shape.split_ctas == 8 * 132 and "XQA's sequence split" in hw.sources["attention_shape"]
    c = datasheet_cost("h200-sxm", DecodeAttention(8, 4096, 32, 8, 128, "bf16"), framework="trtllm")
    # c = 8 x 8 = 64 blocks; k = 4096 // 128 = 32, m0 = min(32, round(sqrt(8 x 32) = 16)) = 16 blocks a sequence;
    # 64 x 16 = 1,024 blocks, under 8 x 132 = 1,056; g = 32 / 8 = 4 query heads a block
    kv_bytes = (8 * 4096 + 8) * 2 * 8 * 128 * 2
    rate = gpu.hbm_bytes_per_s * a.hbm_efficiency * 64 / (64 + a.half_ctas)
    by_hand = a.floor_s + kv_bytes / rate + 1024 * (a.per_cta_s + 4 * a.per_cta_head_s)
    assert c.seconds == pytest.approx(by_hand)
    assert 55e-6 < c.seconds < 75e-6  # ~65 us: 9.9 us floor + 29 us streaming + 26 us of blocks (fit of today's tables)
    wide = datasheet_cost("h200-sxm", DecodeAttention(32, 4096, 32, 8, 128, "bf16"), framework="trtllm")
    rate = gpu.hbm_bytes_per_s * a.hbm_efficiency * 256 / (256 + a.half_ctas)  # 256 x 16 = 4,096 blocks: capped at 1,056
    assert wide.seconds == pytest.approx(a.floor_s + 4 * kv_bytes / rate + 1056 * (a.per_cta_s + 4 * a.per_cta_head_s))
    short = datasheet_cost("h200-sxm", DecodeAttention(8, 100, 32, 8, 128, "bf16"), framework="trtllm")
    rate = gpu.hbm_bytes_per_s * a.hbm_efficiency * 64 / (64 + a.half_ctas)  # under 128 tokens: no split, 64 blocks
    assert short.seconds == pytest.approx(a.floor_s + (8 * 100 + 8) * 4096 / rate + 64 * (a.per_cta_s + 4 * a.per_cta_head_s))


def test_vllms_decode_attention_keeps_the_overlapping_form():
    """Only TensorRT-LLM's fit takes XQA's split, and only where it fits its tune split better: vLLM's (and
    SGLang's, and TensorRT-LLM's on B200) decode attention is floor + max(stream, blocks x per block), whatever g."""
    from sim.device.kernels import datasheet_hardware

    gpu, a = catalog.gpu("h200-sxm"), catalog.fitted_kernels()["h200-sxm"].attention
    assert not a.sequence_split and a.per_cta_head_s == 0.0
    for framework, name in (("vllm", "h200-sxm"), ("sglang", "h200-sxm"), ("trtllm", "b200")):
        shape = datasheet_hardware(name, framework=framework).attention_shape
        assert shape.split_ctas == 0.0 and shape.per_cta_head_s == 0.0, (framework, name)
    kv_bytes = (8 * 4096 + 8) * 2 * 8 * 128 * 2
    rate = gpu.hbm_bytes_per_s * a.hbm_efficiency * 64 / (64 + a.half_ctas)
    for heads in (8, 32, 128):  # g = 1, 4, 16: the same cost (the FLOP side does not bind here)
        c = datasheet_cost("h200-sxm", DecodeAttention(8, 4096, heads, 8, 128, "bf16"))
        assert c.seconds == pytest.approx(a.floor_s + max(kv_bytes / rate, 64 * a.per_cta_s))


def test_fitted_constants_are_what_the_fit_script_writes():
    """sim/catalog/fitted_kernels.yaml is generated: the committed file is the fit of today's tables."""
    if not tables_available():
        pytest.skip("aiconfigurator-core (the .[measured] extra) not installed")
    import subprocess
    import sys

    from .conftest import REPO

    res = subprocess.run([sys.executable, str(REPO / "scripts" / "fit_datasheet.py"), "--check"], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


# ---- the measured tables --------------------------------------------------------------------------
def test_an_isolated_spike_is_dropped_but_a_kernel_switch_and_an_edge_are_kept():
    """A point > 1.5x both neighbours along two of m, n, k is a measurement hiccup; a step (a kernel
    switch: one neighbour as slow) and a peak on one axis only are measurements, and a point at an
    axis's end has one neighbour there, so it is never a peak on that axis."""
    rows = [{"dtype": "fp8", "m": m, "n": n, "k": 512, "latency_s": 1e-5} for m in (1, 2, 4) for n in (256, 512, 1024)]
    df = pd.DataFrame(rows)
    df.loc[(df.m == 2) & (df.n == 512), "latency_s"] = 4e-5  # a peak along m and along n
    df.loc[(df.m == 4) & (df.n == 1024), "latency_s"] = 9e-5  # the corner: no neighbour beyond it
    assert isolated_spikes(df, ("m", "n", "k"), ("dtype",)).tolist() == [
        (m, n) == (2, 512) for m in (1, 2, 4) for n in (256, 512, 1024)]
    step = df.copy()
    step.loc[step.m == 4, "latency_s"] = 4e-5  # a whole slower row: a switch at m = 4, no peak
    step.loc[(step.m == 2) & (step.n == 512), "latency_s"] = 1e-5
    assert not isolated_spikes(step, ("m", "n", "k"), ("dtype",)).any()
    one_axis = df.copy()
    one_axis.loc[(one_axis.m == 1) & (one_axis.n == 512), "latency_s"] = 4e-5  # a peak along n, m = 1 its edge
    one_axis.loc[(one_axis.m == 2) & (one_axis.n == 512), "latency_s"] = 1e-5
    assert not isolated_spikes(one_axis, ("m", "n", "k"), ("dtype",)).any()


@needs_tables
def test_an_moe_curves_hiccup_is_dropped_and_its_zigzag_kept():
    """An MoE slice is one curve over tokens: H100's TensorRT-LLM table times 517 us at 4 tokens between
    25 and 46 us (bf16, balanced, 128 experts, top 8, hidden 2048, inter 768, TP 2 x EP 4) - dropped; vLLM's H200 fp8 slice of
    16 experts (top 1, hidden 5120, inter 8192) keeps 3,072 tokens at ~1.7x its neighbours, the
    non-power-of-two zigzag of every slice."""
    from sim.inputs.kernel_tables import with_moe_mla

    def curve(gpu, framework, **key):
        m = with_moe_mla(load_tables(gpu, framework)).moe
        return m[np.logical_and.reduce([m[k] == v for k, v in key.items()])].set_index("tokens")["latency_s"]

    trt = curve("h100-sxm", "trtllm", quant="bfloat16", distribution="balanced", experts=128, top_k=8, hidden=2048,
                inter=768, tp=2, ep=4)
    assert 4 not in trt.index and {2, 8} <= set(trt.index)
    zigzag = curve("h200-sxm", "vllm", quant="fp8", distribution="balanced", experts=16, top_k=1, hidden=5120,
                   inter=8192, tp=1, ep=1)
    assert zigzag[3072] > 1.5 * max(zigzag[2048], zigzag[4096])


@needs_tables
def test_the_b200_fp8_gemm_tables_hiccups_are_dropped_on_reading():
    """0.12.0's B200 fp8 GEMM table has ~300 us added at scattered shapes (m 7, n 64, k 65536: 286 us
    between 48 and 48 us along n and along m); reading drops them, so a query there interpolates its
    neighbours."""
    g = load_tables("b200").gemm
    fp8 = g[g.dtype == "fp8"]
    assert fp8[(fp8.m == 7) & (fp8.n == 64) & (fp8.k == 65536)].empty
    assert len(fp8[(fp8.m == 8) & (fp8.n == 64) & (fp8.k == 65536)]) == 1
    assert not isolated_spikes(g, ("m", "n", "k"), ("dtype",)).any()  # dropped until none is left


@needs_tables
def test_measured_gemm_at_a_table_point_is_the_table_in_seconds():
    t = load_tables("h200-sxm")
    row = t.gemm[(t.gemm.dtype == "bf16") & (t.gemm.m == 8) & (t.gemm.n == 4096) & (t.gemm.k == 4096)]
    assert len(row) == 1
    c = measured_cost("h200-sxm", Gemm(8, 4096, 4096, "bf16"))
    assert c.seconds == pytest.approx(float(row.latency_s.iloc[0]), rel=1e-12) and c.inside
    assert 5e-6 < c.seconds < 5e-5  # ms in the file: 0.0126 ms, a latency floor above the 7 us weight stream
    assert "h200_sxm" in c.source and "vllm" in c.source and "gemm bfloat16" in c.source


@needs_tables
def test_measured_attention_and_allreduce_at_table_points():
    t = load_tables("h100-sxm")
    a = t.decode_attention
    row = a[(a.kv_dtype == "bf16") & (a.kv_heads == 8) & (a.head_dim == 128) & (a.window == 0) & (a.heads == 32)
            & (a.batch == 32) & (a.kv_tokens == 4095)]
    c = measured_cost("h100-sxm", DecodeAttention(32, 4095, 32, 8, 128, "bf16"))
    assert c.seconds == pytest.approx(float(row.latency_s.iloc[0]), rel=1e-12)
    ar = t.allreduce["custom"]
    r = ar[(ar.gpus == 4)].iloc[3]
    assert r.bytes % 2 == 0  # sizes are bf16 elements in the file, bytes here
    assert measured_cost("h100-sxm", AllReduce(float(r.bytes), 4)).seconds == pytest.approx(float(r.latency_s), rel=1e-12)


@needs_tables
def test_measured_all_gather_and_reduce_scatter_at_table_points():
    """NCCL's all_gather / reduce_scatter rows: message sizes in half elements of the whole buffer, read
    as bytes; at a measured point the answer is the measurement; a group size not measured says so."""
    t = load_tables("h200-sxm", "trtllm")
    mk = measured_kernels("h200-sxm", "trtllm")
    for op in ("all_gather", "reduce_scatter"):
        r = t.gather[op][t.gather[op].gpus == 8].iloc[20]
        got = mk.gather_s(op, float(r.bytes), 8)
        assert got.seconds[0] == pytest.approx(float(r.latency_s), rel=1e-12) and got.inside[0]
        assert "nccl " + op in got.source
    assert "6 GPUs not measured" in mk.gather_s("all_gather", 1e6, 6).note


@needs_tables
def test_an_unmeasured_slice_says_which_one_stood_in():
    c = measured_cost("h200-sxm", DecodeAttention(8, 2048, 64, 16, 128, "bf16"))  # 16 KV heads: not in vLLM's table
    assert not c.inside and "16 KV heads" in c.note and "8 KV heads" in c.note
    int4 = measured_cost("h200-sxm", Gemm(8, 4096, 4096, "int4"))
    assert int4.seconds == datasheet_cost("h200-sxm", Gemm(8, 4096, 4096, "int4")).seconds
    assert "datasheet" in int4.note


@needs_tables
def test_held_out_lines_are_left_out_of_the_tune_split():
    tune, held = split_tables(load_tables("h200-sxm"))
    assert set(held.gemm.n) - set(tune.gemm.n)  # whole n lines are held out: the tune grid has a gap there
    assert set(held.decode_attention.kv_tokens) - set(tune.decode_attention.kv_tokens)
    assert len(tune.gemm) + len(held.gemm) == len(load_tables("h200-sxm").gemm)


@needs_tables
@pytest.mark.parametrize("gpu", ["h100-sxm", "h200-sxm"])
def test_measured_path_predicts_held_out_kernels_within_goal(gpu):
    """Issue #20's operator goal, median |error| <= 5% per family on the held-out split (measured
    tables with those lines removed); the worst cases are reported by benchmarks/operator_accuracy.py."""
    from sim.studies.operator_accuracy import held_out_points

    pts, _ = held_out_points(gpu)
    fam = pts["op"].str.extract(r"^(gemm|decode attention|all-reduce)")[0]
    for family, p in pts.groupby(fam):
        assert len(p) >= 10
        assert p["tables_err"].abs().median() <= 0.05, family
        assert p["tables_err"].abs().median() < p["datasheet_err"].abs().median(), family


def _own_profile():
    from sim.inputs.profile import AttentionPoint, ComputeProfile, GemmPoint, Profile

    g = GemmPoint(m=8, n=512, k=3584, dtype="bf16", time_s=2e-5, flop_per_s=1e12, weight_bytes_per_s=1e11)
    a = AttentionPoint(batch=2, context_tokens=1024, num_heads=28, num_kv_heads=4, head_dim=128, dtype="bf16",
                       time_s=3e-5, kv_bytes_per_s=1e11, backend="test")
    return Profile(device="cuda", device_name="NVIDIA H200", machine="t", created_utc="2026-12-01T00:00:00Z",
                   compute=ComputeProfile(gemm_points=[g], attention_points=[a]))


def test_a_profiles_own_kernels_are_a_measured_source_of_the_same_schema():
    """hwprobe calibrate's timed GEMMs and attention read as kernel tables (`tables_from_profile`):
    at its points the measured answer is the profile's time; what it did not time says so."""
    from sim.device.kernels import profile_kernels

    mk = profile_kernels(_own_profile(), "h200-sxm")
    gemm = measured_cost("h200-sxm", Gemm(8, 512, 3584, "bf16"), mk)
    assert gemm.seconds == pytest.approx(2e-5, rel=1e-12) and "hwprobe profile of cuda NVIDIA H200" in gemm.source
    att = measured_cost("h200-sxm", DecodeAttention(2, 1024, 28, 4, 128, "bf16"), mk)
    assert att.seconds == pytest.approx(3e-5, rel=1e-12)
    ar = measured_cost("h200-sxm", AllReduce(1e6, 4), mk)
    assert ar.seconds == datasheet_cost("h200-sxm", AllReduce(1e6, 4)).seconds and "no measured all-reduce" in ar.note


def test_ops_with_a_cpu_profile_says_it_is_not_the_gpu(tmp_path):
    from sim.inputs.profile import profile_to_yaml

    cpu = _own_profile().model_copy(update={"device": "cpu", "device_name": "AMD EPYC"})
    path = tmp_path / "p.yaml"
    path.write_text(profile_to_yaml(cpu))
    res = run_cli("ops", "gemm", "--m", "8", "--n", "512", "--k", "3584", "--profile", str(path), "--kernels", "measured")
    assert res.returncode == 0, res.stderr
    assert "not a GPU" in res.stderr and "hwprobe profile of cpu AMD EPYC" in res.stdout


# ---- kvsim ops ------------------------------------------------------------------------------------
def test_ops_prints_the_datasheet_figure_and_json():
    res = run_cli("ops", "gemm", "--m", "1", "--n", "4096", "--k", "4096", "--kernels", "datasheet", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["datasheet_s"] == pytest.approx(datasheet_cost("h200-sxm", Gemm(1, 4096, 4096)).seconds)
    assert "measured_s" not in out


def test_ops_all_gather_and_reduce_scatter(tmp_path):
    """NCCL's collectives through the seam: the datasheet figure is `Hardware.gather_s`, the bytes the whole
    buffer; a CSV row asks the same."""
    res = run_cli("ops", "allgather", "--bytes", "16777216", "--gpus", "8", "--kernels", "datasheet", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    want = datasheet_hardware("h200-sxm", tp=8).gather_s("all_gather", 16777216)
    assert out["datasheet_s"] == pytest.approx(want) and "Hardware.gather_s (all_gather" in out["datasheet_source"]
    src = tmp_path / "ops.csv"
    src.write_text("op,gpu,bytes,gpus\nreducescatter,h100-sxm,1000000,4\n")
    res = run_cli("ops", "--csv", str(src), "--kernels", "datasheet")
    assert res.returncode == 0, res.stderr
    line = res.stdout.splitlines()[1]
    assert "reduce_scatter" in line and float(line.split(",")[4]) == pytest.approx(
        datasheet_hardware("h100-sxm", tp=4).gather_s("reduce_scatter", 1e6))


@pytest.mark.parametrize("args,expected", [
    (["gemm", "--m", "8", "--n", "4096"], "kvsim ops: k: gemm needs m, n, k; missing k"),
    (["allgather", "--gpus", "8"], "bytes: allgather needs bytes, gpus; missing bytes"),
    (["attention", "--batch", "2", "--kv-tokens", "9", "--heads", "32", "--kv-heads", "5", "--head-dim", "128"],
     "kv_heads: heads (32) must be a multiple of kv_heads"),
    (["gemm", "--m", "8", "--n", "4096", "--k", "4096", "--gpu", "nope"], "gpu: unknown GPU"),
    (["gemm", "--m", "0", "--n", "4096", "--k", "4096"], "m: Input should be greater than or equal to 1"),
    (["gemm", "--m", "8", "--n", "4096", "--k", "4096", "--kernels", "fast"], "--kernels: expected one of"),
    (["gemm", "--m", "8", "--n", "4096", "--k", "4096", "--gpu", "rtx-4090", "--kernels", "measured"],
     "--kernels: no measured kernel tables for 'rtx-4090'"),
    ([], "give an operator"),
])
def test_ops_bad_input_is_one_line(args, expected):
    res = run_cli("ops", *args)
    assert res.returncode == 2
    assert expected in res.stderr and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_ops_csv_passes_columns_through_and_neutralises_formulas(tmp_path):
    src = tmp_path / "ops.csv"
    src.write_text("op,gpu,m,n,k,label\ngemm,h200-sxm,1,4096,4096,=HYPERLINK(1)\ngemm,rtx-4090,64,8192,8192,b\n")
    out = tmp_path / "pred.csv"
    res = run_cli("ops", "--csv", str(src), "--out", str(out))
    assert res.returncode == 0, res.stderr
    lines = out.read_text().splitlines()
    assert lines[0].startswith("op,gpu,m,n,k,label,datasheet_s")
    assert ",'=HYPERLINK(1)," in lines[1]
    assert "no measured kernel tables for 'rtx-4090'" in lines[2]  # both asked: the datasheet answers, measured says why not


@pytest.mark.parametrize("text,expected", [
    ("op,m,m\ngemm,1,2\n", "header: column 'm' appears twice"),
    ("m,n,k\n1,2,3\n", "header: expected an 'op' column"),
    ("op,m,n,k\ngemm,1,x,3\n", "line 2: n: expected an integer"),
    ("op,bytes,gpus\nallreduce,nan,4\n", "bytes"),
    ("op,m,n,k\n", "no operators"),
])
def test_ops_csv_bad_input_is_one_line_and_writes_nothing(tmp_path, text, expected):
    src, out = tmp_path / "ops.csv", tmp_path / "pred.csv"
    src.write_text(text)
    res = run_cli("ops", "--csv", str(src), "--out", str(out))
    assert res.returncode == 2 and expected in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_weight_only_gemm_takes_the_engines_own_fit_by_hand():
    """TensorRT-LLM's weight-only int4 GEMM on A100 (its tables time WeightOnlyQuantMatmul): its own fit, a grid of
    few output tiles slowing the stream and the dequantisation + MMA alike; other engines keep the bf16 fit."""
    from sim.device.hardware import interp_log2
    from sim.model.dtypes import WEIGHT_DTYPES

    g = catalog.fitted_kernels("trtllm")["a100-80gb-sxm"].gemm["int4"]
    spec, eff = catalog.gpu("a100-80gb-sxm"), catalog.efficiency_defaults()
    m, n, k = 64, 4096, 4096
    fill = (1 * 32) / (1 * 32 + g.half_tiles)  # one row tile x 32 column tiles
    w = WEIGHT_DTYPES["int4"].bytes_for(n * k, 128)
    stream = (w + m * k * 2) / (spec.hbm_bytes_per_s * g.weight_hbm_efficiency * fill)
    top = max(e for _, e in eff.gemm_flop_efficiency_by_rows)
    curve = [(r, e * g.flop_efficiency / top) for r, e in eff.gemm_flop_efficiency_by_rows]
    compute = (n * k * eff.dequant_ops_per_weight["int4"] / (spec.fp32_flop_per_s / 2)
               + 2 * m * n * k / (spec.bf16_flop_per_s * interp_log2(curve, m))) / fill
    got = datasheet_cost("a100-80gb-sxm", Gemm(m, n, k, "int4"), framework="trtllm")
    assert got.seconds == pytest.approx(g.floor_s + max(stream, compute) + m * n / (spec.hbm_bytes_per_s * g.output_hbm_efficiency))
    assert g.held_out.median < 0.10  # 8.5% on the held-out grid lines (27% with the bf16 fit it took before)
    bf16 = catalog.fitted_kernels()["a100-80gb-sxm"].gemm["bf16"]  # vLLM's tables time no weight-only GEMM
    assert "int4" not in catalog.fitted_kernels()["a100-80gb-sxm"].gemm
    vllm = datasheet_cost("a100-80gb-sxm", Gemm(1, n, k, "int4"))
    assert vllm.seconds >= bf16.floor_s and vllm.seconds != datasheet_cost("a100-80gb-sxm", Gemm(1, n, k, "int4"),
                                                                           framework="trtllm").seconds


@needs_tables
def test_the_seam_costs_an_all_to_all_and_an_mla_bmm():
    """DeepEP's all-to-all and absorbed MLA's BMM through the seam: the datasheet fit by hand (tokens x remote
    ranks x hidden x wire bytes), the measured tables at a timed point; a BMM dtype the engine never fit says so."""
    from sim.device.kernels import AllToAll, MlaBmm
    from sim.model.experts import expected_remote_ranks

    op = AllToAll(128, 7168, 8, 256, 8, "dispatch", "ll", "fp8")
    hw = datasheet_hardware("h200-sxm", tp=8, framework="trtllm")
    floor, rate = next((f, r) for k, p, f, r in hw.alltoall_fits if (k, p) == ("ll", "dispatch"))
    want = floor + 128 * expected_remote_ranks(256, 8, 8) * 7168 * 1.0 / rate
    assert datasheet_cost("h200-sxm", op, "trtllm").seconds == pytest.approx(want)
    a = load_tables("h200-sxm", "trtllm").a2a
    row = a[(a.backend == "ll") & (a.phase == "dispatch") & (a.wire == "fp8") & (a.hidden == 7168) & (a.top_k == 8)
            & (a.experts == 256) & (a.tokens == 128)]
    assert measured_cost("h200-sxm", op, framework="trtllm").seconds == pytest.approx(float(row.latency_s.iloc[0]))
    bmm = measured_cost("h200-sxm", MlaBmm(128, 128, "post", "fp8"), framework="trtllm")
    assert 20e-6 < bmm.seconds < 60e-6 and "mla_bmm post fp8" in bmm.source
    missing = datasheet_cost("h200-sxm", MlaBmm(128, 128, "pre", "fp8"))  # vLLM's tables time bf16 BMMs only
    assert missing.seconds is None and "no fit of vllm's fp8 MLA BMMs" in missing.note


def test_ops_flags_for_an_all_to_all_and_an_mla_bmm(tmp_path):
    res = run_cli("ops", "alltoall", "--tokens", "128", "--hidden", "7168", "--top-k", "8", "--experts", "256", "--gpus",
                  "8", "--wire", "fp8", "--kernels", "datasheet", "--tables", "trtllm", "--json")
    assert res.returncode == 0, res.stderr
    from sim.device.kernels import AllToAll, MlaBmm

    want = datasheet_cost("h200-sxm", AllToAll(128, 7168, 8, 256, 8, "dispatch", "ll", "fp8"), "trtllm").seconds
    assert json.loads(res.stdout)["datasheet_s"] == pytest.approx(want)
    src = tmp_path / "ops.csv"
    src.write_text("op,gpu,tokens,heads,bmm,dtype\nmlabmm,h200-sxm,128,128,post,bf16\n")
    res = run_cli("ops", "--csv", str(src), "--kernels", "datasheet")
    assert res.returncode == 0, res.stderr
    assert float(res.stdout.splitlines()[1].split(",")[6]) == pytest.approx(
        datasheet_cost("h200-sxm", MlaBmm(128, 128, "post", "bf16")).seconds)
    bad = run_cli("ops", "mlabmm", "--tokens", "8", "--heads", "16", "--dtype", "int4")
    assert bad.returncode == 2 and "mlabmm runs in bf16 or fp8" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_the_operator_summary_gives_the_tail_beside_the_worst_point():
    """median, 95th percentile (linear between order statistics) and worst of |error|, mean signed:
    21 errors of -0% .. -20% in 1% steps have median 10%, p95 19%, worst 20%, mean -10%."""
    from sim.studies.operator_accuracy import summary

    err = -np.arange(21) / 100
    s = summary(pd.DataFrame({"gpu": "g", "op": "gemm bf16", "datasheet_err": err, "tables_err": err / 2}))
    r = s.iloc[0]
    assert (r.points, r.datasheet_median, r.datasheet_p95, r.datasheet_worst) == (21, pytest.approx(0.10),
                                                                                  pytest.approx(0.19), pytest.approx(0.20))
    assert r.datasheet_mean == pytest.approx(-0.10) and r.tables_p95 == pytest.approx(0.095)


def test_a_layers_elementwise_passes_are_held_against_vidurs_profiles():
    """Vidur's H100 profile of Llama-2-70B (held out: the passes were fitted on Llama-2-7B), TP 1, one token:
    RMSNorm 6 us, rope 4, RMSNorm 6, SiLU-and-mul 15, add 1 - 32 us a layer; kvtier's five passes each a
    row's latency, floor + width x per-element cost (h 8,192; rope 72 heads x 128; I 28,672). At 4,096
    tokens the passes stream their bytes: 0.77 ms measured, within 20%."""
    from sim.device.elementwise import ADD, RMSNORM, ROPE, SILU_MUL, elementwise_for
    from sim.studies.elementwise_accuracy import FAMILY, points

    p = points().set_index(["gpu", "shape"])
    row = p.loc[("h100-sxm", "Llama-2-70b-hf tp1 t1")]
    assert row.measured_s == pytest.approx(32e-6) and np.isnan(row.tables_err)
    ew = elementwise_for("h100-sxm", None)

    def lat(kind, width):
        return ew.fit(kind).floor_s + width * ew.fit(kind).s_per_element

    assert row.datasheet_s == pytest.approx(2 * lat(RMSNORM, 8192) + lat(ROPE, 9216) + lat(SILU_MUL, 28672)
                                            + lat(ADD, 8192))
    big = p.loc[("h100-sxm", "Llama-2-70b-hf tp1 t4096")]
    assert big.measured_s == pytest.approx((0.124 + 0.1 + 0.125 + 0.361 + 0.062) * 1e-3)
    assert abs(big.datasheet_err) < 0.2
    assert len(p) == 52 and set(points()["op"]) == {FAMILY}  # 2 GPUs x TP 1, 4 x 13 token counts, 70B only

