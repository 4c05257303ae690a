"""Rail spreading: the job's ranks on a node moved off NICs they share, onto free GPUs of the
same node whose NIC none of its ranks use.

On nodes whose NICs serve two or more GPUs each (a DGX-1's 4 NICs for 8 GPUs, PCIe servers), the
constructive stage takes a node's free GPUs in island or id order, blind to which NIC each one
sits behind: a group that leaves the node then runs its network phase on fewer rails than the
node's free GPUs offer, and two crossing groups may share one NIC at half its rate each. A
tp8 x pp2 x dp4 job on cube-mesh and NVLink nodes had one TP group split 7 + 1 whose lone member
shared its NIC with another TP group's member (109.2 ms for the TP all-reduces, 12.5 GB/s),
while the node's GPUs 6 and 7 (a NIC of their own) stayed free: moving that member there prices
the TP entry at 91.0 ms.

The pass is deterministic, within `max_evals` cost-model calls. First every node at once
(`spread_all`), kept if it prices lower; then hill climbing: for each node of the placement with job ranks sharing a NIC and free unused GPUs behind a NIC no job
rank uses, try moving each of those ranks (the fullest NIC first) to each such GPU; keep the
first move that lowers the exposed comm time, else all comm time, and start again. When no such
move helps (every GPU of the node in use, say), two of the job's ranks on one node trade GPUs
(`rail_swaps`): a member of a group that spans nodes and holds two GPUs behind one NIC of the
node, with a rank behind a NIC the group does not use there. A tp8 x pp2 x dp4 job on a whole
leaf of 8-NIC and 4-NIC nodes had TP groups split 4 + 4 whose half on a 4-NIC node sat behind 3
of its 4 NICs (TP entry 22.5 ms); one member a NIC, 18.2 ms. A node with one NIC per GPU or a
single NIC offers no move, so 8-NIC fleets pay nothing. Where every GPU of the nodes is the
job's and no single swap gains (a pipeline hop is as slow as its busier end), the ranks that reach
another node in a kind are spread over their node's NICs on every node at once (`spread_crossing`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..costmodel import evaluate
from ..costmodel.paths import nic_ids
from ..groups import group_arrays
from ..jobs import JobSpec
from ..topology import Topology
from .mapping import declared_traffic

# Cost-model calls the pass may make per placement.
RAIL_EVALS = 48


def spread_rails(
    topology: Topology,
    job: JobSpec,
    gids: np.ndarray,
    free: np.ndarray,
    leaf_load: np.ndarray,
    *,
    max_evals: int = RAIL_EVALS,
) -> np.ndarray:
    """A map at most as costly (exposed, then all comm ms, then the group sum) as `gids`, using only `free` GPUs,
    with ranks moved off shared NICs where that lowers the cost (module docstring)."""
    cur = np.array(gids, dtype=np.int64)
    # No two ranks behind one NIC (8-NIC nodes): nothing to move, at the cost of one count.
    if np.bincount(nic_ids(topology)[0][cur]).max(initial=0) < 2:
        return cur
    moves = any(True for _ in rail_moves(topology, cur, free))
    spreads = [
        t
        for t in (spread_crossing(topology, job, k, cur) for k in _network_kinds(job))
        if not np.array_equal(t, cur)
    ]
    if not moves and not spreads and not any(True for _ in rail_swaps(topology, job, cur)):
        return cur

    def price(trial: np.ndarray) -> tuple[float, float, float]:
        pred = evaluate(topology, job, trial, leaf_load, detail=False)
        return pred.step_ms - job.compute_ms, pred.comm_ms, pred.group_ms

    cost = price(cur)
    evals = 1
    if moves:
        # Every node at once first: a DP pair on two nodes gains only when both its ends move.
        trial = spread_all(topology, cur, free)
        c = price(trial)
        if _better(c, cost):
            cur, cost = trial, c
    for trial in spreads:
        # Every node at once too: a pipeline hop gains only when both its ends have a NIC alone.
        # (Spread from the map given: kept only if it beats what the free GPUs gave.)
        c = price(trial)
        evals += 1
        if _better(c, cost):
            cur, cost = trial, c
    improved = True
    while improved and evals < max_evals:
        improved = False
        for rank, gid in rail_moves(topology, cur, free):
            if evals >= max_evals:
                break
            trial = cur.copy()
            trial[rank] = gid
            c = price(trial)
            evals += 1
            if _better(c, cost):
                cur, cost, improved = trial, c, True
                break
        if improved:
            continue
        # No free GPU helps: two of the job's ranks on one node trade GPUs, so that a group
        # meets the node's NICs one member each.
        for a, b in rail_swaps(topology, job, cur):
            if evals >= max_evals:
                break
            trial = cur.copy()
            trial[a], trial[b] = cur[b], cur[a]
            c = price(trial)
            evals += 1
            if _better(c, cost):
                cur, cost, improved = trial, c, True
                break
    return cur


def _better(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    # Key by key, equal within 1e-12 ms (1e-9 relative for the group sum).
    for x, y, tol in zip(a, b, (1e-12, 1e-12, 1e-9 * max(abs(b[2]), 1.0)), strict=True):
        if x < y - tol:
            return True
        if x > y + tol:
            return False
    return False


def _networked_gpus(topology: Topology, node: int, networked: np.ndarray) -> np.ndarray:
    """The node's GPU ids that reach the network (have a leaf), in GPU order."""
    first = int(topology.node_first_gid[node])
    local = np.arange(first, first + int(topology.node_gpu_count[node]))
    return local[networked[local]]


