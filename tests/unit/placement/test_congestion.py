"""Flows on leaf uplinks: what counts as a flow, fair shares, other jobs' load, rail alignment."""

from __future__ import annotations

import pytest

from apps.placement.costmodel import (
    allgather_ms,
    alltoall_spanning_ms,
    evaluate,
    hierarchical_allreduce_ms,
    p2p_ms,
)
from apps.placement.topology import load_topology
from tests.unit.placement.specs import generated, job


@pytest.fixture(scope="module")
def thin():
    """2 leaves x 2 nodes x 4 GPUs, a 50 GB/s NIC per GPU, each leaf's uplinks total 100 GB/s."""
    return load_topology(generated(spines=1, uplink_bw_GBps=100))


def _two_nodes(topo):
    # node-001 under leaf-1 and node-003 under leaf-2, four GPUs each.
    return [topo.gid("node-001", i) for i in range(4)] + [topo.gid("node-003", i) for i in range(4)]


def test_alltoall_counts_every_member_as_a_flow_and_shares_the_uplinks(thin):
    p = evaluate(thin, job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)]), _two_nodes(thin))
    assert p.flows == {"leaf-1": 4.0, "leaf-2": 4.0}
    # 100 GB/s over 4 flows = 25 GB/s each, below the 50 GB/s NIC; 2 NICs + 2 uplinks of latency.
    assert p.comm_ms == pytest.approx(alltoall_spanning_ms(8, 4, 1e9, 25, 5.0))
    assert p.groups[0].bottleneck_GBps == 25.0


def test_other_jobs_flows_shrink_the_share_on_the_leaf_they_load(thin):
    j = job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)])
    p = evaluate(thin, j, _two_nodes(thin), {"leaf-1": 4})
    # leaf-1: 100 / (4 + 4) = 12.5 GB/s is the smaller share of the two leaves crossed.
    assert p.comm_ms == pytest.approx(alltoall_spanning_ms(8, 4, 1e9, 12.5, 5.0))
    assert p.flows == {"leaf-1": 4.0, "leaf-2": 4.0}


def test_a_share_above_the_path_bottleneck_changes_nothing():
    roomy = load_topology(generated(spines=1, uplink_bw_GBps=1000))
    p = evaluate(roomy, job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)]), _two_nodes(roomy))
    assert p.comm_ms == pytest.approx(alltoall_spanning_ms(8, 4, 1e9, 50, 5.0))


def test_a_hierarchical_allgather_puts_one_flow_per_rail_on_each_leaf(thin):
    p = evaluate(thin, job(8, comm=[("dp", "allgather", 1e9)]), _two_nodes(thin))
    assert p.flows == {"leaf-1": 4.0, "leaf-2": 4.0}
    # Between the two nodes over 4 rails (S/4 each, 100/4 = 25 GB/s per ring), then inside each.
    assert p.comm_ms == pytest.approx(allgather_ms(2, 1e9 / 4, 25, 5.0) + allgather_ms(4, 1e9, 450, 2.0))


def test_hierarchical_allreduce_puts_one_flow_per_rail_on_each_leaf(thin):
    p = evaluate(thin, job(8, comm=[("dp", "allreduce", 1e9)]), _two_nodes(thin))
    # Four rails per node: 4 rings leave each leaf; 100/4 = 25 GB/s per ring.
    assert p.flows == {"leaf-1": 4.0, "leaf-2": 4.0}
    assert p.comm_ms == pytest.approx(hierarchical_allreduce_ms(4, 2, 1e9, 450, 2.0, 25, 5.0, rails=4))


def test_p2p_hops_between_leaves_are_one_flow_on_each_end(thin):
    # pp=2: stages (r, r+4) for r in 0..3, stage 0 on node-001 and stage 1 on node-003.
    p = evaluate(thin, job(8, pp=2, comm=[("pp", "p2p", 1e8)]), _two_nodes(thin))
    assert p.flows == {"leaf-1": 4.0, "leaf-2": 4.0}
    assert p.comm_ms == pytest.approx(p2p_ms(1e8, 25, 5.0))


def test_flows_are_the_maximum_over_entries_not_their_sum(thin):
    j = job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9), ("dp", "allgather", 1e9)])
    assert evaluate(thin, j, _two_nodes(thin)).flows == {"leaf-1": 4.0, "leaf-2": 4.0}


def test_traffic_under_one_leaf_makes_no_flows(thin):
    gids = [thin.gid("node-001", i) for i in range(4)] + [thin.gid("node-002", i) for i in range(4)]
    p = evaluate(thin, job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)]), gids, {"leaf-1": 100})
    assert p.flows == {}
    assert p.comm_ms == pytest.approx(alltoall_spanning_ms(8, 4, 1e9, 50, 3.0))


def test_rail_aligned_allreduce_stays_under_the_rail_leaves(rail):
    # node-001 and node-002 form one unit; GPUs 0 and 1 use rails (leaves) 1 and 2 on both nodes.
    aligned = [
        rail.gid("node-001", 0),
        rail.gid("node-001", 1),
        rail.gid("node-002", 0),
        rail.gid("node-002", 1),
    ]
    p = evaluate(rail, job(4, comm=[("dp", "allreduce", 1e9)]), aligned)
    assert p.flows == {}
    assert p.comm_ms == pytest.approx(hierarchical_allreduce_ms(2, 2, 1e9, 450, 2.0, 50, 3.0, rails=2))


def test_misaligned_rails_cross_the_spines_and_make_flows(rail):
    crossed = [
        rail.gid("node-001", 0),
        rail.gid("node-001", 1),
        rail.gid("node-002", 2),
        rail.gid("node-002", 3),
    ]
    p = evaluate(rail, job(4, comm=[("dp", "allreduce", 1e9)]), crossed)
    assert p.flows == {"leaf-1": 2.0, "leaf-2": 2.0, "leaf-3": 2.0, "leaf-4": 2.0}
    # Two spines x 400 GB/s per leaf over 2 rings: no squeeze below the NIC; uplinks add 2 us.
    assert p.comm_ms == pytest.approx(hierarchical_allreduce_ms(2, 2, 1e9, 450, 2.0, 50, 5.0, rails=2))
    assert p.groups[0].level == "spine"
