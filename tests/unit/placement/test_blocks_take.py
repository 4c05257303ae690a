"""Taking GPUs from cells of one node each in one gather, as node by node."""

from __future__ import annotations

import numpy as np

from apps.placement.solvers.base import hierarchy
from apps.placement.solvers.blocks import Free, take

from .test_solvers import generated


def test_lowest_gathers_each_nodes_lowest_free_gpus_in_node_order():
    topo = generated(leaves=2, nodes_per_leaf=4)
    idx = hierarchy(topo)
    free = np.random.default_rng(5).random(topo.n_gpus) >= 0.4
    counts = Free(idx, free, np.zeros(len(topo.leaf_names)))
    nodes = np.array([5, 0, 3], dtype=np.int64)
    ks = np.minimum(counts.node[nodes], [3, 2, 1]).astype(np.int64)
    got = counts.lowest(idx, nodes, ks)
    want = np.concatenate([counts.node_gpus(idx, int(n), int(k)) for n, k in zip(nodes, ks, strict=True)])
    assert got.tolist() == want.tolist()
    assert free[got].all()


def test_a_unit_gives_whole_free_nodes_first_then_the_best_fitting_part():
    topo = generated(leaves=1, nodes_per_leaf=4)
    idx = hierarchy(topo)
    free = topo.free_mask()
    free[[0, 1, 2, 8, 9]] = False  # node 0 has 5 free GPUs, node 1 has 6
    counts = Free(idx, free, np.zeros(len(topo.leaf_names)))
    caps = {"cell": counts.cell, "unit": np.bincount(idx.cell_unit, weights=counts.cell).astype(np.int64)}
    got = take(idx, counts, caps, "unit", 0, 21)
    # Nodes 2 and 3 whole (16 GPUs), then 5 from node 0, the smallest that covers the rest.
    assert got.tolist() == list(range(16, 32)) + list(range(3, 8))
