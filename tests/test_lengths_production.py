"""The named output-length distribution from a production reasoning trace (issue #22 item 5):
`reasoning_tokens: {dist: servegen-deepseek-r1}` draws the lengths of ServeGen's DeepSeek-R1 data
(sim/catalog/length_dists.yaml, regenerated from the transcribed figures by scripts/fit_length_dist.py)
for closed batches and served requests, seeded like the other kinds."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.inputs.lengths import LengthDist, draw_lengths, named_dists
from sim.inputs.requests import build_requests
from sim.inputs.scenario import load_scenario

from .conftest import REPO, SCENARIOS, run_cli

NAME = "servegen-deepseek-r1"
EXAMPLE = SCENARIOS / "serving-h200-gpt-oss-120b.yaml"
QUANTILES = {"p10": 0.10, "p25": 0.25, "p50": 0.50, "p75": 0.75, "p90": 0.90, "p95": 0.95, "p99": 0.99}
N = 200_000  # draws: the sample quantile's own spread at p99 is ~1% here


def draws(seed: int = 7, n: int = N, **clip) -> np.ndarray:
    return draw_lengths(SimpleNamespace(reasoning_tokens=LengthDist(dist=NAME, **clip), seed=seed), n)


def test_the_catalog_entry_is_what_the_published_figures_give():
    """The transcribed histograms sum to their stated N and the knots regenerate byte for byte."""
    res = subprocess.run([sys.executable, "scripts/fit_length_dist.py", "--check"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    d = named_dists()[NAME]
    assert d.figures["requests"] == 4345 + 5500  # the two clients' N, as the data files state them
    assert (d.figures["p50"], d.figures["p90"], d.figures["max"]) == (677, 1846.2, 17997)
    assert abs(d.fit_error["mean"]) < 0.01 and d.fit_error["ks"] < 0.01


@pytest.mark.parametrize("figure, p", QUANTILES.items())
def test_draws_reproduce_the_figures_quantiles(figure, p):
    """Within 2% at p10-p99 (rounding to whole tokens and sampling; 0 at the knots themselves)."""
    assert np.quantile(draws(), p) == pytest.approx(named_dists()[NAME].figures[figure], rel=0.02)


def test_draws_reproduce_the_mean_and_stay_within_the_published_bounds():
    x, f = draws(), named_dists()[NAME].figures
    assert x.mean() == pytest.approx(f["mean"], rel=0.01)  # 944.9 tokens
    assert x.min() >= 64 and x.max() <= f["max"] == 17997  # the sample's own min and max bound it
    assert x.dtype == np.int64


def test_the_draws_are_bimodal_as_the_trace():
    """Density per unit of ln(length): two peaks (~260 and ~1,180 tokens) around a trough."""
    x = draws()

    def density(lo, hi):
        return ((x >= lo) & (x < hi)).mean() / np.log(hi / lo)

    short, trough, long = density(200, 350), density(450, 650), density(900, 1500)
    assert trough < 0.85 * short and trough < 0.75 * long, (short, trough, long)


def test_max_and_min_clip_the_draws():
    free, capped = draws(), draws(max=4096, min=128)
    assert capped.max() == 4096 and capped.min() == 128
    assert (capped == 4096).mean() == pytest.approx((free >= 4096).mean(), abs=1e-3)  # the same u, clipped
    assert np.array_equal(capped, np.clip(free, 128, 4096))


def test_the_same_seed_gives_the_same_draws_and_another_seed_others():
    assert np.array_equal(draws(seed=3, n=1000), draws(seed=3, n=1000))
    assert not np.array_equal(draws(seed=3, n=1000), draws(seed=4, n=1000))
    assert np.array_equal(draws(seed=3, n=10), draws(seed=3, n=1000)[:10])  # the first n draws


def test_the_parametric_kinds_draw_as_before():
    """Unchanged rule for lognormal (the goldens pin every kind end to end)."""
    rt = LengthDist(dist="lognormal", mean=300, std=200, min=16)
    got = draw_lengths(SimpleNamespace(reasoning_tokens=rt, seed=5), 50)
    var = np.log1p((200 / 300) ** 2)
    want = np.random.default_rng([5, 1]).lognormal(np.log(300) - var / 2, np.sqrt(var), size=50)
    assert np.array_equal(got, np.clip(np.rint(want), 16, np.inf).astype(np.int64))


def test_a_closed_batch_runs_with_the_named_dist(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", str(SCENARIOS / "cpu-tiny.yaml"), "--out", str(out), "--json",
                  "--set", f"workload.reasoning_tokens={{dist: {NAME}, max: 400}}", "--set", "workload.batch_size=4")
    assert res.returncode == 0, res.stdout + res.stderr
    sc = load_scenario(SCENARIOS / "cpu-tiny.yaml", [f"workload.reasoning_tokens={{dist: {NAME}, max: 400}}",
                                                     "workload.batch_size=4"])
    lengths = draw_lengths(sc.workload, 4)
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text())
    assert resolved["workload"]["reasoning_tokens"] == {"dist": NAME, "min": None, "max": 400, "mean": None, "std": None}
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["generated_tokens"] == int(lengths.sum()), (summary["generated_tokens"], lengths)


def test_the_serving_example_draws_its_requests_from_the_named_dist(tmp_path):
    sc = load_scenario(EXAMPLE)
    assert sc.workload.reasoning_tokens.dist == NAME
    req = build_requests(sc.workload)
    assert len(req) == 600 and np.array_equal(req.output_tokens, draw_lengths(sc.workload, 600))
    assert req.output_tokens.mean() == pytest.approx(945, rel=0.1)  # 600 draws of a 945-token mean
    out = tmp_path / "serve"
    res = run_cli("run", str(EXAMPLE), "--out", str(out), "--set", "workload.arrivals.requests=40")
    assert res.returncode == 0, res.stdout + res.stderr
    table = pd.read_csv(out / "requests.csv").sort_values("id")
    assert table["output_tokens"].tolist() == req.output_tokens[:40].tolist()  # the first 40 of the same draws
    assert table["finish_s"].notna().all()


def test_a_served_prompt_may_take_the_named_dist_on_its_own_stream():
    sc = load_scenario(EXAMPLE, [f"workload.prompt_tokens={{dist: {NAME}, max: 8192}}"])
    req = build_requests(sc.workload)
    assert req.prompt_tokens.max() <= 8192 and not np.array_equal(req.prompt_tokens, req.output_tokens)
    assert np.array_equal(req.output_tokens, build_requests(load_scenario(EXAMPLE).workload).output_tokens)


@pytest.mark.parametrize("value, says", [
    ("{dist: deepseek-r1}", "workload.reasoning_tokens.dist: expected one of uniform, normal, lognormal, "
                            f"{NAME}, got 'deepseek-r1'"),
    (f"{{dist: {NAME}, mean: 900, std: 100}}", f"workload.reasoning_tokens: {NAME} takes no mean or std"),
    (f"{{dist: {NAME}, min: 500, max: 100}}", f"workload.reasoning_tokens: {NAME} needs min <= max"),
])
def test_a_bad_named_dist_is_one_line_naming_the_field(tmp_path, value, says):
    res = run_cli("run", str(SCENARIOS / "cpu-tiny.yaml"), "--out", str(tmp_path / "o"),
                  "--set", f"workload.reasoning_tokens={value}")
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert not (tmp_path / "o").exists()
