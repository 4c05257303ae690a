"""`tree_best_fit`: Slurm's topology/tree selection, at GPU granularity.

Each node hangs under the leaf of its first NIC (as a Slurm topology.conf lists it); leaves sit
under spine groups (pods), pods under the core. The job goes under the lowest switch level where
one switch has enough free GPUs, choosing the best-fitting such switch (fewest free GPUs that
suffice). Below it, leaves are taken best-fit first: a leaf that alone covers what is still needed,
the one with the fewest free GPUs; otherwise the leaf with the most free GPUs, and repeat. Inside a
leaf, nodes and GPUs go in order. Ranks follow node order. Blind to NVLink domains, groups and rails.
"""

from __future__ import annotations

import numpy as np

from ..jobs import JobSpec
from ..topology import Topology
from .base import shortage
from .cover import best_fit_cover


def _levels(topology: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-GPU Slurm leaf, pod and top ids; standalone nodes are switches of their own."""
    node_leaf = topology.node_leaf.astype(np.int64)
    n_leaves = len(topology.leaf_names)
    lone = node_leaf < 0
    node_leaf = node_leaf.copy()
    node_leaf[lone] = n_leaves + np.arange(int(lone.sum()))
    leaf_pod = np.concatenate(
        [
            topology.leaf_pod.astype(np.int64),
            int(topology.leaf_pod.max(initial=-1)) + 1 + np.arange(int(lone.sum())),
        ]
    )
    gpu_leaf = node_leaf[topology.gpu_node]
    gpu_pod = leaf_pod[gpu_leaf]
    n_pods = int(leaf_pod.max(initial=-1)) + 1
    # Networked pods share the core; every standalone node is a tree of its own.
    pod_top = np.zeros(n_pods, dtype=np.int64)
    lone_pods = leaf_pod[n_leaves:]
    pod_top[lone_pods] = 1 + np.arange(lone_pods.size)
    return gpu_leaf, gpu_pod, pod_top[gpu_pod]


def choose(topology: Topology, free: np.ndarray, link_load, job: JobSpec, seed: int = 0):
    """Lowest switch that fits, best-fit leaves under it, ranks in node order; NoFit when too few."""
    missing = shortage(job, free)
    if missing is not None:
        return missing
    n = job.gpus
    gpu_leaf, gpu_pod, gpu_top = _levels(topology)
    free_ids = np.flatnonzero(free)
    leaf_of = gpu_leaf[free_ids]
    leaf_free = np.bincount(leaf_of, minlength=int(gpu_leaf.max()) + 1)
    chosen_leaves: np.ndarray | None = None
    for level in (gpu_leaf, gpu_pod, gpu_top):
        sw_free = np.bincount(level[free_ids], minlength=int(level.max()) + 1)
        fits = np.flatnonzero(sw_free >= n)
        if fits.size:
            # Best fit: the fitting switch with the fewest free GPUs (ties to the lowest id).
            switch = int(fits[np.argmin(sw_free[fits])])
            under = np.unique(gpu_leaf[free_ids[level[free_ids] == switch]])
            chosen_leaves = under
            break
    if chosen_leaves is None:
        # Only standalone fragments are left; Slurm would spread over all free nodes anyway.
        chosen_leaves = np.unique(leaf_of)
    plan = best_fit_cover(leaf_free[chosen_leaves], n)
    picked: list[np.ndarray] = []
    for k, take in plan:
        leaf = chosen_leaves[k]
        picked.append(free_ids[leaf_of == leaf][:take])
    return tuple(int(g) for g in np.sort(np.concatenate(picked)))
