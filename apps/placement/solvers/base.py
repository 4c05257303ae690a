"""What every solver shares: the result types, input checks and a per-topology hierarchy index.

The hierarchy a placement is chosen in, smallest first: GPU, node, cell (the part of one NVLink
domain under one unit), unit (nodes joined by shared leaves: a leaf in a leaf-spine cluster, a
scalable unit of a rail-optimized one), pod (leaves sharing spines), plane (pods sharing cores).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..costmodel import Prediction
from ..jobs import JobSpec
from ..topology import Topology


@dataclass(frozen=True, slots=True)
class Placement:
    """A gang placement: `gids[r]` is rank r's GPU; `prediction` is its cost-model price."""

    policy: str
    gids: tuple[int, ...]
    prediction: Prediction


@dataclass(frozen=True, slots=True)
class NoFit:
    """The job cannot be placed now; `reason` says what is missing."""

    reason: str


def check_free(topology: Topology, free) -> np.ndarray:
    """`free` as a bool array over gids; ValueError naming `free` if it has the wrong length."""
    mask = np.asarray(free)
    if mask.ndim != 1 or mask.shape[0] != topology.n_gpus:
        raise ValueError(f"free: expected {topology.n_gpus} booleans (one per GPU), got shape {mask.shape}")
    if mask.dtype != bool:
        mask = mask.astype(bool)
    return mask


def check_link_load(link_load) -> Mapping[str, float]:
    """`link_load` as a mapping of leaf name to other jobs' rates (GB/s) on its uplinks (empty if None)."""
    if link_load is None:
        return {}
    if not isinstance(link_load, Mapping):
        raise ValueError(
            f"link_load: expected a mapping of leaf name to flows, got {type(link_load).__name__}"
        )
    return link_load


def shortage(job: JobSpec, free: np.ndarray) -> NoFit | None:
    """NoFit when fewer GPUs are free than the job needs, else None."""
    n_free = int(np.count_nonzero(free))
    if n_free < job.gpus:
        return NoFit(f"needs {job.gpus} GPUs, {n_free} free")
    return None


class HierarchyIndex:
    """Per-GPU ids of every level and a canonical GPU order, built once per topology (O(GPUs)).

    Standalone nodes (no NIC) each form a unit, pod and plane of their own."""

    def __init__(self, topology: Topology):
        t = topology
        self.n_nodes = len(t.nodes)
        self.n_domains = len(t.domain_names)
        self.leaf_unit, node_unit, n_net_units, unit_root_leaf = _units(t)
        lone = np.flatnonzero(t.node_leaf < 0)
        node_unit[lone] = n_net_units + np.arange(lone.size)
        self.n_units = n_net_units + lone.size
        n_net_pods = int(t.leaf_pod.max()) + 1 if len(t.leaf_names) else 0
        self.unit_pod = np.concatenate([t.leaf_pod[unit_root_leaf], n_net_pods + np.arange(lone.size)])
        self.unit_pod = self.unit_pod.astype(np.int64)
        self.n_pods = n_net_pods + lone.size
        self.pod_plane, n_net_planes = _planes(t, n_net_pods)
        self.pod_plane = np.concatenate([self.pod_plane, n_net_planes + np.arange(lone.size)])
        self.n_planes = max(n_net_planes + lone.size, 1)

        self.gpu_node = t.gpu_node.astype(np.int64)
        self.gpu_index = t.gpu_index.astype(np.int64)
        self.gpu_domain = t.gpu_domain.astype(np.int64)
        self.gpu_unit = node_unit[self.gpu_node]
        self.gpu_pod = self.unit_pod[self.gpu_unit]
        self.gpu_plane = self.pod_plane[self.gpu_pod]
        self.networked = t.gpu_leaf >= 0
        # A cell is one (unit, domain) pair: NVLink inside, the unit's leaves outside.
        _, cell = np.unique(self.gpu_unit * (self.n_domains + 1) + self.gpu_domain, return_inverse=True)
        self.gpu_cell = cell.astype(np.int64).reshape(-1)
        self.n_cells = int(self.gpu_cell.max()) + 1
        self.cell_unit = np.zeros(self.n_cells, dtype=np.int64)
        self.cell_unit[self.gpu_cell] = self.gpu_unit
        self.node_cell = np.zeros(self.n_nodes, dtype=np.int64)
        self.node_cell[self.gpu_node] = self.gpu_cell
        self.node_first_gid = t.node_first_gid.astype(np.int64)
        self.node_gpu_count = t.node_gpu_count.astype(np.int64)
        self.node_domain = t.node_domain.astype(np.int64)
        self.max_node_gpus = int(self.node_gpu_count.max())
        self.max_domain_gpus = int(np.bincount(self.gpu_domain, minlength=self.n_domains).max())
        # A domain is uniform when every GPU pair in it runs at the domain's rate and latency: not
        # so a node with intra links (PCIe GPUs, a partial NVLink mesh) whose pairs differ.
        self.node_intra = t.node_intra
        self.domain_uniform = np.ones(self.n_domains, dtype=bool)
        for ni, intra in t.node_intra.items():
            off = ~np.eye(intra.bw.shape[0], dtype=bool)
            bw, lat = intra.bw[off], intra.latency[off]
            if bw.size and (np.ptp(bw) > 0 or np.ptp(lat) > 0):
                self.domain_uniform[int(t.node_domain[ni])] = False
        # Canonical order: plane, pod, unit, cell, node, GPU index; position of each gid in it.
        order = np.lexsort(
            (self.gpu_index, self.gpu_node, self.gpu_cell, self.gpu_unit, self.gpu_pod, self.gpu_plane)
        )
        self.position = np.empty(t.n_gpus, dtype=np.int64)
        self.position[order] = np.arange(t.n_gpus)
        # Children of each block, as (members sorted by parent, offsets) pairs.
        self.nodes_of_cell = _children(self.node_cell, self.n_cells)
        self.nodes_of_domain = _children(self.node_domain, self.n_domains)
        self.cells_of_unit = _children(self.cell_unit, self.n_units)
        self.units_of_pod = _children(self.unit_pod, self.n_pods)
        self.pods_of_plane = _children(self.pod_plane, self.n_planes)


