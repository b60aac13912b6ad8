"""Blackwell's die twins in the fused-experts tables (`kernel_tables.twin_checked_moe`): a point that stands
>= 1.3x from its die twin's and from the four Blackwell systems' median, while the twin's agrees with that
median, takes the twin's time; every other point is read as measured."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.inputs.kernel_tables import DIE_TWINS, MOE_SLICE, TWIN_APART, tables_available, twin_checked_moe

NEEDS_TABLES = pytest.mark.skipif(not tables_available(),
                                  reason="aiconfigurator-core (the .[measured] extra) not installed")
SLICE = {"quant": "nvfp4", "distribution": "balanced", "experts": 256, "top_k": 8, "hidden": 7168, "inter": 2048,
         "tp": 1, "ep": 4}


def _table(latency_us: dict[int, float], kernel: str = "moe_torch_flow_cutlass") -> pd.DataFrame:
    """One slice's rows: token count -> microseconds."""
    tokens = list(latency_us)
    return pd.DataFrame({**{c: [SLICE[c]] * len(tokens) for c in MOE_SLICE}, "tokens": tokens,
                         "kernel": [kernel] * len(tokens), "latency_s": [latency_us[t] * 1e-6 for t in tokens]})


def test_a_point_apart_from_its_twin_and_the_consensus_takes_the_twins_time():
    mine = _table({1: 100.0, 2: 200.0, 3: 100.0, 4: 100.0, 5: 300.0, 6: 125.0})
    twin = _table({1: 100.0, 2: 100.0, 3: 150.0, 4: 100.0, 5: 100.0, 6: 100.0})
    ultra = [_table({1: 100.0, 2: 104.0, 3: 100.0, 4: 140.0, 6: 100.0}),
             _table({1: 100.0, 2: 100.0, 3: 100.0, 4: 140.0, 6: 100.0})]  # neither times 5 tokens
    mine.index = mine.index + 10  # a table's index after its spikes are dropped: kept as it is
    out = twin_checked_moe(mine, twin, ultra)
    assert list(out.index) == list(mine.index) and list(out["kernel"]) == list(mine["kernel"])
    # 2: 2x its twin and the median (100 of 100, 104, 100) -> the twin's; 3: the twin stands apart, not it;
    # 4: it agrees with its twin, whatever the other die's; 5: only the twin times it, no median of two;
    # 6: 1.25x, within TWIN_APART
    assert list(out["from_twin"]) == [False, True, False, False, False, False]
    assert np.allclose(out["latency_s"] * 1e6, [100.0, 100.0, 100.0, 100.0, 300.0, 125.0])
    assert TWIN_APART == 1.3


def test_without_a_twins_point_nothing_moves():
    mine = _table({1: 100.0, 2: 500.0})
    out = twin_checked_moe(mine, _table({1: 100.0}), [_table({2: 100.0}), _table({2: 100.0})])
    assert not out["from_twin"].any() and np.allclose(out["latency_s"], mine["latency_s"])


def test_the_twins_are_the_dies():
    assert DIE_TWINS == {"b200_sxm": "gb200", "gb200": "b200_sxm", "b300_sxm": "gb300", "gb300": "b300_sxm"}


@NEEDS_TABLES
def test_b200s_deepseek_r1_slice_reads_the_dies_other_measurement():
    """TensorRT-LLM's B200 table times DeepSeek-R1's NVFP4 EP4 experts ~1.8x GB200's (~500 against ~290 us at
    32-512 tokens), B300's and GB300's with GB200: 25 of its 27 points take GB200's time, so the two GPUs
    cost the slice alike, and a run says so; Hopper has no twin."""
    from sim.device.measured_kernels import measured_kernels_for

    shape = (256, 8, 7168, 2048, 1, 4)
    b200, gb200 = (measured_kernels_for(g, "trtllm") for g in ("b200", "gb200"))
    tokens = [64, 256, 512]
    assert np.allclose(b200.moe_s(tokens, *shape, quant="nvfp4").seconds,
                       gb200.moe_s(tokens, *shape, quant="nvfp4").seconds)
    assert b200.moe_twin_points(*shape, "nvfp4") == (25, 27)
    assert gb200.moe_twin_points(*shape, "nvfp4") == (0, 27)
    assert 250e-6 < b200.moe_one_s(256, *shape, quant="nvfp4") < 320e-6
    h200 = measured_kernels_for("h200-sxm", "trtllm")
    assert not h200._moe_mla_tables.moe["from_twin"].any()


@NEEDS_TABLES
def test_a_run_on_the_checked_slice_says_so():
    from sim.decode.context import build_context
    from sim.studies.accuracy import scenario_for
    from sim.studies.e2e_table import load_measurements

    row = {m.id: m for m in load_measurements()}["trt-b200-deepseek-r1-nvfp4-dep4-1k1k"]
    said = build_context(scenario_for(row, "measured")).hw.sources["kernels_moe_mla"]
    # the run reads R1's power-law-1.01 rows (sim/inputs/moe_routing.py), every one of whose points the check replaced
    assert "power_law_1.01 routing" in said
    assert ("; 27 of the slice's 27 points stood >= 1.3x from the same die's other system's and from the four "
            "Blackwell tables' median, and take that system's time (kernel_tables.twin_checked_moe)") in said


@NEEDS_TABLES
def test_the_raw_table_is_what_the_package_holds():
    """`raw_moe_table` (benchmarks/sibling_tables.py) reads B200's R1 slice before the check: ~0.5 ms at 64-160
    tokens, where the checked table reads GB200's ~0.28 ms; a GPU without tables has none."""
    from sim.inputs.kernel_tables import raw_moe_table

    raw = raw_moe_table("b200", "trtllm")
    keyed = raw.set_index(MOE_SLICE + ["tokens"])["latency_s"]
    assert all(470e-6 < keyed[("nvfp4", "balanced", *(256, 8, 7168, 2048, 1, 4), t)] < 540e-6 for t in (64, 128, 160))
    assert "from_twin" not in raw and raw_moe_table("rtx-5080") is None
