"""Context parallelism: cp groups in Megatron order, ring attention priced as a closed ring of p2p
sends, cp nested inside the node right after tp, and the bound below every placement."""

from __future__ import annotations

import numpy as np
import pytest

from apps.placement.bounds import lower_bound
from apps.placement.costmodel import evaluate
from apps.placement.groups import rank_coordinates, rank_groups
from apps.placement.solvers import Placement, place
from tests.unit.placement.specs import job
from tests.unit.placement.test_adversarial_cases import cluster as adversarial_cluster
from tests.unit.placement.test_adversarial_cases import node as adversarial_node
from tests.unit.placement.test_link_aware import cluster, node


def ring(nbytes: float, count: int = 1):
    return [("cp", "p2p", nbytes, count)]


def test_cp_groups_follow_megatron_order_tp_then_cp():
    j = job(16, tp=2, cp=2, pp=2, dp=2)
    groups = rank_groups(j)
    assert j.rank_order == "tp-cp-ep-dp-pp"
    assert groups["tp"][:2] == [(0, 1), (2, 3)]
    assert groups["cp"][:3] == [(0, 2), (1, 3), (4, 6)]
    # DP groups keep one context slice; PP strides over tp*cp*dp ranks.
    assert groups["dp"][0] == (0, 4)
    assert groups["pp"][0] == (0, 8)
    assert rank_coordinates(j, 6) == {"tp": 0, "pp": 0, "ep": 0, "dp": 1, "dp_index": 1, "cp": 1}


def test_a_ring_inside_one_nvlink_domain_takes_n_minus_one_sends():
    topo = cluster([node("a", 8), node("b", 8)])
    j = job(4, cp=4, comm=ring(1e8, count=3))
    got = evaluate(topo, j, np.arange(4)).comm_ms
    # 3 steps of (2 us + 1e8 B at 450 GB/s), three passes per step.
    assert got == pytest.approx(3 * 3 * (2e-3 + 1e8 / 450e6))


def test_a_ring_across_nodes_closes_from_the_last_member_to_the_first():
    topo = cluster([node(f"n{i}", 8) for i in range(4)])
    j = job(4, cp=4, comm=ring(1e8))
    one_per_node = np.array([topo.gid(f"n{i}", 0) for i in range(4)])
    # Each NIC sends one hop and receives one: 50 GB/s, 1.5 + 1.5 us per hop.
    assert evaluate(topo, j, one_per_node).comm_ms == pytest.approx(3 * (3e-3 + 1e8 / 50e6))
    # Three members on n0 and one on n1: the closing hop n1 -> n0 crosses the network too.
    three_one = np.array([topo.gid("n0", 0), topo.gid("n0", 1), topo.gid("n0", 2), topo.gid("n1", 0)])
    assert evaluate(topo, j, three_one).comm_ms == pytest.approx(3 * (3e-3 + 1e8 / 50e6))


def test_cp_nests_inside_the_node_after_tp():
    topo = cluster([node(f"n{i}", 8) for i in range(4)])
    j = job(
        32,
        tp=2,
        cp=4,
        dp=4,
        comm=[("tp", "allreduce", 1e8, 4), ("cp", "p2p", 5e7, 8), ("dp", "allreduce", 1e8)],
    )
    placed = place(topo, topo.free_mask(), None, j)
    assert isinstance(placed, Placement)
    gids = np.asarray(placed.gids)
    for kind in ("tp", "cp"):
        for group in rank_groups(j)[kind]:
            assert np.unique(topo.gpu_node[gids[list(group)]]).size == 1
    assert placed.prediction.comm_ms == pytest.approx(lower_bound(topo, j).comm_ms, rel=1e-9)


def test_no_map_of_a_cp_job_beats_its_bound():
    topo = cluster([node(f"n{i}", 8 if i % 2 else 1) for i in range(4)])
    j = job(16, tp=2, cp=2, pp=2, dp=2, comm=[*ring(4e7, 4), ("tp", "allreduce", 1e7, 4), ("pp", "p2p", 1e7)])
    bound = lower_bound(topo, j).comm_ms
    rng = np.random.default_rng(5)
    for _ in range(40):
        gids = rng.permutation(topo.n_gpus)[:16]
        assert evaluate(topo, j, gids).comm_ms >= bound * (1 - 1e-9)


def test_cp_ep_and_pp_share_a_node_where_together_they_outweigh_tp():
    """A long-context MoE job (tp4 x cp2 x pp2 x dp2 x ep2) on two leaves of two 8-GPU nodes (4:1
    uplinks): TP moves the most bytes of any one kind, yet CP, EP (with DP, the same ranks here)
    and PP move more together. The nestings led by TP (innermost) leave some of them across
    nodes, 101.36 ms; with the lightest kinds innermost they all stay in a node and each TP group
    spans the four nodes one rank per node over its own NICs: 50.97 ms, the bound."""
    topo = adversarial_cluster(
        2, 200, [adversarial_node(f"n{i}", 8, f"leaf-{i // 2 + 1}", 8) for i in range(4)]
    )
    comm = [
        ("cp", "p2p", 3.2e7, 48),
        ("ep", "alltoall", 6.4e7, 32),
        ("dp", "allreduce", 5e8),
        ("tp", "allreduce", 2e7, 64),
        ("pp", "p2p", 6e7, 32),
    ]
    j = job(32, tp=4, cp=2, pp=2, dp=2, ep=2, comm=comm)
    placed = place(topo, topo.free_mask(), None, j)
    assert isinstance(placed, Placement)
    gids = np.asarray(placed.gids)
    for kind in ("cp", "ep", "pp"):
        for group in rank_groups(j)[kind]:
            assert np.unique(topo.gpu_node[gids[list(group)]]).size == 1
    assert placed.prediction.comm_ms == pytest.approx(lower_bound(topo, j).comm_ms, rel=1e-9)
