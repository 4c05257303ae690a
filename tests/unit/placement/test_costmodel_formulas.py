"""Closed forms of the cost model against hand-computed values (GB = 1e9 bytes, ms, us)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from apps.placement.costmodel import (
    allgather_ms,
    alltoall_ms,
    hierarchical_allreduce_ms,
    mfu,
    p2p_ms,
    reducescatter_ms,
    ring_allreduce_ms,
    step_ms,
    volume_ms,
)


def test_ring_allreduce_is_2_n_minus_1_latencies_plus_2_n_minus_1_over_n_of_s_over_b():
    # 2*7*5 us = 0.07 ms; 2*7/8 * 1e9 B / 100 GB/s = 17.5 ms.
    assert ring_allreduce_ms(8, 1e9, 100, 5) == pytest.approx(0.07 + 17.5)


@pytest.mark.parametrize("form", [allgather_ms, reducescatter_ms, alltoall_ms])
def test_allgather_reducescatter_alltoall_are_n_minus_1_latencies_plus_n_minus_1_over_n(form):
    # 3*2 us = 0.006 ms; 3/4 * 4e8 B / 50 GB/s = 6 ms.
    assert form(4, 4e8, 50, 2) == pytest.approx(6.006)


def test_p2p_is_one_latency_plus_s_over_b():
    assert p2p_ms(1e8, 25, 10) == pytest.approx(0.01 + 4.0)


def test_volume_reproduces_the_seeds_case_4_4_accounting():
    assert volume_ms(1.2e9, 11) == pytest.approx(109.0909, abs=1e-4)
    assert volume_ms(1.2e9, 450) == pytest.approx(2.6667, abs=1e-4)


def test_hierarchical_allreduce_is_intra_scatter_inter_ring_per_rail_intra_gather():
    # RS and AG over 4 at 400 GB/s: 3*1 us + 3/4*1e9/400e9 s = 0.003 + 1.875 ms each.
    # Inter ring over 2 domains with 1e9/4 per rail at 50 GB/s: 2*3 us + 2*1/2*2.5e8/50e9 s.
    expected = 2 * (0.003 + 1.875) + (0.006 + 5.0)
    assert hierarchical_allreduce_ms(4, 2, 1e9, 400, 1, 50, 3) == pytest.approx(expected)
    # One shared NIC per domain carries the whole buffer.
    one_rail = 2 * (0.003 + 1.875) + (0.006 + 20.0)
    assert hierarchical_allreduce_ms(4, 2, 1e9, 400, 1, 50, 3, rails=1) == pytest.approx(one_rail)


def test_hierarchical_with_one_rank_per_domain_is_a_flat_ring():
    assert hierarchical_allreduce_ms(1, 8, 1e9, math.inf, 0, 50, 3) == pytest.approx(
        ring_allreduce_ms(8, 1e9, 50, 3)
    )


def test_a_group_of_one_costs_nothing():
    assert [f(1, 1e9, 10, 5) for f in (ring_allreduce_ms, allgather_ms, alltoall_ms)] == [0.0, 0.0, 0.0]


def test_zero_bandwidth_is_infinitely_slow_and_zero_bytes_cost_only_latency():
    assert volume_ms(1e6, 0.0) == math.inf
    assert ring_allreduce_ms(2, 0, 0.0, 5) == pytest.approx(0.01)


def test_closed_forms_accept_arrays_elementwise():
    n = np.array([1, 2, 8])
    bw = np.array([10.0, 50.0, 100.0])
    out = ring_allreduce_ms(n, 1e9, bw, 5)
    assert out.tolist() == pytest.approx(
        [ring_allreduce_ms(int(a), 1e9, float(b), 5) for a, b in zip(n, bw, strict=False)]
    )


def test_step_time_hides_the_overlapped_share_of_communication():
    assert step_ms(100.0, 0.25, 40.0) == pytest.approx(130.0)


def test_mfu_is_flops_over_step_seconds_times_total_peak():
    # 2.6e14 / (0.10267 s * 16 * 312e12) = 0.5073.
    assert mfu(2.6e14, 102.6667, 16 * 312) == pytest.approx(2.6e14 / (0.1026667 * 16 * 312e12), rel=1e-6)
    assert mfu(None, 100.0, 312) is None
    assert mfu(1e12, math.inf, 312) == 0.0


def test_nvls_costs_25_us_flat_in_the_rank_count_and_the_domain_takes_the_best_algorithm():
    from apps.placement.costmodel import domain_ms, nvls_ms, tree_allreduce_ms

    # NCCL 2.30.7 tuning.cc: NVLS latency 25 us whatever n; allreduce at the NVLink rate.
    for n in (4, 8, 32, 72):
        assert nvls_ms("allreduce", n, 0, 900, 0.74) == pytest.approx(0.025)
    assert nvls_ms("allreduce", 8, 1e9, 450, 0.85) == pytest.approx(0.025 + 2 * 7 / 8 * 1e9 / 450e6)
    # Allgather at bus rate B x e x (n-1)/n; no NVLS (e = 0): never chosen.
    assert nvls_ms("allgather", 8, 1e9, 450, 0.85) == pytest.approx(0.025 + 1e9 / (450e6 * 0.85 * 7 / 8))
    assert math.isinf(nvls_ms("allreduce", 8, 1e6, 450, 0.0))
    # A 32-rank allreduce of 1 MB in a 900 GB/s rack: ring 62 x 2 us, NVLS 25 us.
    ring = ring_allreduce_ms(32, 1e6, 900, 2.0)
    assert domain_ms("allreduce", 32, 1e6, 900, 2.0, 0.74) == pytest.approx(
        nvls_ms("allreduce", 32, 1e6, 900, 0.74)
    )
    assert domain_ms("allreduce", 32, 1e6, 900, 2.0, 0.0) == pytest.approx(ring)
    # Small rings beat NVLS on latency (4 ranks: 6 x 2 us); the tree never beats the ring in a domain.
    assert domain_ms("allreduce", 4, 1e3, 450, 2.0, 0.85) == pytest.approx(
        ring_allreduce_ms(4, 1e3, 450, 2.0)
    )
    for n, s, b, a in itertools.product((2, 8, 72), (0, 1e3, 1e9), (50, 900), (0.5, 3)):
        assert tree_allreduce_ms(n, s, b, a) >= ring_allreduce_ms(n, s, b, a)
    # Alltoall has no NVLS form; arrays price element by element.
    assert domain_ms("alltoall", 8, 1e6, 450, 2.0, 0.85) == pytest.approx(alltoall_ms(8, 1e6, 450, 2.0))
    both = domain_ms("allreduce", 32, 1e6, 900, 2.0, np.array([0.0, 0.74]))
    assert both.tolist() == pytest.approx([ring, nvls_ms("allreduce", 32, 1e6, 900, 0.74)])
