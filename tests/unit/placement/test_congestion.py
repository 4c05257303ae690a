"""Flows on leaf uplinks: what counts as a flow, proportional shares of offered rates, other jobs'
load, rail alignment; a job's flows are its mean offered rates per leaf (GB/s)."""

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


def _busy(rate, t, compute_ms=10.0):
    # A leaf's mean rate over a step: `rate` GB/s while the entries run (t ms), none during compute.
    return pytest.approx(rate * t / (compute_ms + t))


def test_alltoall_counts_every_member_as_a_flow_and_shares_the_uplinks(thin):
    p = evaluate(thin, job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)]), _two_nodes(thin))
    # 4 flows offer 50 GB/s each (their NICs) to 100 GB/s of uplinks: 25 GB/s each, the uplinks
    # full while the entry runs; 2 NICs + 2 uplinks of latency.
    t = alltoall_spanning_ms(8, 4, 1e9, 25, 5.0)
    assert p.comm_ms == pytest.approx(t)
    assert p.groups[0].bottleneck_GBps == 25.0
    assert p.flows == {"leaf-1": _busy(100, t), "leaf-2": _busy(100, t)}


def test_other_jobs_flows_shrink_the_share_on_the_leaf_they_load(thin):
    j = job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)])
    p = evaluate(thin, j, _two_nodes(thin), {"leaf-1": 100})
    # leaf-1 carries 100 GB/s of other jobs' rates beside 4 x 50 offered: each flow gets
    # 50 x 100 / 300, the smaller share of the two leaves crossed (leaf-2: 50 x 100 / 200).
    t = alltoall_spanning_ms(8, 4, 1e9, 50 / 3, 5.0)
    assert p.comm_ms == pytest.approx(t)
    assert p.flows == {"leaf-1": _busy(200 / 3, t), "leaf-2": _busy(200 / 3, t)}


def test_a_light_job_on_the_leaf_takes_only_its_rate_from_the_share(thin):
    j = job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)])
    light = evaluate(thin, j, _two_nodes(thin), {"leaf-1": 10})
    heavy = evaluate(thin, j, _two_nodes(thin), {"leaf-1": 400})
    # Proportional shares: 50 x 100 / (10 + 200) against 50 x 100 / (400 + 200) per flow.
    assert light.comm_ms == pytest.approx(alltoall_spanning_ms(8, 4, 1e9, 5000 / 210, 5.0))
    assert heavy.comm_ms == pytest.approx(alltoall_spanning_ms(8, 4, 1e9, 5000 / 600, 5.0))


def test_a_share_above_the_path_bottleneck_changes_nothing():
    roomy = load_topology(generated(spines=1, uplink_bw_GBps=1000))
    p = evaluate(roomy, job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)]), _two_nodes(roomy))
    assert p.comm_ms == pytest.approx(alltoall_spanning_ms(8, 4, 1e9, 50, 5.0))


def test_a_hierarchical_allgather_puts_one_flow_per_rail_on_each_leaf(thin):
    p = evaluate(thin, job(8, comm=[("dp", "allgather", 1e9)]), _two_nodes(thin))
    # Between the two nodes over 4 rails (S/4 each, 100/4 = 25 GB/s per ring), then inside each.
    t = allgather_ms(2, 1e9 / 4, 25, 5.0) + allgather_ms(4, 1e9, 450, 2.0)
    assert p.comm_ms == pytest.approx(t)
    assert p.flows == {"leaf-1": _busy(100, t), "leaf-2": _busy(100, t)}


def test_hierarchical_allreduce_puts_one_flow_per_rail_on_each_leaf(thin):
    p = evaluate(thin, job(8, comm=[("dp", "allreduce", 1e9)]), _two_nodes(thin))
    # Four rails per node: 4 rings leave each leaf; 100/4 = 25 GB/s per ring.
    t = hierarchical_allreduce_ms(4, 2, 1e9, 450, 2.0, 25, 5.0, rails=4)
    assert p.comm_ms == pytest.approx(t)
    assert p.flows == {"leaf-1": _busy(100, t), "leaf-2": _busy(100, t)}


def test_p2p_hops_between_leaves_are_one_flow_on_each_end(thin):
    # pp=2: stages (r, r+4) for r in 0..3, stage 0 on node-001 and stage 1 on node-003.
    p = evaluate(thin, job(8, pp=2, comm=[("pp", "p2p", 1e8)]), _two_nodes(thin))
    t = p2p_ms(1e8, 25, 5.0)
    assert p.comm_ms == pytest.approx(t)
    # Each leaf carries the 4 hops' bytes (4 x 1e8) once per step of 10 + t ms.
    assert p.flows == {
        "leaf-1": pytest.approx(4e8 / 1e6 / (10 + t)),
        "leaf-2": pytest.approx(4e8 / 1e6 / (10 + t)),
    }


def test_flows_add_what_every_entry_carries_over_the_step(thin):
    j = job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9), ("dp", "allgather", 1e9, 2)])
    p = evaluate(thin, j, _two_nodes(thin))
    # Both entries fill the uplinks (100 GB/s) while they run, one after the other.
    t = alltoall_spanning_ms(8, 4, 1e9, 25, 5.0) + 2 * (
        allgather_ms(2, 1e9 / 4, 25, 5.0) + allgather_ms(4, 1e9, 450, 2.0)
    )
    assert p.comm_ms == pytest.approx(t)
    assert p.flows == {"leaf-1": _busy(100, t), "leaf-2": _busy(100, t)}


def test_a_job_rates_fed_back_as_load_slow_a_twin_by_its_busy_share(thin):
    j = job(8, dp=8, ep=8, comm=[("ep", "alltoall", 1e9)])
    alone = evaluate(thin, j, _two_nodes(thin))
    twin = evaluate(thin, j, _two_nodes(thin), alone.flows)
    other = alone.flows["leaf-1"]
    assert twin.comm_ms == pytest.approx(alltoall_spanning_ms(8, 4, 1e9, 50 * 100 / (other + 200), 5.0))


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
    # Two spines x 400 GB/s per leaf over 2 rings: no squeeze below the NIC; uplinks add 2 us.
    t = hierarchical_allreduce_ms(2, 2, 1e9, 450, 2.0, 50, 5.0, rails=2)
    assert p.comm_ms == pytest.approx(t)
    # Each leaf: 2 rings at 50 GB/s while the entry runs.
    assert p.flows == {leaf: _busy(100, t) for leaf in ("leaf-1", "leaf-2", "leaf-3", "leaf-4")}
    assert p.groups[0].level == "spine"
