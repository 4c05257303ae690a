"""Spread layouts that cut a job's replicas inside its EP groups: a job whose EP group is its
whole DP group (dp == ep) had no split at all, so its all-to-all never got an even spread over
the leaves (the bench's cp-ep class, seed 8888, scenario 3)."""

from __future__ import annotations

import numpy as np

from apps.placement.solvers import place
from apps.placement.solvers.base import rank_coordinates
from apps.placement.solvers.mapping import split_layout, splits
from apps.placement.topology import load_topology
from tests.unit.placement.specs import generated, job

BUSY = [16, 17, 18, 19, 20, 21, 22, 23, 28, 29, 30, 31, 33, 37, 38, 39, 41, 43, 46, 47, 68, 69]
BUSY += [70, 71, 81, 86, 96, 105, 112, 118, 119, 127]
# The cheapest comm an annealing search found in 4,000 prices (topo's map among its starts).
ORACLE_MS = 110.38


def cp_ep_job():
    comm = (
        ("cp", "p2p", 3.2e7, 48),
        ("ep", "alltoall", 6.4e7, 32),
        ("dp", "allreduce", 5e8),
        ("tp", "allreduce", 2e7, 64),
    )
    return job(64, tp=4, cp=2, dp=8, ep=8, comm=comm, compute_ms=500.0, rank_order="tp-cp-ep-dp-pp")


def test_replicas_split_inside_ep_groups():
    j = cp_ep_job()
    # pp 1, dp / ep = 1: only cuts of the 8 replicas, which lie in one EP group.
    assert splits(j, 4) == [(1, 4)] and splits(j, 3) == []
    gids = split_layout(j, np.arange(64), 1, 4, ("tp", "cp", "ep", "dp", "pp"))
    ep = rank_coordinates(j)["ep"]
    # Each quarter of the slots holds two whole replicas (16 ranks), EP ranks 2q and 2q + 1.
    for q in range(4):
        assert sorted(set(ep[(gids >= 16 * q) & (gids < 16 * q + 16)].tolist())) == [2 * q, 2 * q + 1]


def test_an_all_to_all_over_whole_dp_is_spread_evenly_over_the_leaves():
    # 4 leaves x 4 nodes of 8 GPUs, 4:1 uplinks; 20, 24, 26 and 26 GPUs free a leaf.
    topo = load_topology(
        generated(gpus_per_node=8, nics_per_node=8, leaves=4, nodes_per_leaf=4, uplink_bw_GBps=200)
    )
    free = np.ones(topo.n_gpus, dtype=bool)
    free[BUSY] = False
    placed = place(topo, free, None, cp_ep_job())
    # Packed best fit takes 20 + 16 + 12 + 16 (128.30 ms); 16 a leaf halves each EP group's
    # members under the busiest uplink.
    assert placed.prediction.comm_ms <= ORACLE_MS
    assert np.bincount(topo.gpu_leaf[list(placed.gids)], minlength=4).tolist() == [16, 16, 16, 16]
