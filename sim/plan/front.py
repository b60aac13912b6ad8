"""Which candidates may lie on a GPU count's Pareto front, before they are simulated.

The front (`sim.plan.answer.pareto`) is per GPU count: output tokens/s per GPU at the max rate
against tokens/s per user (1 / p99 TPOT at the rate asked). Within one count tokens/s per GPU is the
max rate times a constant, so a candidate is a point (max rate, tokens/s per user). Before its
simulation the screen gives an estimate of both: its max rate, and its p99 TPOT at the rate asked.

A candidate not yet simulated is off the front when a simulated, passing one of its count, as exact as
it, beats its estimates by FRONT_MARGIN in max rate and USER_MARGIN in tokens/s per user, each over
the screen's largest measured error in the direction that matters (benchmarks/plan_speed.py): its
estimate of a max rate has been measured at 0.86-1.21 of the simulated one, its p99 TPOT at
0.65-1.03 (it never overstates a p99 TPOT by more than 3%; tiered policies with fixed ratios it
understates, which overstates their users' speed and keeps them in), so a candidate the screen
underestimates most still cannot reach a point those margins above its estimate (nor a max rate
above the search's cap, max_factor x the rate). A candidate whose screen estimate is within NEAR_TIE
of a simulated pass's on both axes ties with it, and the one simulated, as exact as it, stands for
both: prefill/decode splits whose decode pool binds give the same estimate, and policies the screen
barely tells apart (full_hbm, tiered:auto and evict_only where HBM holds the batch) estimates
within a few tenths of a percent - far inside the tolerance (10%) to which the search knows any
simulated max rate, so simulating both would not tell them apart either.
The rest are simulated in rounds, each round the ones no other remaining candidate beats on its
estimates, rates past the search's cap taken at the cap (`screen_front`), until every candidate is
simulated, beaten or tied (`sim.plan.search`).
"""

from __future__ import annotations

from dataclasses import dataclass

FRONT_MARGIN = 1.25  # over 1 / 0.86, the screen's largest measured underestimate of a max rate
USER_MARGIN = 1.10  # over 1.03, its largest measured overstatement of a p99 TPOT
NEAR_TIE = 0.01  # screen estimates this close (relative, on both axes) tie
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

    def stands_for(self, other: Point) -> bool:
        """Within NEAR_TIE of the other on both axes and as exact as it: the screen cannot tell them apart."""
        return (abs(self.rate_per_s - other.rate_per_s) <= NEAR_TIE * other.rate_per_s and (self.exact or not other.exact)
                and abs(self.tokens_per_s_per_user - other.tokens_per_s_per_user) <= NEAR_TIE * other.tokens_per_s_per_user)


def estimate(curve, est_rate_per_s: float, rate_per_s: float, replicas: int, exact: bool) -> Point:
    """The screen's point for a candidate: its estimated max rate, and 1 / its p99 TPOT estimate at
    the rate asked (where the curve does not reach the rate, 1 / its mean step at batch 1: a p99 TPOT
    is never below the mean step, so that bounds the user's speed from above)."""
    tpot_s = curve.tpot_p99_at(rate_per_s / replicas)
    tpot_s = curve.step_s[0] if tpot_s is None else tpot_s
    return Point(est_rate_per_s, 1.0 / tpot_s if tpot_s > 0 else float("inf"), exact)


def measured(row: dict, exact: bool) -> Point | None:
    """A simulated row's point, None unless it passed with a p99 TPOT."""
    if row["status"] != "pass" or not row.get("tpot_p99_ms"):
        return None
    return Point(row["max_rate_per_s"], 1e3 / row["tpot_p99_ms"], exact)


def beaten_by(est: Point, simulated: list[tuple[object, Point, Point]], cap_rate_per_s: float,
              margin: float = FRONT_MARGIN, user_margin: float = USER_MARGIN):
    """Why a candidate of screen estimate `est` is off the front, from its count's simulated passes
    [(label, simulated point, their screen estimate)]: ("beaten", label, point) for the first whose
    simulated point is at least `margin` x `est` in rate (at most the search's cap: no row's max rate
    exceeds it) and `user_margin` x in tokens/s per user, ("ties", label, point) for the first the
    screen cannot tell from it (its estimate `stands_for` this one), else None."""
    bound = Point(min(margin * est.rate_per_s, cap_rate_per_s), user_margin * est.tokens_per_s_per_user, est.exact)
    for label, p, _ in simulated:
        if p.rate_per_s >= bound.rate_per_s and p.tokens_per_s_per_user >= bound.tokens_per_s_per_user \
                and (p.exact or not est.exact):
            return "beaten", label, p
    return next((("ties", label, p) for label, p, e in simulated if e is not None and e.stands_for(est)), None)


def screen_front(points: dict, cap_rate_per_s: float = float("inf")) -> list:
    """The keys of `points` ({key: Point}) no other point beats, in the dict's order, each rate taken
    at most `cap_rate_per_s` (no simulated max rate exceeds the search's cap, so estimates past it
    are alike); of points the screen cannot tell apart, the first only (the rest tie with it once it
    is simulated: `beaten_by`; if it fails, a later round takes them)."""
    at = {k: Point(min(p.rate_per_s, cap_rate_per_s), p.tokens_per_s_per_user, p.exact) for k, p in points.items()}
    front = []
    for k, p in at.items():
        if not any(q.beats(p) for j, q in at.items() if j != k) and not any(at[j].stands_for(p) for j in front):
            front.append(k)
    return front
