"""The report's "Mixture-of-experts and hybrid models" section (`kvsim report --moe`): each model
placed on the smallest TP that fits, its table's numbers the projection's own (recomputed here with
sim.decode.projection.project and sim.decode.capacity.max_batch), HBM saved = full_hbm's peak minus
the policy's, the same tables from any worker count or a store, and the dense section unchanged."""

from __future__ import annotations

import html
import re
from dataclasses import replace

import pandas as pd
import pytest

from sim.decode.capacity import batch_memory_trace, max_batch
from sim.decode.context import build_context
from sim.decode.projection import project
from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.outputs.csv_text import csv_text
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION
from sim.report import figures_moe
from sim.report.command import build_report, moe_csv_path
from sim.report.document import ReportData, render, sections
from sim.runner.options import Execution
from sim.studies.moe_projection import (
    CHOOSE,
    MOE_MODELS,
    MOE_POLICIES,
    MoeCell,
    MoeGridSpec,
    binding,
    default_models,
    moe_cells,
    moe_scenario,
    placements_for,
    run_moe_grid,
    step_parts,
)
from sim.studies.projection_grid import DEFAULT_GRID, run_grid

from .conftest import SCENARIOS

R1, OSS20 = (next(m for m in MOE_MODELS if m.name == name) for name in ("deepseek-r1", "gpt-oss-20b"))
GPU, LENGTH = "h200-sxm", 4096
SPEC = MoeGridSpec(models=(R1, OSS20), gpus=(GPU,), lengths=(LENGTH,))
DENSE = replace(DEFAULT_GRID, models=(("7B", "deepseek-r1-distill-qwen-7b"),), weight_dtypes=("bf16",),
                gpus=("rtx-4090",), batches=(1, 2, 4, 8), lengths=(2048,))
POLICY = {p.key: p for p in MOE_POLICIES}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The grid computed into a store, then read back from it: (first run, second run)."""
    cache = tmp_path_factory.mktemp("moe-cache")
    first = run_moe_grid(SPEC, execution=Execution(workers=1, cache=cache))
    again = run_moe_grid(SPEC, execution=Execution(workers=1, cache=cache))
    return first, again


@pytest.fixture(scope="module")
def moe(stored):
    return stored[0]


def _row(moe, model: str, policy: str) -> pd.Series:
    lim = moe.limits
    return lim[(lim.model == model) & (lim.policy == policy)].iloc[0]


def _scenario(model, tp: int, batch: int, policy: str, length: int = LENGTH):
    return moe_scenario(model, GPU, tp, length, batch, POLICY[policy], SPEC.prompt_tokens)


def test_each_model_on_the_smallest_tp_that_fits():
    r1, oss = placements_for(SPEC)
    assert (r1.tp, oss.tp) == (8, 1)
    assert [tp for tp, _ in r1.skipped] == [1, 2, 4]
    spec = catalog.model("deepseek-r1")
    for tp in (1, 2, 4):  # allowed by the shapes, but the weights do not fit
        assert spec.tp_problem(tp) is None
        assert max_batch(build_context(_scenario(R1, tp, 1, "full_hbm"))) == 0
    assert spec.tp_problem(8) is None and max_batch(build_context(_scenario(R1, 8, 1, "full_hbm"))) >= 1
    assert r1.weights_bytes_per_gpu == pytest.approx(spec.shard(8).weight_bytes("fp8"))
    assert r1.kv_by_kind == {"mla": {"layers": 61, "bytes_per_token": 61 * 576 * 2.0}}  # bf16 latent, replicated


def test_a_tp_the_shapes_refuse_is_skipped_with_its_reason():
    qwen = next(m for m in MOE_MODELS if m.name == "qwen3-235b-a22b")
    pl, = placements_for(replace(SPEC, models=(qwen,), tp_options=(3, 2)))
    assert pl.tp == 2 and pl.skipped[0][0] == 3
    assert pl.skipped[0][1] == catalog.model("qwen3-235b-a22b").tp_problem(3)


def test_a_model_not_listed_gets_the_first_format_that_fits_every_gpu():
    """bf16 DeepSeek-R1 is 168 GB per GPU even at TP8: more than an H200 holds, so fp8."""
    chosen = placements_for(replace(SPEC, models=(replace(R1, label="R1 chosen", weight_dtype=CHOOSE),)))
    assert [(pl.model.weight_dtype, pl.tp) for pl in chosen] == [("fp8", 8)]
    assert "(bf16 does not)" in chosen[0].model.why
    bf16 = replace(R1, weight_dtype="bf16")
    assert max_batch(build_context(_scenario(bf16, 8, 1, "full_hbm"))) == 0
    assert {m.name for m in default_models()} >= {m.name for m in MOE_MODELS}
    assert all(m.weight_dtype == CHOOSE for m in default_models()[len(MOE_MODELS):])


def test_max_batch_and_throughput_are_the_projections(moe):
    """gpt-oss-20b on one H200: every policy's row recomputed from the public functions."""
    for key in POLICY:
        row = _row(moe, OSS20.label, key)
        mb = max_batch(build_context(_scenario(OSS20, 1, 1, key)))
        assert mb > 0 and row.max_batch == mb
        at = project(_scenario(OSS20, 1, mb, key), with_max_batch=False)
        assert at.fits
        assert row.at_max_throughput_tok_per_s == pytest.approx(at.throughput_tok_per_s, rel=1e-12)
        assert row.at_max_h2d_utilization == pytest.approx(at.h2d_utilization, rel=1e-12, abs=1e-15)
        assert not project(_scenario(OSS20, 1, mb + 1, key), with_max_batch=False).fits


