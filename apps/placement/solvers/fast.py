"""Link-aware candidate sets: the job split evenly over the nodes with the fastest network per GPU.

Best fit counts free GPUs; it cannot tell two whole nodes whose 8 GPUs share one NIC from 8-NIC
nodes with 5 free GPUs each. These sets are priced beside the best-fit ones, so the cost model
chooses: for each split of the job into k equal per-node parts (the largest parts first), the k
nodes with room for a part and the highest NIC rate per free GPU (distinct NICs serving their free
GPUs, GB/s, over the free GPU count), ties to the quieter unit and then hierarchy order, so that
equal nodes stay together under as few leaves as possible. Rail-balanced sets give every node
they use as many distinct NICs as the job allows (`rail_balanced_sets`).
"""

from __future__ import annotations

import numpy as np

from ..costmodel.paths import nic_ids
from ..jobs import JobSpec
from ..topology import Topology
from .base import HierarchyIndex
from .blocks import Free, canonical

# Splits (per-node part sizes) tried, largest parts first.
SPLITS_TRIED = 3


def node_rates(topology: Topology, counts: Free) -> np.ndarray:
    """Per node: the summed rate (GB/s) of the distinct NICs serving its free GPUs, per free GPU."""
    ids, _ = nic_ids(topology)
    net = counts.ids[topology.gpu_nic_bw[counts.ids] > 0]
    _, first = np.unique(ids[net], return_index=True)
    served = net[first]
    total = np.bincount(
        topology.gpu_node[served], weights=topology.gpu_nic_bw[served], minlength=counts.node.size
    )
    return total / np.maximum(counts.node, 1)


