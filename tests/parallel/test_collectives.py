"""Ring collectives priced from an interconnect: the formulas of ``planner.parallel.collectives``."""

from __future__ import annotations

import pytest

from torchfl.hcd.model import Interconnect
from torchfl.planner.parallel import all_gather_s, all_reduce_s, p2p_s

IC = Interconnect.model_validate({"fabric": "nvswitch", "links": {"count": 12, "bandwidth_gb_per_s": 25},
                                  "domain_chips": 8, "sustained_fraction": 0.5, "latency_us": 1.0,
                                  "collective_overhead_us": 4.0})
BUS = 12 * 25e9 * 0.5


def test_all_reduce_is_overhead_plus_steps_plus_the_ring_share_of_the_bytes():
    n = 1 << 30
    assert all_reduce_s(n, 8, IC) == pytest.approx(4e-6 + 14 * 1e-6 + 2 * 7 / 8 * n / BUS)
    assert all_reduce_s(n, 2, IC) == pytest.approx(4e-6 + 2 * 1e-6 + n / BUS)


def test_one_chip_or_no_bytes_costs_nothing():
    assert all_reduce_s(1 << 20, 1, IC) == 0.0 and all_gather_s(1 << 20, 1, IC) == 0.0
    assert all_reduce_s(0, 8, IC) == 0.0 and p2p_s(0, IC) == 0.0


def test_a_small_all_reduce_is_latency_bound_a_large_one_bandwidth_bound():
    small, large = 16 << 10, 1 << 30
    assert (4e-6 + 14e-6) / all_reduce_s(small, 8, IC) > 0.9
    assert (2 * 7 / 8 * large / BUS) / all_reduce_s(large, 8, IC) > 0.99


def test_all_gather_moves_half_the_ring_bytes_of_an_all_reduce():
    n = 1 << 30
    ar, ag = all_reduce_s(n, 8, IC), all_gather_s(n, 8, IC)
    assert ag == pytest.approx(4e-6 + 7e-6 + 7 / 8 * n / BUS)
    assert ag < ar


def test_a_point_to_point_send_through_a_switch_uses_every_link():
    assert p2p_s(1 << 30, IC) == pytest.approx(4e-6 + 1e-6 + (1 << 30) / BUS)
    mesh = IC.model_copy(update={"fabric": "xgmi"})
    assert p2p_s(1 << 30, mesh) == pytest.approx(4e-6 + 1e-6 + (1 << 30) / (25e9 * 0.5))


def test_absent_latencies_and_share_price_the_line_rate_only():
    bare = Interconnect.model_validate({"fabric": "pcie", "links": {"count": 1, "bandwidth_gb_per_s": 32},
                                        "domain_chips": 4})
    assert all_reduce_s(1 << 30, 4, bare) == pytest.approx(1.5 * (1 << 30) / 32e9)
