"""The fitted all-reduce's arithmetic (sim/device/collectives.py), by hand."""

import pytest

from sim.device.collectives import nearest_protocols, ring_bytes, two_protocol_allreduce_s


def test_ring_bytes():
    assert ring_bytes(1e6, 2) == 1e6
    assert ring_bytes(1e6, 4) == 1.5e6
    assert ring_bytes(8e6, 8) == 14e6


def test_the_faster_protocol_wins():
    # 1 MB over 4 GPUs: 1.5 MB of ring bytes; 5 us + 15 us = 20 us against 20 us + 3.75 us = 23.75 us
    assert two_protocol_allreduce_s(1e6, 4, 5e-6, 100e9, 20e-6, 400e9) == pytest.approx(20e-6)
    # 16 MB: 5 us + 240 us against 20 us + 60 us
    assert two_protocol_allreduce_s(16e6, 4, 5e-6, 100e9, 20e-6, 400e9) == pytest.approx(80e-6)
    # a tiny message costs the latency floor
    assert two_protocol_allreduce_s(2, 8, 5e-6, 100e9, 20e-6, 400e9) == pytest.approx(5e-6, rel=1e-4)


def test_a_size_not_measured_takes_the_nearest_measured():
    by = ((2, 1.0, 1.0, 1.0, 1.0), (4, 2.0, 1.0, 1.0, 1.0), (8, 3.0, 1.0, 1.0, 1.0))
    assert nearest_protocols(by, 4)[0] == 4
    assert nearest_protocols(by, 16)[0] == 8
    assert nearest_protocols(by, 6)[0] == 8  # log2 6 = 2.58: nearer 8 than 4
    assert nearest_protocols(by, 3)[0] == 4  # log2 3 = 1.58: nearer 4 than 2