def test_hbm_saved_is_full_hbm_peak_minus_the_policys(moe):
    full_mb = int(_row(moe, OSS20.label, "full_hbm").max_batch)
    for key in ("tiered_50", "tiered_auto"):
        row = _row(moe, OSS20.label, key)
        for batch, saved in ((full_mb, row.at_full_max_hbm_saved_bytes), (int(row.max_batch), row.at_max_hbm_saved_bytes)):
            full = batch_memory_trace(build_context(_scenario(OSS20, 1, batch, "full_hbm")), batch).hbm_peak_bytes
            tiered = batch_memory_trace(build_context(_scenario(OSS20, 1, batch, key)), batch).hbm_peak_bytes
            assert saved == pytest.approx(full - tiered, rel=1e-12) and saved > 0
    # the fixed ratio moves half of the unprotected tokens whatever the pressure; auto only what HBM cannot hold
    assert (_row(moe, OSS20.label, "tiered_50").at_full_max_hbm_saved_bytes
            > 10 * _row(moe, OSS20.label, "tiered_auto").at_full_max_hbm_saved_bytes)


def test_link_bound_batch_and_what_binds(moe):
    for key in ("tiered_50", "tiered_auto"):
        row = _row(moe, OSS20.label, key)
        lb = int(row.link_bound_batch)
        assert 1 < lb <= row.max_batch
        util = [project(_scenario(OSS20, 1, b, key), with_max_batch=False).h2d_utilization for b in (lb - 1, lb)]
        assert util[0] < LINK_BOTTLENECK_UTILIZATION <= util[1]
        assert row.at_max_h2d_utilization >= LINK_BOTTLENECK_UTILIZATION and row.binds.startswith("host link")
    full = _row(moe, OSS20.label, "full_hbm")
    parts = step_parts(_scenario(OSS20, 1, int(full.max_batch), "full_hbm"))
    assert parts["mid_step_stall_share"] == 0 and sum(parts.values()) == pytest.approx(1.0)
    assert full.binds == binding(0.0, parts) and full.binds.startswith("GPU ")
    assert full.mid_step_attention_share == pytest.approx(parts["mid_step_attention_share"], rel=1e-12)


def test_table_rows_print_the_numbers(moe):
    rows = {r[2]: r for r in figures_moe.table_rows(moe, OSS20.label)}
    full, tiered = _row(moe, OSS20.label, "full_hbm"), _row(moe, OSS20.label, "tiered_50")
    assert list(rows) == ["full_hbm", "tiered 50% HBM", "tiered auto"]
    at_full = project(_scenario(OSS20, 1, int(full.max_batch), "tiered_50"), with_max_batch=False)
    assert rows["tiered 50% HBM"] == [
        GPU, "4K", "tiered 50% HBM", f"{tiered.max_batch:,}", f"{at_full.hbm_saved_bytes / 1e9:,.1f} GB",
        f"{at_full.throughput_tok_per_s:,.0f}", f"{tiered.at_max_hbm_saved_bytes / 1e9:,.1f} GB",
        f"{tiered.at_max_throughput_tok_per_s:,.0f}", f"{tiered.at_max_h2d_utilization:.0%}", tiered.binds,
        f"{int(tiered.link_bound_batch):,}"]
    f = rows["full_hbm"]
    assert f[3] == f"{full.max_batch:,}" and f[4] == f[6] == f[8] == f[10] == "-" and f[5] == f[7]
    assert figures_moe.table_rows(moe, R1.label)[0][0] == f"{GPU} x 8"


