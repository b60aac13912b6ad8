"""Which candidates may lie on a GPU count's Pareto front, before they are simulated.

The front (`sim.plan.answer.pareto`) is per GPU count: output tokens/s per GPU at the max rate
against tokens/s per user (1 / p99 TPOT at the rate asked). Within one count tokens/s per GPU is the
max rate times a constant, so a candidate is a point (max rate, tokens/s per user). Before its
simulation the screen gives an estimate of both: its max rate, and its mean step at the rate asked
(a p99 TPOT is never below the mean step, so 1 / that step bounds the user's speed from above).

A candidate not yet simulated is off the front when a simulated, passing one of its count, as exact as
it, beats its estimates on both axes by FRONT_MARGIN: the screen's estimate of a max rate has been measured at
0.87-1.21 of the simulated one (benchmarks/plan_speed.py), so a candidate whose rate the screen
underestimates most still cannot reach a point FRONT_MARGIN above its estimate (nor a max rate above
the search's cap, max_factor x the rate). A candidate whose screen estimate equals a simulated one's
(prefill/decode splits whose decode pool binds, say) ties with it: the one simulated stands for both.
The rest are simulated in rounds, each round the ones no other remaining candidate beats on its
estimates (`screen_front`), until every candidate is simulated, beaten or tied (`sim.plan.search`).
"""

from __future__ import annotations

from dataclasses import dataclass

FRONT_MARGIN = 1.25  # over 1 / 0.87, the screen's largest measured underestimate of a max rate
OFF_FRONT = "for the Pareto front"  # in the reason of a candidate the front search did not simulate


@dataclass(frozen=True)
class Point:
    """A candidate's place for the front: its max rate (req/s) and tokens/s per user at the rate asked."""

    rate_per_s: float
    tokens_per_s_per_user: float
    exact: bool = True  # the policy keeps every token (a lossy one never beats an exact one)

    def beats(self, other: Point, margin: float = 1.0) -> bool:
        """At least `margin` x the other on both axes, as exact as it, and not the same point."""
        return (self.rate_per_s >= margin * other.rate_per_s and (self.exact or not other.exact)
                and self.tokens_per_s_per_user >= margin * other.tokens_per_s_per_user and self != other)


def estimate(curve, est_rate_per_s: float, rate_per_s: float, replicas: int, exact: bool) -> Point:
    """The screen's point for a candidate: its estimated max rate, and 1 / its mean step at the rate
    asked (the step at batch 1 where the curve does not reach the rate: still an upper bound)."""
    at = curve.at(rate_per_s / replicas)
    step_s = at[1] if at is not None else curve.step_s[0]
    return Point(est_rate_per_s, 1.0 / step_s if step_s > 0 else float("inf"), exact)


def measured(row: dict, exact: bool) -> Point | None:
    """A simulated row's point, None unless it passed with a p99 TPOT."""
    if row["status"] != "pass" or not row.get("tpot_p99_ms"):
        return None
    return Point(row["max_rate_per_s"], 1e3 / row["tpot_p99_ms"], exact)


def beaten_by(est: Point, simulated: list[tuple[object, Point, Point]], cap_rate_per_s: float,
              margin: float = FRONT_MARGIN):
    """Why a candidate of screen estimate `est` is off the front, from its count's simulated passes
    [(label, simulated point, their screen estimate)]: ("beaten", label, point) for the first whose
    simulated point is at least `margin` x `est` on both axes (the rate at most the search's cap:
    no row's max rate exceeds it), ("ties", label, point) for the first the screen cannot tell from it
    (the same estimate, as exact), else None."""
    bound = Point(min(margin * est.rate_per_s, cap_rate_per_s), margin * est.tokens_per_s_per_user, est.exact)
    for label, p, _ in simulated:
        if p.rate_per_s >= bound.rate_per_s and p.tokens_per_s_per_user >= bound.tokens_per_s_per_user \
                and (p.exact or not est.exact):
            return "beaten", label, p
    return next((("ties", label, p) for label, p, e in simulated if e == est), None)


def screen_front(points: dict) -> list:
    """The keys of `points` ({key: Point}) no other point beats, in the dict's order; of points the
    screen gives the same estimate, the first only (the rest tie with it: `beaten_by`)."""
    seen, front = set(), []
    for k, p in points.items():
        if p not in seen and not any(q.beats(p) for j, q in points.items() if j != k):
            front.append(k)
        seen.add(p)
    return front
