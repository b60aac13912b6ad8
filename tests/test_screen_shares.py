"""The screen's tier shares (sim.plan.screen.tier_shares): weighted by step, as a steady-state batch
sees its requests - a long request is in the batch for more steps, and its host share is larger."""

from __future__ import annotations

import numpy as np

from sim.plan.screen import Moments, tier_shares
from sim.serving.tier_counts import TierCounter
from sim.tiering.tiers import T0, T1, T2, TierPolicy


def _moments(prompts, outputs) -> Moments:
    p, n = np.asarray(prompts, float), np.asarray(outputs, float)
    return Moments(p.mean(), n.mean(), float(np.sum(n * (p + n / 2)) / np.sum(n)), 2.0, 0.0,
                   (tuple(prompts), tuple(outputs)))


def test_no_tiering_is_all_hbm():
    assert tier_shares(TierPolicy(kind="full_hbm"), _moments([64, 128], [100, 900])).tolist() == [1.0, 0.0, 0.0]


def test_shares_are_the_tokens_of_every_step_over_all_their_tokens():
    pol = TierPolicy(kind="tiered", hbm_ratio=0.25, evict_ratio=0.1, recent_window=16, sink_tokens=0,
                     protect_prompt=False, retier_interval=8)
    def every_step(prompts, outputs):  # step by step: what a batch holding these requests attends
        counter = TierCounter(pol, np.array(prompts), np.array(outputs))
        total, by_tier = 0.0, np.zeros(3)
        for p, n in zip(prompts, outputs):
            c = counter.attended(p, np.arange(n))
            by_tier += c[:, [T0, T1, T2]].sum(axis=0)
            total += c.sum()
        return by_tier / total

    short = tier_shares(pol, _moments([32, 32], [40, 120]))  # up to SHARE_STEPS: every step
    assert np.allclose(short, every_step([32, 32], [40, 120])) and short[1] > 0 and short.sum() < 1.0  # T3 not attended
    long = tier_shares(pol, _moments([32, 32], [40, 4000]))  # past it: evenly spaced steps stand for the rest
    assert np.allclose(long, every_step([32, 32], [40, 4000]), atol=0.01)


def test_a_spread_of_lengths_puts_more_on_the_host_than_the_mean_request():
    pol = TierPolicy(kind="tiered", hbm_ratio=0.25, evict_ratio=0.0, recent_window=16, sink_tokens=0,
                     protect_prompt=True, retier_interval=8)
    spread = tier_shares(pol, _moments([64, 64, 64, 64], [50, 50, 50, 1050]))  # mean output 300
    mean = tier_shares(pol, _moments([64], [300]))
    assert spread[T1] > 1.2 * mean[T1]
