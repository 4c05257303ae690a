"""Candidate placements inside one node with intra-node links (`Node.intra`): PCIe-only nodes
and partial NVLink meshes, where which GPUs of the node a job gets, and which of them form its
TP groups, decides its bandwidth.

For the best-fitting few such nodes with room for the whole job: the free GPU subsets of the
job's size with the fastest slowest pair (then the fastest total), and for each the splits into
TP groups whose slowest in-group pair is fastest. The caller prices them with the cost model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from ..groups import rank_groups
from ..jobs import JobSpec
from ..topology import Topology

NODES_TRIED = 2
SUBSETS_TRIED = 8
SPLITS_TRIED = 6
# Beyond these the enumeration would cost more than the cost model saves.
MAX_SUBSETS = 5000
MAX_SPLIT_GPUS = 8


def intra_candidates(topology: Topology, free: np.ndarray, job: JobSpec) -> Iterator[np.ndarray]:
    """Rank-to-gid arrays placing the whole job on one node with intra links."""
    n = job.gpus
    if not topology.node_intra or n < 2:
        return
    nodes = []
    for ni in topology.node_intra:
        first = int(topology.node_first_gid[ni])
        ids = np.flatnonzero(free[first : first + int(topology.node_gpu_count[ni])])
        if ids.size >= n and math.comb(int(ids.size), n) <= MAX_SUBSETS:
            nodes.append((ids.size - n, ni, ids))
    nodes.sort(key=lambda t: (t[0], t[1]))
    tp_groups = rank_groups(job)["tp"]
    for _, ni, ids in nodes[:NODES_TRIED]:
        bw = topology.node_intra[ni].bw
        first = int(topology.node_first_gid[ni])
        for subset in _best(itertools.combinations(ids.tolist(), n), bw, SUBSETS_TRIED):
            for split in _splits(subset, job.tp, bw):
                gids = np.empty(n, dtype=np.int64)
                for ranks, block in zip(tp_groups, split, strict=True):
                    gids[list(ranks)] = first + np.asarray(block)
                yield gids


def _score(gpus, bw: np.ndarray) -> tuple[float, float]:
    """(slowest pair, total) bandwidth among `gpus` (node-local indices)."""
    if len(gpus) < 2:
        return math.inf, 0.0
    sub = bw[np.ix_(gpus, gpus)]
    off = ~np.eye(len(gpus), dtype=bool)
    return float(sub[off].min()), float(sub[off].sum())


def _best(subsets, bw: np.ndarray, keep: int) -> list[tuple[int, ...]]:
    scored = [(_score(s, bw), s) for s in subsets]
    scored.sort(key=lambda t: (-t[0][0], -t[0][1], t[1]))
    return [s for _, s in scored[:keep]]


def _splits(subset: tuple[int, ...], tp: int, bw: np.ndarray) -> list[list[tuple[int, ...]]]:
    """Ways to cut `subset` into TP groups of `tp` GPUs, best first (slowest in-group pair)."""
    if tp == 1 or tp == len(subset) or len(subset) > MAX_SPLIT_GPUS:
        return [[subset[k : k + tp] for k in range(0, len(subset), tp)]]

    def cuts(rest: tuple[int, ...]) -> Iterator[list[tuple[int, ...]]]:
        if not rest:
            yield []
            return
        head = rest[0]
        for partners in itertools.combinations(rest[1:], tp - 1):
            block = (head, *partners)
            left = tuple(g for g in rest if g not in block)
            for tail in cuts(left):
                yield [block, *tail]

    scored = []
    for split in cuts(subset):
        worst = min(_score(b, bw)[0] for b in split)
        total = sum(_score(b, bw)[1] for b in split)
        scored.append(((-worst, -total), split))
    scored.sort(key=lambda t: t[0])
    return [s for _, s in scored[:SPLITS_TRIED]]