def spread_all(topology: Topology, gids: np.ndarray, free: np.ndarray) -> np.ndarray:
    """`gids` with, on every node, ranks moved off shared NICs until no NIC holds two of the
    job's ranks or no free GPU is left behind a NIC the job does not use: the last rank (in GPU
    order) of the NIC holding the most goes to the first such GPU of the NIC with the most of
    them. Ranks on different nodes in the same place of their node's order end up on NICs of
    their own together, so groups that pair them (DP over two nodes) gain at once."""
    cur = np.array(gids, dtype=np.int64)
    ids, _ = nic_ids(topology)
    networked = topology.gpu_leaf >= 0
    used = np.zeros(topology.n_gpus, dtype=bool)
    used[cur] = True
    node_of = topology.gpu_node[cur]
    for node in dict.fromkeys(node_of.tolist()):
        local = _networked_gpus(topology, node, networked)
        ranks = np.flatnonzero(node_of == node)
        while local.size:
            ranks = ranks[np.argsort(cur[ranks], kind="stable")]
            nics, counts = np.unique(ids[cur[ranks]], return_counts=True)
            spare = local[free[local] & ~used[local] & ~np.isin(ids[local], nics)]
            if counts.max() < 2 or not spare.size:
                break
            crowded = nics[np.argmax(counts)]
            rank = int(ranks[ids[cur[ranks]] == crowded][-1])
            spare_nics, per_nic = np.unique(ids[spare], return_counts=True)
            target = int(spare[ids[spare] == spare_nics[np.argmax(per_nic)]][0])
            used[cur[rank]], used[target] = False, True
            cur[rank] = target
    return cur


def _network_kinds(job: JobSpec) -> list[str]:
    """Group kinds with declared traffic and groups of two or more, heaviest first."""
    traffic = declared_traffic(job)
    arrays = group_arrays(job)
    return [
        k
        for k in sorted(arrays, key=lambda k: -traffic.get(k, 0.0))
        if traffic.get(k, 0.0) > 0 and arrays[k].shape[1] > 1
    ]


