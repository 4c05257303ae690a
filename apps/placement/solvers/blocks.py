"""What a block of the hierarchy can supply: free GPUs counted per level, best-fit takes from a
block down to nodes and GPUs, and the canonical order of a chosen set."""

from __future__ import annotations

import numpy as np

from .base import HierarchyIndex
from .cover import best_fit_cover

CHILD_LEVEL = {"plane": "pod", "pod": "unit", "unit": "cell"}


class Free:
    """Free GPUs counted at every level of the hierarchy for one call; `*_load` are the other
    jobs' flows on the uplinks of each unit, pod and plane."""

    def __init__(self, idx: HierarchyIndex, free: np.ndarray, leaf_load: np.ndarray):
        self.ids = np.flatnonzero(free)
        self.node = np.bincount(idx.gpu_node[self.ids], minlength=idx.n_nodes)
        self.domain = np.bincount(idx.node_domain, weights=self.node, minlength=idx.n_domains).astype(
            np.int64
        )
        self.cell = np.bincount(idx.node_cell, weights=self.node, minlength=idx.n_cells).astype(np.int64)
        # Leaf uplinks only (the array may go on with the pods' core links).
        leaf_load = leaf_load[: idx.leaf_unit.size]
        unit_load = (
            np.bincount(idx.leaf_unit, weights=leaf_load, minlength=idx.n_units) if leaf_load.size else None
        )
        self.unit_load = np.zeros(idx.n_units) if unit_load is None else unit_load
        self.pod_load = np.bincount(idx.unit_pod, weights=self.unit_load, minlength=idx.n_pods)
        self.plane_load = np.bincount(idx.pod_plane, weights=self.pod_load, minlength=idx.n_planes)

    def node_gpus(self, idx: HierarchyIndex, node: int, k: int) -> np.ndarray:
        """The k lowest free gids of a node."""
        lo = int(idx.node_first_gid[node])
        start = int(np.searchsorted(self.ids, lo))
        return self.ids[start : start + k]

    def lowest(self, idx: HierarchyIndex, nodes: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """The ks[i] lowest free gids of nodes[i], for every i, one node after another (as
        `node_gpus` node by node, in one gather)."""
        start = np.searchsorted(self.ids, idx.node_first_gid[nodes])
        before = np.cumsum(ks) - ks
        return self.ids[np.repeat(start - before, ks) + np.arange(int(ks.sum()))]


def take(idx: HierarchyIndex, counts: Free, caps: dict, level: str, block: int, need: int) -> np.ndarray:
    """`need` GPUs from one block of `level`, children best-fit first by their capacity in `caps`
    (level name -> GPUs each block may give), down to nodes and GPUs."""
    if level == "cell":
        members, off = idx.nodes_of_cell
        return take_nodes(idx, counts, members[off[block] : off[block + 1]], need)
    child_level = CHILD_LEVEL[level]
    members, off = {
        "plane": idx.pods_of_plane,
        "pod": idx.units_of_pod,
        "unit": idx.cells_of_unit,
    }[level]
    children = members[off[block] : off[block + 1]]
    load = None
    if child_level == "pod":
        load = counts.pod_load[children]
    elif child_level == "unit":
        load = counts.unit_load[children]
    plan = best_fit_cover(caps[child_level][children], need, load)
    if child_level == "cell":
        # Cells of one node each (every cluster whose NVLink domains are single nodes): each
        # part is its node's lowest free GPUs, gathered at once.
        members, off = idx.nodes_of_cell
        cells = children[[k for k, _ in plan]]
        if (off[cells + 1] - off[cells] == 1).all():
            return counts.lowest(idx, members[off[cells]], np.array([n for _, n in plan], dtype=np.int64))
    parts = [take(idx, counts, caps, child_level, int(children[k]), n) for k, n in plan]
    return np.concatenate(parts)


def take_nodes(idx: HierarchyIndex, counts: Free, nodes: np.ndarray, need: int) -> np.ndarray:
    """`need` free GPUs from these nodes: best-fit nodes, each node's lowest free GPUs."""
    if nodes.size == 1:
        return counts.node_gpus(idx, int(nodes[0]), need)
    plan = best_fit_cover(counts.node[nodes], need)
    return np.concatenate([counts.node_gpus(idx, int(nodes[k]), n) for k, n in plan])


def fragmentation(idx: HierarchyIndex, counts: Free, gset: np.ndarray) -> float:
    """Penalty in GPUs: half a node for every node the set leaves partly free."""
    nodes, used = np.unique(idx.gpu_node[gset], return_counts=True)
    broken = int(np.count_nonzero(counts.node[nodes] > used))
    return broken * idx.max_node_gpus / 2


def canonical(idx: HierarchyIndex, gset: np.ndarray) -> np.ndarray:
    """The set in hierarchy order: plane, pod, unit, then the unit's cells fullest first (so TP
    groups line up with whole domains and split ones pair up), node, GPU index."""
    cell = idx.gpu_cell[gset]
    _, inverse, per_cell = np.unique(cell, return_inverse=True, return_counts=True)
    order = np.lexsort(
        (
            idx.gpu_index[gset],
            idx.gpu_node[gset],
            cell,
            -per_cell[inverse],
            idx.gpu_unit[gset],
            idx.gpu_pod[gset],
            idx.gpu_plane[gset],
        )
    )
    return gset[order]
