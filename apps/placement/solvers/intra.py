"""Candidate placements inside one node with intra-node links (`Node.intra`): PCIe-only nodes
and partial NVLink meshes, where which GPUs of the node a job gets, and which of them form its
TP groups, decides its bandwidth.

For the best-fitting few such nodes with room for the whole job: the free GPU subsets of the
job's size with the fastest slowest pair (then the fastest total), and for each the splits into
TP groups whose slowest in-group pair is fastest. The caller prices them with the cost model.

For a job larger than the free GPUs of uniform NVLink domains (`thin_sets`): every such GPU, and
the rest taken thinly from the nodes with intra links, a GPU from each node in turn. A group with
two or more members on such a node runs at the slowest pair between them (a PCIe node's 8 GB/s
SYS link, 14 GB/s across its host bridge) and its members there share the node's NICs, while one
member per node runs at its own NIC's rate: best fit and the even splits pack the job into few
such nodes, 4 or 8 GPUs each, and the groups laid over them pay the bucket effect.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from ..costmodel.paths import nic_ids
from ..groups import rank_groups
from ..jobs import JobSpec
from ..topology import Topology
from .base import HierarchyIndex
from .blocks import canonical

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


def thin_sets(topology: Topology, idx: HierarchyIndex, free: np.ndarray, job: JobSpec) -> list[np.ndarray]:
    """GPU sets (canonical order) of every free GPU of the uniform NVLink domains and the rest of
    the job from nodes with intra links, one GPU of each node a round: in a round the GPUs worth
    the most network rate first (their NIC's rate over the job's GPUs behind it), then
    hierarchy order. Each node's GPUs come in two orders, so two sets: its own NICs first (then
    the fastest pair to the GPUs taken before), or the fastest pair first (a PCIe switch's
    partner, the NVLink pair of a cube mesh; then the NIC). Ties go to the GPU with the fastest
    partner still free (behind another NIC in the first order), so a node's first GPU is not one
    whose only partners left are SYS pairs (a cube mesh's GPU 3 beside free 5 and 6). Empty when
    the uniform domains hold the job or the free GPUs do not."""
    if not topology.node_intra:
        return []
    ids = np.flatnonzero(free)
    mixed = ~idx.domain_uniform[idx.gpu_domain[ids]]
    uniform, spare = ids[~mixed], ids[mixed]
    need = job.gpus - uniform.size
    if need <= 0 or need > spare.size:
        return []
    nic, _ = nic_ids(topology)
    nodes, per_node = np.unique(idx.gpu_node[spare], return_counts=True)
    nodes = nodes.tolist()
    # Rounds the job reaches (nodes with fewer free GPUs drop out): orders go no further.
    rounds = -(-need // len(nodes))
    while np.minimum(per_node, rounds).sum() < need:
        rounds += 1
    out: list[np.ndarray] = []
    for pairs_first in (False, True):
        keys = []
        for node in nodes:
            bw = topology.node_intra[node].bw
            first = int(topology.node_first_gid[node])
            left = spare[idx.gpu_node[spare] == node].tolist()
            taken: list[int] = []
            while left and len(taken) < rounds:
                scored = []
                for g in left:
                    worth = float(topology.gpu_nic_bw[g]) / (1 + sum(nic[t] == nic[g] for t in taken))
                    pair = min((float(bw[g - first, t - first]) for t in taken), default=math.inf)
                    # Ties to the GPU with the fastest partner left (behind another NIC unless the
                    # pair comes first): a node's first GPU opens its best pair, not a SYS one.
                    partner = max(
                        (
                            float(bw[g - first, h - first])
                            for h in left
                            if h != g and (pairs_first or nic[h] != nic[g])
                        ),
                        default=0.0,
                    )
                    key = (-pair, -worth) if pairs_first else (-worth, -pair)
                    scored.append(((*key, -partner), g, worth))
                (_, g, worth) = min(scored)
                keys.append((len(taken), -worth, int(idx.position[g]), g))
                taken.append(g)
                left.remove(g)
        keys.sort()
        gset = canonical(
            idx, np.concatenate([uniform, np.array([k[-1] for k in keys[:need]], dtype=np.int64)])
        )
        if all(gset.tobytes() != o.tobytes() for o in out):
            out.append(gset)
    return out
