"""Link utilisation is a share of decode time: 0 <= busy share <= 1 in every direction, at every
level of detail and in the projection, including runs where the host link binds (a direction busy
>= 90%) and where re-tier offloads overlap prefetches (docs/invariants.md)."""

from __future__ import annotations

import pytest

from sim.decode.projection import project
from sim.decode.simulate import simulate
from sim.inputs.scenario import load_scenario

from .conftest import SCENARIOS

# (scenario, overrides): the link binds (7B batch 32), int4 70B, the paper's prototype (sync copies),
# and a short run with both directions busy at once (re-tier every 8 steps, 25% in HBM)
CASES = [
    ("h200-7b-batch.yaml", ["workload.reasoning_tokens=512"]),
    ("h200-70b-int4.yaml", ["workload.reasoning_tokens=512"]),
    ("paper-rtx5080-7b.yaml", ["workload.reasoning_tokens=512"]),
    ("h200-7b-batch.yaml", ["workload.reasoning_tokens=512", "policy.hbm_ratio=0.25", "policy.retier_interval=8"]),
]


@pytest.mark.parametrize("detail", ["layer", "step", "fast"])
@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}{'+' if o[1:] else ''}" for n, o in CASES])
def test_link_utilisation_is_a_share_of_decode_time(name, overrides, detail):
    s = simulate(load_scenario(SCENARIOS / name, [*overrides, f"sim.detail={detail}"])).summary
    for u in (s.h2d_utilization, s.d2h_utilization):
        assert 0.0 <= u <= 1.0


def test_a_binding_link_is_busy_most_of_decode_but_never_more_than_all_of_it():
    s = simulate(load_scenario(SCENARIOS / "h200-7b-batch.yaml", ["sim.detail=fast"])).summary
    assert 0.9 <= s.h2d_utilization <= 1.0  # this case is link-bound: the bound is reached, not exceeded


@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}{'+' if o[1:] else ''}" for n, o in CASES])
def test_projection_utilisation_is_a_share_too(name, overrides):
    p = project(load_scenario(SCENARIOS / name, overrides), with_max_batch=False)
    for u in (p.h2d_utilization, p.d2h_utilization):
        assert 0.0 <= u <= 1.0
