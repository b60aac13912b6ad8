"""Report figure builders on small data: the OOM wall sits at the computed max batch, every selector
combination has a variant with the same traces, link-bound markers, per-run and validation views."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.decode.capacity import max_batch
from sim.decode.context import build_context
from sim.decode.simulate import simulate
from sim.inputs.scenario import scenario_from_dict
from sim.model.units import MS
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.report.figures_projection import Lookup, dimensions, projection_figures
from sim.report.figures_run import occupancy_figure, stall_intervals, thin, timeline_figure, timeline_rows
from sim.report.figures_validation import validation_figure
from sim.report.selectable import compact
from sim.studies.projection_grid import DEFAULT_GRID, grid_scenario, run_grid

SMALL = replace(DEFAULT_GRID, models=(("7B", "deepseek-r1-distill-qwen-7b"),), weight_dtypes=("bf16", "int4"),
                gpus=("rtx-4090", "h100-sxm"), batches=(1, 2, 4, 8, 16, 32, 64), lengths=(2048, 8192),
                default_selection={"model": "7B", "weights": "bf16", "gpu": "rtx-4090", "length": "8K"})


@pytest.fixture(scope="module")
def grid():
    return run_grid(SMALL, workers=1)


@pytest.fixture(scope="module")
def figs(grid):
    return {f.fig_id: f for f in projection_figures(grid)}


def _limit(grid, sel, policy):
    lim = grid.limits
    row = lim[(lim.model == sel["model"]) & (lim.weights == sel["weights"]) & (lim.gpu == sel["gpu"])
              & (lim.length == sel["length"]) & (lim.policy == policy)]
    assert len(row) == 1
    return row.iloc[0]


def test_grid_max_batch_matches_capacity_search(grid):
    pol = SMALL.policies[2]  # tiered 25 %
    sc = grid_scenario("deepseek-r1-distill-qwen-7b", "bf16", "rtx-4090", 8192, 1, pol, SMALL.prompt_tokens)
    expected = max_batch(build_context(sc))
    assert _limit(grid, {"model": "7B", "weights": "bf16", "gpu": "rtx-4090", "length": "8K"}, pol.key).max_batch == expected


def test_oom_wall_is_at_the_computed_max_batch(grid, figs):
    fig = figs["fig-throughput"]
    sel = SMALL.default_selection
    walls = [s.x0 for s in fig.figure.layout.shapes]
    top = max(SMALL.batches)
    expected = [int(_limit(grid, sel, p.key).max_batch) for p in SMALL.policies]
    assert walls == [mb for mb in expected if 1 <= mb <= top]
    assert all(s.x0 == s.x1 for s in fig.figure.layout.shapes)
    assert len(fig.figure.data) == len(SMALL.policies)  # one line per policy: the zip below drops none
    assert walls  # at least one line ends at a wall inside the plotted batches
    for trace, pol, mb in zip(fig.figure.data, SMALL.policies, expected):
        assert f"max batch {mb}" in trace.name
        if 1 <= mb <= top:  # the line ends exactly at the wall
            assert int(trace.x[-1]) == mb
            assert all(int(x) <= mb for x in trace.x)


def test_every_selection_has_a_variant_with_the_same_trace_count(grid, figs):
    dims = {d.name: [v for v, _ in d.options] for d in dimensions(grid)}
    for fig in figs.values():
        combos = list(itertools.product(*(dims[d] for d in fig.dims)))
        assert len(fig.variants) == len(combos)
        n = len(fig.figure.data)
        for v in fig.variants.values():
            assert all(len(values) == n for values in v["data"].values())
    # variants agree with the limits table, e.g. the int4 2K walls
    sel = {"model": "7B", "weights": "int4", "gpu": "h100-sxm", "length": "2K"}
    v = figs["fig-throughput"].variants["7B|int4|h100-sxm|2K"]
    top = max(SMALL.batches)
    expected = [int(_limit(grid, sel, p.key).max_batch) for p in SMALL.policies]
    assert [s["x0"] for s in v["layout"]["shapes"]] == [mb for mb in expected if 1 <= mb <= top]


def test_max_batch_bars_equal_the_limits(grid, figs):
    fig = figs["fig-max-batch"].figure
    sel = SMALL.default_selection
    assert len(fig.data) == len(SMALL.policies)  # one bar series per policy: the zip below drops none
    for trace, pol in zip(fig.data, SMALL.policies):
        assert list(trace.x) == ["rtx-4090", "h100-sxm"]
        assert list(trace.y) == [int(_limit(grid, {**sel, "gpu": g}, pol.key).max_batch) for g in SMALL.gpus]


def test_link_bound_marker_where_utilisation_crosses_the_threshold(grid, figs):
    lk = Lookup(grid)
    found = False
    for key, v in figs["fig-link"].variants.items():
        sel = dict(zip(figs["fig-link"].dims, key.split("|")))
        pts, lim = lk.cell(sel)
        for pol in (p for p in SMALL.policies if p.tiered):
            lb = lim.loc[pol.key, "link_bound_batch"]
            p = pts[(pts.policy == pol.key) & pts.fits].set_index("batch")
            if pd.isna(lb):
                assert (p.h2d_utilization < LINK_BOTTLENECK_UTILIZATION).all()
                continue
            found = True
            assert lb <= lim.loc[pol.key, "max_batch"]
            assert (p.h2d_utilization[p.index >= lb] >= LINK_BOTTLENECK_UTILIZATION).all()
            assert (p.h2d_utilization[p.index < lb] < LINK_BOTTLENECK_UTILIZATION).all()
            assert any(s.get("x0") == lb for s in v["layout"]["shapes"])
    assert found, "the small grid should contain a link-bound configuration"


def test_hbm_saved_grows_with_batch_and_full_hbm_is_absent(figs):
    fig = figs["fig-hbm-saved"].figure
    assert "full_hbm" not in {t.name for t in fig.data}
    assert len(fig.data) > 0
    for t in fig.data:
        y = np.asarray(t.y, dtype=float)
        assert (np.diff(y) >= 0).all() and y[-1] > 0


def test_compact_rounds_and_nulls():
    assert compact(1234.5678) == 1235.0
    assert compact([float("nan"), float("inf"), 1.0]) == [None, None, 1.0]
    assert compact({"a": np.float64(0.123456)}) == {"a": 0.1235}


def test_stall_is_transfer_time_not_covered_by_compute():
    tl = pd.DataFrame([
        {"kind": "h2d", "start_s": 0.0, "end_s": 2.0, "what": "copy"},
        {"kind": "compute", "start_s": 2.0, "end_s": 5.0, "what": "forward"},
        {"kind": "h2d", "start_s": 3.0, "end_s": 6.0, "what": "prefetch"},  # 3-5 hidden, 5-6 exposed
        {"kind": "d2h", "start_s": 7.0, "end_s": 8.0, "what": "offload"},
    ])
    assert stall_intervals(tl) == [(0.0, 2.0), (5.0, 6.0), (7.0, 8.0)]
    rows = timeline_rows(tl)
    assert len(rows["compute"]) == 1 and len(rows["stall"]) == 3


def test_thin_keeps_first_and_last_step():
    steps = pd.DataFrame({"step": np.arange(10_000)})
    t = thin(steps)
    assert len(t) <= 1600 and t.step.iloc[0] == 0 and t.step.iloc[-1] == 9_999


def test_run_figures_from_a_real_simulation(small_scenario_dict):
    res = simulate(scenario_from_dict(small_scenario_dict, "test"), with_max_batch=False)
    occ = occupancy_figure(res)
    assert [t.name for t in occ.data] == ["T0 HBM", "T1 host", "T2 host, compressed", "T3 evicted"]
    last = res.steps.iloc[-1]
    assert [int(t.y[-1]) for t in occ.data] == [int(last[c]) for c in ("tokens_t0", "tokens_t1", "tokens_t2", "tokens_t3")]
    tl = timeline_figure(res)
    bars = {t.name: t for t in tl.data}
    n_compute = int((res.timeline.kind == "compute").sum())
    assert len(bars["compute"].x) == n_compute > 0
    assert all(x >= 0 for t in tl.data for x in t.x)


def test_validation_figure_has_identity_line_and_bands():
    table = pd.DataFrame({"scenario": ["a", "b", "a", "b"], "metric": ["throughput_tok_per_s"] * 2 + ["transfer_share"] * 2,
                          "predicted": [110.0, 90.0, 0.05, 0.2], "measured": [100.0, 100.0, 0.04, 0.25],
                          "rel_error": [0.1, -0.1, 0.25, -0.2]})
    fig = validation_figure(table)
    names = [t.name for t in fig.data]
    assert names.count("y = x (exact)") == 2 and names.count("+-10%") == 2 and names.count("+-25%") == 2
    points = [t for t in fig.data if t.name == "scenario"]
    assert list(points[0].x) == [100.0, 100.0] and list(points[0].y) == [110.0, 90.0]
    assert list(points[1].x) == pytest.approx([4.0, 25.0])  # shares shown in percent
    band = next(t for t in fig.data if t.name == "+-10%")
    lo, hi = band.x[0], band.x[1]
    assert band.y[0] == pytest.approx(lo * 0.9) and band.y[2] == pytest.approx(hi * 1.1)
    assert not math.isnan(lo)


MEASURED_PROFILE = {
    "schema_version": 1, "kind": "measured", "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
    "machine": "test-box", "created_utc": "2026-01-01T00:00:00+00:00", "device_memory_bytes": 79.0e9,
}


def test_measured_profile_is_an_extra_gpu_column(tmp_path):
    from sim.inputs.profile import load_profile
    from sim.studies.projection_grid import profile_base_gpu

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(MEASURED_PROFILE))
    prof = load_profile(path)
    assert profile_base_gpu(prof) == "h100-sxm"
    spec = replace(SMALL, weight_dtypes=("bf16",), gpus=("rtx-4090",), lengths=(2048,), batches=(1, 2, 4))
    g = run_grid(spec, [prof], workers=1)
    assert [c.label for c in g.gpus] == ["rtx-4090", "NVIDIA H100 80GB HBM3 (measured)"]
    measured = g.limits[g.limits.gpu == g.gpus[1].key]
    assert len(measured) == len(spec.policies)
    assert (g.points[g.points.gpu == g.gpus[1].key].hbm_capacity_bytes == 79.0e9).all()
    mb = {f.fig_id: f for f in projection_figures(g)}["fig-max-batch"]
    assert list(mb.figure.data[0].x) == ["rtx-4090", "NVIDIA H100 80GB HBM3 (measured)"]


def test_timeline_shows_copies_and_their_stalls():
    """A window whose re-tier moves tokens: the synchronous pageable copies show as H2D bars, and
    compute waits for them (stall bars) exactly where no compute runs."""
    sc = scenario_from_dict({
        "name": "tiny-window", "model": {"name": "deepseek-r1-distill-qwen-7b"}, "hardware": {"gpu": "rtx-4090"},
        "workload": {"batch_size": 2, "prompt_tokens": 16, "reasoning_tokens": 100},
        "policy": {"kind": "tiered", "hbm_ratio": 0.25, "evict_ratio": 0.1, "retier_interval": 32, "recent_window": 8,
                   "sink_tokens": 4, "prefetch": "sync_per_step", "pinned": False},
        "sim": {"detail": "layer"}}, "test")
    res = simulate(sc, with_max_batch=False)
    bars = {t.name: t for t in timeline_figure(res).data}
    n_h2d = int((res.timeline.kind == "h2d").sum())
    assert n_h2d > 0 and len(bars["host -> device"].x) == n_h2d
    stalls = stall_intervals(res.timeline)
    assert len(bars["stall (compute waits)"].x) == len(stalls) > 0
    total_stall_ms = sum(bars["stall (compute waits)"].x)
    assert total_stall_ms == pytest.approx(sum(b - a for a, b in stalls) / MS)
