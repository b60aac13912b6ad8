"""The generated reports opened in real headless chromium: no JavaScript error, every figure drawn,
the selectors update the figures, and nothing is fetched from the network.

A probe script is injected into a copy of the page; it records errors and results as attributes
of <html>, which `chromium --dump-dom` prints. Skipped where chromium is missing, except under CI
(the CI environment variable set), where a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import yaml

from sim.report.command import build_report
from sim.studies.projection_grid import DEFAULT_GRID

from .conftest import small_scenario

pytestmark = pytest.mark.browser

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
VIRTUAL_TIME_BUDGET_MS = 15_000  # chromium's virtual clock: lets plotly finish drawing before the DOM dump
BROWSER_TIMEOUT_S = 180
SMALL = replace(DEFAULT_GRID, models=(("7B", "deepseek-r1-distill-qwen-7b"), ("70B", "deepseek-r1-distill-llama-70b")),
                weight_dtypes=("bf16",), gpus=("rtx-4090", "h100-sxm"), batches=(1, 2, 4, 8), lengths=(2048, 8192))
VALIDATION = ("scenario,metric,predicted,measured,rel_error\nsmall,throughput_tok_per_s,105,100,0.05\n"
              "small,transfer_share,0.02,0.025,\nsmall,hbm_peak_bytes,2.1e10,2.0e10,\n")

PROBE = """
(function () {
  var root = document.documentElement, errors = [];
  function note(msg) { errors.push(String(msg)); root.setAttribute('data-js-errors', JSON.stringify(errors)); }
  root.setAttribute('data-js-errors', '[]');
  window.addEventListener('error', function (e) { note(e.message || 'error'); });
  window.addEventListener('unhandledrejection', function (e) { note('unhandled rejection: ' + e.reason); });
  var original = console.error;
  console.error = function () { note(Array.prototype.join.call(arguments, ' ')); original.apply(console, arguments); };
  window.addEventListener('load', function () {
    setTimeout(function () {
      var plots = document.querySelectorAll('.js-plotly-plot'), drawn = 0;
      plots.forEach(function (p) { if (p.querySelector('.main-svg') && p.querySelector('.main-svg').getBoundingClientRect().width > 0) { drawn++; } });
      root.setAttribute('data-plots', String(plots.length));
      root.setAttribute('data-drawn', String(drawn));
      var changed = [];
      document.querySelectorAll('select[data-dim]').forEach(function (sel) {
        if (sel.options.length < 2) { changed.push(sel.dataset.dim + ':single'); return; }
        var figs = document.querySelectorAll('div[data-variants][data-dims*="' + sel.dataset.dim + '"]');
        var before = Array.prototype.map.call(figs, function (b) { return JSON.stringify(document.getElementById(b.dataset.fig).data.map(function (t) { return t.y; })) + document.getElementById(b.dataset.fig).layout.title.text; });
        sel.value = sel.options[sel.selectedIndex === 0 ? 1 : 0].value;
        sel.dispatchEvent(new Event('change'));
        var after = Array.prototype.map.call(figs, function (b) { return JSON.stringify(document.getElementById(b.dataset.fig).data.map(function (t) { return t.y; })) + document.getElementById(b.dataset.fig).layout.title.text; });
        changed.push(sel.dataset.dim + ':' + after.filter(function (a, i) { return a !== before[i]; }).length + '/' + figs.length);
      });
      root.setAttribute('data-selectors', JSON.stringify(changed));
      var remote = performance.getEntriesByType('resource').map(function (r) { return r.name; })
        .filter(function (n) { return !/^(file|data|blob):/.test(n); });
      root.setAttribute('data-remote', JSON.stringify(remote));
      root.setAttribute('data-done', '1');
    }, 500);
  });
})();
"""


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail(f"none of {', '.join(BROWSERS)} found; CI must run the browser test (scripts/setup.sh installs chromium)")
    pytest.skip("chromium not installed (scripts/setup.sh installs it when run as root)")


def _open(html_path, tmp_path) -> dict:
    """Load a probed copy of the page in headless chromium; the <html> attributes it left behind."""
    html = html_path.read_text()
    probed = tmp_path / f"probed-{html_path.name}"
    probed.write_text(html.replace("<head>", f"<head><script>{PROBE}</script>", 1))
    cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}",
           "--window-size=1400,1000", "--dump-dom", probed.resolve().as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)
    tag = re.search(r"<html[^>]*>", res.stdout)
    assert tag, f"chromium printed no DOM (exit {res.returncode}): {res.stderr[-2000:]}"
    attrs = dict(re.findall(r'(data-[\w-]+)="([^"]*)"', tag.group(0)))
    assert attrs.get("data-done") == "1", f"the probe did not finish: {tag.group(0)}"
    return {k: json.loads(v.replace("&quot;", '"')) if v.startswith(("[", "{")) or v.startswith("&quot;") else v
            for k, v in attrs.items()}


def _figure_count(html: str) -> int:
    return len(re.findall(r'class="plotly-graph-div"', html))


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Both reports built and opened in headless chromium, each chromium started in the background as
    soon as its page is written, so the run report renders while the projection builds and the two
    render at once: {"runs" | "projection": (page, future of _open's attributes)}; result() re-raises
    what _open raised."""
    _browser()
    with ThreadPoolExecutor(max_workers=2) as pool:
        tmp = tmp_path_factory.mktemp("runs")
        sc = tmp / "small.yaml"
        sc.write_text(yaml.safe_dump(small_scenario()))
        runs = tmp / "runs.html"
        build_report([sc], [], None, runs, show_progress=False)
        opened = {"runs": (runs, pool.submit(_open, runs, tmp))}
        tmp = tmp_path_factory.mktemp("projection")
        projection = tmp / "projection.html"
        val = tmp / "val.csv"
        val.write_text(VALIDATION)
        build_report([], [], val, projection, grid_spec=SMALL, workers=1, show_progress=False)
        opened["projection"] = (projection, pool.submit(_open, projection, tmp))
        yield opened


def test_projection_report_renders_without_errors(pages):
    out, opened = pages["projection"]
    expected = _figure_count(out.read_text())
    assert expected == 10  # 5 projection + 2 access strategies + 2 paper + 1 validation
    r = opened.result()
    assert r["data-js-errors"] == []
    assert int(r["data-plots"]) == expected and int(r["data-drawn"]) == expected
    assert r["data-remote"] == []
    # changing each selector updates every figure that depends on it
    assert len(r["data-selectors"]) == 4
    switched = 0
    for entry in r["data-selectors"]:
        dim, counts = entry.split(":")
        if counts == "single":  # a selector with one option cannot change anything
            continue
        changed, total = map(int, counts.split("/"))
        assert total > 0 and changed == total, entry
        switched += 1
    assert switched, r["data-selectors"]  # at least one selector had options to switch between


def test_run_report_renders_without_errors(pages):
    out, opened = pages["runs"]
    r = opened.result()
    assert r["data-js-errors"] == []
    assert int(r["data-plots"]) == int(r["data-drawn"]) == _figure_count(out.read_text()) == 3
    assert r["data-remote"] == []
