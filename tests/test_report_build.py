"""Building whole reports: a reduced projection with the paper checked, per-run views with a
validation table, the CLI end to end; self-contained, deterministic, written atomically."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import replace

import pandas as pd
import pytest
import yaml
from plotly.offline import get_plotlyjs

from sim.inputs.errors import ConfigError
from sim.report.command import build_report
from sim.studies.projection_grid import DEFAULT_GRID

from .conftest import SCENARIOS, run_cli

SMALL = replace(DEFAULT_GRID, models=(("7B", "deepseek-r1-distill-qwen-7b"),), weight_dtypes=("bf16",),
                gpus=("rtx-4090",), batches=(1, 2, 4, 8), lengths=(2048,))
VALIDATION = "scenario,metric,predicted,measured,rel_error\nsmall,throughput_tok_per_s,105,100,0.05\n" \
             "small,tpot_p50_s,0.010,0.012,\n"


def _figure_ids(html: str) -> list[str]:
    return re.findall(r'<div id="(fig-[^"]+)" class="plotly-graph-div"', html)


@pytest.fixture(scope="module")
def projection_html(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "projection.html"
    build_report([], [], None, out, grid_spec=SMALL, workers=1, show_progress=False)
    return out


def test_projection_report_sections_and_figures(projection_html):
    html = projection_html.read_text()
    for anchor in ('id="summary"', 'id="projection"', 'id="access"', 'fig-access-0', 'fig-access-1', 'id="paper"', 'class="controls"', "What the figures say"):
        assert anchor in html
    assert _figure_ids(html) == ["fig-throughput", "fig-max-batch", "fig-hbm-saved", "fig-link", "fig-transfer-share",
                                 "fig-access-0", "fig-access-1", "fig-paper-kv", "fig-paper-throughput"]
    assert "Which access strategy wins" in html and "host CPU" in html  # the binding resource is named
    for fid in ("fig-throughput", "fig-max-batch", "fig-hbm-saved", "fig-link", "fig-transfer-share"):
        assert f'id="variants-{fid}"' in html
    # the written summary is computed, e.g. it quotes the capacity gain and the paper's sizing error
    assert "Capacity: across 1 model x weights x GPU x length configuration" in html
    assert "7x too much for the 7B" in html


def test_self_contained_no_network(projection_html):
    html = projection_html.read_text()
    assert html.count(get_plotlyjs()) == 1  # plotly.js inline, once
    page = html.replace(get_plotlyjs(), "")  # the bundle itself mentions URLs it never loads for these charts
    assert not re.search(r"<script[^>]*\bsrc=", page) and "cdn.plot.ly" not in page and "<link" not in page
    assert html.count("Plotly.newPlot") == len(_figure_ids(html))
    assert 3_000_000 < len(html) < 8_000_000  # one inline plotly.js bundle, compact data


def test_deterministic_across_runs_and_worker_counts(projection_html, tmp_path):
    again = tmp_path / "again.html"
    build_report([], [], None, again, grid_spec=SMALL, workers=2, show_progress=False)
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(again) == digest(projection_html)


def test_report_gets_plain_file_permissions(projection_html):
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(projection_html.stat().st_mode) == 0o666 & ~mask  # not the temporary file's 0600


def test_run_report_with_validation(tmp_path, small_scenario_dict):
    sc = tmp_path / "small.yaml"
    sc.write_text(yaml.safe_dump(small_scenario_dict))
    val = tmp_path / "val.csv"
    val.write_text(VALIDATION)
    out = tmp_path / "runs.html"
    build_report([sc], [], val, out, show_progress=False)
    html = out.read_text()
    assert _figure_ids(html) == ["fig-run-0-occupancy", "fig-run-0-memory", "fig-run-0-timeline", "fig-validation"]
    assert 'id="projection"' not in html and "Run: small" in html
    assert "Validation (predicted against measured): throughput_tok_per_s: median |error| 5.0%" in html


def test_bad_scenario_raises_before_writing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: no-such-model}\n")
    out = tmp_path / "r.html"
    with pytest.raises(ConfigError, match="no-such-model"):
        build_report([bad], [], None, out, show_progress=False)
    assert not out.exists()


def test_out_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        build_report([], [], None, tmp_path, grid_spec=SMALL, show_progress=False)


def test_cli_run_report_end_to_end(tmp_path):
    out = tmp_path / "paper.html"
    res = run_cli("report", str(SCENARIOS / "paper-rtx5080-7b.yaml"), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""  # progress and the final line go to stderr
    assert f"wrote {out}" in res.stderr
    html = out.read_text()
    assert "Run: paper-rtx5080-7b" in html and len(_figure_ids(html)) == 3


def test_cli_bad_scenario_one_line_exit_2(tmp_path):
    out = tmp_path / "r.html"
    res = run_cli("report", str(tmp_path / "missing.yaml"), "--out", str(out))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"kvsim: {tmp_path / 'missing.yaml'}: file not found"]
    assert not out.exists()


def test_set_needs_scenarios(tmp_path):
    with pytest.raises(ConfigError, match="--set applies to scenarios"):
        build_report([], [], None, tmp_path / "r.html", overrides=["sim.detail=layer"], grid_spec=SMALL, show_progress=False)


def test_set_overrides_every_scenario(tmp_path, small_scenario_dict):
    sc = tmp_path / "small.yaml"
    sc.write_text(yaml.safe_dump(small_scenario_dict))
    out = tmp_path / "r.html"
    build_report([sc], [], None, out, overrides=["workload.batch_size=3"], show_progress=False)
    assert "batch 3" in out.read_text()


def test_projection_tables_written_beside_the_html(projection_html):
    from sim.decode.capacity import max_batch
    from sim.decode.context import build_context
    from sim.report.command import grid_csv_paths
    from sim.studies.projection_grid import DEFAULT_POLICIES, grid_scenario

    points_path, limits_path = grid_csv_paths(projection_html)
    points, limits = pd.read_csv(points_path), pd.read_csv(limits_path)
    assert set(limits["policy"]) == {p.key for p in DEFAULT_POLICIES}
    assert {"throughput_tok_per_s", "batch", "fits", "h2d_utilization"} <= set(points.columns)
    full = next(p for p in DEFAULT_POLICIES if p.key == "full_hbm")
    sc = grid_scenario("deepseek-r1-distill-qwen-7b", "bf16", "rtx-4090", 2048, 1, full, SMALL.prompt_tokens)
    row = limits[limits["policy"] == "full_hbm"].iloc[0]
    assert row["max_batch"] == max_batch(build_context(sc))