def spread_crossing(topology: Topology, job: JobSpec, kind: str, gids: np.ndarray) -> np.ndarray:
    """`gids` with, on every node, the job's ranks that reach another node in `kind` (`crossing`)
    spread over the node's NICs by swaps: while two of them share a NIC, the last of those (in
    GPU order) trades GPUs with the first rank of the node that does not cross, behind a NIC none
    of them uses. A tp4 x pp4 job on two 4-NIC nodes whose crossing stages sat on GPUs 4 to 7 of
    one and 0 to 3 of the other sent its four pipeline hops two to a NIC at each end (p2p entry
    26.9 ms); one NIC a hop, 13.5 ms. Single swaps cannot get there: a hop is as slow as its
    busier end, so none gains until both ends of every hop have moved."""
    cur = np.array(gids, dtype=np.int64)
    ids, _ = nic_ids(topology)
    node_of = topology.gpu_node[cur]
    crossing = _crossing(job, kind, node_of)
    for node in dict.fromkeys(node_of.tolist()):
        here = node_of == node
        while True:
            nic_of = ids[cur]
            out = np.flatnonzero(here & crossing)
            out = out[np.argsort(cur[out], kind="stable")]
            nics, counts = np.unique(nic_of[out], return_counts=True)
            others = np.flatnonzero(here & ~crossing & ~np.isin(nic_of, nics))
            if counts.max(initial=0) < 2 or not others.size:
                break
            rank = int(out[nic_of[out] == nics[np.argmax(counts)]][-1])
            other = int(others[np.argmin(cur[others])])
            cur[rank], cur[other] = cur[other], cur[rank]
    return cur


def _crossing(job: JobSpec, kind: str, node_of: np.ndarray) -> np.ndarray:
    """Per rank: whether it reaches another node in `kind`: with a p2p entry, a neighbour in its
    group's order sits elsewhere; otherwise its group spans nodes."""
    groups = group_arrays(job)[kind]
    at = node_of[groups]
    out = np.zeros(node_of.size, dtype=bool)
    if any(c.group == kind and c.collective == "p2p" for c in job.comm):
        cut = at[:, 1:] != at[:, :-1]
        out[groups[:, 1:][cut]] = True
        out[groups[:, :-1][cut]] = True
    else:
        out[groups[(at != at[:, :1]).any(axis=1)].ravel()] = True
    return out


def rail_moves(topology: Topology, gids: np.ndarray, free: np.ndarray) -> Iterator[tuple[int, int]]:
    """(rank, gid) moves of a job's rank off a NIC it shares with another of the job's ranks onto
    a free GPU, unused by the job, of the same node behind a NIC no rank of the job uses; node by
    node in the order the job holds them, the NICs holding the most ranks first."""
    ids, _ = nic_ids(topology)
    networked = topology.gpu_leaf >= 0
    used = np.zeros(topology.n_gpus, dtype=bool)
    used[gids] = True
    node_of = topology.gpu_node[gids]
    for node in dict.fromkeys(node_of.tolist()):
        local = _networked_gpus(topology, node, networked)
        if not local.size:
            continue
        ranks = np.flatnonzero(node_of == node)
        rank_nics = ids[gids[ranks]]
        nics, counts = np.unique(rank_nics, return_counts=True)
        if counts.max() < 2:
            continue
        spare = local[free[local] & ~used[local] & ~np.isin(ids[local], nics)]
        if not spare.size:
            continue
        for k in np.argsort(-counts, kind="stable"):
            if counts[k] < 2:
                break
            for rank in ranks[rank_nics == nics[k]].tolist():
                for gid in spare.tolist():
                    yield rank, gid


def rail_swaps(topology: Topology, job: JobSpec, gids: np.ndarray) -> Iterator[tuple[int, int]]:
    """(rank, rank) swaps on one node: a rank of a group that spans nodes and holds two or more
    GPUs behind one NIC of this node trades GPUs with another of the job's ranks on the node
    behind a NIC the group does not use there; by kind in the job's declared traffic order
    (heaviest first), then group, node and rank order."""
    ids, _ = nic_ids(topology)
    node_of = topology.gpu_node[gids]
    nic_of = ids[gids]
    arrays = group_arrays(job)
    for kind in _network_kinds(job):
        for group in arrays[kind]:
            nodes = node_of[group]
            if np.unique(nodes).size < 2:
                continue
            for node in dict.fromkeys(nodes.tolist()):
                members = group[nodes == node]
                nics, counts = np.unique(nic_of[members], return_counts=True)
                if counts.max() < 2:
                    continue
                others = np.flatnonzero((node_of == node) & ~np.isin(nic_of, nics))
                for k in np.flatnonzero(counts >= 2).tolist():
                    for rank in members[nic_of[members] == nics[k]][1:].tolist():
                        for other in others.tolist():
                            yield rank, other
