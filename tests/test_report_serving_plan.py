"""The report's "Serving plan" section (issue #14 item 4): `kvsim plan --out` writes probes.csv and
plan.json beside an unchanged plan.csv, consistent with the search's bracket; `kvsim report --plan`
draws them (traces, SLO and target lines, the table ranked by cost) with no simulation of its own; the
default report says how to add it; a bad folder is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import replace

import pandas as pd
import pytest
import yaml

from sim.plan import search as P
from sim.plan.files import MISS_KEYS, PLAN_FILES, PROBE_COLUMNS, candidate_key, plan_csv
from sim.report.command import build_report
from sim.report.document import PLAN_EXAMPLE
from sim.report.figures_serving import LATENCY_PANELS, latency_figure, max_rate_figure, table_rows
from sim.report.plan_input import load_plan
from sim.studies.projection_grid import DEFAULT_GRID

from .conftest import SCENARIOS, run_cli
from .test_plan import SCENARIO

RATE_PER_S, TTFT_MS, TPOT_MS, REQUESTS = 16.0, 500.0, 15.0, 60
SPEC = P.PlanSpec(rate=RATE_PER_S, ttft_s=TTFT_MS / 1e3, tpot_s=TPOT_MS / 1e3, requests=REQUESTS)
SMALL = replace(DEFAULT_GRID, models=(("7B", "deepseek-r1-distill-qwen-7b"),), weight_dtypes=("bf16",),
                gpus=("rtx-4090",), batches=(1, 2, 4, 8), lengths=(2048,))
RUN = SCENARIOS / "cpu-tiny.yaml"


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One small search (a second): a pruned GPU (one RTX 5080 cannot hold the 14B), failing rows,
    bisected and capped passing rows, and two replicas of TP 1. Returns (folder, the --json rows)."""
    tmp = tmp_path_factory.mktemp("serving-plan")
    scenario = tmp / "plan-14b.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    out = tmp / "plan"
    res = run_cli("plan", str(scenario), "--rate", f"{RATE_PER_S:g}", "--ttft-p99-ms", f"{TTFT_MS:g}", "--tpot-p99-ms",
                  f"{TPOT_MS:g}", "--gpus", "rtx-5080,h100-sxm", "--counts", "1,2", "--policies", "full_hbm,tiered:0.5",
                  "--requests", str(REQUESTS), "--workers", "2", "--replicas", "--no-disagg", "--json", "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out, json.loads(res.stdout)


@pytest.fixture(scope="module")
def files(searched):
    out, _ = searched
    return pd.read_csv(out / "plan.csv"), pd.read_csv(out / "probes.csv"), json.loads((out / "plan.json").read_text())


def _probes_of(probes: pd.DataFrame, row) -> pd.DataFrame:
    return probes[probes.candidate == candidate_key(row.gpu, row.gpus, row.tp, row.policy, None if pd.isna(row.prefill) else row.prefill, row.max_num_seqs)]


def test_plan_writes_three_files_and_plan_csv_is_unchanged(searched, files):
    out, rows = searched
    assert sorted(p.name for p in out.iterdir()) == sorted(PLAN_FILES)  # no temporary file left
    assert (out / "plan.csv").read_text() == plan_csv(rows)  # the same table as before this section existed
    plan, probes, doc = files
    assert list(probes.columns) == PROBE_COLUMNS
    assert doc["rate_per_s"] == RATE_PER_S and doc["ttft_p99_ms"] == TTFT_MS and doc["tpot_p99_ms"] == TPOT_MS
    assert doc["requests"] == REQUESTS and doc["model"] == SCENARIO["model"]["name"] and doc["scenario"] == SCENARIO["name"]
    assert doc["gpus"] == ["rtx-5080", "h100-sxm"] and doc["policies"] == ["full_hbm", "tiered:0.5"] and doc["replicas"]
    assert "prices.yaml" in doc["prices_source"]


def test_every_simulated_candidate_has_its_probes_and_pruned_ones_none(files):
    plan, probes, _ = files
    keys = {candidate_key(r.gpu, r.gpus, r.tp, r.policy, None if pd.isna(r.prefill) else r.prefill, r.max_num_seqs): r.status for r in plan.itertuples()}
    assert set(probes.candidate) == {k for k, s in keys.items() if s in ("pass", "fail")}  # the simulated ones
    assert {"pass", "screened", "pruned"} <= set(keys.values())
    for _, p in probes.groupby("candidate", sort=False):
        assert list(p.probe) == list(range(1, len(p) + 1))
        first = p.iloc[0]
        assert first.step == "rate" and first.offered_rate_per_s == RATE_PER_S


def test_probes_agree_with_plan_csv_within_the_bisection(files):
    """evaluate() gives every passing rate to `lo` and every failing one to `hi`: the max rate is
    exactly the highest passing probe, the next rate the lowest failing one, and every passing probe
    lies below every failing one; the bracket is within the tolerance unless the cap was reached."""
    plan, probes, _ = files
    seen = {"bisected": 0, "capped": 0, "fail": 0}
    for r in plan[plan.status.isin(["pass", "fail"])].itertuples():
        p = _probes_of(probes, r)
        at_rate = p.iloc[0]
        assert at_rate.ttft_p99_ms == pytest.approx(r.ttft_p99_ms, rel=1e-12)
        assert at_rate.tpot_p99_ms == pytest.approx(r.tpot_p99_ms, rel=1e-12)
        ok, bad = p[p.passed], p[~p.passed]
        if r.status == "fail":
            seen["fail"] += 1
            assert len(p) == 1 and not at_rate.passed and at_rate.reason in r.reason
            continue
        assert r.max_rate_per_s == ok.offered_rate_per_s.max()
        if not bad.empty:
            assert ok.offered_rate_per_s.max() < bad.offered_rate_per_s.min()
        if r.max_rate_capped:
            seen["capped"] += 1
            assert bad.empty and r.max_rate_per_s == pytest.approx(RATE_PER_S * SPEC.max_factor) and math.isnan(r.next_rate_per_s)
        else:
            seen["bisected"] += 1
            assert r.next_rate_per_s == bad.offered_rate_per_s.min()
            assert r.next_rate_per_s / r.max_rate_per_s <= 1 + SPEC.tolerance + 1e-12
            assert "bisect" in set(p.step)
        for before, after in zip(p.iloc[:-1].itertuples(), p.iloc[1:].itertuples()):
            if after.step == "double":  # twice the last rate, which passed, up to the cap
                assert before.passed and after.offered_rate_per_s == pytest.approx(
                    min(2 * before.offered_rate_per_s, RATE_PER_S * SPEC.max_factor))
    assert seen["bisected"] and seen["capped"], seen


def test_probe_outcome_columns(files):
    _, probes, _ = files
    assert (probes.passed == probes.slo_missed.isna()).all()
    for missed, reason in zip(probes.slo_missed.dropna(), probes.reason.dropna()):
        assert set(missed.split(";")) <= set(MISS_KEYS)
        assert ("TTFT" in reason) == ("ttft_p99" in missed) and ("TPOT" in reason) == ("tpot_p99" in missed)
    bad_ttft = probes[probes.ttft_p99_ms > TTFT_MS]
    assert bad_ttft.slo_missed.str.contains("ttft_p99").all()
    ran = probes[probes.end == "measured"]  # a probe stopped at its verdict has no percentiles
    assert (ran.ttft_p50_ms <= ran.ttft_p90_ms).all() and (ran.ttft_p90_ms <= ran.ttft_p99_ms).all()
    assert probes[probes.end != "measured"].ttft_p99_ms.isna().all()
    # two replicas of TP 1: the rate is the configuration's (each replica simulated at half of it)
    two = probes[(probes.dp == 2) & (probes.probe == 1)]
    assert not two.empty and (two.offered_rate_per_s == RATE_PER_S).all()


def test_the_section_draws_the_probes_with_slo_and_target_lines(searched, files):
    plan, probes, _ = files
    pf = load_plan(searched[0])
    fig = latency_figure(pf)
    n_cands = probes.candidate.nunique()
    assert len(fig.data) == len(LATENCY_PANELS) * n_cands + 2
    slo = [t for t in fig.data if "target" in (t.name or "")]
    assert [list(t.y) for t in slo] == [[TTFT_MS, TTFT_MS], [TPOT_MS, TPOT_MS]]
    assert [s.x0 for s in fig.layout.shapes] == [RATE_PER_S, RATE_PER_S]  # the target rate on both panels
    for t in fig.data[:-2]:  # each candidate's points: its probes, by rate
        p = probes[probes.candidate == t.legendgroup]
        assert sorted(t.x) == list(t.x) and len(t.x) == len(p)
    menu = fig.layout.updatemenus[0].buttons
    configs = {(r.gpu, r.gpus, r.tp) for r in plan[plan.status.isin(["pass", "fail"])].itertuples()}
    assert len(menu) == 1 + len(configs)
    assert all(len(b.args[0]["visible"]) == len(fig.data) for b in menu)

    bars = max_rate_figure(pf)
    assert [t.name for t in bars.data] == ["full_hbm", "tiered:0.5"] and bars.layout.shapes[0].y0 == RATE_PER_S
    passing = plan[plan.status == "pass"]
    drawn = sorted(y for t in bars.data for y in t.y if y)
    assert drawn == pytest.approx(sorted(passing.max_rate_per_s))


def test_one_slo_given_one_slo_line(searched, tmp_path):
    folder = _broken(searched, tmp_path, "plan.json", lambda t: t.replace(f'"tpot_p99_ms": {TPOT_MS}', '"tpot_p99_ms": null'))
    pf = load_plan(folder)
    fig = latency_figure(pf)
    assert len(fig.data) == len(LATENCY_PANELS) * pf.probes.candidate.nunique() + 1
    assert list(fig.data[-1].y) == [TTFT_MS, TTFT_MS] and fig.data[-1].xaxis == "x"


def test_the_table_ranks_by_cost(searched, files):
    plan, _, _ = files
    rows = table_rows(load_plan(searched[0]))
    assert len(rows) == len(plan)
    ranked = [r for r in rows if r[0] != "-"]
    assert [r[0] for r in ranked] == [str(i) for i in range(1, len(ranked) + 1)]
    keys = [(r[5] != "exact", float(r[6])) for r in ranked]  # exact before lossy, then by cost
    assert keys == sorted(keys) and len(ranked) == (plan.status == "pass").sum()
    assert [r[0] for r in rows[len(ranked):]] == ["-"] * (len(rows) - len(ranked))  # failing and pruned after


def test_report_with_plan_beside_a_run_and_the_projection(searched, tmp_path):
    out = tmp_path / "r.html"
    res = run_cli("report", str(RUN), "--plan", str(searched[0]), "--out", str(out))
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    figs = re.findall(r'<div id="(fig-[^"]+)" class="plotly-graph-div"', html)
    assert figs[:3] == ["fig-plan-pareto", "fig-plan-latency", "fig-plan-max-rate"]
    assert any(f.startswith("fig-run-0") for f in figs)
    assert 'id="serving-plan"' in html and "Serving plan for deepseek-r1-distill-qwen-14b at 16 req/s" in html
    proj = tmp_path / "p.html"
    build_report([], [], None, proj, grid_spec=SMALL, workers=1, show_progress=False, plan_path=searched[0])
    html = proj.read_text()
    assert html.index('id="paper"') < html.index('id="serving-plan"') and "fig-plan-latency" in html
    assert "Not in this report" not in html


def test_default_report_without_plan_says_how_to_add_it(tmp_path):
    out = tmp_path / "p.html"
    build_report([], [], None, out, grid_spec=SMALL, workers=1, show_progress=False, command="kvsim report --out x.html")
    html = out.read_text()
    section = html[html.index('id="serving-plan"'):]
    section = section[:section.index("</section>")]
    assert PLAN_EXAMPLE in section and "kvsim report --out x.html --plan runs/plan" in section
    assert "fig-plan" not in html and "plotly-graph-div" not in section


def _broken(searched, tmp_path, name, edit):
    folder = tmp_path / "plan"
    shutil.copytree(searched[0], folder)
    if edit is None:
        (folder / name).unlink()
    else:
        (folder / name).write_text(edit((folder / name).read_text()))
    return folder


def _drop_column(text: str, column: str) -> str:
    frame = pd.read_csv(__import__("io").StringIO(text), dtype=str, keep_default_na=False)
    return frame.drop(columns=[column]).to_csv(index=False)


@pytest.mark.parametrize("name, edit, expected", [
    (None, None, "--plan: folder not found; expected the folder `kvsim plan --out DIR` writes"),
    ("probes.csv", None, "probes.csv: file not found"),
    ("plan.csv", lambda t: _drop_column(t, "max_rate_per_s"), "plan.csv: missing column(s) max_rate_per_s"),
    ("probes.csv", lambda t: t.replace(f",rate,{RATE_PER_S},", ",rate,fast,", 1),
     "probes.csv: offered_rate_per_s: expected a number, got 'fast' (data row 1)"),
    ("plan.json", lambda t: t.replace(f'"rate_per_s": {RATE_PER_S}', '"rate_per_s": 0'), "plan.json: rate_per_s:"),
    ("plan.json", lambda t: t[:20], "plan.json: invalid JSON"),
])
def test_a_bad_plan_folder_is_one_line_exit_2_nothing_written(searched, tmp_path, name, edit, expected):
    folder = tmp_path / "missing" if name is None else _broken(searched, tmp_path, name, edit)
    out = tmp_path / "r.html"
    res = run_cli("report", str(RUN), "--plan", str(folder), "--out", str(out))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: ") and expected in lines[0], lines
    assert "Traceback" not in res.stderr and not out.exists() and not list(tmp_path.glob(".r.html.*"))


@pytest.mark.browser
def test_the_section_renders_in_a_browser_without_errors(searched, tmp_path):
    from .test_report_browser import _figure_count, _open

    out = tmp_path / "r.html"
    build_report([RUN], [], None, out, show_progress=False, plan_path=searched[0])
    r = _open(out, tmp_path)
    assert r["data-js-errors"] == [] and r["data-remote"] == []
    assert int(r["data-plots"]) == int(r["data-drawn"]) == _figure_count(out.read_text()) == 6  # 3 plan + 3 run


def test_the_pareto_figure_draws_every_passing_configuration_per_gpu_count(searched, files):
    from sim.report.figures_serving import pareto_figure

    plan, _, doc = files
    fig = pareto_figure(load_plan(searched[0]))
    points = [t for t in fig.data if t.mode == "markers"]
    passing = plan[plan.status == "pass"]
    assert sorted(t.name for t in points) == sorted(f"{n} GPUs" for n in passing.gpus.unique())
    assert sum(len(t.x) for t in points) == len(passing)
    for t in points:  # tokens/s per user = 1000 / p99 TPOT at the rate
        n = int(t.name.split()[0])
        assert sorted(t.x) == pytest.approx(sorted(1e3 / passing[passing.gpus == n].tpot_p99_ms))


def test_a_plan_folder_written_before_pipeline_layouts_reads_as_no_pipeline(searched, tmp_path):
    folder = _broken(searched, tmp_path, "plan.csv", lambda t: _drop_column(t, "pp"))
    assert "pp" not in pd.read_csv(folder / "plan.csv").columns
    plan = load_plan(folder).plan
    assert (plan["pp"] == 1).all() and len(plan) == len(pd.read_csv(searched[0] / "plan.csv"))
