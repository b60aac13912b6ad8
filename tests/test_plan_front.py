"""The Pareto front per GPU count (issue #21): which points beat which (exact before lossy), the
screen's front, and the pruning rule the front search applies (sim.plan.front)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sim.plan.answer import pareto
from sim.plan.front import FRONT_MARGIN, NEAR_TIE, USER_MARGIN, Point, beaten_by, estimate, measured, screen_front


def test_a_point_beats_another_only_on_both_axes_and_as_exact():
    a, b = Point(10.0, 50.0), Point(8.0, 40.0)
    assert a.beats(b) and not b.beats(a)
    assert not Point(10.0, 30.0).beats(b)  # faster per GPU, slower per user: both on the front
    assert not a.beats(a) and not a.beats(Point(10.0, 50.0))  # the same point beats nothing
    assert not Point(10.0, 50.0, exact=False).beats(b)  # a lossy policy never beats an exact one
    assert a.beats(Point(8.0, 40.0, exact=False))
    assert a.beats(b, margin=1.25) and not a.beats(b, margin=1.26)  # 10 / 8 = 1.25


def test_screen_front_keeps_the_points_nothing_beats_in_order_and_one_of_points_it_cannot_tell_apart():
    pts = {"slow": Point(5.0, 20.0), "fast_user": Point(6.0, 90.0), "wide": Point(12.0, 30.0),
           "twin": Point(12.0, 30.0), "near": Point(12.1, 29.9), "beaten": Point(11.0, 29.0),
           "lossy": Point(20.0, 100.0, exact=False), "lossy_twin": Point(20.1, 99.9, exact=False)}
    # twin and near (within 1% on both axes) tie with wide; lossy beats nothing exact and nothing beats it
    assert screen_front(pts) == ["fast_user", "wide", "lossy"]
    # a lossy point does not stand for an exact one the screen cannot tell from it: both go
    assert screen_front({"lossy": Point(12.0, 30.0, exact=False), "exact": Point(11.95, 30.1)}) == ["lossy", "exact"]


def test_screen_front_takes_rates_past_the_cap_at_the_cap():
    pts = {"wide": Point(350.0, 250.0), "fast_user": Point(160.0, 340.0), "slow": Point(60.0, 400.0)}
    assert screen_front(pts) == ["wide", "fast_user", "slow"]
    # no max rate exceeds the cap (80): past it the faster one per user beats the wider one
    assert screen_front(pts, 80.0) == ["fast_user", "slow"]


def test_a_point_stands_for_another_within_one_percent_on_both_axes_and_as_exact():
    a = Point(100.0, 50.0)
    assert NEAR_TIE == 0.01
    assert a.stands_for(Point(101.0, 50.5)) and a.stands_for(Point(99.01, 49.51)) and a.stands_for(a)
    assert not a.stands_for(Point(102.0, 50.0)) and not a.stands_for(Point(100.0, 48.0))
    assert a.stands_for(Point(100.0, 50.0, exact=False))  # an exact one stands for a lossy one
    assert not Point(100.0, 50.0, exact=False).stands_for(a)  # ... not the other way


def test_beaten_by_needs_each_axis_margin_up_to_the_cap():
    q = Point(12.5, 111.0)
    sim = [("q", q, Point(14.0, 120.0))]
    assert (FRONT_MARGIN, USER_MARGIN) == (1.25, 1.10)
    assert beaten_by(Point(10.0, 100.0), sim, 40.0) == ("beaten", "q", q)  # 1.25 x in rate, 1.1 x per user
    assert beaten_by(Point(10.0, 101.0), sim, 40.0) is None  # 111 / 101 < 1.1
    assert beaten_by(Point(10.1, 100.0), sim, 40.0) is None
    assert beaten_by(Point(10.1, 100.0), sim, 12.5) == ("beaten", "q", q)  # no max rate goes past the search's cap
    assert beaten_by(Point(10.0, 100.0, exact=False), [("q", Point(12.5, 111.0, False), q)], 40.0)[0] == "beaten"
    assert beaten_by(Point(10.0, 100.0), [("q", Point(12.5, 111.0, False), q)], 40.0) is None  # lossy: not over exact
    assert beaten_by(Point(14.0, 120.0), sim, 40.0) == ("ties", "q", q)  # the same screen estimate as q's
    assert beaten_by(Point(13.9, 121.0), sim, 40.0) == ("ties", "q", q)  # within 1%: the screen cannot tell them apart
    assert beaten_by(Point(13.5, 120.0), sim, 40.0) is None


def test_estimate_reads_the_p99_tpot_at_the_rate_and_the_batch_one_step_past_the_curve():
    cv = SimpleNamespace(tpot_p99_at=lambda r: 0.025 if r <= 4 else None, step_s=(0.01, 0.02))
    assert estimate(cv, 9.0, 8.0, 2, True) == Point(9.0, 40.0)  # 8 req/s over 2 replicas: 4 each, a 25 ms p99
    assert estimate(cv, 9.0, 16.0, 2, False) == Point(9.0, 100.0, False)  # past it: the batch-1 step bounds it


def test_the_curves_p99_tpot_at_a_rate_interpolates_as_its_mean_step_does():
    from sim.plan.screen import Curve

    cv = Curve(batch=(1.0, 10.0, 20.0), rate_per_s=(1.0, 5.0, 9.0), step_s=(0.01, 0.02, 0.04),
               tpot_p99_s=(0.02, 0.03, 0.05), ttft_s=(0.1, 0.2, 0.3), output_tokens=100.0, cap="x",
               hbm_batch=20.0, step_binds=("compute",) * 3)
    assert cv.tpot_p99_at(0.5) == 0.02 and cv.tpot_p99_at(9.5) is None
    assert cv.tpot_p99_at(7.0) == pytest.approx(0.04) and cv.at(7.0)[1] == pytest.approx(0.03)  # half way from 5 to 9
    assert cv.at(3.0) == pytest.approx((0.15, 0.015, 0.15 + 100 * 0.015))


def test_measured_is_a_passing_row_only():
    assert measured({"status": "pass", "max_rate_per_s": 3.0, "tpot_p99_ms": 25.0}, True) == Point(3.0, 40.0)
    assert measured({"status": "fail", "max_rate_per_s": None, "tpot_p99_ms": 25.0}, True) is None
    assert measured({"status": "pass", "max_rate_per_s": 3.0, "tpot_p99_ms": None}, True) is None


def _row(gpus, layout, policy, output, rate, tpot_ms, status="pass"):
    return dict(gpu="h100-sxm", gpus=gpus, layout=layout, policy=policy, output=output, status=status,
                max_rate_per_s=rate, tpot_p99_ms=tpot_ms)


def test_pareto_per_count_keeps_exact_rows_a_lossy_one_would_beat():
    rows = [_row(2, "TP2", "full_hbm", "exact", 10.0, 20.0), _row(2, "TP2", "evict_only", "lossy", 10.0, 19.0),
            _row(2, "TP1 x 2", "full_hbm", "exact", 12.0, 25.0), _row(2, "TP1 x 2", "tiered", "exact", 11.0, 26.0),
            _row(1, "TP1", "full_hbm", "exact", 5.0, 30.0), _row(1, "TP1", "tiered", "exact", 9.0, 30.0, "fail")]
    front = pareto(rows, mean_output_tokens=100.0)
    assert list(front) == [1, 2]
    assert [(p["layout"], p["policy"]) for p in front[2]] == [("TP1 x 2", "full_hbm"), ("TP2", "full_hbm"),
                                                             ("TP2", "evict_only")]
    assert front[2][0]["tokens_per_s_per_gpu"] == 12.0 * 100.0 / 2 and front[2][0]["tokens_per_s_per_user"] == 40.0
    assert [p["policy"] for p in front[1]] == ["full_hbm"]  # a failing row is on no front


def _ranked(gpus, policy, output, rank, status="pass", usd=10.0):
    return dict(gpu="b200", gpus=gpus, layout=f"TP{gpus}", policy=policy, output=output, status=status, rank=rank,
                max_rate_per_s=5.0 * gpus, max_rate_capped=False, usd_per_hour=usd * gpus)


def test_fewest_gpus_is_the_smallest_count_with_an_exact_pass_and_says_when_a_smaller_one_went_unsimulated():
    from sim.plan.answer import fewest_sentence

    rows = [_ranked(4, "full_hbm", "exact", 1), _ranked(2, "full_hbm", "exact", 3, usd=20.0),
            _ranked(2, "tiered:auto", "exact", 2, usd=20.0), _ranked(1, "evict_only", "lossy", 4),
            _ranked(1, "full_hbm", "exact", None, status="fail")]
    said = fewest_sentence(rows, 8.0, whole=True)
    assert said == "Fewest GPUs for 8 req/s: 2 x B200 as TP2, tiered:auto (exact); sustains 10 req/s; $40.00/h."
    rows.append(_ranked(1, "tiered:0.5", "exact", None, status="unsearched"))
    assert fewest_sentence(rows, 8.0, whole=True) == said  # every count's front searched: nothing was left
    assert fewest_sentence(rows, 8.0, whole=False).endswith(
        " - of those simulated: 1 configuration of fewer GPUs was not (cheaper ones passed; --pareto searches every count).")
    assert fewest_sentence([_ranked(1, "evict_only", "lossy", 1)], 8.0, whole=True) is None  # nothing exact passes