def _units(t: Topology) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Units: connected components of the node-leaf graph (a node joins every leaf of its NICs).

    Returns each leaf's unit, each node's unit (-1 standalone), the unit count and each unit's
    lowest leaf."""
    n_leaves = len(t.leaf_names)
    parent = list(range(n_leaves))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for node in t.nodes:
        leaves = sorted({t.leaf_by_name[c.leaf] for c in node.nics})
        for lf in leaves[1:]:
            ra, rb = find(leaves[0]), find(lf)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    roots = sorted({find(i) for i in range(n_leaves)})
    unit_of_root = {r: k for k, r in enumerate(roots)}
    leaf_unit = np.array([unit_of_root[find(i)] for i in range(n_leaves)], dtype=np.int64)
    node_unit = np.full(len(t.nodes), -1, dtype=np.int64)
    has_leaf = t.node_leaf >= 0
    node_unit[has_leaf] = leaf_unit[t.node_leaf[has_leaf]]
    return leaf_unit, node_unit, len(roots), np.array(roots, dtype=np.int64)


def _planes(t: Topology, n_pods: int) -> tuple[np.ndarray, int]:
    """Each networked pod's plane (pods joined through core switches), numbered 0.., and the count."""
    net = t.gpu_leaf >= 0
    if not net.any():
        return np.zeros(n_pods, dtype=np.int64), 0
    raw = np.zeros(n_pods, dtype=np.int64)
    raw[t.gpu_pod[net]] = t.gpu_plane[net]
    _, compact = np.unique(raw, return_inverse=True)
    compact = compact.astype(np.int64).reshape(-1)
    return compact, int(compact.max()) + 1


def _children(parent: np.ndarray, n_parents: int) -> tuple[np.ndarray, np.ndarray]:
    """Children grouped by parent: `members[offsets[p]:offsets[p + 1]]` are parent p's, in order."""
    members = np.argsort(parent, kind="stable")
    offsets = np.searchsorted(parent[members], np.arange(n_parents + 1))
    return members, offsets


_INDEX: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hierarchy(topology: Topology) -> HierarchyIndex:
    """The cached HierarchyIndex of a topology."""
    idx = _INDEX.get(topology)
    if idx is None:
        idx = HierarchyIndex(topology)
        _INDEX[topology] = idx
    return idx


def rank_coordinates(job: JobSpec) -> dict[str, np.ndarray]:
    """Each rank's coordinate per rank-order dimension (Megatron: the first varies fastest).

    Sizes: tp, cp, ep, dp/ep (the `dp` dimension counts EP groups), pp; cp is 0 everywhere
    while it is 1 (left out of the rank order).
    """
    sizes = {"tp": job.tp, "cp": job.cp, "ep": job.ep, "dp": job.dp // job.ep, "pp": job.pp}
    ranks = np.arange(job.gpus, dtype=np.int64)
    coords: dict[str, np.ndarray] = {"cp": np.zeros(job.gpus, dtype=np.int64)}
    stride = 1
    for dim in job.dims:
        coords[dim] = (ranks // stride) % sizes[dim]
        stride *= sizes[dim]
    return coords
