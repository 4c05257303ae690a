"""`naive`: the seed's free-GPU-first scheduler, which spreads rank blocks over the emptiest nodes.

Ranks are handed out in blocks of half a node (one CPU socket's GPUs on a two-socket server); each
block goes to whichever node has the most free GPUs at that moment (ties to the node listed first),
on that node's lowest free GPUs. Blind to groups, rails and switches. On case 4.4 (two empty
8-GPU nodes, 16 ranks) this gives ranks 0-3 on node A GPUs 0-3, 4-7 on node B 0-3, 8-11 on A 4-7
and 12-15 on B 4-7.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..jobs import JobSpec
from ..topology import Topology
from .base import shortage


def block_size(gpus_on_node: int) -> int:
    """GPUs per rank block on a node with `gpus_on_node` GPUs: half the node, at least one."""
    return max(1, gpus_on_node // 2)


def choose(topology: Topology, free: np.ndarray, link_load, job: JobSpec, seed: int = 0):
    """Rank blocks round-robin over the nodes with the most free GPUs; NoFit when too few are free."""
    missing = shortage(job, free)
    if missing is not None:
        return missing
    first = topology.node_first_gid
    count = topology.node_gpu_count
    free_per_node = np.add.reduceat(free.astype(np.int64), first) if len(first) else np.zeros(0)
    heap = [(-int(f), int(i)) for i, f in enumerate(free_per_node) if f > 0]
    heapq.heapify(heap)
    taken: dict[int, int] = {}  # node -> how many of its free GPUs are handed out
    gids: list[int] = []
    while len(gids) < job.gpus:
        neg_free, node = heapq.heappop(heap)
        lo, hi = int(first[node]), int(first[node] + count[node])
        local = np.flatnonzero(free[lo:hi]) + lo
        start = taken.get(node, 0)
        k = min(block_size(int(count[node])), -neg_free, job.gpus - len(gids))
        gids.extend(int(g) for g in local[start : start + k])
        taken[node] = start + k
        if -neg_free - k > 0:
            heapq.heappush(heap, (neg_free + k, node))
    return tuple(gids)
