"""evaluate(): groups priced by their paths, entries by their slowest group, steps and MFU."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.placement.costmodel import (
    alltoall_ms,
    evaluate,
    hierarchical_allreduce_ms,
    kind_stats,
    nvls_ms,
    p2p_ms,
    ring_allreduce_ms,
    volume_ms,
)
from apps.placement.topology import LEVELS, load_topology, topology_to_spec
from tests.unit.placement.specs import job

# The seed's first mapping: ranks 0-3 on A 0-3, 4-7 on B 0-3, 8-11 on A 4-7, 12-15 on B 4-7.
SEED_MAPPING = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


def test_case_4_4_dp_groups_on_nvlink_cost_2_67_ms_and_split_ones_109_ms(case44, case44_job):
    good = evaluate(case44, case44_job, list(range(16)))
    bad = evaluate(case44, case44_job, SEED_MAPPING)
    assert good.comm_ms == pytest.approx(2.6667, abs=1e-4)
    assert good.step_ms == pytest.approx(102.6667, abs=1e-4)
    assert bad.comm_ms == pytest.approx(109.0909, abs=1e-4)
    assert bad.comm_ms / good.comm_ms == pytest.approx(40.9, abs=0.05)
    assert good.mfu == pytest.approx(2.6e14 / (good.step_ms / 1e3 * 16 * 312e12))


def test_case_4_4_lists_each_dp_group_with_level_and_bottleneck(case44, case44_job):
    good = evaluate(case44, case44_job, list(range(16)))
    assert [(g.group, g.ranks, g.level, g.bottleneck_GBps) for g in good.groups] == [
        ("dp", tuple(range(8)), "nvlink", 450.0),
        ("dp", tuple(range(8, 16)), "nvlink", 450.0),
    ]
    bad = evaluate(case44, case44_job, SEED_MAPPING)
    assert {(g.level, g.bottleneck_GBps) for g in bad.groups} == {("leaf", 11.0)}


def test_an_entry_costs_its_slowest_group_times_count(case44):
    j = job(8, pp=2, comm=[("dp", "volume", 1.2e9, 3)])
    # DP group 0 = ranks 0-3 on node A; group 1 = ranks 4-7, two of them on node B.
    p = evaluate(case44, j, [0, 1, 2, 3, 4, 5, 8, 9])
    assert p.comm_ms == pytest.approx(3 * volume_ms(1.2e9, 11))
    assert [g.time_ms for g in p.groups] == pytest.approx(
        [3 * volume_ms(1.2e9, 450), 3 * volume_ms(1.2e9, 11)]
    )


def test_comm_sums_entries_and_overlap_hides_its_share(case44):
    j = job(8, comm=[("dp", "volume", 1e9), ("dp", "allreduce", 1e8, 2)], compute_ms=50, overlap=0.4)
    p = evaluate(case44, j, list(range(8)))
    entries = [volume_ms(1e9, 450), 2 * ring_allreduce_ms(8, 1e8, 450, 2.0)]
    assert p.entry_ms == pytest.approx(tuple(entries))
    assert p.comm_ms == pytest.approx(sum(entries))
    assert p.step_ms == pytest.approx(50 + 0.6 * sum(entries))
    # Two entries on one kind: the group's time is their sum.
    assert p.groups[0].time_ms == pytest.approx(sum(entries))


def test_allreduce_across_domains_is_hierarchical_over_the_shared_nic(case44):
    j = job(8, comm=[("dp", "allreduce", 1e9)])
    p = evaluate(case44, j, [0, 1, 2, 3, 8, 9, 10, 11])
    assert p.comm_ms == pytest.approx(hierarchical_allreduce_ms(4, 2, 1e9, 450, 2.0, 11, 3.0, rails=1))
    uneven = evaluate(case44, j, [0, 1, 2, 3, 4, 5, 8, 9])
    assert uneven.comm_ms == pytest.approx(hierarchical_allreduce_ms(6, 2, 1e9, 450, 2.0, 11, 3.0, rails=1))


def test_hierarchical_rails_are_the_fewest_nics_of_any_domain(hetero):
    # n4 GPUs 0 and 4 use two NICs (50 and 100 GB/s); n5 GPUs 0, 1 share one 50 GB/s NIC.
    g = [hetero.gid("n4", 0), hetero.gid("n4", 4), hetero.gid("n5", 0), hetero.gid("n5", 1)]
    p = evaluate(hetero, job(4, comm=[("dp", "allreduce", 1e9)]), g)
    # Inter path: NICs 50, uplinks leaf-3 200 and leaf-4 30 -> 30 GB/s; 1.5+1.5 + 2*1.5 us.
    expected = hierarchical_allreduce_ms(2, 2, 1e9, 450, 2.5, 30, 6.0, rails=1)
    assert p.comm_ms == pytest.approx(expected)
    assert p.groups[0].level == "spine" and p.groups[0].bottleneck_GBps == 30.0


def test_allreduce_inside_one_h100_domain_is_the_best_of_ring_and_nvls(pod256):
    # H100 SXM nodes of 8 run NVLS by default: 25 us flat against the ring's 14 x 2 us.
    p = evaluate(pod256, job(8, comm=[("dp", "allreduce", 1e9)]), list(range(8, 16)))
    ring = ring_allreduce_ms(8, 1e9, 450, 2.0)
    assert p.comm_ms == pytest.approx(nvls_ms("allreduce", 8, 1e9, 450, 0.85)) and p.comm_ms < ring
    small = evaluate(pod256, job(8, comm=[("dp", "allreduce", 1e3)]), list(range(8, 16)))
    assert small.comm_ms == pytest.approx(0.025 + 2 * 7 / 8 * 1e3 / 450e6)


def test_allreduce_inside_a_domain_without_nvls_is_a_flat_ring(pod256):
    spec = topology_to_spec(pod256)
    for n in spec["nodes"]:
        n["nvlink"]["nvls"] = False
    topo = load_topology(spec)
    p = evaluate(topo, job(8, comm=[("dp", "allreduce", 1e9)]), list(range(8, 16)))
    assert p.comm_ms == pytest.approx(ring_allreduce_ms(8, 1e9, 450, 2.0))


def test_alltoall_across_nodes_runs_at_one_nics_rate(pod256):
    gids = [pod256.gid(f"node-00{i}", 0) for i in range(1, 9)]
    p = evaluate(pod256, job(8, dp=8, ep=8, comm=[("ep", "alltoall", 5e8)]), gids)
    assert p.comm_ms == pytest.approx(alltoall_ms(8, 5e8, 50, 3.0))
    assert p.groups[0].level == "leaf"


def test_p2p_costs_the_slowest_hop_between_consecutive_stages(case44):
    # Stages 0,1 on node A and 2,3 on node B: one hop crosses the 11 GB/s NIC.
    p = evaluate(case44, job(4, pp=4, comm=[("pp", "p2p", 1e8)]), [0, 1, 8, 9])
    assert p.comm_ms == pytest.approx(p2p_ms(1e8, 11, 3.0))
    inside = evaluate(case44, job(4, pp=4, comm=[("pp", "p2p", 1e8)]), [0, 1, 2, 3])
    assert inside.comm_ms == pytest.approx(p2p_ms(1e8, 450, 2.0))


def test_volume_across_leaves_is_bound_by_a_slow_uplink(pods):
    # pods: NIC 50, leaf->spine 80, spine->core 100 GB/s; node-001 and node-005 sit in different pods.
    gids = [pods.gid("node-001", 0), pods.gid("node-005", 0)]
    assert evaluate(pods, job(2, comm=[("dp", "volume", 1e9)]), gids).comm_ms == pytest.approx(
        volume_ms(1e9, 50)
    )
    gids = [pods.gid("node-001", 0), pods.gid("node-003", 0)]
    p = evaluate(pods, job(2, comm=[("dp", "volume", 1e9)]), gids)
    assert p.groups[0].level == "spine"


def test_single_rank_groups_cost_nothing(case44):
    p = evaluate(case44, job(2, tp=1, comm=[("tp", "allreduce", 1e9), ("pp", "p2p", 1e9)]), [0, 8])
    assert p.comm_ms == 0.0 and p.step_ms == 10.0


def test_a_standalone_gpu_in_a_spanning_group_never_finishes(hetero):
    gids = [hetero.gid("n6", 0), hetero.gid("n5", 0)]
    p = evaluate(hetero, job(2, comm=[("dp", "allreduce", 1e6)], model={"flops_per_step": 1e12}), gids)
    assert p.comm_ms == math.inf and p.mfu == 0.0 and p.groups[0].level == "core"


def test_detail_false_skips_groups_but_keeps_the_times(pod256):
    j = job(64, tp=8, comm=[("dp", "allreduce", 1e9), ("tp", "allreduce", 1e7, 10)])
    gids = np.random.default_rng(3).permutation(256)[:64]
    full, quick = evaluate(pod256, j, gids), evaluate(pod256, j, gids, detail=False)
    assert quick.groups == () and len(full.groups) == 8 + 8
    assert (quick.comm_ms, quick.step_ms, quick.flows) == (full.comm_ms, full.step_ms, full.flows)


def test_mfu_uses_the_placed_gpus_peak(hetero):
    # Two A GPUs (312) and two B GPUs (989): peak 2*312 + 2*989 TFLOPS.
    gids = [hetero.gid("n1", 0), hetero.gid("n1", 1), hetero.gid("n4", 0), hetero.gid("n4", 1)]
    p = evaluate(hetero, job(4, tp=2, pp=2, model={"flops_per_step": 1e15}), gids)
    assert p.mfu == pytest.approx(1e15 / (p.step_ms / 1e3 * (2 * 312 + 2 * 989) * 1e12))


@pytest.mark.parametrize(
    ("gids", "link_load", "message"),
    [
        ([0, 1, 2], None, "has 4 ranks, got 3 GPUs"),
        ([0, 1, 2, 2], None, "more than one rank"),
        ([0, 1, 2, 99], None, "must lie in 0..15"),
        ([0, 1, 2, 3], {"leaf-9": 1}, "link_load: unknown switch 'leaf-9'"),
        ([0, 1, 2, 3], {"leaf-1": -1}, "must be non-negative"),
    ],
)
def test_bad_placement_input_is_rejected_with_a_clear_message(case44, gids, link_load, message):
    with pytest.raises(ValueError, match=message):
        evaluate(case44, job(4, comm=[("dp", "allreduce", 1e6)]), gids, link_load)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_vectorised_group_paths_equal_topology_group_path(hetero, data):
    size = data.draw(st.sampled_from([2, 3, 4, 6]))
    rows = data.draw(st.integers(1, hetero.n_gpus // size))
    perm = data.draw(st.permutations(range(hetero.n_gpus)))
    members = np.asarray(perm[: rows * size], dtype=np.int64).reshape(rows, size)
    st_ = kind_stats(hetero, members)
    for r in range(rows):
        p = hetero.group_path(members[r])
        assert st_.path_bw[r] == pytest.approx(p.bw_GBps)
        assert st_.path_lat[r] == pytest.approx(p.latency_us)
        assert LEVELS[st_.level[r]] == p.level
