"""The best map's nodes moved onto more leaves, each rank keeping its place within its node
(`spread.node_spreads`): the bench's cp-ep class, seed 271828, scenario 3, where the nestings
packed a tp4 x cp2 x pp2 x dp4 job into two leaves and the split layouts re-nested it."""

from __future__ import annotations

import numpy as np

from apps.placement.costmodel import evaluate, load_array
from apps.placement.solvers import place
from apps.placement.solvers.base import hierarchy
from apps.placement.solvers.blocks import Free
from apps.placement.solvers.spread import node_spreads
from apps.placement.topology import load_topology
from tests.unit.placement.specs import generated, job


def four_leaves():
    """4 leaves x 4 nodes of 8 GPUs at 8 x 50 GB/s, 4:1 uplinks."""
    return load_topology(
        generated(gpus_per_node=8, nics_per_node=8, leaves=4, nodes_per_leaf=4, uplink_bw_GBps=200)
    )


def cp_pp_job():
    comm = (
        ("cp", "p2p", 3.2e7, 48),
        ("ep", "alltoall", 6.4e7, 32),
        ("dp", "allreduce", 5e8),
        ("tp", "allreduce", 2e7, 64),
        ("pp", "p2p", 6e7, 32),
    )
    return job(64, tp=4, cp=2, pp=2, dp=4, ep=2, comm=comm, compute_ms=500.0)


def test_node_spreads_keep_every_nodes_ranks_together():
    topo, j = four_leaves(), cp_pp_job()
    idx = hierarchy(topo)
    free = np.ones(topo.n_gpus, dtype=bool)
    counts = Free(idx, free, load_array(topo, None))
    # Packed into the first two leaves, ranks in a scrambled order.
    packed = np.random.default_rng(0).permutation(64)
    moves = node_spreads(idx, counts, j, packed, 0, 2)
    assert moves
    for moved, _ in moves:
        assert np.unique(moved).size == 64 and free[moved].all()
        # Ranks sharing a node before share one after, in the same order of GPU index.
        for v in np.unique(topo.gpu_node[packed]):
            at = np.flatnonzero(topo.gpu_node[packed] == v)
            assert np.unique(topo.gpu_node[moved[at]]).size == 1
            assert (np.argsort(moved[at]) == np.argsort(packed[at])).all()
    # The first cut is four parts: 16 GPUs a leaf, consecutive nodes (by first rank) together.
    assert np.bincount(topo.gpu_leaf[moves[0][0]], minlength=4).tolist() == [16, 16, 16, 16]


def test_a_job_packed_into_two_leaves_shares_the_uplinks_of_four():
    topo, j = four_leaves(), cp_pp_job()
    placed = place(topo, np.ones(topo.n_gpus, dtype=bool), None, j)
    # Packed 32 + 32: 70.47 ms (its DP all-reduce 21.13); the oracle's 60.98 (11.13).
    assert np.bincount(topo.gpu_leaf[list(placed.gids)], minlength=4).tolist() == [16, 16, 16, 16]
    assert placed.prediction.comm_ms <= 61.0
    assert evaluate(topo, j, np.asarray(placed.gids), None).comm_ms == placed.prediction.comm_ms