def fast_sets(topology: Topology, idx: HierarchyIndex, counts: Free, job: JobSpec) -> list[np.ndarray]:
    """GPU sets (canonical order) of the job split evenly over the fastest nodes, one per split;
    then split near-evenly (parts of two sizes one apart, 7 + 7 + 6 + 6 + 6): a hierarchical
    allreduce's network phase moves each node's share through as many NICs as the node has ranks,
    so its smallest part decides, and best fit's whole nodes and a remainder (8 + 8 + 8 + 4 + 4)
    lose to an even spread where no equal split fits."""
    n = job.gpus
    rate = node_rates(topology, counts)
    out: list[np.ndarray] = []
    for per in range(min(n, idx.max_node_gpus), 0, -1):
        if len(out) >= SPLITS_TRIED:
            break
        if n % per or _cuts_tp(per, job):
            continue
        pick = _fastest(idx, counts, rate, per)[: n // per]
        if pick.size < n // per or n // per < 2:
            continue
        out.append(_take(idx, counts, pick, np.full(pick.size, per)))
    near = 0
    first = max(2, -(-n // idx.max_node_gpus))
    for k in range(first, min(n, 2 * first) + 1):
        if near >= SPLITS_TRIED:
            break
        lo, extra = divmod(n, k)
        if not extra or _cuts_tp(lo, job) or _cuts_tp(lo + 1, job):
            continue
        pick = _fastest(idx, counts, rate, lo)[:k]
        roomy = pick[counts.node[pick] > lo][:extra]
        if pick.size < k or roomy.size < extra:
            continue
        out.append(_take(idx, counts, pick, lo + np.isin(pick, roomy)))
        near += 1
    return out


def _cuts_tp(part: int, job: JobSpec) -> bool:
    """Whether a per-node part of `part` GPUs neither holds whole TP groups nor divides one."""
    return bool(part % job.tp and job.tp % part)


def _fastest(idx: HierarchyIndex, counts: Free, rate: np.ndarray, part: int) -> np.ndarray:
    """Nodes with room for `part` GPUs, the highest NIC rate per free GPU first, ties to the
    quieter unit, then hierarchy order."""
    ok = np.flatnonzero(counts.node >= part)
    unit = idx.gpu_unit[idx.node_first_gid[ok]]
    return ok[np.lexsort((idx.position[idx.node_first_gid[ok]], unit, counts.unit_load[unit], -rate[ok]))]


def _take(idx: HierarchyIndex, counts: Free, nodes: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Each node's `parts` lowest free GPUs, in canonical order."""
    start = np.searchsorted(counts.ids, idx.node_first_gid[nodes])
    return canonical(idx, np.concatenate([counts.ids[s : s + p] for s, p in zip(start, parts, strict=True)]))


def rate_filled_set(topology: Topology, idx: HierarchyIndex, counts: Free, job: JobSpec) -> np.ndarray | None:
    """The job's GPUs taken by the network rate each would get: the k-th free GPU behind a NIC is
    worth the NIC's rate over k, and the job takes the best-served GPUs, among equals those of
    the nodes with the higher rate per free GPU (`node_rates`), then the quieter unit, then the
    fuller node, then hierarchy order. So 8-NIC nodes with 5 free GPUs come before whole nodes
    whose GPUs share one NIC, and what they cannot hold goes one GPU per 1-NIC node. A 4-NIC
    node's first GPU behind each NIC is worth as much as an 8-NIC node's GPU, but taking it
    leaves its NIC partner out (on a DGX-1 cube mesh, GPUs 0, 2, 4 and 6 hold no NVLink island
    of 4): the 8-NIC nodes, whose GPUs a group can take whole, come first.
    None when every free node has the same rate per free GPU (best fit covers that already)."""
    n = job.gpus
    rate = node_rates(topology, counts)
    nodes = np.flatnonzero((counts.node > 0) & (rate > 0))
    if nodes.size < 2 or np.ptp(rate[nodes]) <= 1e-9 * rate[nodes].max():
        return None
    gids = counts.ids[topology.gpu_nic_bw[counts.ids] > 0]
    if gids.size < n:
        return None
    ids, _ = nic_ids(topology)
    nic = ids[gids]
    by_nic = np.argsort(nic, kind="stable")
    starts = np.flatnonzero(np.r_[True, nic[by_nic][1:] != nic[by_nic][:-1]])
    behind = np.empty(gids.size, dtype=np.int64)
    behind[by_nic] = np.arange(gids.size) - np.repeat(starts, np.diff(np.r_[starts, gids.size]))
    worth = topology.gpu_nic_bw[gids] / (behind + 1)
    node = idx.gpu_node[gids]
    unit = idx.gpu_unit[gids]
    order = np.lexsort(
        (
            idx.position[gids],
            idx.position[idx.node_first_gid[node]],
            -counts.node[node],
            unit,
            counts.unit_load[unit],
            -np.round(rate[node], 9),
            -np.round(worth, 9),
        )
    )
    return canonical(idx, gids[order[:n]])


# NIC rates (the fastest first) a rail-balanced set may stop at, and node counts tried per rate.
RAIL_RATES_TRIED, RAIL_COUNTS_TRIED = 2, 2


def rail_balanced_sets(
    topology: Topology, idx: HierarchyIndex, counts: Free, job: JobSpec
) -> list[np.ndarray]:
    """GPU sets (canonical order) that give every node they use as many distinct NICs as they
    can: a group spanning nodes runs its network phase on as many rails as its node with the
    fewest distinct NICs offers, at its slowest NIC's rate. For each of the RAIL_RATES_TRIED
    fastest NIC rates R whose NICs serve free GPUs enough for the job (a faster rate too
    scarce to hold it is passed over: 8 GPUs at 100 GB/s must not stop a DP32 job from trying
    4-NIC nodes at 50 beside them): only free GPUs behind NICs of at least R; the nodes with the most such
    distinct NICs first (ties to the fuller node, the quieter unit, then hierarchy order), as few
    as hold the job and one more; each node takes one GPU behind each of its NICs up to a common
    level, the level as high as the job allows, the GPUs left over behind the NICs some nodes
    have beyond it, then GPUs behind NICs a node already uses, evenly. Parts are whole pieces
    (`_pieces`: a node holds whole TP x EP groups where it can), and each set is built for the
    whole pieces and for single GPUs. Best fit and `fast_sets` take a node's lowest free GPUs
    and cut the last node short: a DP64 all-reduce on 8-NIC nodes whose failed NICs left some
    GPUs sharing one (and some NICs at 25 GB/s) ran on 4 rails, here on 6 (12.86 to 8.60 ms)."""
    n = job.gpus
    ids, _ = nic_ids(topology)
    net = counts.ids[topology.gpu_nic_bw[counts.ids] > 0]
    if net.size < n:
        return []
    out: list[np.ndarray] = []
    # The fastest rates whose NICs serve enough free GPUs for the job (rates too fast to hold it
    # are passed over, not the end of the search).
    rates = np.unique(topology.gpu_nic_bw[net])[::-1]
    held_at = np.array([int((topology.gpu_nic_bw[net] >= r).sum()) for r in rates])
    for rate in rates[held_at >= n][:RAIL_RATES_TRIED]:
        gids = net[topology.gpu_nic_bw[net] >= rate]
        # The first GPU behind each NIC, then the others; by node, in id order.
        first = np.zeros(gids.size, dtype=bool)
        first[np.unique(ids[gids], return_index=True)[1]] = True
        node = idx.gpu_node[gids]
        rails = np.bincount(node[first], minlength=idx.n_nodes)
        held = np.bincount(node, minlength=idx.n_nodes)
        nodes = np.flatnonzero(held)
        unit = idx.gpu_unit[idx.node_first_gid[nodes]]
        nodes = nodes[
            np.lexsort(
                (
                    idx.position[idx.node_first_gid[nodes]],
                    unit,
                    counts.unit_load[unit],
                    -held[nodes],
                    -rails[nodes],
                )
            )
        ]
        for piece in _pieces(job, idx.max_node_gpus):
            # In pieces: a piece adds rails while the node has NICs it does not use yet.
            whole = nodes[held[nodes] >= piece]
            rails_p, held_p = -(-rails[whole] // piece), held[whole] // piece
            k = int(np.searchsorted(np.cumsum(held_p), n // piece)) + 1
            for size in range(k, min(k + RAIL_COUNTS_TRIED, whole.size + 1)):
                parts = _levelled(rails_p[:size], held_p[:size], n // piece)
                if parts is None:
                    continue
                per_node = []
                for v, p in zip(whole[:size].tolist(), (parts * piece).tolist(), strict=True):
                    mine = node == v
                    # Distinct NICs first, each part in id order.
                    order = np.lexsort((gids[mine], ~first[mine]))
                    per_node.append(gids[mine][order][:p])
                gset = canonical(idx, np.concatenate(per_node))
                if all(not np.array_equal(np.sort(gset), np.sort(o)) for o in out):
                    out.append(gset)
    return out


def _pieces(job: JobSpec, node_gpus: int) -> list[int]:
    """Part granularities of a rail-balanced set: the largest of TP x CP x EP, TP x EP, TP x CP
    and TP that divides the job and fits a node (so an all-to-all or TP group stays inside one),
    then half a TP group (TP of 4 or more), then single GPUs. A TP group split over two nodes
    runs its network phase on the fewer rails of its two parts: where too few nodes hold whole
    groups on fast NICs, single GPUs levelled by rails cut groups 7 + 1 and 6 + 2 (a tp8 x dp4
    job on faulty-NIC nodes, 82.15 ms), halves cut them 4 + 4 (59.35 ms)."""
    sizes = (job.tp * job.cp * job.ep, job.tp * job.ep, job.tp * job.cp, job.tp)
    piece = next((c for c in sizes if c <= node_gpus and job.gpus % c == 0), 1)
    half = job.tp // 2 if job.tp >= 4 and job.tp % 2 == 0 and job.tp // 2 <= node_gpus else 1
    return sorted({piece, half, 1}, reverse=True)


def _levelled(rails: np.ndarray, held: np.ndarray, n: int) -> np.ndarray | None:
    """Per node, GPUs to take (n in all, at most `held`): min(rails, L) for the highest level L
    the job allows, then one more on as many nodes with rails above L as needed, then GPUs
    beyond their rails, one a node at a time; None when n is not reached or a node gets none.
    Rails above `held` count as `held` (a node's pieces may be fewer than the NICs they use)."""
    rails = np.minimum(rails, held)
    level = 0
    while level < int(rails.max()) and int(np.minimum(rails, level + 1).sum()) <= n:
        level += 1
    parts = np.minimum(rails, level)
    for k in np.flatnonzero(rails > level)[: n - int(parts.sum())]:
        parts[k] += 1
    # GPUs behind NICs a node already uses add no rail: spread one a node at a time.
    while int(parts.sum()) < n and (parts < held).any():
        room = np.flatnonzero(parts < held)[: n - int(parts.sum())]
        parts[room] += 1
    if int(parts.sum()) != n or (parts == 0).any():
        return None
    return parts