def test_a_store_gives_the_same_tables_and_a_rerun_computes_nothing(stored):
    first, again = stored
    assert (first.computed, first.stored) == (2, 0) and (again.computed, again.stored) == (0, 2)
    assert csv_text(first.limits) == csv_text(again.limits) and csv_text(first.points) == csv_text(again.points)
    cell = moe_cells(SPEC, first.placements)[0]
    result = cell.run()
    assert cell.accepts(result)
    assert not cell.accepts({"points": result["points"], "limits": result["limits"]})  # a dense cell's shape
    assert not cell.accepts({**result, "extras": result["extras"][:-1]})
    assert MoeCell.kind != "projection cell" and cell.key != replace(cell, tp=4).key


def test_deterministic_across_worker_counts(moe):
    twice = run_moe_grid(SPEC, workers=2)
    assert csv_text(twice.limits) == csv_text(moe.limits)
    one, two = ReportData(moe=moe), ReportData(moe=twice)
    assert render(one, "kvsim report --moe") == render(two, "kvsim report --moe")


def test_the_dense_section_is_unchanged(moe):
    grid = run_grid(DENSE, workers=1)
    without, with_moe = sections(ReportData(grid=grid), "c"), sections(ReportData(grid=grid, moe=moe), "c")
    assert [s[0] for s in with_moe] == ["projection", "moe", "serving-plan"]
    assert with_moe[0] == without[0]  # byte for byte
    assert [s[0] for s in without] == ["projection", "serving-plan"]


@pytest.fixture(scope="module")
def page(moe, tmp_path_factory):
    out = tmp_path_factory.mktemp("moe-report") / "projection.html"
    build_report([], [], None, out, grid_spec=DENSE, workers=1, show_progress=False, moe_spec=SPEC)
    return out


def test_the_section_appears_after_the_dense_projection_with_every_model(page, moe):
    text = page.read_text()
    ids = re.findall(r'<div id="(fig-[^"]+)" class="plotly-graph-div"', text)
    assert ids[:6] == ["fig-throughput", "fig-max-batch", "fig-hbm-saved", "fig-link", "fig-transfer-share",
                       "fig-moe-max-batch"]
    assert text.index('id="projection"') < text.index('id="moe"') < text.index('id="access"')
    section = html.unescape(text[text.index('<section id="moe">'):text.index("</section>", text.index('id="moe"'))])
    assert "Mixture-of-experts and hybrid models" in section and "nothing here was measured on these models" in section
    for label, name in ((R1.label, R1.name), (OSS20.label, OSS20.name)):
        assert f"<h3>{label} ({name}): " in section
    assert "TP8, 85.1 GB of weights per GPU" in section and "mla 70,272 B (61 layers)" in section
    assert 'data-dim="moe_gpu"' in section and 'data-dim="moe_length"' in section
    tiered = _row(moe, OSS20.label, "tiered_50")
    assert f"<td>{tiered.max_batch:,}</td>" in section and f"<td>{tiered.at_max_throughput_tok_per_s:,.0f}</td>" in section
    gains = [(_row(moe, m, "tiered_50").max_batch / _row(moe, m, "full_hbm").max_batch) for m in (R1.label, OSS20.label)]
    assert f"tiering fits {min(gains):.1f}-{max(gains):.1f}x (tiered 50% HBM)" in text


def test_the_numbers_are_written_beside_and_the_dense_ones_are_the_grids(page, moe):
    table = pd.read_csv(moe_csv_path(page))
    assert len(table) == 2 * len(MOE_POLICIES) and list(table.model.unique()) == [R1.label, OSS20.label]
    assert table.max_batch.tolist() == moe.limits.max_batch.tolist()
    grid = run_grid(DENSE, workers=1)
    assert page.with_suffix(".points.csv").read_text() == csv_text(grid.points)
    assert page.with_suffix(".limits.csv").read_text() == csv_text(grid.limits)


def test_moe_is_refused_beside_scenarios(tmp_path):
    with pytest.raises(ConfigError) as err:
        build_report([SCENARIOS / "h200-7b-batch.yaml"], [], None, tmp_path / "r.html", moe=True, show_progress=False)
    assert err.value.field == "--moe" and "adds a section to the projection" in err.value.message
    assert not (tmp_path / "r.html").exists()
