"""`kvsim report SCENARIO` on a serving scenario (one with workload.arrivals): the run simulated as
`kvsim run` simulates it and drawn - TTFT and TPOT of each request over arrival time with the SLO
lines, the requests running and waiting over time, HBM and host memory against their capacities -
with the summary's figures in words and in a table; beside a closed batch on one page; a run that
does not fit said, not drawn; one past its cost limit refused in one line, exit 2."""

from __future__ import annotations

import html as htmllib
import re
from dataclasses import replace

import pytest
import yaml

from sim.inputs.scenario import load_scenario
from sim.model.units import GB, MS
from sim.report.figures_serving_run import (
    latency_figure,
    latency_title,
    memory_figure,
    memory_title,
    queue_figure,
    queue_title,
    serving_run_figures,
)
from sim.report.summary_text import serving_run_sentence
from sim.serving.run import simulate_serving

from .conftest import SCENARIOS, run_cli

SERVING = SCENARIOS / "serving-h100-70b-tp4.yaml"
CLOSED = SCENARIOS / "cpu-tiny.yaml"
REQUESTS = 50
SMALL = [f"workload.arrivals.requests={REQUESTS}"]  # about a second of simulation


def _figure_ids(text: str) -> list[str]:
    return re.findall(r'<div id="(fig-[^"]+)" class="plotly-graph-div"', text)


@pytest.fixture(scope="module")
def result():
    return simulate_serving(load_scenario(SERVING, SMALL))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A closed batch and the serving run (of REQUESTS requests) on one page, through the command
    line (--set would apply to both scenarios: the serving one is written with fewer requests)."""
    tmp = tmp_path_factory.mktemp("serving-run")
    doc = yaml.safe_load(SERVING.read_text())
    doc["workload"]["arrivals"]["requests"] = REQUESTS
    (tmp / f"{SERVING.stem}.yaml").write_text(yaml.safe_dump(doc))
    out = tmp / "r.html"
    res = run_cli("report", str(CLOSED), str(tmp / f"{SERVING.stem}.yaml"), "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out.read_text()


def test_the_page_draws_the_serving_run_beside_the_closed_batch(page, result):
    name = result.scenario.name
    assert re.findall(r'<section id="([^"]+)">', page) == ["run-0", "run-1"]
    assert re.findall(r'<nav class="toc" id="contents">.*?</nav>', page)  # two sections: a table of contents
    assert '<a href="#run-1">Serving run: serving-h100-70b-tp4</a>' in page
    assert _figure_ids(page) == ["fig-run-0-occupancy", "fig-run-0-memory", "fig-run-0-timeline",
                                 "fig-run-1-latency", "fig-run-1-queue", "fig-run-1-memory"]
    for title in (latency_title(name), queue_title(name), memory_title(name)):
        assert title in page


def test_the_page_says_the_summary_figures(page, result):
    s = result.summary
    assert s.fits and s.requests == REQUESTS and s.preemptions is not None
    text = htmllib.unescape(page)
    sentence = serving_run_sentence(s)
    assert sentence in text  # the summary at the top of the page
    assert f"{REQUESTS} requests at 10 req/s: the run takes {s.duration_s:,.1f} s" in sentence
    assert f"{s.request_throughput_per_s:,.2f} req/s" in sentence and f"{s.output_throughput_tok_per_s:,.0f} output tok/s" in sentence
    for p in (s.ttft_p50_s, s.ttft_p99_s, s.tpot_p50_s, s.tpot_p99_s):
        assert f"{p / MS:,.0f} ms" in sentence or f"{p / MS:,.1f} ms" in sentence
    assert f"{s.preemptions:,} preemption" in sentence and "goodput" in sentence
    # and the table of every figure (sim.outputs.run_folder.serving_summary_rows)
    assert f"<td>duration</td><td>{s.duration_s:,.1f} s ({s.steps:,} steps)</td>" in page
    assert f"{REQUESTS} requests, Poisson at 10 req/s" in text


def test_latency_figure_has_every_request_and_the_slo_lines(result):
    reqs, fig = result.requests, latency_figure(result)
    markers = [t for t in fig.data if t.mode == "markers"]
    ttft = [t for t in markers if t.xaxis == "x"]
    tpot = [t for t in markers if t.xaxis == "x2"]
    assert sum(len(t.x) for t in ttft) == REQUESTS
    assert sum(len(t.x) for t in tpot) == int(reqs.tpot_s.notna().sum())
    drawn = sorted(y for t in ttft for y in t.y)
    assert drawn == pytest.approx(sorted(reqs.ttft_s / MS))
    slo = [t for t in fig.data if t.mode == "lines"]
    assert [list(t.y) for t in slo] == [[2000.0, 2000.0], [50.0, 50.0]]  # the scenario's slo: ttft_ms, tpot_ms
    assert [t.xaxis for t in slo] == ["x", "x2"]
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type == "log"


def test_no_slo_no_slo_lines(result):
    bare = replace(result, scenario=result.scenario.model_copy(update={"slo": None}))
    fig = latency_figure(bare)
    assert all(t.mode == "markers" for t in fig.data)


def test_queue_and_memory_follow_the_timeline(result):
    tl, s = result.timeline, result.summary
    queue = queue_figure(result)
    assert [t.name for t in queue.data] == ["running", "waiting (queue)"]  # recompute preemption: no swapped
    assert list(queue.data[0].x) == list(tl.t_s) and list(queue.data[0].y) == list(tl.running)
    assert list(queue.data[1].y) == list(tl.waiting)
    assert queue.layout.shapes[0].y0 == s.max_num_seqs
    mem = memory_figure(result)
    assert [t.name for t in mem.data] == ["HBM in use", "host (T1 + T2)"]
    assert list(mem.data[0].y) == pytest.approx(list(tl.hbm_bytes / GB))
    assert max(mem.data[0].y) == pytest.approx(s.hbm_peak_bytes / GB)
    lines = sorted(sh.y0 for sh in mem.layout.shapes)
    assert lines == pytest.approx(sorted([s.hbm_capacity_bytes / GB, (s.hbm_capacity_bytes - s.kv_budget_bytes) / GB]))
    assert any("host capacity" in a.text and "off the scale" in a.text for a in mem.layout.annotations)


def test_a_run_that_does_not_fit_is_said_not_drawn(tmp_path):
    out = tmp_path / "r.html"
    res = run_cli("report", str(SERVING), "--set", SMALL[0], "--set", "parallel.tp=1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    page = htmllib.unescape(out.read_text())
    assert _figure_ids(page) == [] and "Serving run: serving-h100-70b-tp4" in page
    assert f"{REQUESTS} requests at 10 req/s does not fit: weights" in page
    assert serving_run_figures(simulate_serving(load_scenario(SERVING, [*SMALL, "parallel.tp=1"]))) == []


def test_a_run_past_its_cost_limit_is_one_line_exit_2(tmp_path):
    out = tmp_path / "r.html"
    res = run_cli("report", str(SERVING), "--set", "scheduler.max_num_seqs=1", "--out", str(out))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvsim: {SERVING}: workload.arrivals: ") and "--allow-large" in lines[0]
    assert not out.exists()


@pytest.mark.browser
def test_the_serving_run_renders_in_a_browser_without_errors(page, tmp_path):
    from .test_report_browser import _figure_count, _open

    out = tmp_path / "r.html"
    out.write_text(page)
    r = _open(out, tmp_path)
    assert r["data-js-errors"] == [] and r["data-remote"] == []
    assert int(r["data-plots"]) == int(r["data-drawn"]) == _figure_count(page) == 6  # 3 closed batch + 3 serving
