"""`kvsim report --plan DIR --only plan`: a page of the "Serving plan" section alone, drawn from the
folder with nothing computed (no projection, access study or paper check); a bad --only is one line
naming the flag, exit 2, nothing written. Every page of more than one section opens with a table of
contents linking each section."""

from __future__ import annotations

import re

import pytest

from sim.report import command

from .conftest import run_cli
from .test_report_serving_plan import RUN, searched  # noqa: F401 - the plan folder fixture (one small search)


def _section_ids(html: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)">', html)


def _toc_links(html: str) -> list[str]:
    toc = re.search(r'<nav class="toc" id="contents">(.*?)</nav>', html)
    return re.findall(r'<a href="#([^"]+)">', toc.group(1)) if toc else []


@pytest.fixture
def nothing_computed(monkeypatch):
    """The projection, the access study, the paper check and any simulation fail if called."""
    def refuse(*args, **kwargs):
        raise AssertionError("--only plan computed something")

    for name in ("run_grid", "access_study", "check_paper", "simulate", "simulate_serving"):
        monkeypatch.setattr(command, name, refuse)


def test_only_plan_draws_the_plan_alone_and_computes_nothing(searched, nothing_computed, tmp_path):  # noqa: F811
    out = tmp_path / "plan.html"
    res = run_cli("report", "--plan", str(searched[0]), "--only", "plan", "--out", str(out))
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    assert _section_ids(html) == ["serving-plan"]
    assert 'id="projection"' not in html and 'id="paper"' not in html and 'id="access"' not in html
    assert "fig-plan-latency" in html and "fig-plan-max-rate" in html and "fig-throughput" not in html
    assert "Serving plan for deepseek-r1-distill-qwen-14b at 16 req/s" in html  # the summary says the plan
    assert "Not in this report" not in html and 'id="contents"' not in html  # one section: no table of contents
    assert not out.with_suffix(".points.csv").exists() and not out.with_suffix(".limits.csv").exists()


@pytest.mark.parametrize("args, expected", [
    (["--only", "projection"], "kvsim: --only: expected plan, got 'projection'"),
    (["--only", "plan"], "kvsim: --only: plan draws the folder of --plan DIR"),
    (["--only", "plan", "PLAN", "RUN"], "kvsim: --only: plan draws the serving plan alone; drop scenarios"),
    (["--only", "plan", "PLAN", "--cache", "CACHE"], "kvsim: --only: plan draws the serving plan alone; drop --cache"),
])
def test_a_bad_only_is_one_line_exit_2_nothing_written(nothing_computed, tmp_path, args, expected):
    """--only is checked before any input is read: the plan folder need not exist."""
    subst = {"PLAN": ["--plan", str(tmp_path / "plan")], "RUN": [str(RUN)], "CACHE": [str(tmp_path / "cache")]}
    argv = [a for arg in args for a in subst.get(arg, [arg])]
    out = tmp_path / "r.html"
    res = run_cli("report", *argv, "--out", str(out))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert "Traceback" not in res.stderr and not out.exists() and not (tmp_path / "cache").exists()


def test_a_page_of_several_sections_opens_with_their_contents(searched, tmp_path):  # noqa: F811
    out = tmp_path / "r.html"
    res = run_cli("report", str(RUN), "--plan", str(searched[0]), "--out", str(out))
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    ids = _section_ids(html)
    assert ids == ["serving-plan", "run-0"] and _toc_links(html) == ids
    assert html.index('id="summary"') < html.index('id="contents"') < html.index('<section id="serving-plan"')
    assert '<a href="#serving-plan">Serving plan</a>' in html and '<a href="#run-0">Run: cpu-tiny</a>' in html


def test_a_page_of_one_section_has_no_contents(tmp_path):
    out = tmp_path / "r.html"
    res = run_cli("report", str(RUN), "--out", str(out))
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    assert _section_ids(html) == ["run-0"] and 'id="contents"' not in html
